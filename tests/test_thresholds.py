"""Thresholds of k-sparse features (Thm 13), Disjointness, k-DNF, k-CNF: builders, ground truths,
exhaustive == certificate, mutants."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.core import registry
from exactformer.constructions.theorems import thresholds as th
from exactformer.constructions.blocks import PatternMLP, RetrieveByPosition, ThresholdReadout, UniformAverage
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.codes.positions import CodeView, position_codes
from exactformer.precision import FixedPoint, parse_format
from exactformer.verify.executor.exact import run
from exactformer.verify.verifier import verify
from mutants import shift_keys


def task(model):
    return registry.task_of(model)


def encode(model, x):
    return task(model).encode_arrays(model, np.asarray(x))


def all_bits(n):
    return np.array(list(itertools.product([0, 1], repeat=n)), dtype=np.int64)


def py_truth(model, x):
    """Ground truth computed the slow, obvious way (independent of constructions/theorems/boolean_tasks.py)."""
    kind, n = model.construction, model.n
    out = []
    for r in x.tolist():
        if kind == "disjointness":
            out.append(int(not any(r[i] and r[i + n // 2] for i in range(n // 2))))
        elif kind in ("dnf", "cnf"):
            cl = model.task_params["clauses"]
            lit = lambda v: r[abs(v) - 1] == (1 if v > 0 else 0)  # noqa: E731
            out.append(int(any(all(lit(v) for v in c) for c in cl)) if kind == "dnf"
                       else int(all(any(lit(v) for v in c) for c in cl)))
        else:
            tp = model.task_params
            S = 0
            for idx, t in zip(np.asarray(tp["feature_index"]).tolist(), np.asarray(tp["feature_type"]).tolist()):
                if t < 0:
                    continue
                ar, table = tp["types"][t]
                bits = [r[v - 1] for v in idx[:ar]]
                S += table[int("".join(map(str, bits)), 2)] if bits else 0
            out.append(int(S > tp["b"]))
    return np.array(out, dtype=np.int64)


def confirm(model, fmt, cex):
    x = np.asarray([cex["input"]])
    assert cex["expected"] == int(py_truth(model, x)[0])
    assert run(model, encode(model, x), fmt).answers[0][0] != cex["expected"]


def rs(n):
    return position_codes(n, family="reed-solomon")


def table_entries(model) -> int:
    """Query-code indices stored in table views (0 when every query block is an affine or constant run)."""
    return sum(len(b.code.data) for b in model.pos_embed.blocks if isinstance(b.code, CodeView) and b.code.kind == "table")


MIXED = [([1, 2], [0, 1, 1, 0]), ([3], [1, 0]), ([], None), ([2, 4, 1], lambda a, b, c: int(a + b + c >= 2)),
         ([5, 6], [0, 1, 1, 0]), ([6, 1], [1, 0, 0, 0])]


def mixed(n=6, **kw):
    feats = [(s, g) if g is not None else s for s, g in MIXED]
    return th.threshold_features(n, feats, b=2, **kw)


# ------------------------------------------------------------------------------------------------
# builders and bad input
# ------------------------------------------------------------------------------------------------


def test_shapes_and_params():
    m = th.disjointness(16, positions="reed-solomon")
    r = m.params["k"].value
    assert m.n_ctx == 17 and m.d_vocab == 3 and m.answers == [0, 1] and m.n_layers == 2
    assert m.blocks[0].attn.n_heads == 2 and m.params["sparsity"].value == 2
    assert m.d_model == 3 + 2 + r * 3 and m.params["b"].value == 7 and m.params["function_types"].value == 1
    for key in ("eta", "eta_one_hot", "eta_paper", "uniform_weight", "readout", "precision_bits", "size_bits",
                "d_model", "d_mlp", "heads"):
        assert m.params[key].formula
    fmt = parse_format(m.precision)
    for t in m.tensors().values():
        t.raw(fmt)
    assert table_entries(m) == 0  # affine and constant runs only
    assert [type(p.block) for p in m.plan] == [RetrieveByPosition, RetrieveByPosition, PatternMLP, UniformAverage,
                                               ThresholdReadout]
    mm = mixed()
    assert mm.params["function_types"].value == 4 and mm.params["sparsity"].value == 3
    assert mm.d_model == 3 + 3 + mm.params["k"].value * 4 + 4  # type columns for G >= 2


def test_callable_and_table_g_agree():
    a = th.threshold_features(6, [[1, 2], [3, 4], [5, 6]], b=1, g=[0, 1, 1, 0], positions="reed-solomon")
    b = th.threshold_features(6, [[1, 2], [3, 4], [5, 6]], b=1, g=lambda x, y: x ^ y, positions="reed-solomon")
    assert a.task_params["types"] == b.task_params["types"]
    x = all_bits(6)
    fmt = parse_format(a.precision)
    assert run(a, encode(a, x), fmt).answers == run(b, encode(b, x), fmt).answers


@pytest.mark.parametrize("call,word", [
    (lambda: th.threshold_features(8, [[1, 9]], b=0, g=[0, 1, 1, 0]), r"index 9 out of range; indices must lie in \[1, n\]"),
    (lambda: th.threshold_features(8, [[0, 1]], b=0, g=[0, 1, 1, 0]), r"must lie in \[1, n\]"),
    (lambda: th.threshold_features(8, [[1, 2, 3]], b=0, g=[0] * 8, k=2), r"exceeds k = 2 \(allowed: \|I_j\| <= k\)"),
    (lambda: th.threshold_features(8, [[1, 2]], b=2, g=[0, 1, 1, 0]), r"b must be an integer in \[0, m\]"),
    (lambda: th.threshold_features(8, [[1, 2]], b=-1, g=[0, 1, 1, 0]), r"b must be an integer in \[0, m\]"),
    (lambda: th.threshold_features(8, [[1, 1]], b=0, g=[0, 1, 1, 0]), "repeats an index"),
    (lambda: th.threshold_features(8, [[1, 2]], b=0, g=[0, 1, 1]), "truth table has length 3"),
    (lambda: th.threshold_features(8, [[1, 2]], b=0), "no g given"),
    (lambda: th.threshold_features(2, [[1], [2], [1]], b=0, g=[0, 1]), r"number of features must lie in \[1, n\]"),
    (lambda: th.threshold_features(8, [[1, 2]], b=0, g=[0, 1, 1, 0], k=9), r"k must be an integer in \[1, 8\]"),
    (lambda: th.threshold_features(1), r"n must be an integer in \[2, 2\^30\]"),
    (lambda: th.threshold_features(1 << 23), r"n must be an integer in \[2, 2\^22\]"),  # listed (random) features
    (lambda: th.disjointness(7), r"n must be an even integer"),
    (lambda: th.k_dnf(6, [[1, 0]]), "literal 0 out of range"),
    (lambda: th.k_cnf(6, [[1, -7]]), "literal -7 out of range"),
    (lambda: th.k_cnf(6, [[1, 2, 3]], k=2), "exceed k = 2"),
    (lambda: th.k_dnf(6, [[1, -1]]), "repeats a variable"),
    (lambda: th.k_dnf(2, [[1], [2], [-1]]), "at most n = 2 terms"),
])
def test_bad_parameters(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_unknown_parameter_is_refused():
    """Disjointness fixes b = N/2 - 1: passing b is refused with one line naming it (the old
    builder said "takes no 'b'")."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'b'"):
        th.disjointness(8, b=1)
    with pytest.raises(ValueError, match="'b'"):
        xf.build("disjointness", n=8, b=1)


def test_encode_errors():
    m = xf.disjointness(4, positions="reed-solomon")
    assert m.encode([1, 0, 0, 1]).tolist() == [th.BOS, 1, 0, 0, 1]
    with pytest.raises(ValueError, match="list of N = 4 values"):
        m.encode([1, 0, 0])
    with pytest.raises(ValueError, match="integers 0 or 1"):
        m.encode([1, 0, 0, -1])
    assert m([[1, 0, 0, 1], [1, 0, 1, 0]]) == [1, 0]


def test_query_blocks_compress_and_table_view():
    dis = th.disjointness(64, positions="reed-solomon")
    assert len(dis.pos_embed.blocks) <= 1 + 2 * 3  # key block + (BOS, affine run, constant run) per head
    dnf = th.k_dnf(64, k=3, positions="reed-solomon")  # random terms: one table view per head
    assert table_entries(dnf) == 3 * 65
    assert verify(dnf, mode="certify").passed


# ------------------------------------------------------------------------------------------------
# ground truths and adversarial inputs
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: th.disjointness(8, positions="reed-solomon"),
                                  lambda: th.k_dnf(8, [[1, -2], [3, 4, -5], [-8]], positions="reed-solomon"),
                                  lambda: th.k_cnf(8, [[1, -2], [3, 4, -5], [-8, 6]], positions="reed-solomon"),
                                  lambda: mixed(8, positions="reed-solomon")])
def test_ground_truths(make):
    m = make()
    t = task(m)
    x = all_bits(m.n)
    assert np.array_equal(t.truth(m, x), py_truth(m, x))
    assert t.count(m) == 2**m.n
    xs = np.concatenate([b.arrays[0] for b in t.exhaustive(m, batch=100)])
    assert np.array_equal(xs, x)
    # the specification the certificate compares with says the same on every input
    domains = t.domains(m)
    assert np.array_equal(t.spec(m).evaluate(encode(m, x), [domains[i] for i in range(len(domains))]), py_truth(m, x))


def test_adversarial_inputs_sit_on_the_threshold():
    m = th.k_cnf(24, positions="reed-solomon")  # b = m - 1: exactly one clause false, or none
    t = task(m)
    b = m.task_params["b"]
    adv = np.concatenate([bt.arrays[0] for bt in t.adversarial(m, 200, seed=4)])
    S = t.feature_counts(m, adv)
    assert S[:4].tolist() == [b, b + 1, b, b + 1]  # two inputs on each side of the threshold ...
    flips = adv[4 : 4 + 24]
    assert np.all(np.sum(flips != adv[0], axis=1) == 1)  # ... then every single-bit flip of each
    assert [int(np.flatnonzero(f != adv[0])[0]) for f in flips] == list(range(24))
    dis = th.disjointness(16, positions="reed-solomon")
    adv = np.concatenate([bt.arrays[0] for bt in task(dis).adversarial(dis, 64, seed=0)])
    assert set(task(dis).feature_counts(dis, adv[:4]).tolist()) <= {7, 8}


# ------------------------------------------------------------------------------------------------
# certificate == exhaustive (passing and failing)
# ------------------------------------------------------------------------------------------------

CASES = [
    ("disj-4", lambda **kw: th.disjointness(4, **kw)),
    ("disj-10", lambda **kw: th.disjointness(10, positions="reed-solomon", **kw)),
    ("dnf-9", lambda **kw: th.k_dnf(9, [[1, -2], [3, 4, -5], [-9], [6, 7]], positions="reed-solomon", **kw)),
    ("cnf-10", lambda **kw: th.k_cnf(10, positions="reed-solomon", **kw)),
    ("thres-10", lambda **kw: th.threshold_features(10, positions="reed-solomon", **kw)),
    ("mixed-8", lambda **kw: mixed(8, positions="reed-solomon", **kw)),
    ("mixed-8-random", lambda **kw: mixed(8, positions="random", **kw)),
    ("maj-9", lambda **kw: th.threshold_features(9, [[i] for i in range(1, 10)], b=4, g=[0, 1], **kw)),
]


@pytest.mark.parametrize("name,make", CASES)
@pytest.mark.parametrize("variant", ["default", "eta-unit", "threshold-eta"])
def test_certificate_agrees_with_exhaustive(name, make, variant):
    m = make()
    if variant == "eta-unit":
        fmt = parse_format(m.precision)
        m = make(precision=fmt, eta=fmt.step / Fraction(m.position_code.gram_scale))
    elif variant == "threshold-eta":
        m = make(eta="threshold")
    fmt = parse_format(m.precision)
    ex = verify(m, mode="exhaustive", fmt=fmt)
    ce = verify(m, mode="certify", fmt=fmt)
    assert ce.passed == ex.passed, (ce.reason, ex.reason)
    if variant != "eta-unit":
        assert ce.passed, ce.reason
    if not ce.passed:
        assert ce.counterexample is not None
        confirm(m, fmt, ce.counterexample)


# ------------------------------------------------------------------------------------------------
# mutants
# ------------------------------------------------------------------------------------------------


def _reject(model, fmt):
    rep = verify(model, mode="certify", fmt=fmt)
    assert not rep.passed and rep.counterexample is not None, rep.reason
    assert set(rep.counterexample) >= {"input", "expected", "got"}
    confirm(model, fmt, rep.counterexample)
    if model.n <= 10:
        assert not verify(model, mode="exhaustive", fmt=fmt).passed
    return rep


def test_mutant_eta_too_small():
    m = th.disjointness(10, positions=rs(11))
    fmt = parse_format(m.precision)
    assert verify(m, mode="certify").passed
    _reject(th.disjointness(10, positions=rs(11), precision=fmt, eta=fmt.step / Fraction(m.position_code.gram_scale)), fmt)


def test_mutant_precision_too_low():
    fmt = FixedPoint.binary(int_bits=5, frac_bits=3)  # step 1/8 <= 1/5: the uniform weight is 1/8
    m = th.disjointness(4, positions=rs(5), precision=fmt, eta=4)  # eta/k on the coarser grid too
    assert verify(m, mode="certify", fmt=fmt).passed
    rep = _reject(m, FixedPoint.binary(int_bits=5, frac_bits=2))  # step 1/4 > 1/5: the uniform weight rounds to 0
    assert [h["uniform_weight"] for h in rep.details["heads"] if h["block"] == "UniformAverage"] == ["0"]


@pytest.mark.parametrize("make", [lambda: th.disjointness(10, positions="reed-solomon"),
                                  lambda: th.k_cnf(10, positions="reed-solomon")])
def test_mutant_wrong_key_offset(make):
    m = make()
    _reject(shift_keys(m), parse_format(m.precision))


def test_mutant_perturbed_mlp_weight():
    m = mixed(8, positions="reed-solomon")
    fmt = parse_format(m.precision)
    W = m.blocks[0].mlp.W_in
    num = W.num.copy()
    col = int(np.flatnonzero(np.any(num != 0, axis=0))[0])
    row = int(np.flatnonzero(num[:, col])[0])
    num[row, col] = -num[row, col]  # one pattern unit now matches the wrong bit
    _reject(m.replace_weight("blocks.0.mlp.W_in", ExactTensor(num, W.den)), fmt)


def test_mutant_readout_threshold():
    m = th.disjointness(8, positions="reed-solomon")
    fmt = parse_format(m.precision)
    vals = m.b_U.fractions()
    vals[0] += m.params["readout_gain"].value * m.params["uniform_weight"].value  # threshold b -> b + 1
    _reject(m.replace_weight("unembed.b_U", ExactTensor.from_values(vals)), fmt)


# ------------------------------------------------------------------------------------------------
# scale
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_larger_models_certify_and_sample():
    for m in (th.disjointness(2048, positions="reed-solomon"), th.k_cnf(512, positions="reed-solomon")):
        rep = verify(m, mode="certify")
        assert rep.passed, rep.reason
        assert all((h["min_target_weight"], h["max_stray_weight"]) == ("1", "0")  # one-hot rows
                   for h in rep.details["heads"] if h["block"] == "RetrieveByPosition")
    for m in (th.disjointness(128, positions="reed-solomon"), th.k_dnf(96, positions="reed-solomon")):
        rep = verify(m, mode="sample", samples=32, seed=1)
        assert rep.passed and rep.inputs_covered == 64


def test_saved_and_loaded_models_certify(tmp_path):
    """The exporter stores index-view query blocks densely; the certificate reads the dense table."""
    from exactformer.constructions.theorems.equality import inequality
    from exactformer.constructions.export import load, save

    for i, m in enumerate((th.disjointness(10, positions="reed-solomon"), mixed(8), inequality(10))):
        d = tmp_path / str(i)
        save(m, d)
        m2 = load(d)
        rep = verify(m2, mode="certify")
        assert rep.passed, rep.reason
        assert verify(m2, mode="exhaustive").passed
