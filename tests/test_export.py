"""Exports: save/load round trips, tamper detection, the non-materialised path, plain torch and
TransformerLens 4.x (skipped when transformer_lens is not installed)."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from exactformer.constructions.export import (
    EXACT_FILE,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    ManifestError,
    load,
    save,
    to_torch,
    to_transformer_lens,
)
from exactformer.constructions.theorems.index_lookup import IndexLookupTask, index_lookup
from exactformer.constructions.core.ir import MLP, Attention, TransformerBlock, ExactTensor, check_shapes
from exactformer.precision import Float64, parse_format
from exactformer.verify.executor.exact import run

N, S = 16, 4


@pytest.fixture(scope="module", params=["reed-solomon", "random"])
def model(request):
    return index_lookup(N, S, positions=request.param)


def _inputs(model, B=64, seed=0):
    rng = np.random.default_rng(seed)
    syms = rng.integers(0, len(model.answers), (B, model.n))
    p = rng.integers(1, model.n + 1, B)
    return IndexLookupTask().encode_arrays(model, syms, p), syms[np.arange(B), p - 1]


def _same_values(x: ExactTensor, y: ExactTensor) -> bool:
    """Whether two exact tensors hold the same rationals: x.num / x.den == y.num / y.den entry by entry,
    compared as x.num * y.den == y.num * x.den in Python integers (exact; the dens are positive), which
    is what comparing their Fractions decides, without making a Fraction per entry."""
    return x.shape == y.shape and np.array_equal(x.num.astype(object) * y.den, y.num.astype(object) * x.den)


def _same_weights(a, b):
    ta, tb = a.tensors(), b.tensors()
    assert ta.keys() == tb.keys()
    for k in ta:
        assert ta[k].shape == tb[k].shape, k
        assert _same_values(ta[k], tb[k]), k
    for ea, eb in ((a.embed, b.embed), (a.pos_embed, b.pos_embed)):
        assert (ea.n_rows, ea.d_model) == (eb.n_rows, eb.d_model)
        rows = np.arange(ea.n_rows)
        assert _same_values(ea.values(rows), eb.values(rows))
    assert [bl.attn.causal for bl in a.blocks] == [bl.attn.causal for bl in b.blocks]


def test_round_trip_exact(model, tmp_path: Path):
    out = save(model, tmp_path / "m")
    assert out == tmp_path / "m"
    for f in (WEIGHTS_FILE, EXACT_FILE, MANIFEST_FILE):
        assert (out / f).is_file()
    m2 = load(out)
    _same_weights(model, m2)
    assert m2.vocab == model.vocab and m2.answers == model.answers and m2.precision == model.precision
    assert {k: p.value for k, p in m2.params.items()} == {k: p.value for k, p in model.params.items()}
    assert isinstance(m2.params["mu"].value, Fraction)
    # the code blocks are regenerated, and shared codes are shared again (certificates need it)
    assert m2.embed.blocks and m2.embed.blocks[0].code is m2.pos_embed.blocks[0].code is m2.position_code
    assert m2.position_code.k == model.position_code.k and m2.position_code.family == model.position_code.family
    tokens, _ = _inputs(model)
    for fmt in (parse_format(model.precision), Float64):
        r1, r2 = run(model, tokens, fmt), run(m2, tokens, fmt)
        assert np.array_equal(r1.logits, r2.logits) and r1.answers == r2.answers


def test_safetensors_names_shapes_and_manifest(model, tmp_path: Path):
    out = save(model, tmp_path / "m")
    sd = load_file(str(out / WEIGHTS_FILE))
    d, H, dh, dm, V = model.d_model, model.n_heads, model.d_head, model.d_mlp, len(model.answers)
    expect = {
        "embed.W_E": (model.d_vocab, d), "pos_embed.W_pos": (model.n_ctx, d),
        "blocks.0.attn.W_Q": (H, d, dh), "blocks.0.attn.W_K": (H, d, dh), "blocks.0.attn.W_V": (H, d, dh),
        "blocks.0.attn.W_O": (H, dh, d), "blocks.0.attn.b_Q": (H, dh), "blocks.0.attn.b_K": (H, dh),
        "blocks.0.attn.b_V": (H, dh), "blocks.0.attn.b_O": (d,), "blocks.0.mlp.W_in": (d, dm),
        "blocks.0.mlp.b_in": (dm,), "blocks.0.mlp.W_out": (dm, d), "blocks.0.mlp.b_out": (d,),
        "unembed.W_U": (d, V), "unembed.b_U": (V,),
    }
    assert {k: tuple(v.shape) for k, v in sd.items()} == expect  # TL names only
    assert all(v.dtype == np.float64 for v in sd.values())
    # float64 values are the exact weights (index lookup's weights are dyadic)
    for name, t in model.tensors().items():
        assert np.array_equal(sd[name], t.to_float()), name
    assert np.array_equal(sd["embed.W_E"], model.embed.values(np.arange(model.d_vocab)).to_float())
    man = json.loads((out / MANIFEST_FILE).read_text())
    assert man["vocab"] == model.vocab
    assert man["vocab"][:S] == [f"s{s}" for s in range(S)] and man["vocab"][S] == "p1"
    assert man["output_vocab"] == [str(s) for s in range(S)]
    cfg = man["transformer_lens_config"]
    assert cfg["attention_dir"] == "bidirectional" and cfg["use_attn_scale"] is False
    assert cfg["act_fn"] == "relu" and cfg["normalization_type"] is None
    assert cfg["positional_embedding_type"] == "standard"
    assert (cfg["n_layers"], cfg["d_model"], cfg["d_head"], cfg["n_heads"], cfg["d_mlp"]) == (1, d, dh, H, dm)
    assert (cfg["d_vocab"], cfg["d_vocab_out"], cfg["n_ctx"]) == (model.d_vocab, V, model.n_ctx)
    assert man["construction"] == "index-lookup" and man["n"] == N and man["precision"] == model.precision
    assert man["params"]["eta"]["formula"] and man["summary"]["d_model"] == d
    assert man["task_params"]["alphabet"] == S
    assert man["exactness"]["weights_exact_in_float64"] is True
    assert "says nothing about arithmetic" in man["exactness"]["note"] and man["certified_arithmetics"] is None
    assert man["tensors"]["blocks.0.attn.W_Q"]["den"] == model.blocks[0].attn.W_Q.den
    gen = man["codes"][0]["generator"]
    assert gen["family"] == model.position_code.family and gen["k"] == model.position_code.k
    assert man["embedding"]["embed"]["materialized"] and man["embedding"]["embed"]["blocks"]
    # the exact file: nonzero numerators (int64) at flat indices, den in the manifest
    exact = load_file(str(out / EXACT_FILE))
    for name, t in model.tensors().items():
        entry = man["tensors"][name]
        assert entry["index"] == f"{EXACT_FILE}:{name}.index" and entry["numerators"] == f"{EXACT_FILE}:{name}.numerators"
        idx, num = exact[f"{name}.index"], exact[f"{name}.numerators"]
        assert idx.dtype == num.dtype == np.int64 and entry["nonzero"] == idx.size == np.count_nonzero(t.num)
        dense = np.zeros(int(np.prod(entry["shape"])), np.int64)
        dense[idx] = num
        assert np.array_equal(dense.reshape(entry["shape"]), t.num) and entry["den"] == t.den


def test_tampered_weights_refused(model, tmp_path: Path):
    for fname in (WEIGHTS_FILE, EXACT_FILE):
        out = save(model, tmp_path / fname)
        data = bytearray((out / fname).read_bytes())
        data[-1] ^= 0x01
        (out / fname).write_bytes(bytes(data))
        with pytest.raises(ManifestError, match="sha256") as e:
            load(out)
        assert fname in str(e.value)
    out = save(model, tmp_path / "gone")
    (out / EXACT_FILE).unlink()
    with pytest.raises(ManifestError, match=EXACT_FILE):
        load(out)
    with pytest.raises(ManifestError, match=MANIFEST_FILE):
        load(tmp_path / "nothing-here")


def test_edited_manifest_refused(model, tmp_path: Path):
    out = save(model, tmp_path / "m", dense=False)
    man = json.loads((out / MANIFEST_FILE).read_text())
    man["embedding"]["embed"]["blocks"][0]["scale"] = "2/1"  # would silently change the rows
    (out / MANIFEST_FILE).write_text(json.dumps(man))
    with pytest.raises(ManifestError, match=r"field embedding\.embed\.blocks\[0\]\.scale was modified"):
        load(out)
    (out / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ManifestError, match=MANIFEST_FILE):
        load(out)


def test_not_materialised_round_trip(model, tmp_path: Path):
    out = save(model, tmp_path / "m", materialize_limit=8)
    sd = load_file(str(out / WEIGHTS_FILE))
    assert "embed.W_E" not in sd and "pos_embed.W_pos" not in sd
    man = json.loads((out / MANIFEST_FILE).read_text())
    for prefix in ("embed", "pos_embed"):
        lay = man["embedding"][prefix]
        assert lay["materialized"] is False and lay["blocks"]
    assert man["embedding"]["embed"]["blocks"][0]["count"] == N
    m2 = load(out)
    _same_weights(model, m2)
    tokens, _ = _inputs(model, seed=1)
    fmt = parse_format(model.precision)
    assert np.array_equal(run(model, tokens, fmt).logits, run(m2, tokens, fmt).logits)


def _reseal(out: Path) -> None:
    """What a deliberate forger does after editing: recompute the manifest digests into the exact
    file's metadata and that file's sha256 and size into the manifest."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from exactformer.constructions.export.manifest import DIGESTS_KEY, field_digests, sha256_file

    man = json.loads((out / MANIFEST_FILE).read_text())
    epath = out / EXACT_FILE
    with safe_open(str(epath), framework="np") as f:
        meta = f.metadata()
    save_file(load_file(str(epath)), str(epath), metadata=meta | {DIGESTS_KEY: json.dumps(field_digests(man))})
    man["files"][EXACT_FILE].update(sha256=sha256_file(epath), bytes=epath.stat().st_size)
    (out / MANIFEST_FILE).write_text(json.dumps(man))


def test_materialised_rows_checked(model, tmp_path: Path):
    """A stored W_E that disagrees with the generated rows is refused, even when the forger fixed
    up every sha256 and digest."""
    from safetensors.numpy import save_file

    from exactformer.constructions.export.manifest import sha256_file

    out = save(model, tmp_path / "m")
    sd = load_file(str(out / WEIGHTS_FILE))
    blk = model.embed.blocks[0]
    sd["embed.W_E"][blk.first_row, blk.col] *= -1  # flip one code sign of the first index token
    save_file(sd, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    man = json.loads((out / MANIFEST_FILE).read_text())
    man["files"][WEIGHTS_FILE]["sha256"] = sha256_file(out / WEIGHTS_FILE)
    (out / MANIFEST_FILE).write_text(json.dumps(man))
    with pytest.raises(ManifestError, match=r'field files\["model.safetensors"\]\.sha256 was modified'):
        load(out)
    _reseal(out)
    with pytest.raises(ManifestError, match="W_E rows differ"):
        load(out)


def test_resealed_weight_checked_against_exact(model, tmp_path: Path):
    """A float weight that is not the rounding of its exact value is refused after a full reseal."""
    from safetensors.numpy import save_file

    from exactformer.constructions.export.manifest import sha256_file

    out = save(model, tmp_path / "m")
    sd = load_file(str(out / WEIGHTS_FILE))
    sd["unembed.b_U"][0] += 0.5
    save_file(sd, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    man = json.loads((out / MANIFEST_FILE).read_text())
    man["files"][WEIGHTS_FILE]["sha256"] = sha256_file(out / WEIGHTS_FILE)
    (out / MANIFEST_FILE).write_text(json.dumps(man))
    _reseal(out)
    with pytest.raises(ManifestError, match="unembed.b_U differs from its exact value"):
        load(out)


def test_to_torch_matches_executor(model):
    tokens, truth = _inputs(model, B=128, seed=2)
    tm = to_torch(model)
    logits = tm(torch.as_tensor(tokens))
    # one answer at the last position: the last layer runs there only (positions="answers")
    assert tm.positions == "answers" and list(tm.output_positions(model.n + 1)) == [model.n]
    assert logits.shape == (128, 1, len(model.answers)) and logits.dtype == torch.float64
    every = to_torch(model, positions="all")(torch.as_tensor(tokens))
    assert every.shape == (128, model.n + 1, len(model.answers)) and torch.allclose(every[:, -1:], logits, rtol=0, atol=1e-12)
    last = logits[:, -1, :].detach().numpy()
    rf = run(model, tokens, Float64)
    assert np.allclose(last, rf.logits[:, -1], rtol=0, atol=1e-9)
    for fmt in (parse_format(model.precision), Float64):
        r = run(model, tokens, fmt)
        ok = [i for i, a in enumerate(r.answers) if a is not None]
        assert ok and all(int(np.argmax(last[i])) == model.answers.index(r.answers[i][0]) for i in ok)
    assert tm.decode(logits) == list(truth)
    assert "blocks.0.attn.W_Q" in tm.state_dict()
    t32 = to_torch(model, dtype=torch.float32)
    assert t32(torch.as_tensor(tokens)).dtype == torch.float32
    with pytest.raises(ValueError, match="token ids"):
        tm(torch.full((1, 3), model.d_vocab))


def _with_extra_layer(model, causal: bool):
    """model + a second, exactly neutral layer with other head counts/widths (zero weights), every
    layer causal or not: exercises padding to uniform TL shapes and causal masks."""
    d = model.d_model
    z = lambda *s: ExactTensor(np.zeros(s, np.int64))  # noqa: E731
    attn = Attention(z(2, d, 3), z(2, d, 3), z(2, d, 3), z(2, 3, d), z(2, 3), z(2, 3), z(2, 3), z(d), causal=causal)
    blocks = [TransformerBlock(dataclasses.replace(b.attn, causal=causal), b.mlp) for b in model.blocks]
    blocks.append(TransformerBlock(attn, MLP(z(d, 5), z(5), z(5, d), z(d))))
    m = dataclasses.replace(model, blocks=blocks)
    check_shapes(m)
    return m


@pytest.mark.parametrize("causal", [False, True])
def test_padding_and_causal(model, tmp_path: Path, causal: bool):
    m = _with_extra_layer(model, causal)
    out = save(m, tmp_path / "m")
    sd = load_file(str(out / WEIGHTS_FILE))
    H, dh = m.n_heads, m.d_head
    assert sd["blocks.0.attn.W_Q"].shape == (H, m.d_model, dh) == sd["blocks.1.attn.W_Q"].shape
    assert sd["blocks.0.mlp.W_in"].shape[1] == m.d_mlp == sd["blocks.1.mlp.W_in"].shape[1]
    man = json.loads((out / MANIFEST_FILE).read_text())
    assert man["transformer_lens_config"]["attention_dir"] == ("causal" if causal else "bidirectional")
    m2 = load(out)
    _same_weights(m, m2)
    assert m2.blocks[1].attn.n_heads == 2 and m2.blocks[1].mlp.d_mlp == 5
    tokens, _ = _inputs(m, B=32, seed=3)
    rf = run(m, tokens, Float64)
    assert np.array_equal(rf.logits, run(m2, tokens, Float64).logits)
    last = to_torch(m)(torch.as_tensor(tokens))[:, -1, :].detach().numpy()
    assert np.allclose(last, rf.logits[:, -1], rtol=0, atol=1e-9)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_torch_cuda(model):
    tokens, truth = _inputs(model, B=64, seed=4)
    tm = to_torch(model).to("cuda")
    logits = tm(torch.as_tensor(tokens, device="cuda"))
    assert logits.device.type == "cuda"
    assert np.allclose(logits[:, -1].cpu().numpy(), run(model, tokens, Float64).logits[:, -1], rtol=0, atol=1e-9)


# ------------------------------------------------------------------------------------------------
# TransformerLens 4.x (optional extra [lens])
# ------------------------------------------------------------------------------------------------


def test_to_transformer_lens_missing_gives_hint(model, monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name.startswith("transformer_lens"):
            raise ImportError("No module named 'transformer_lens'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match=r"pip install 'exactformer\[lens\]'"):
        to_transformer_lens(model)


@pytest.mark.parametrize("causal", [False, True])
def test_to_transformer_lens_matches_executor(model, causal: bool):
    pytest.importorskip("transformer_lens", reason="transformer_lens not installed (extra [lens])")
    m = _with_extra_layer(model, causal) if causal else model
    bridge = to_transformer_lens(m)
    tokens, truth = _inputs(m, B=64, seed=5)
    with torch.no_grad():
        logits = bridge(torch.as_tensor(tokens))
    assert logits.shape == (64, m.n + 1, len(m.answers))
    last = logits[:, -1, :].double().cpu().numpy()
    rf = run(m, tokens, Float64)
    scale = max(1.0, float(np.abs(rf.logits[:, -1]).max()))
    assert np.allclose(last, rf.logits[:, -1], rtol=0, atol=1e-5 * scale)  # float32 tolerance
    r = run(m, tokens, parse_format(m.precision))
    ok = [i for i, a in enumerate(r.answers) if a is not None]
    assert ok and all(int(np.argmax(last[i])) == m.answers.index(r.answers[i][0]) for i in ok)
    assert [m.answers[int(i)] for i in last.argmax(axis=1)] == list(truth)


def test_non_dyadic_weights_recorded_exactly(model, tmp_path: Path):
    """A weight float64 cannot hold (1/3) is stored rounded in model.safetensors, flagged in the
    manifest with its exact "num/den" value, and reloaded exactly from the numerators."""
    W_Q = model.blocks[0].attn.W_Q
    m = model.replace_weight("blocks.0.attn.W_Q", ExactTensor(W_Q.num, W_Q.den * 3))
    out = save(m, tmp_path / "m")
    man = json.loads((out / MANIFEST_FILE).read_text())
    entry = man["tensors"]["blocks.0.attn.W_Q"]
    assert entry["exact_in_float64"] is False and entry["den"] == W_Q.den * 3
    value = Fraction(int(W_Q.num.max()), W_Q.den * 3)
    assert f"{value.numerator}/{value.denominator}" in entry["inexact_values"]
    assert man["exactness"]["weights_exact_in_float64"] is False
    assert man["tensors"]["blocks.0.attn.W_K"]["exact_in_float64"] is True
    sd = load_file(str(out / WEIGHTS_FILE))
    assert sd["blocks.0.attn.W_Q"].max() == float(value)  # correctly rounded
    m2 = load(out)
    assert np.array_equal(m2.blocks[0].attn.W_Q.fractions(), m.blocks[0].attn.W_Q.fractions())
