"""Float arithmetics (issue 10): the certificates' float error bounds against what torch and IEEE
summation in every order compute, default builds right in float32/float64 torch and in
TransformerLens, and a build proved only in fixed point refuted in float32 with a counterexample
that torch itself gets wrong."""

from __future__ import annotations

import json
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import exactformer as xf
from exactformer.constructions.export.floats import ArithmeticWarning
from exactformer.precision.boxes import Box, FloatArithmetic

F32 = FloatArithmetic("float32")
F64 = FloatArithmetic("float64")
REAL = FloatArithmetic(None)
NP = {"float32": np.float32, "float64": np.float64}


def _inside(value: np.ndarray, box: Box) -> bool:
    v = np.asarray(value, dtype=np.float64)
    return bool(np.all(np.asarray(box.lo) <= v) and np.all(v <= np.asarray(box.hi)))


def _orders(terms: np.ndarray, dt, rng: np.random.Generator) -> list[np.ndarray]:
    """The sum of ``terms`` [n] in dtype ``dt`` as several orders compute it: left to right, right to
    left, numpy's pairwise sum, torch's sum, a random permutation, and a dot with ones."""
    t = terms.astype(dt)
    seq = dt(0)
    for x in t:
        seq = dt(seq + x)
    rev = dt(0)
    for x in t[::-1]:
        rev = dt(rev + x)
    perm = dt(0)
    for x in t[rng.permutation(t.size)]:
        perm = dt(perm + x)
    tt = torch.as_tensor(t)
    return [seq, rev, perm, np.sum(t, dtype=dt), tt.sum().numpy(), (tt @ torch.ones_like(tt)).numpy()]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**31), st.sampled_from(["float32", "float64"]),
       st.sampled_from([1e-3, 1.0, 1e4]))
def test_sum_box_encloses_every_summation_order(n: int, seed: int, dtype: str, scale: float):
    rng = np.random.default_rng(seed)
    arith = FloatArithmetic(dtype)
    terms = arith._cast(rng.normal(size=n) * scale)  # values of the dtype, as the terms of a forward pass are
    box = arith.sum(Box(terms, terms), axis=-1)
    for s in _orders(terms, NP[dtype], rng):
        assert _inside(s, box), (dtype, n, float(s), box)
    # and the exact sum
    exact = sum(Fraction(float(x)) for x in terms)
    assert Fraction(float(np.asarray(box.lo))) <= exact <= Fraction(float(np.asarray(box.hi)))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 16), st.integers(0, 2**31), st.sampled_from(["float32", "float64"]))
def test_matmul_box_encloses_torch(n: int, m: int, seed: int, dtype: str):
    """x W for x anywhere in a box: torch's matmul of any point of the box (and its transposed,
    batched and einsum forms, which BLAS blocks differently) lies in the enclosure."""
    rng = np.random.default_rng(seed)
    arith = FloatArithmetic(dtype)
    W = arith._cast(rng.integers(-8, 9, size=(n, m)) / 4)
    lo = arith._cast(rng.normal(size=(3, n)))
    hi = arith._cast(lo + np.abs(rng.normal(size=(3, n))) * 0.01)
    box = arith.matmul(Box(lo, hi), W)
    tdt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    Wt = torch.as_tensor(W, dtype=tdt)
    for x in (lo, hi, arith._cast(lo + (hi - lo) * rng.random(size=lo.shape))):
        xt = torch.as_tensor(x, dtype=tdt)
        for out in (xt @ Wt, (Wt.T @ xt.T).T, torch.einsum("bn,nm->bm", xt, Wt), torch.bmm(xt[None], Wt[None])[0]):
            assert _inside(out.double().numpy(), box)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exp_box_encloses_torch_exp(dtype: str):
    """torch's exp (vectorised and scalar kernels) against the correctly rounded value: within the
    certificates' EXP_ULPS bound on 200k arguments across the softmax range [-100, 0]."""
    arith = FloatArithmetic(dtype)
    tdt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    rng = np.random.default_rng(1)
    x = arith._cast(np.concatenate([-rng.exponential(3.0, 100_000), rng.uniform(-100, 0, 100_000), [0.0, -1e-30]]))
    box = arith.exp(Box(x, x))
    got = torch.exp(torch.as_tensor(x, dtype=tdt)).double().numpy()
    assert _inside(got, box)
    one_by_one = np.array([torch.exp(torch.tensor(v, dtype=tdt)).item() for v in x[:2000]])
    assert _inside(one_by_one, Box(np.asarray(box.lo)[:2000], np.asarray(box.hi)[:2000]))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 300), st.integers(0, 2**31), st.sampled_from(["float32", "float64"]),
       st.floats(0.5, 40.0))
def test_row_weights_enclose_torch_softmax(T: int, seed: int, dtype: str, gap: float):
    """A row with the target logit above every other by >= gap: torch.softmax's weights of the
    target and of each other key lie in :meth:`FloatArithmetic.row_weights`'s boxes."""
    rng = np.random.default_rng(seed)
    arith = FloatArithmetic(dtype)
    levels = arith._cast(np.sort(rng.uniform(-30, 0, size=4)))  # the distinct non-target logits
    target = arith._cast(np.array(levels.max() + gap))
    idx = rng.integers(0, 4, size=T - 1)
    counts = np.bincount(idx, minlength=4)
    w_t, w_l = arith.row_weights(Box(target[None], target[None]), Box(levels[None], levels[None]), counts[None])
    row = np.concatenate([[target], levels[idx]])
    tdt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    for perm in (np.arange(T), rng.permutation(T)):
        p = torch.softmax(torch.as_tensor(row[perm], dtype=tdt), dim=-1).double().numpy()
        inv = np.argsort(perm)
        assert _inside(p[inv[0]], Box(np.asarray(w_t.lo)[0], np.asarray(w_t.hi)[0]))
        others = p[inv[1:]]
        assert _inside(others, Box(np.asarray(w_l.lo)[0][idx], np.asarray(w_l.hi)[0][idx]))


def test_real_arithmetic_is_exact_enclosure():
    """The real arithmetic encloses exact rational results (no dtype rounding, only float64 slack)."""
    a = Box(np.array([1 / 3]), np.array([1 / 3]))
    b = REAL.mul(a, Box.point(np.array([3.0])))
    assert _inside(np.array([1.0]), b) and float(np.asarray(b.hi)[0] - np.asarray(b.lo)[0]) < 1e-15


# ------------------------------------------------------------------------------------------------
# default builds in the arithmetics users run them in
# ------------------------------------------------------------------------------------------------

#: (construction, builder keywords, verification mode in torch): small enough to enumerate where exhaustive
DEFAULTS = [
    ("index-lookup", dict(n=64), "sample"),
    ("equality", dict(n=6), "exhaustive"),
    ("inequality", dict(n=6), "exhaustive"),
    ("threshold", dict(n=10), "exhaustive"),
    ("disjointness", dict(n=10), "exhaustive"),
    ("cnf", dict(n=8, clauses=[[1, -2], [3, 4, -8]]), "exhaustive"),
    ("dnf", dict(n=8, terms=[[1, 2], [-3, 5]]), "exhaustive"),
]


@pytest.fixture(scope="module", params=DEFAULTS, ids=[d[0] for d in DEFAULTS])
def default_build(request):
    name, kw, mode = request.param
    return xf.build(name, **kw), mode


@pytest.mark.parametrize("arithmetic", ["real", "float64", "float32"])
def test_default_builds_certify_in_floats(default_build, arithmetic: str):
    m, _ = default_build
    assert arithmetic in m.params["arithmetics"].value
    r = xf.verify(m, mode="certify", arithmetic=arithmetic)
    assert r.passed, r.reason
    assert r.to_dict()["precision"] == arithmetic


@pytest.mark.parametrize("arithmetic", ["float64", "float32"])
def test_default_builds_run_right_in_torch(default_build, arithmetic: str):
    """The certificate's claim, checked by running the torch module on every input (or a seeded
    sample plus the task's adversarial inputs where enumeration is out of reach)."""
    m, mode = default_build
    sampled = dict(samples=300, seed=3) if mode == "sample" else {}
    r = xf.verify(m, mode=mode, arithmetic=arithmetic, **sampled)
    assert r.passed, (r.reason, r.counterexample)
    assert r.inputs_covered == (m.task.count(m.compiled) if mode == "exhaustive" else 600)


def test_default_builds_right_in_transformer_lens(default_build):
    """TransformerLens 4 (its bridge folds sqrt(d_head) into W_Q, one more rounding) in float32."""
    pytest.importorskip("transformer_lens", reason="transformer_lens not installed")
    m, _ = default_build
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArithmeticWarning)
        bridge = m.to_transformer_lens(torch.float32)
    batches = list(m.task.adversarial(m.compiled, 100, 7)) + list(m.task.sample(m.compiled, 100, 8))
    pos = torch.as_tensor(m.compiled.answer_positions_for(batches[0].tokens.shape[1]))
    for b in batches:
        with torch.no_grad():
            logits = bridge(torch.as_tensor(b.tokens))[:, pos]
        got = np.array([[m.answers[int(i)] for i in row] for row in logits.argmax(-1).numpy()])
        assert np.array_equal(got, np.asarray(b.truth).reshape(got.shape))


# ------------------------------------------------------------------------------------------------
# a fixed-point-only build: proved in its format, refuted in float32
# ------------------------------------------------------------------------------------------------


def test_minimal_eta_refuted_in_float32_by_torch():
    """eta "minimal" is the smallest eta the fixed-point format's rounding makes work (exp rounds
    small weights to 0). The fixed-point certificate proves it; the float32 certificate fails and
    its counterexample is answered wrong by the torch float32 module itself."""
    m = xf.build("index-lookup", n=64, eta="minimal")
    assert m.params["arithmetics"].value == [m.precision]
    assert xf.verify(m, mode="certify").passed
    r = xf.verify(m, mode="certify", arithmetic="float32")
    assert not r.passed and r.counterexample is not None and r.counterexample["arithmetic"] == "float32"
    tokens = m.encode(tuple(r.counterexample["input"]))
    with pytest.warns(ArithmeticWarning, match="float32"):
        module = m.to_torch(torch.float32)
    with torch.no_grad():
        logits = module(torch.as_tensor(tokens[None]))[0, -1]
    assert m.answers[int(logits.argmax())] != r.counterexample["expected"]
    # the robust default at the same n is certified in float32 and runs without warning
    d = xf.build("index-lookup", n=64)
    assert xf.verify(d, mode="certify", arithmetic="float32").passed
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArithmeticWarning)
        d.to_torch(torch.float32)


def test_saved_manifest_records_certified_arithmetics(tmp_path):
    m = xf.build("index-lookup", n=64, eta="minimal")
    man = json.loads((xf.save(m, tmp_path / "a") / "manifest.json").read_text())
    assert man["certified_arithmetics"] == {"certified": [m.precision], "not_certified": ["float64", "float32"]}
    d = xf.build("index-lookup", n=64)
    man = json.loads((xf.save(d, tmp_path / "b") / "manifest.json").read_text())
    assert man["certified_arithmetics"] == {"certified": [d.precision, "float64", "float32"], "not_certified": []}
    man = json.loads((xf.save(d, tmp_path / "c", certify=False) / "manifest.json").read_text())
    assert man["certified_arithmetics"] is None


@pytest.mark.slow
@pytest.mark.parametrize("name,kw", [("index-lookup", dict(n=64, alphabet=8)), ("equality", dict(n=16))])
def test_eta_just_below_the_float32_certified_bound_is_refuted_in_torch(name: str, kw: dict):
    """Lower eta on the grid from the robust default: the float32 certificate proves down to some
    eta*, never passes below it, and within two grid steps below eta* finds a counterexample that
    the torch float32 module answers wrong (the float certificate is sound and nearly tight)."""
    d = xf.build(name, **kw)
    etas = [d.params["eta"].value - Fraction(j, 2) for j in range(12)]  # eta's grid is 1/2 in both formats
    results = []
    for eta in etas:
        if eta <= 0:
            break
        m = xf.build(name, **kw, eta=eta, precision=d.precision)
        results.append((eta, m, xf.verify(m, mode="certify", arithmetic="float32")))
    proved = [eta for eta, _, r in results if r.passed]
    assert proved and proved == [eta for eta, _, _ in results[: len(proved)]]  # a prefix: monotone
    below = results[len(proved):]
    assert below and not any(r.passed for _, _, r in below)
    eta, m, r = next((e, m, r) for e, m, r in below[:3] if r.counterexample is not None)
    tokens = m.encode(r.counterexample["input"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ArithmeticWarning)
        module = m.to_torch(torch.float32, positions="all")  # every position: indexed at the answers below
    pos = torch.as_tensor(m.compiled.answer_positions_for(len(tokens)))
    with torch.no_grad():
        logits = module(torch.as_tensor(np.asarray(tokens)[None]))[0, pos]
    got = [m.answers[int(i)] for i in logits.argmax(-1)]
    expected = r.counterexample["expected"]
    assert got != (expected if isinstance(expected, list) else [expected])


# ------------------------------------------------------------------------------------------------
# content-dependent constructions: designed for the floats, checked by running torch
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kw", [("nearest-neighbor", dict(n=16)), ("mqar", dict(n=16)),
                                     # slow: the same property for MQAR at n = 16 is checked by the case before
                                     pytest.param("mqar", dict(n=64, labels=3), marks=pytest.mark.slow)])
@pytest.mark.parametrize("arithmetic", ["float64", "float32"])
def test_content_default_builds_run_right_in_torch(name: str, kw: dict, arithmetic: str):
    """Vector inputs reach the torch module (run_torch passes them to the embedding's vector
    columns), and the default builds, whose first-layer certificate is fixed-point only, answer
    the seeded sample and every adversarial kind right in float32 and float64."""
    m = xf.build(name, **kw)
    r = xf.verify(m, mode="sample", samples=200, seed=5, arithmetic=arithmetic)
    assert r.passed, (r.reason, r.counterexample)


def test_mqar_fixed_point_only_eta_is_refuted_in_torch_and_says_so():
    """MQAR's default etas satisfy the row bound in reals, float64 and float32; eta1 = eta2 = 1 (the
    smallest the fixed-point format allows, through exp rounding to 0) is proved in the format,
    recorded as fixed-point only, warned about on export, and answered wrong by torch."""
    m = xf.build("mqar", n=16, precision="binary:int=4,frac=1", eta1=1, eta2=1)
    assert m.params["arithmetics"].value == ["binary:int=4,frac=1"]
    assert xf.verify(m, mode="certify").passed
    with pytest.warns(ArithmeticWarning):
        m.to_torch(torch.float32)
    r = xf.verify(m, mode="sample", samples=200, seed=5, arithmetic="float32")
    assert not r.passed and r.counterexample["arithmetic"] == "float32"
    robust = xf.build("mqar", n=16)
    assert robust.params["arithmetics"].value == [robust.precision, "real", "float64", "float32"]


@pytest.mark.slow
def test_vacuous_float_rows_prove_nothing_and_never_raise():
    """A row whose a-priori float bound is vacuous (exp overflowing float32 at a huge eta, or
    n u >= 1 terms) gives the trivial weights [0, 1]: the builders' searches read it as "the
    condition fails" (index_lookup at N = 2^24 raised 'divisor boxes must be positive')."""
    f32 = FloatArithmetic("float32")
    w_t, w_l = f32.row_weights(Box.point(np.array([0.0])), Box.point(np.array([[-1.0]])), np.array([[1 << 26]]))
    assert float(np.asarray(w_t.lo)[0]) == 0.0 and float(np.asarray(w_t.hi)[0]) == 1.0
    assert xf.build("index-lookup", n=1 << 24).params["arithmetics"].value[-1] == "float32"


def test_a_readout_whose_logit_overflows_is_unproven_with_its_margin():
    """A float16 readout whose logits overflow to infinity: 'unproven' naming the margin -inf (the
    message's Fraction of -inf was an internal error that ended the frontier's float16 chains)."""
    from exactformer.constructions.core.proof import Unproven
    from exactformer.precision.boxes import Box, FloatArithmetic
    from exactformer.verify.certify.layers import readout_table
    arith = FloatArithmetic("float16")
    table = Box(np.array([[-60000.0, -60000.0]]), np.array([[60000.0, 60000.0]]))  # every logit in [-inf, inf]
    with pytest.raises(Unproven, match="margin -inf"):
        readout_table(arith, table, np.array([[2.0, 2.0], [2.0, 2.0]]), np.zeros(2), 7)
