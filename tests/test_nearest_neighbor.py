"""Nearest neighbour and MQAR in two layers (Theorem 7, App. G of P1; issue 11).

* The specification (a content pointer and the label beside it) equals the ground truth on every
  input of the finite families.
* The certificate agrees with exhaustive enumeration (finite families at tiny N, MQAR for small N
  and alphabet) and with sampled adversarial runs at larger N.
* Mutants are refuted with real counterexamples (run again here through the executor): eta1 too
  small, c_self = 0 (the query matches itself), c_label = 0 (labels win), a self-exclusion code
  whose cross-correlation is too large for the margin, a code with too few bits; a format with too
  few fraction bits is "not proven", never a pass.
* Inputs outside the precondition are refused and named; the generator is exact; state (batch sizes,
  repeated runs); exports and TransformerLens (causal).
"""

from __future__ import annotations

import shutil
from fractions import Fraction

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.theorems import nearest_neighbor_inputs as ni
from exactformer.constructions.theorems.mqar import MQARError, mqar
from exactformer.constructions.theorems.nearest_neighbor import (NearestNeighborError, _grid_up, build, design, nearest_neighbor)
from exactformer.constructions.codes.positions import RandomSignCode, ReedSolomonCode
from exactformer.constructions.core.registry import task_of
from exactformer.precision import FixedPoint, parse_format
from exactformer.verify.executor.exact import run
from exactformer.verify.verifier import verify

HALF = Fraction(1, 2)
QUARTER = Fraction(1, 4)


def family_models():
    return [nearest_neighbor(4, d_in=4, margin=Fraction(1), queries=q, labels=L) for q, L in (("last", 2), ("all", 3))]


def mqar_models():
    return [mqar(6, alphabet=4, variant=v, queries=q) for v in ("lean", "nn") for q in ("last", "all")]


# ------------------------------------------------------------------------------------------------
# specification, certificate and exhaustive enumeration
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", family_models() + mqar_models(), ids=lambda m: f"{m.construction}-{m.task_params['queries']}"
                         f"-{m.task_params.get('variant')}")
@pytest.mark.slow
def test_spec_equals_truth_and_certificate_agrees_with_exhaustive(model):
    task = task_of(model)
    spec = task.spec(model)
    for b in task.exhaustive(model, batch=1 << 14):
        if model.vector_input is not None:
            got = spec.evaluate(b.tokens.tokens, b.tokens.vectors.num, b.tokens.vectors.den)
        else:
            got = spec.evaluate(b.tokens)
        assert np.array_equal(got, b.truth)
    cert, exh = verify(model, "certify"), verify(model, "exhaustive")
    assert cert.passed and cert.inputs_covered == "all", cert.reason
    assert exh.passed and exh.inputs_covered == task.count(model) > 0


@pytest.mark.parametrize("kw", [dict(n=16, labels=3), pytest.param(dict(n=64, queries="all", margin=HALF), marks=pytest.mark.slow),
                                dict(n=8, variant="paper", margin=1), dict(n=256, d_in=4, margin=HALF)], ids=str)
def test_certificate_agrees_with_sampled_adversarial_runs(kw):
    m = nearest_neighbor(**kw)
    cert = verify(m, "certify")
    assert cert.passed, cert.reason
    s = verify(m, "sample", samples=150, seed=3)
    assert s.passed and s.inputs_covered == 300, s.counterexample


# slow: MQAR certified at n = 8 by test_cli.py::test_a_new_construction_needs_no_cli_edit (verify all) and
# test_saved_models.py, sampled at n = 16 by test_float_arithmetics.py
@pytest.mark.slow
def test_mqar_sampled_and_certified_at_larger_n():
    for m in (mqar(64, labels=5, queries="all"), mqar(32, alphabet=40, variant="nn")):
        assert verify(m, "certify").passed
        assert verify(m, "sample", samples=100).passed


# ------------------------------------------------------------------------------------------------
# mutants: refuted with counterexamples that the executor really answers wrong
# ------------------------------------------------------------------------------------------------


def mutant(n: int = 16, margin: Fraction = QUARTER, d: int = 16, eta1: Fraction | None = None, code1=None,
           c_self: Fraction | None = None, c_label: Fraction | None = None):
    """The design of nearest_neighbor(n, d, margin), one constant changed, every weight rounded to
    the grid the way the builder rounds it (the builder itself refuses such constants)."""
    dz = design(n, d, margin, "two-code", 2, None, None, None, 8)
    if code1 is not None:
        dz.code1 = code1
    e = dz.eta1 if eta1 is None else eta1
    dz.eta1 = e
    dz.code_weight = _grid_up(dz.fmt, e * (dz.c_self_min if c_self is None else c_self) * Fraction(dz.code1.gram_scale))
    dz.label_bias = _grid_up(dz.fmt, e * (dz.c_label_min if c_label is None else c_label))
    return build(dz, "last")


def _assert_refuted(model):
    r = verify(model, "certify")
    assert not r.passed and r.counterexample is not None, r.reason
    # the counterexample is a real input the model answers wrong
    task = task_of(model)
    X, Y = task.to_arrays(model, [r.counterexample["input"]])
    batch = task.batch(model, X, Y)
    got = run(model, batch.tokens, parse_format(model.precision))
    assert got.answers[0] != batch.truth[0].tolist()
    return r


@pytest.mark.parametrize("name", ["eta1-too-small", "c_self-0", "c_label-0", "code-cross-correlation", "code-too-few-bits"])
def test_mutants_are_refuted_with_counterexamples(name):
    n = 16
    kw = {"eta1-too-small": dict(eta1=Fraction(3)), "c_self-0": dict(c_self=Fraction(0)),
          "c_label-0": dict(c_label=Fraction(0)),
          "code-cross-correlation": dict(code1=ReedSolomonCode.for_max_inner(2 * n, QUARTER)),  # mu = 1/8: c_self mu > margin/2
          "code-too-few-bits": dict(code1=RandomSignCode(2 * n, 8, seed=1))}[name]
    _assert_refuted(mutant(n, **kw))


@pytest.mark.slow
def test_too_few_fraction_bits_is_not_proven_never_a_pass():
    """A format whose bounds fail but that no input breaks (exhaustively): the certificate says so."""
    dz = design(4, 4, HALF, "two-code", 2, None, None, None, 8)
    fmt = FixedPoint.binary(int_bits=8, frac_bits=1)
    dz.fmt, dz.eta1 = fmt, Fraction(9, 2)
    dz.code_weight, dz.label_bias = _grid_up(fmt, dz.eta1 * dz.c_self_min), _grid_up(fmt, dz.eta1 * dz.c_label_min)
    dz.eta2 = _grid_up(fmt, dz.eta2)
    m = build(dz, "last")
    cert = verify(m, "certify")
    assert not cert.passed and cert.counterexample is None and cert.reason.startswith("unproven")
    assert verify(m, "exhaustive").passed


# ------------------------------------------------------------------------------------------------
# the precondition, the generator, parameters
# ------------------------------------------------------------------------------------------------


def test_inputs_outside_the_precondition_are_refused_and_named():
    """The ground truth refuses (and names) inputs outside the precondition, so a verification never
    counts them as model errors; running the model on them is allowed (it computes something)."""
    m = xf.build("nearest-neighbor", n=4, d_in=4, margin=HALF)
    task, c = m.task, m.compiled

    def truth(example):
        return task.batch(c, *task.to_arrays(c, [example])).truth[0].tolist()

    h = [HALF] * 4
    ok = ([h, [-x for x in h], [HALF, HALF, -HALF, -HALF], h], [0, 1, 0])
    assert truth(ok) == [0] and m(ok) == 0  # x_4 = x_1: the label of x_1
    with pytest.raises(NearestNeighborError, match=r"input 0: \|\|x_2\|\|\^2 = 2 exceeds 1"):
        truth(([h, [1, 1, 0, 0], h, h], [0, 1, 0]))
    with pytest.raises(NearestNeighborError, match=r"query x_4: the nearest candidate .* leads by 0 < margin 1/2"):
        truth(([h, h, [-x for x in h], h], [0, 1, 0]))  # a tie
    with pytest.raises(NearestNeighborError, match="leads by 1/4 < margin 1/2"):
        truth(([h, [HALF, HALF, HALF, 0], [0, 0, 0, 0], h], [0, 1, 0]))
    assert m(([h, h, [-x for x in h], h], [0, 1, 0])) in (0, 1)  # the model runs; the truth refuses
    q = xf.build("mqar", n=6, alphabet=4)

    def qtruth(example):
        return q.task.batch(q.compiled, *q.task.to_arrays(q.compiled, [example])).truth[0].tolist()

    assert qtruth(([0, 1, 2, 2, 0, 1], [0, 1, 1, 0, 0])) == [1] and q(([0, 1, 2, 2, 0, 1], [0, 1, 1, 0, 0])) == 1
    with pytest.raises(MQARError, match="input 0: the first half repeats a symbol"):
        qtruth(([0, 0, 2, 2, 0, 1], [0, 1, 1, 0, 0]))
    with pytest.raises(MQARError, match="not a permutation"):
        qtruth(([0, 1, 2, 2, 2, 1], [0, 1, 1, 0, 0]))


def test_user_values_are_rounded_to_the_grid_before_the_truth():
    m = xf.build("nearest-neighbor", n=4, d_in=4, margin=HALF)
    h = 0.5 + 1e-9  # rounds (floor) to 1/2 on the model's grid, then ||x||^2 = 1
    assert m(([[h] * 4, [-0.5] * 4, [0.5, 0.5, -0.5, -0.5], [0.5] * 4], [1, 0, 0])) == 1


@pytest.mark.parametrize("queries", ["last", "all"])
def test_generator_is_exact_and_every_kind_keeps_the_precondition(queries):
    m = nearest_neighbor(16, labels=3, queries=queries)
    task = task_of(m)
    S = task.scale(m)
    kinds = ni.KINDS_LAST if queries == "last" else ni.KINDS_ALL
    rng = np.random.default_rng(0)
    seen_tight = False
    for kind in kinds:
        make = ni._last_batch if queries == "last" else ni._all_batch
        X, Y = make(task, m, 20, kind, rng)
        task.check(m, X, Y)  # every input satisfies the precondition exactly
        norms = np.einsum("bnd,bnd->bn", X, X)
        assert norms.max() <= S * S
        if kind == "alltight":  # every candidate exactly margin behind the nearest
            ip = np.einsum("bnd,bd->bn", X[:, :-1], X[:, -1])
            top = ip.max(axis=1)
            assert np.all(np.sort(ip, axis=1)[:, -2] * 4 == top * 4 - S * S)
            seen_tight = True
    assert seen_tight or queries == "all"
    assert task.scale(m) % 16 == 0


@pytest.mark.parametrize("d_in", [2, 3])
def test_all_queries_in_fewer_than_four_dims_are_sampled(d_in):
    """The reported crash: with queries="all" and d_in < 4 the model certified but sampling raised
    (the hypercube words needed a Hadamard basis of order 4). Words on all d_in coordinates with
    entries +-1/2 keep the precondition; the sample runs and agrees with the certificate."""
    m = nearest_neighbor(8, d_in=d_in, queries="all")
    task = task_of(m)
    for kind in ni.KINDS_ALL:
        X, Y = ni._all_batch(task, m, 10, kind, np.random.default_rng(1))
        task.check(m, X, Y)
    assert xf.verify(m, mode="certify").passed
    r = xf.verify(m, mode="sample", samples=20)
    assert r.passed and r.inputs_covered == 40


def test_parameters_are_checked_with_one_line_errors():
    for kw, word in [(dict(n=7), "n must be an even integer"), (dict(n=8, margin=3), "margin must lie in"),
                     (dict(n=8, variant="x"), "variant must be one of"), (dict(n=8, queries="some"), "queries must be one of"),
                     (dict(n=8, labels=1), "labels must be"), (dict(n=8, precision="float64"), "fixed-point")]:
        with pytest.raises(NearestNeighborError, match=word):
            nearest_neighbor(**kw)
    with pytest.raises(MQARError, match="alphabet must be"):
        mqar(8, alphabet=2)
    big = nearest_neighbor(8)
    assert task_of(big).count(big) == ni.UNENUMERABLE
    with pytest.raises(ValueError, match="nearest-neighbor at N = 8 has too many inputs to count, above the limit"):
        verify(big, "exhaustive")
    with pytest.raises(ValueError, match="finite input family"):
        next(task_of(big).exhaustive(big))


def test_constants_are_recorded_with_formulas_and_the_papers_beside_them():
    m = nearest_neighbor(64, margin=QUARTER)
    p = m.params
    for key in ("k", "k2", "mu1", "mu2", "c_self", "c_label", "tau", "eta", "eta2", "eta_paper", "c_paper", "eps_paper",
                "d_model", "precision"):
        assert p[key].formula, key
    assert p["c_self"].value >= Fraction(9, 4) and p["c_label"].value >= Fraction(9, 4)
    assert p["tau"].value >= QUARTER / 2 and p["c_paper"].value == 6 and p["eps_paper"].value == QUARTER / 100
    assert m.d_model == p["d_model"].value and m.vector_input.width == 16


# ------------------------------------------------------------------------------------------------
# state, exports, TransformerLens
# ------------------------------------------------------------------------------------------------


def test_state_batches_and_repeated_runs():
    m = nearest_neighbor(16, labels=3, queries="all")
    task = task_of(m)
    fmt = parse_format(m.precision)
    b = next(task.adversarial(m, 7, seed=5, batch=7))
    whole = run(m, b.tokens, fmt)
    assert np.array_equal(np.array(whole.answers), b.truth)
    for size in (1, 2, 7):
        assert np.array_equal(run(m, b.tokens, fmt, batch_size=size).logits, whole.logits)
    singles = np.concatenate([run(m, b.tokens[i], fmt).logits for i in range(len(b))])
    assert np.array_equal(singles, whole.logits)
    other = next(task.sample(m, 3, seed=9))
    run(m, other.tokens, fmt)
    assert np.array_equal(run(m, b.tokens, fmt).logits, whole.logits)  # nothing kept from other inputs


def test_export_round_trip_and_transformer_lens(tmp_path):
    m = xf.build("nearest-neighbor", n=4, d_in=4, margin=HALF, queries="all")
    out = tmp_path / "nn"
    m.save(out)
    m2 = xf.load(out)
    assert m2.compiled.vector_input == m.compiled.vector_input and m2.compiled.fingerprint() == m.compiled.fingerprint()
    b = next(task_of(m2.compiled).sample(m2.compiled, 6, seed=0))
    assert np.array_equal(run(m2.compiled, b.tokens, parse_format(m2.precision)).logits,
                          run(m.compiled, b.tokens, parse_format(m.precision)).logits)
    pytest.importorskip("transformer_lens", reason="transformer_lens not installed (extra [lens])")
    import torch

    bridge = m2.to_transformer_lens()
    vi = m2.compiled.vector_input
    vec = torch.as_tensor(b.tokens.vectors.num / b.tokens.vectors.den, dtype=torch.float64)

    def add_vectors(x, hook):  # the vector input: hook_embed = W_E[token] + vector
        x = x.clone()
        x[..., vi.col : vi.col + vi.width] += vec
        return x

    logits = bridge.run_with_hooks(torch.as_tensor(b.tokens.tokens), fwd_hooks=[("hook_embed", add_vectors)])
    answers = logits[:, list(m2.compiled.answer_positions)].argmax(-1).numpy()
    assert np.array_equal(answers, b.truth)
    shutil.rmtree(out)


@pytest.mark.parametrize("name,kw", [("nearest-neighbor", dict(n=16, precision="binary:int=3,frac=2")),
                                     ("mqar", dict(n=64, precision="binary:int=2,frac=1"))])
def test_too_few_bits_names_the_smallest_precision_that_works(name, kw):
    with pytest.raises(ValueError, match=r"precision binary:int=\d,frac=\d: .*the smallest precision that works is "
                                         r"binary:int=\d+,frac=\d+ \(eta1 = [\d/]+, eta2 = [\d/]+\)"):
        xf.build(name, **kw)
