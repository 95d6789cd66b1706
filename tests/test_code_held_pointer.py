"""A content pointer held by its code (Theorem 7's address path; docs/positions.md).

The first layer of MQAR and nearest neighbour chooses a candidate J by content; its value is the
address code vector of J + 1. The certificate holds J by that code -- two classes per coordinate --
instead of one table row per candidate, and the second layer's row from the code's weight
distribution (a causal prefix: optional keys), so the position-code half costs the same at every N.

* held and listed (one class per candidate) give the same verdict, margin and weights;
* at a size exhaustive enumeration covers (an RS address code forced at N = 8), the held
  certificate agrees with every input, on the model and on hand-built wrong models: each targeted
  mutant is refused by the step it breaks, never passed, and exhaustive finds the truly wrong ones wrong;
* random adversarial mutants: a held PASS is always an exhaustive PASS (slow);
* the same in a fresh process from saved files.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.blocks import content
from exactformer.constructions.codes.positions import ReedSolomonCode
from exactformer.constructions.core.ir import CodeBlock, ExactTensor
from exactformer.constructions.theorems import mqar as mqar_module
from exactformer.constructions.theorems.nearest_neighbor import smallest_code
from exactformer.precision import parse_format
from exactformer.verify.verifier import verify

from adversarial import _replace_attn, _replace_mlp, _set, _with, mutants


def _held(report) -> list:
    return [h.get("held_by") or h.get("query") for h in report.details.get("heads", [])]


@pytest.mark.parametrize("build", [lambda: xf.build("mqar", n=64), lambda: xf.build("mqar", n=64, labels=3, queries="all"),
                                   pytest.param(lambda: xf.build("mqar", n=256, labels=3, queries="all"), marks=pytest.mark.slow),
                                   lambda: xf.build("nearest-neighbor", n=64, d_in=4, margin=Fraction(1, 2))],
                         ids=["mqar-64", "mqar-64-all", "mqar-256-all", "nn-64"])
def test_held_and_listed_certificates_agree(build, monkeypatch):
    m = build()
    held = verify(m, "certify")
    monkeypatch.setattr(content, "CODE_AXIS", False)
    listed = verify(m, "certify")
    assert held.passed and listed.passed, (held.reason, listed.reason)
    assert held.min_margin == listed.min_margin
    assert set(_held(held)) == {"code", "held by code"} and "held by code" not in _held(listed)
    weights = lambda r: [h.get("min_target_weight") for h in r.details["heads"]]  # noqa: E731
    assert weights(held) == weights(listed)


@pytest.fixture
def rs_mqar(monkeypatch):
    """MQAR at N = 8, |Sigma| = 4 with a Reed--Solomon address code (the builder would pick one-hot
    there): 73,728 inputs, all enumerable."""
    def rs_first(n, mu):
        try:
            return ReedSolomonCode.for_max_inner(n, mu)
        except Exception:
            return smallest_code(n, mu)
    monkeypatch.setattr(mqar_module, "smallest_code", rs_first)
    m = mqar_module.mqar(8, alphabet=4)
    address = [b for b in m.pos_embed.blocks if b.col in (m.layout["P2"][0], m.layout["A"][0])]
    assert len(address) == 2 and all(type(b.code) is ReedSolomonCode for b in address)
    return m


def test_held_certificate_agrees_with_every_input(rs_mqar):
    cert, exh = verify(rs_mqar, "certify"), verify(rs_mqar, "exhaustive")
    assert cert.passed and cert.inputs_covered == "all", cert.reason
    assert _held(cert) == ["code", "held by code"]
    assert exh.passed and exh.inputs_covered == 73728


def _slot(m, name):
    start, width = m.layout[name]
    return np.arange(start, start + width)


def _pos_block(m, name, **kw):
    """The model with the positional code block on slot ``name`` changed (``kw``: CodeBlock fields)."""
    col = int(_slot(m, name)[0])
    blocks = [dataclasses.replace(b, **kw) if b.col == col else b for b in m.pos_embed.blocks]
    return _with(m, pos_embed=dataclasses.replace(m.pos_embed, blocks=tuple(blocks)))


def _mutant(m, kind):
    R, S, Bc = _slot(m, "R"), _slot(m, "S"), _slot(m, "B")
    if kind == "value-own-address":  # A = code(t): the first layer hands over the symbol's own position
        return _pos_block(m, "A", code_start=0)
    if kind == "key-shifted":  # P2 = code(t + 1): the label's address is held by the symbol before it
        return _pos_block(m, "P2", code_start=1)
    if kind == "mlp-mixes":  # an MLP unit that reads two address coordinates
        mlp = m.blocks[0].mlp
        u = int(np.flatnonzero(mlp.W_in.num[R[0]] != 0)[0])
        return _replace_mlp(m, 0, W_in=_set(mlp.W_in, (int(R[1]), u), Fraction(1)))
    if kind == "query-negated":  # the second layer's query reads -S
        a = m.blocks[1].attn
        return _replace_attn(m, 1, W_Q=ExactTensor(np.where(np.isin(np.arange(m.d_model), S)[None, :, None], -a.W_Q.num,
                                                            a.W_Q.num), a.W_Q.den))
    if kind == "coordinates-swapped":  # W_O writes the retrieved coordinates 0 and 1 into each other's R column
        a = m.blocks[0].attn
        W_O = a.W_O.num.copy()
        W_O[:, :, [R[0], R[1]]] = W_O[:, :, [R[1], R[0]]]
        return _replace_attn(m, 0, W_O=ExactTensor(W_O, a.W_O.den))
    if kind == "readout-reads-address":  # W_U reads an address column
        return _with(m, W_U=_set(m.W_U, (int(S[0]), 1), Fraction(1, 4)))
    raise ValueError(kind)


REFUSED_BY = {"value-own-address": "not to its label", "key-shifted": "not to its label",
              "mlp-mixes": "two coordinates", "query-negated": "not above every other key",
              "coordinates-swapped": "coordinate by coordinate", "readout-reads-address": "unembedding reads a column"}


@pytest.mark.parametrize("kind", sorted(REFUSED_BY))
def test_wrong_models_are_refused_by_the_step_they_break(rs_mqar, kind):
    m = _mutant(rs_mqar, kind)
    cert = verify(m, "certify")
    assert not cert.passed and REFUSED_BY[kind] in cert.reason, cert.reason
    if kind in ("value-own-address", "key-shifted", "query-negated"):  # wrong answers, found by enumeration
        exh = verify(m, "exhaustive")
        assert not exh.passed and exh.counterexample is not None
        assert cert.counterexample is not None  # and by the certificate's search


@pytest.mark.slow
def test_random_mutants_never_pass_where_enumeration_fails(rs_mqar):
    step = parse_format(rs_mqar.precision).step
    for kind, m in mutants(rs_mqar, 16, seed=5, step=step):
        cert = verify(m, "certify")
        if cert.passed:
            assert verify(m, "exhaustive").passed, kind


def test_held_certificate_in_a_fresh_process_from_saved_files(tmp_path):
    xf.save(xf.build("mqar", n=128), tmp_path / "m")
    code = ("import exactformer as xf; r = xf.verify(xf.load(%r), mode='certify'); "
            "print(r.passed, [h.get('held_by') or h.get('query') for h in r.details['heads']])" % str(tmp_path / "m"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True ['code', 'held by code']", out.stderr


@pytest.mark.parametrize("n, mu", [(64, Fraction(1, 4)), (200, Fraction(1, 4)), (1000, Fraction(1, 8))])
def test_best_other_symbol_level_from_the_algebra_bounds_the_generator(n, mu):
    """The content half's rows (MQAR's symbol code): the largest inner product with another key
    vector, from the code's algebra, is never below the generator's histograms and equals them
    here (small sub-blocks are counted exactly); keys that do not hold every query: None."""
    from exactformer.constructions.blocks.content import best_other_level
    from exactformer.constructions.codes.products import histograms, pair_inner
    gen = ReedSolomonCode.for_max_inner(n, mu)
    rng = np.random.default_rng(n)
    for a, b in [(0, n), (n - 1, n)] + [tuple(sorted(rng.choice(n + 1, size=2, replace=False))) for _ in range(12)]:
        kj = np.arange(a, b)
        iq = np.sort(rng.choice(kj, size=min(kj.size, 7), replace=False))
        got = best_other_level(gen, iq, kj)
        lv, hist = histograms(gen, iq, gen, kj)
        hist = hist.copy()
        hist[np.arange(iq.size), np.searchsorted(lv, pair_inner(gen, iq, gen, iq))] -= 1
        want = np.where(hist > 0, lv[None, :], np.iinfo(np.int64).min).max(axis=1)
        assert got is not None and np.array_equal(got, want), (a, b)
    assert best_other_level(gen, np.array([0]), np.array([1, 2])) is None  # the query's own vector is no key
    assert best_other_level(gen, np.array([1]), np.array([0, 1, 3])) is None  # not one range


@pytest.mark.parametrize("n", [8, 64])
def test_the_query_itself_is_a_key_of_the_first_layer(n):
    """A flag that misses the last query's own position (runs over [N, T - 1) only): the layer-0 row
    there puts 1/2 on the query itself, so the certificate must not state the row 'target 1, stray
    0' on the way to a PASS (it did while the query's own position was left out of its row)."""
    from exactformer.constructions.core.runs import RunConstantCode
    m = xf.build("mqar", n=n).compiled
    T, col = 2 * n - 1, m.layout["FX"][0]
    short = RunConstantCode(np.zeros(1, np.int64), np.ones((1, 1), np.int8), T - 1 - n)
    blocks = tuple(dataclasses.replace(b, code=short, count=T - 1 - n) if b.col == col else b for b in m.pos_embed.blocks)
    bad = _with(m, pos_embed=dataclasses.replace(m.pos_embed, blocks=blocks))
    assert verify(m, "certify").passed
    cert = verify(bad, "certify")
    assert not cert.passed and "unproven" in cert.reason, cert.reason
