"""A certificate covers exactly what runs: every field of every registered construction, mutated.

For every registered construction at its small build (the registry's ``small``, else ``example``:
inputs few enough to enumerate), every leaf of the model (tests/fields.py walks the model's fields;
nothing is listed here) is changed in turn -- flags flipped, tensors perturbed, labels swapped,
positions shifted, formats and task parameters edited, code parameters corrupted -- and the
mutant is verified:

* ``certify`` must never pass a mutant that exhaustive enumeration (the executor, against the task's
  truth) finds wrong, or that does not run at all;
* a counterexample it reports must be answered wrong by the executor;
* nothing raises: a mutant that cannot run gets a failed report naming what is wrong.

The default suite changes one leaf of every field (a row of docs/architecture.md's table "What a
model is"), every flag (the mask of every layer) and every whole-sequence change; the slow suite
one leaf of every field in every layer. Every field family met
must have its row in docs/architecture.md's table "What a model is", and every row must name a
field some construction has.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from exactformer.constructions.core import registry
from exactformer.verify.verifier import VerifyError, certificate_refusal, verify
from fields import doc_key, get, group_key, leaves, mutants

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _small(name: str):
    entry = registry.get(name)
    return entry.builder(**(entry.small or entry.example))


def _report(model, mode, arithmetic="fixed"):
    """The verifier's report, or None where it refuses the model with a clear error (VerifyError)."""
    try:
        return verify(model, mode, arithmetic=arithmetic)
    except VerifyError:
        return None


def _judge(name: str, what: str, mutant, arithmetic: str = "fixed") -> str:
    """Certify then (where it passed) enumerate ``mutant`` in ``arithmetic`` (a float: through the
    exported torch module); return the outcome's kind."""
    if mutant is None:
        return "unmakeable"
    modes = registry.task_of(mutant).modes if mutant.construction in registry.names() else ()
    cert = _report(mutant, "certify", arithmetic) if "certify" in modes else None
    if cert is not None:
        assert "internal error" not in cert.reason, f"{name}: {what}: {cert.reason}"
    if cert is not None and cert.passed:
        exh = _report(mutant, "exhaustive", arithmetic)
        assert exh is not None and exh.passed, (
            f"{name}: certified a mutant that is wrong ({what}): "
            f"{exh.counterexample if exh is not None else 'exhaustive refused it'}")
        return "proved"
    if cert is not None:  # a report, never a raise (its search ran every input where there are <= 2048)
        return "refuted" if cert.counterexample is not None else "unproven"
    if "certify" in modes:
        return "refused"
    exh = _report(mutant, "exhaustive", arithmetic)  # no certificate: the mutant runs or is reported, never raises
    return "ran" if exh is not None else "refused"


def _run(name: str, pick, arithmetic: str = "fixed") -> None:
    """Judge the mutants ``pick(value, path, what, seen)`` selects in ``arithmetic``; check every field
    with a value was changed."""
    model = _small(name)
    kinds: dict[str, int] = {}
    seen: set = set()
    mutated = set()
    for what, path, mutant in mutants(model):
        if not pick(get(model, path), path, what, seen):
            continue
        kind = _judge(name, what, mutant, arithmetic)
        kinds[kind] = kinds.get(kind, 0) + 1
        if mutant is not None:
            mutated.add(doc_key(path))
    assert kinds.get("unmakeable", 0) == 0, kinds
    # every field with a value to change was changed (None leaves and empty containers hold none)
    fields = {doc_key(p) for p, v in leaves(model)
              if not (v is None or (isinstance(v, (tuple, list, dict)) and not v) or np.size(getattr(v, "num", v)) == 0)}
    assert fields <= mutated, sorted(fields - mutated)[:5]
    if "certify" in registry.task_of(model).modes and verify(model, "certify", arithmetic=arithmetic).passed:
        assert kinds.get("proved", 0) > 0, kinds  # the metadata changes still prove: not a refusal machine


def _first_of_each_field(value, path, what, seen) -> bool:
    """One leaf of every field, every flag (each layer's mask) and every whole-sequence change."""
    key = doc_key(path)
    if " reordered" in what or isinstance(value, (bool, np.bool_)) or key not in seen:
        seen.add(key)
        return True
    return False


def _each_group(value, path, what, seen) -> bool:
    """One leaf of every group (a family of fields in one layer) and every whole-sequence change."""
    key = group_key(path)
    if " reordered" in what or key not in seen:
        seen.add(key)
        return True
    return False


@pytest.mark.parametrize("name", registry.names())
def test_every_field_mutated(name):
    _run(name, _first_of_each_field)


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.names())
def test_every_field_of_every_layer_mutated(name):
    _run(name, _each_group)


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.names())
def test_every_field_mutated_in_float32(name):
    """The same in float32: a mutant certified there is answered right by the exported torch module."""
    model = _small(name)
    if "certify" not in registry.task_of(model).modes or certificate_refusal(model, "float32") is not None:
        pytest.skip(f"no float32 certificate covers {name}")
    _run(name, _first_of_each_field, "float32")


def _doc_rows() -> set[str]:
    text = DOC.read_text()
    section = text.split("## What a model is", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))


def test_every_field_has_its_row_in_the_docs():
    rows = _doc_rows()
    met = set()
    for name in registry.names():
        met |= {doc_key(p) for p, _ in leaves(_small(name))}
    assert met - rows == set(), f"fields without a row in docs/architecture.md: {sorted(met - rows)}"
    assert rows - met == set(), f"rows of docs/architecture.md naming no field: {sorted(rows - met)}"


def test_a_mutant_saved_and_verified_in_a_fresh_process(tmp_path):
    """The audit's two cases end to end: answer labels swapped (k-hop) and answer positions shifted
    (Index Lookup) are saved with xf.save, whose manifest then certifies nothing, and a fresh process
    verifying the saved files from the command line fails (exit 1), with the counterexample."""
    import json
    import subprocess
    import sys

    import exactformer as xf

    hop = _small("k-hop")
    swapped = list(hop.answers)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    lookup = _small("index-lookup")
    T = registry.task_of(lookup).length(lookup)
    for name, mutant in (("swapped", _replace(hop, answers=swapped)),
                         ("shifted", _replace(lookup, answer_positions=(T - 2,)))):
        out = xf.save(mutant, tmp_path / name)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["certified_arithmetics"]["certified"] == [], manifest["certified_arithmetics"]
        proc = subprocess.run([sys.executable, "-m", "exactformer.cli.main", "verify", str(out), "--mode", "certify",
                               "--json"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        report = json.loads(proc.stdout)
        assert not report["passed"] and report["counterexample"] is not None, report


def _replace(model, **fields):
    import copy

    new = copy.copy(model)
    for k, v in fields.items():
        setattr(new, k, v)
    return new


def _runs_as(model) -> tuple:
    """Everything a run reads, by value: every tensor, every embedding row, the masks, the answers
    and where they are read, the format and the task (two models equal here run the same)."""
    import json

    tensors = {k: (t.num.tolist(), t.den) for k, t in model.tensors().items()}
    rows = {}
    for name in ("embed", "pos_embed"):
        emb = getattr(model, name, None)
        if emb is not None and hasattr(emb, "values"):
            v = emb.values(np.arange(emb.n_rows))
            rows[name] = (v.num.tolist(), v.den)
    extra = (model.W_hh.cols.tolist(), model.W_hh.vals.num.tolist()) if hasattr(model, "W_hh") else None
    masks = [b.attn.causal for b in getattr(model, "blocks", [])]
    task = json.dumps(model.task_params, sort_keys=True, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    return (tensors, rows, extra, masks, [repr(a) for a in model.answers], model.answer_positions, model.precision, task,
            model.construction, model.n)


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.names())
def test_every_field_survives_save_and_load(name, tmp_path):
    """xf.save either refuses a mutant (naming what does not fit) or xf.load gives back a model that
    runs exactly as the mutant: what the manifest certifies is what loads."""
    import exactformer as xf
    from exactformer.constructions.core.ir import IRError
    from exactformer.constructions.export.files import ExportError, ManifestError

    model = _small(name)
    seen: set = set()
    for i, (what, path, mutant) in enumerate(mutants(model)):
        if mutant is None or not _first_of_each_field(get(model, path), path, what, seen):
            continue
        try:
            out = xf.save(mutant, tmp_path / str(i), certify=False)
        except (IRError, ExportError, ValueError, TypeError, AttributeError):  # (a token-name run made of other types)
            continue
        try:
            loaded = xf.load(out).compiled
        except (ManifestError, ValueError):  # an unregistered construction name, a recipe that does not rebuild
            continue
        assert _runs_as(loaded) == _runs_as(mutant), f"{name}: {what}: the loaded model differs from the saved one"


def test_a_tie_is_never_a_right_answer():
    """The executor decodes a tie as no answer (None), which the verifier used to compare as -1 --
    k-hop's "no answer" truth -- while torch's argmax picks the lowest index. A k-hop model whose
    logits all tie is now wrong on an input whose every answer is "no answer"."""
    import dataclasses

    from exactformer.constructions.core.ir import ExactTensor
    from exactformer.precision import parse_format
    from exactformer.verify.verifier import check_batches

    hop = _small("k-hop")
    flat = dataclasses.replace(hop, W_U=ExactTensor.zeros(*hop.W_U.shape), b_U=ExactTensor.zeros(*hop.b_U.shape))
    task = registry.task_of(hop)
    every = next(b for b in task.exhaustive(hop) if np.any(np.all(np.asarray(b.truth).reshape(len(b), -1) == -1, axis=1)))
    batch = every.take(np.flatnonzero(np.all(np.asarray(every.truth).reshape(len(every), -1) == -1, axis=1))[:1])
    assert check_batches(hop, parse_format(hop.precision), [batch])[1] is None  # the model as built answers it right
    _, cex, _, _ = check_batches(flat, parse_format(hop.precision), [batch])
    assert cex is not None and cex["got"][0] is None, cex
    assert not verify(flat, "certify").passed and not verify(flat, "exhaustive").passed
