"""Blocks on their own, the certificate they compose, and a new construction written from blocks.

* The box arithmetic and the MLP image are exact where they claim to be and sound everywhere:
  compared with brute force over every grid point of small boxes.
* A rounded-softmax row bound from ``row_weights`` contains every row its boxes allow.
* A table of (construction, parameters, format) cases covering every block: the composed
  certificate's verdict agrees with exhaustive enumeration (passing and failing configurations).
* A construction defined in this file (Index Lookup with the index first, "a new construction in
  40 lines", the worked example of docs/architecture.md) registers, builds and certifies without
  touching a package file; a mutant of it is refuted.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.core import registry
from exactformer.constructions.core.registry import Claim, SizeRows
from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.blocks import BitThreshold, RetrieveByPosition, SymbolReadout
from exactformer.constructions.theorems.index_lookup import IndexLookupTask, retrieval_holds
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.design.precision_search import fewest_bits, smallest_grid_eta
from exactformer.constructions.codes.positions import position_codes
from exactformer.constructions.core.spec import Select
from exactformer.constructions.core.task import Domains
from exactformer.constructions.blocks.mlp import mlp_image
from exactformer.precision import FixedPoint
from exactformer.precision.boxes import Box, FixedArithmetic
from exactformer.verify.verifier import verify

FMT = FixedPoint.binary(int_bits=4, frac_bits=3)


def _grid_box(rng, shape, width):
    lo = rng.integers(-40, 40, size=shape)
    return Box(lo, lo + rng.integers(0, width + 1, size=shape))


def _points(box: Box):
    ranges = [range(int(a), int(b) + 1) for a, b in zip(np.ravel(box.lo), np.ravel(box.hi))]
    for p in itertools.product(*ranges):
        yield np.array(p, dtype=np.int64).reshape(box.shape)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "exp", "relu"])
def test_box_operations_are_exact_images(op):
    ar = FixedArithmetic(FMT)
    f = ar.fmt
    rng = np.random.default_rng(hash(op) % 100)
    for _ in range(30):
        a = _grid_box(rng, (1,), 5)
        b = _grid_box(rng, (1,), 5)
        if op == "div":
            b = Box(np.abs(b.lo) + 1, np.abs(b.hi) + 1 + np.abs(b.lo))
        if op == "exp":
            a = Box(-np.abs(a.hi), -np.abs(a.lo) + 0 * a.lo)
            a = Box(np.minimum(a.lo, a.hi), np.maximum(a.lo, a.hi))
        fn = {"add": f.add, "sub": f.sub, "mul": f.mul, "div": f.div}.get(op)
        got = getattr(ar, op)(a, b) if fn else getattr(ar, op)(a)
        vals = [int(np.asarray(fn(x, y))[0]) for x in _points(a) for y in _points(b)] if fn else \
            [int(np.asarray(getattr(f, op)(x))[0]) for x in _points(a)]
        assert (int(got.lo[0]), int(got.hi[0])) == (min(vals), max(vals)), (op, a, b)


def test_matmul_and_sum_are_exact_images():
    ar = FixedArithmetic(FMT)
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = _grid_box(rng, (3,), 2)
        W = rng.integers(-16, 16, size=(3, 2))
        got = ar.matmul(x, W)
        vals = np.array([np.asarray(ar.fmt.matmul(p, W)) for p in _points(x)])
        assert np.array_equal(got.lo, vals.min(axis=0)) and np.array_equal(got.hi, vals.max(axis=0))


@pytest.mark.parametrize("seed", range(12))
def test_mlp_image_is_sound_and_exact_for_shared_pre_activations(seed):
    ar = FixedArithmetic(FMT)
    f = ar.fmt
    rng = np.random.default_rng(seed)
    n, U, m = 2, 4, 2
    W_in = rng.integers(-12, 12, size=(n, U))
    if seed % 2:  # units sharing a pre-activation (the BitThreshold shape), output weights +-1
        W_in[:, 1] = W_in[:, 0]
        W_in[:, 3] = W_in[:, 2]
    b_in = rng.integers(-12, 12, size=U)
    W_out = rng.choice([-8, 0, 8], size=(U, m)) if seed % 2 else rng.integers(-12, 12, size=(U, m))
    b_out = rng.integers(-8, 8, size=m)
    x = _grid_box(rng, (n,), 6)
    got = mlp_image(ar, x, W_in, b_in, W_out, b_out)

    def forward(p):
        h = f.relu(f.add(f.matmul(p, W_in), b_in))
        return np.asarray(f.add(f.matmul(h, W_out), b_out))

    vals = np.array([forward(p) for p in _points(x)])
    assert np.all(got.lo <= vals.min(axis=0)) and np.all(got.hi >= vals.max(axis=0))  # sound


def test_bit_threshold_image_is_exact_on_wide_boxes():
    """relu(2z - 1/2) - relu(2z - 3/2) over z in [3/4, 1] is exactly 1 (the units share 2z)."""
    fmt = FixedPoint.binary(int_bits=4, frac_bits=20)
    ar = FixedArithmetic(fmt)
    S = int(fmt.scale)
    z = Box(np.array([3 * S // 4]), np.array([S]))
    W_in = np.array([[2 * S, 2 * S]])
    b_in = np.array([-S // 2, -3 * S // 2])
    W_out = np.array([[S], [-S]])
    got = mlp_image(ar, z, W_in, b_in, W_out, np.array([0]))
    assert int(got.lo[0]) == int(got.hi[0]) == S


def test_row_weights_contain_every_row():
    ar = FixedArithmetic(FMT)
    f = ar.fmt
    rng = np.random.default_rng(3)
    for _ in range(20):
        t = Box(np.array([40]), np.array([40 + int(rng.integers(0, 3))]))
        lv = Box(np.array([[-8, 5]]), np.array([[-8 + int(rng.integers(0, 3)), 5 + int(rng.integers(0, 3))]]))
        counts = np.array([[2, 1]])
        w_t, w_l = ar.row_weights(t, lv, counts)
        for tt in range(int(t.lo[0]), int(t.hi[0]) + 1):
            for a in range(int(lv.lo[0, 0]), int(lv.hi[0, 0]) + 1):
                for b in range(int(lv.lo[0, 1]), int(lv.hi[0, 1]) + 1):
                    row = np.asarray(f.softmax(np.array([tt, a, a, b])))
                    assert w_t.lo[0] <= row[0] <= w_t.hi[0]
                    assert w_l.lo[0, 0] <= row[1] <= w_l.hi[0, 0] and w_l.lo[0, 1] <= row[3] <= w_l.hi[0, 1]


# ------------------------------------------------------------------------------------------------
# every block, composed: the certificate agrees with exhaustive enumeration
# ------------------------------------------------------------------------------------------------

CASES = [  # (construction, parameters, expected verdict); blocks exercised in the comment
    ("index-lookup", dict(n=6, alphabet=4, positions="reed-solomon"), True),  # Retrieve, BitThreshold, SymbolReadout
    ("index-lookup", dict(n=5, alphabet=3, positions="random"), True),  # Gram rows
    ("index-lookup", dict(n=5, alphabet=3, positions="onehot"), True),  # 0/1 code numerators
    ("index-lookup", dict(n=4, alphabet=2, precision="paper:n=4,kc=2"), True),  # the App. B.2 grid
    ("index-lookup", dict(n=6, alphabet=4, positions="reed-solomon", precision="binary:int=3,frac=3", eta=2), False),
    ("equality", dict(n=8), True),  # Retrieve with a key offset, XorMLP, UniformAverage, ThresholdReadout
    ("inequality", dict(n=6, eta="threshold"), True),  # rows within the XOR's tolerance, not one-hot
    ("equality", dict(n=8, positions="reed-solomon", precision="binary:int=4,frac=4", eta=1), False),
    ("disjointness", dict(n=8), True),  # PatternMLP, one type
    ("threshold", dict(n=6, features=[[[1, 2], [0, 1, 1, 0]], [[3], [0, 1]], [4, 5]], g=[1, 1, 1, 0], b=1), True),  # types
    ("cnf", dict(n=6, clauses=[[1, -2], [3, 4, -5]], eta="threshold"), True),
    ("dnf", dict(n=6, terms=[[1, -2], [3]], precision="binary:int=4,frac=4", eta=Fraction(1, 4)), False),
]


@pytest.mark.parametrize("name,kw,expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_certificate_agrees_with_exhaustive(name, kw, expected):
    m = registry.get(name).builder(**kw)
    cert, exh = verify(m, "certify"), verify(m, "exhaustive")
    assert exh.passed == expected, exh.counterexample
    assert cert.passed == expected, cert.reason
    if not expected:
        assert cert.counterexample is not None and cert.counterexample["input"] is not None


# ------------------------------------------------------------------------------------------------
# a new construction from blocks, defined here
# ------------------------------------------------------------------------------------------------

class IndexFirstTask(IndexLookupTask):
    """IdxL with the index token first: tokens p, s_1 .. s_N; the answer s_p, read at position 0."""

    def domains(self, model):
        S, n = self.alphabet(model), model.n
        return Domains([np.arange(S, S + n), np.arange(S)], np.r_[0, np.ones(n, np.int64)])

    def spec(self, model):
        S, n = self.alphabet(model), model.n
        pointer = np.full(S + n, -1)
        pointer[S:] = np.arange(1, n + 1)
        return Select(0, 0, pointer, np.r_[np.arange(S), np.full(n, -1)], values=tuple(range(S)))

    def encode_arrays(self, model, symbols, p):
        t = super().encode_arrays(model, symbols, p)
        return np.concatenate([t[:, -1:], t[:, :-1]], axis=1)


def index_first(n: int, alphabet: int = 4, eta: Fraction | None = None):
    """Index Lookup with the index first (Theorem 1's construction, the query at position 0)."""
    code = position_codes(n, family="reed-solomon")
    m, k, mu = max(1, (alphabet - 1).bit_length()), code.k, Fraction(code.bound)
    fmt, auto = fewest_bits(lambda f: smallest_grid_eta(f, f.step * k, lambda e: retrieval_holds(f, e, mu, n)))
    L = Layout()
    for name, width in (("rho", m), ("qcode", k), ("pcode", k), ("bits", m)):
        L.add(name, width)
    mb = ModelBuilder(L, n_layers=1, d_vocab=alphabet + n, n_ctx=n + 1)
    mb.token_rows(range(alphabet), "rho", np.array([[(s >> j) & 1 for j in range(m)] for s in range(alphabet)]))
    mb.token_code("qcode", alphabet, n, code)
    mb.position_code("pcode", 1, n, code)  # symbols sit at positions 1..N
    RetrieveByPosition("qcode", "pcode", ("rho",), ("rho",), eta or auto, Fraction(1, k)).emit(mb, 0)
    BitThreshold("rho", "bits").emit(mb, 0)
    SymbolReadout("bits", alphabet).emit(mb)
    return mb.build(answers=list(range(alphabet)), vocab=[f"s{s}" for s in range(alphabet)] + [f"p{p}" for p in range(1, n + 1)],
                    construction="test-index-first", theorem="Thm 1, index first", n=n, precision=fmt.name,
                    answer_positions=(0,), task_params={"n": n, "alphabet": alphabet})


#: the decorator docs/architecture.md writes above ``index_first`` (evaluated by the fixture below)
DECORATOR = """@construction("test-index-first", task=IndexFirstTask(), theorem="Thm 1, index first",
              claim=Claim("P1 Thm 1 (App. C.2), index first", "1", "1", "O(log N)", "O(log N)", "O((log N)^3)"),
              sizes=SizeRows("index-lookup", (("alphabet", 4),), max_n=1 << 12))"""


@pytest.fixture
def registered():
    names = {"construction": registry.construction, "IndexFirstTask": IndexFirstTask, "Claim": Claim, "SizeRows": SizeRows}
    eval(DECORATOR.removeprefix("@"), names)(index_first)
    yield
    registry._REGISTRY.pop("test-index-first")


def test_a_new_construction_certifies_without_package_changes(registered):
    m = xf.build("test-index-first", n=6, alphabet=4)
    assert m(([3, 1, 2, 0, 1, 2], 4)) == 0 and m.compiled.answer_positions == (0,)
    cert, exh = xf.verify(m), xf.verify(m, mode="exhaustive")
    assert cert.passed and cert.inputs_covered == "all" and exh.passed
    b_U = m.compiled.b_U
    bonus = ExactTensor(b_U.num + np.array([3, 0, 0, 0]) * b_U.den, b_U.den)  # +3 on symbol 0's logit
    weak = m.compiled.replace_weight("unembed.b_U", bonus)
    r = xf.verify(weak)
    assert not r.passed and r.counterexample is not None and not xf.verify(weak, mode="exhaustive").passed


def test_the_architecture_doc_shows_this_file():
    """docs/architecture.md's worked example is this file's construction, line for line."""
    import inspect
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    for obj in (IndexFirstTask, index_first):
        src = inspect.getsource(obj)
        assert src.strip() in doc.replace(DECORATOR + "\n", ""), obj.__name__
    assert DECORATOR + "\ndef index_first(" in doc
