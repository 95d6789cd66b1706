"""The run certificate (verify/certify/runs.py): cost independent of N, from the code's algebra.

* the closed forms of constructions/codes/weights.py (MDS weight distribution, block and shell
  histograms, query classes) against enumeration of small Reed--Solomon∘Hadamard codes;
* a regression table: on every configuration below the run certificate and the view certificate
  (forced by declining the run form) give the same verdict, margin and target weight;
* exhaustive enumeration at small N agrees with it (also where it fails);
* wrong models (keys read at an offset, query vectors shifted, negated keys, swapped readout, MLP
  bias) are refuted with counterexamples the executor confirms, by the run certificate itself;
* N = 2^30: Index Lookup built and certified by it.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from fractions import Fraction

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.codes import weights
from exactformer.constructions.codes.positions import ReedSolomonCode
from exactformer.constructions.core import registry
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.core.runs import Declined
from exactformer.precision import parse_format
from exactformer.verify.certify import composed, runs
from exactformer.verify.verifier import verify


# ------------------------------------------------------------------------------------------------
# closed forms against enumeration
# ------------------------------------------------------------------------------------------------


def _roots_by_brute_force(m: int, s: int) -> list[int]:
    """Polynomials of degree < s over GF(2^m) by number of roots, evaluated point by point."""
    from exactformer.constructions.codes.generators import gf2m

    field = gf2m(m)
    q = 1 << m

    def mul(a: int, b: int) -> int:
        if a == 0 or b == 0:
            return 0
        return int(field.exp[(int(field.log[a]) + int(field.log[b])) % (q - 1)])

    out = [0] * (q + 1)
    for coeffs in itertools.product(range(q), repeat=s):
        roots = 0
        for x in range(q):
            v, p = 0, 1
            for c in coeffs:
                v ^= mul(c, p)
                p = mul(p, x)
            roots += v == 0
        out[roots] += 1
    return out


@pytest.mark.parametrize("m,s", [(1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (2, 3), (2, 4), (3, 2), (3, 3)])
def test_mds_weight_distribution_counts_roots(m, s):
    assert list(weights._root_counts(1 << m, s)) == _roots_by_brute_force(m, s)


@pytest.mark.parametrize("m,d", [(1, 4), (2, 3), (3, 2)])
def test_block_and_shell_histograms_match_the_generator(m, d):
    code = ReedSolomonCode((1 << m) ** d, m, d)
    idx = np.arange(code.n)
    q = code.q
    # the inner products are q * agreements(i XOR j) (the identity every histogram rests on)
    num = code.numerators(idx).astype(np.int64)
    assert np.array_equal(num @ num.T, q * code.agreements(idx[:, None] ^ idx[None, :]))
    top = m * min(d, q)  # polynomials of degree >= q have no MDS closed form
    for b in range(top + 1):
        want = np.bincount(code.agreements(np.arange(1 << b)), minlength=q + 1).tolist()
        assert list(weights.block_counts(m, b)) == want, b
        if b < top:
            shell = np.bincount(code.agreements(np.arange(1 << b, 2 << b)), minlength=q + 1).tolist()
            assert list(weights.shell_counts(m, b)) == shell, b
    if top < m * d:
        with pytest.raises(weights.CodeAlgebraError):
            weights.block_counts(m, top + 1)


def _check_pieces(code, keys, start, stop, pieces, exact_only):
    q = code.q
    assert pieces[0][0] == start and pieces[-1][1] == stop
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    key_idx = np.concatenate([np.arange(s, e) for s, e in keys])
    for c0, c1, row in pieces:
        for c in range(c0, c1):
            holder = [i for i, (s, e) in enumerate(keys) if s <= c < e]
            if not holder:
                assert row is None
                continue
            assert row is not None and row.target == holder[0]
            others = key_idx[key_idx != c]
            actual = np.bincount(code.agreements(others ^ c), minlength=q + 1)
            exact, optional = np.array(row.exact), np.array(row.optional)
            free = actual - exact
            assert np.all(free >= 0) and free.sum() == optional.sum(), (c, actual, row)
            # the optional keys sit at the highest levels their shells allow: they bound the real ones
            assert np.all(np.cumsum(free[::-1]) <= np.cumsum(optional[::-1])), (c, actual, row)
            if exact_only:
                assert not optional.any() and np.array_equal(actual, exact)


@pytest.mark.parametrize("seed", range(6))
def test_query_classes_bound_every_query(seed):
    rng = np.random.default_rng(seed)
    code = ReedSolomonCode(64, 2, 3)
    cuts = np.sort(rng.choice(np.arange(1, 64), size=6, replace=False))
    keys = [(int(a), int(b)) for a, b in zip(cuts[::2], cuts[1::2])]
    start, stop = sorted(int(x) for x in rng.choice(65, size=2, replace=False))
    algebra = weights.ReedSolomonAlgebra(code)
    _check_pieces(code, keys, start, stop, algebra.classify(keys, start, stop), exact_only=True)
    # closed forms only (what large codes use): exact where shells are whole, bounded elsewhere
    _check_pieces(code, keys, start, stop, weights.classify(2, keys, start, stop), exact_only=False)


def test_codes_without_the_closed_form_are_declined():
    """A Reed-Solomon code of degree >= q (d > q) has no MDS weight distribution, a random code no
    algebra at all: the run certificate declines them (the view certificate then decides, from
    the generator's Gram rows), it never reads a histogram it cannot derive."""
    from exactformer.constructions.blocks.retrieve import code_algebra
    from exactformer.constructions.codes.positions import position_codes

    code = ReedSolomonCode(16, 1, 4)  # q = 2, polynomials of degree < 4
    with pytest.raises(weights.CodeAlgebraError):
        weights.check_algebra(code)
    for c in (code, position_codes(64, family="random")):
        with pytest.raises(Declined):
            code_algebra([c])
    with pytest.raises(Declined):  # two different codes in one head
        code_algebra([ReedSolomonCode(64, 2, 3), ReedSolomonCode(64, 3, 2)])
    model = registry.get("index-lookup").builder(n=16, alphabet=4, positions="random")
    c = verify(model, "certify")
    assert c.passed and c.details["engine"].startswith("views (no run form"), c.details["engine"]


# ------------------------------------------------------------------------------------------------
# the regression table: runs and views agree
# ------------------------------------------------------------------------------------------------

TABLE = [
    ("index-lookup", dict(n=16, alphabet=4, positions="reed-solomon"), ("fixed", "float64", "float32")),
    ("index-lookup", dict(n=100, alphabet=3, positions="reed-solomon"), ("fixed", "float64")),
    ("index-lookup", dict(n=1000, alphabet=64), ("fixed", "float64", "float32")),
    ("index-lookup", dict(n=4096, alphabet=64), ("fixed", "float32")),
    ("index-lookup", dict(n=32, alphabet=4, positions="onehot"), ("fixed", "float64")),
    ("index-lookup", dict(n=256, alphabet=4, positions="reed-solomon", eta="minimal"), ("fixed", "float64", "float32")),
    ("equality", dict(n=64), ("fixed", "float64")),
    ("equality", dict(n=1024), ("fixed", "float32")),
    ("inequality", dict(n=64), ("fixed", "float64")),
    ("disjointness", dict(n=32), ("fixed", "float64")),
    ("disjointness", dict(n=256), ("fixed", "float64")),  # one run of features (Reed-Solomon code)
    ("threshold", dict(n=64, b=3, features=[{"count": 16, "index": [1, 33], "g": "0110"},
                                            {"count": 16, "index": [17, 49], "g": "0110"}]), ("fixed", "float64")),
    ("threshold", dict(n=64, b=5, features=[{"count": 16, "index": [1, 33], "g": "0110"},  # three types: type signs
                                            {"count": 16, "index": [17], "g": "01"},
                                            {"count": 4, "index": [2, 40], "g": "0001"}]), ("fixed",)),
]


def _certify(model, arithmetic, engine, monkeypatch):
    def declined(*_):
        raise Declined("forced: the view certificate")

    with monkeypatch.context() as mp:
        if engine == "views":
            mp.setattr(runs, "applies", declined)
        task = registry.task_of(model)
        return composed.certify(model, parse_format(model.precision), task, arithmetic=arithmetic)


@pytest.mark.parametrize("name,kw,arithmetics", TABLE, ids=[f"{t[0]}-{i}" for i, t in enumerate(TABLE)])
def test_run_and_view_certificates_agree(name, kw, arithmetics, monkeypatch):
    model = registry.get(name).builder(**kw)
    for a in arithmetics:
        r, v = _certify(model, a, "runs", monkeypatch), _certify(model, a, "views", monkeypatch)
        assert r.details["engine"] == "runs" and v.details["engine"].startswith("views"), (a, r.details["engine"])
        assert r.passed == v.passed, (a, r.reason, v.reason)
        assert r.min_margin == v.min_margin, a
        if r.passed:
            for hr, hv in zip(r.details["heads"], v.details["heads"]):
                assert (hr["layer"], hr["head"], hr["block"]) == (hv["layer"], hv["head"], hv["block"])
                if "min_target_weight" in hr:  # partial shells are bounded: never more than the exact rows
                    assert Fraction(hr["min_target_weight"]) <= Fraction(hv["min_target_weight"]), a
                    if a == "fixed":
                        assert hr["min_target_weight"] == hv["min_target_weight"]
                if "uniform_weight" in hr:
                    assert hr["uniform_weight"] == hv["uniform_weight"]


@pytest.mark.parametrize("name,kw", [
    ("index-lookup", dict(n=4, alphabet=3, positions="reed-solomon")),
    ("index-lookup", dict(n=6, alphabet=2, positions="reed-solomon", eta="minimal")),
    ("index-lookup", dict(n=5, alphabet=2, positions="onehot")),
    ("equality", dict(n=8)),
    ("inequality", dict(n=6)),
    ("disjointness", dict(n=6)),
])
def test_runs_agree_with_exhaustive_enumeration(name, kw):
    model = registry.get(name).builder(**kw)
    for arithmetic in ("fixed", "float32") if kw.get("eta") == "minimal" else ("fixed",):
        c = verify(model, "certify", arithmetic=arithmetic)
        assert c.details["engine"] == "runs"
        e = verify(model, "exhaustive", arithmetic=arithmetic)
        assert e.inputs_covered == registry.task_of(model).count(model)
        assert not c.passed or e.passed, (arithmetic, c.reason, e.counterexample)
        if c.counterexample is not None:
            assert not e.passed


# ------------------------------------------------------------------------------------------------
# wrong models
# ------------------------------------------------------------------------------------------------


def _with_blocks(model, which, blocks):
    out = copy.copy(model)
    setattr(out, which, dataclasses.replace(getattr(model, which), blocks=tuple(blocks)))
    return out


def _mutants(model):
    kb, qb = model.pos_embed.blocks[0], model.embed.blocks[0]
    yield "keys read T(j + 1)", _with_blocks(model, "pos_embed", [dataclasses.replace(kb, code_start=1, count=kb.count - 1)])
    yield "key rows start late", _with_blocks(model, "pos_embed", [dataclasses.replace(kb, first_row=1, count=kb.count - 1)])
    yield "queries read T(p)", _with_blocks(model, "embed", [dataclasses.replace(qb, code_start=1, count=qb.count - 1)])
    yield "keys negated", _with_blocks(model, "pos_embed", [dataclasses.replace(kb, scale=-kb.scale)])
    m = copy.copy(model)
    num = model.W_U.num.copy()
    num[:, [0, 1]] = num[:, [1, 0]]
    m.W_U = ExactTensor(num, model.W_U.den)
    yield "readout columns swapped", m
    blk = model.blocks[0]
    b_in = blk.mlp.b_in.num.copy()
    b_in[0] += 4 * blk.mlp.b_in.den
    yield "MLP bias", dataclasses.replace(model, blocks=[dataclasses.replace(blk, mlp=dataclasses.replace(
        blk.mlp, b_in=ExactTensor(b_in, blk.mlp.b_in.den)))])


def test_wrong_models_are_refuted_by_the_run_certificate():
    model = registry.get("index-lookup").builder(n=1 << 10, alphabet=8, positions="reed-solomon")
    assert verify(model, "certify").passed
    for what, m in _mutants(model):
        r = verify(m, "certify")
        assert not r.passed, what
        assert r.details["engine"] == "runs", (what, r.details["engine"])
        assert r.counterexample is not None, (what, r.reason)
        cex = r.counterexample
        assert cex["got"] != cex["expected"], (what, cex)


# ------------------------------------------------------------------------------------------------
# N = 2^30
# ------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # float32: inf * 0 upstream, caught
def test_index_lookup_at_a_billion_positions():
    m = xf.build("index-lookup", n=1 << 30)
    r = xf.verify(m, mode="certify")
    assert r.passed and r.inputs_covered == "all" and r.details["engine"] == "runs", r.reason
    assert r.input_count == "64^1073741824*1073741824"
    (head,) = r.details["heads"]
    assert head["method"] == "Reed-Solomon weight distribution"
    # in float32 the softmax sum of 2^30 terms has no finite enclosure: never a pass (its NaN
    # bounds are caught, not compared), and no candidate of 2^30 tokens is run
    f = xf.verify(m, mode="certify", arithmetic="float32")
    assert not f.passed and "not a number" in f.reason and "no counterexample search" in f.reason, f.reason


@pytest.mark.slow
@pytest.mark.parametrize("name", ["equality", "inequality"])
def test_equality_at_a_billion_positions(name):
    """Thm 6 at N = 2^30 (the format alone: 62 bits, as the design's fallback finds it)."""
    m = xf.build(name, n=1 << 30)
    assert m.compiled.precision == "binary:int=31,frac=30"
    r = xf.verify(m, mode="certify")
    assert r.passed and r.details["engine"] == "runs", r.reason


def test_wrong_models_at_a_billion_positions_are_not_passed():
    """Where no counterexample can be run (inputs of 2^30 tokens), a wrong model is "unproven" with
    the step that failed, never passed: keys one position late (a real off-by-one lookup), keys
    from the wrong vector, negated keys."""
    model = xf.build("index-lookup", n=1 << 30).compiled
    kb = model.pos_embed.blocks[0]
    for what, blk, says in (
            ("keys one position late", dataclasses.replace(kb, first_row=1), "looked-up position"),
            ("keys read T(j + 1)", dataclasses.replace(kb, code_start=1, count=kb.count - 1), "that no key holds"),
            ("keys negated", dataclasses.replace(kb, scale=-kb.scale), "strict maximum")):
        r = verify(_with_blocks(model, "pos_embed", [blk]), "certify")
        assert not r.passed and r.counterexample is None and r.details["engine"] == "runs", what
        assert r.reason.startswith("unproven") and says in r.reason and "no counterexample search" in r.reason, (what, r.reason)
