"""Every operation the runtime rounds is modelled in each arithmetic a certificate claims.

A float certificate (float64, float32, bfloat16, float16) claims what torch computes with the
exported weights. For every registered construction a float certificate covers, at its small build,
models are made whose floats sit at the dtype's rounding boundaries -- large equal offsets on the
readout bias (the exact margins unchanged, the float logits rounded onto a coarse grid), weights a
half unit in the last place off a float, embedding entries likewise -- and for each arithmetic: if
the certificate passes, every input run through ``to_torch`` in that dtype (exhaustive mode) must be
answered right.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

from exactformer.constructions.core import registry
from exactformer.constructions.core.ir import ExactTensor
from exactformer.verify.verifier import certificate_refusal, verify

#: significand bits (the implicit one included) of each float arithmetic (the exact reals round nothing:
#: their claim is about exact arithmetic, which no dtype runs)
BITS = {"float64": 53, "float32": 24, "bfloat16": 8, "float16": 11}


def _small(name: str):
    entry = registry.get(name)
    return entry.builder(**(entry.small or entry.example))


def _plus(t: ExactTensor, delta: Fraction, where: np.ndarray | None = None) -> ExactTensor:
    """``t`` + ``delta`` (at the flat entries ``where``, default every entry), exactly."""
    vals = t.fractions()
    flat = vals.reshape(-1)
    for i in range(flat.size) if where is None else where:
        flat[int(i)] += delta
    return ExactTensor.from_values(vals)


def boundary_mutants(model, bits: int):
    """(what, mutant): floats at the rounding boundaries of a dtype with ``bits`` significand bits."""
    b_U = model.b_U
    scale = max([abs(Fraction(int(v), b_U.den)) for v in np.ravel(b_U.num)] + [Fraction(1)])
    for e in (bits - 2, bits - 1, bits, bits + 1):  # equal offsets: exact margins kept, float logits coarsened
        yield f"b_U + 2^{e}", dataclasses.replace(model, b_U=_plus(b_U, scale * 2**e))
    half_ulp = scale / 2**bits  # one logit half a unit in the last place up: a tie in the float
    yield "b_U[0] + half ulp", dataclasses.replace(model, b_U=_plus(b_U, half_ulp, np.array([0])))
    W_U = model.W_U
    nz = np.flatnonzero(W_U.num)
    if nz.size:
        w = abs(Fraction(int(np.ravel(W_U.num)[nz[0]]), W_U.den))
        yield "W_U entry + half ulp", dataclasses.replace(model, W_U=_plus(W_U, w / 2**bits, nz[:1]))
    table = getattr(getattr(model, "embed", None), "table", None)
    if table is not None and np.any(table.num):
        i = np.flatnonzero(table.num)[:1]
        v = abs(Fraction(int(np.ravel(table.num)[i[0]]), table.den))
        yield "embedding entry + half ulp", dataclasses.replace(
            model, embed=dataclasses.replace(model.embed, table=_plus(table, v / 2**bits, i)))


@pytest.mark.parametrize("arithmetic", ["float32", "float16"])
@pytest.mark.parametrize("name", ["index-lookup", "equality", "dyck-rnn"])
def test_boundaries_are_modelled(name, arithmetic):
    assert _check(name, arithmetic) >= 1  # the model as built is certified there: the check is not vacuous


@pytest.mark.slow
@pytest.mark.parametrize("arithmetic", list(BITS))
@pytest.mark.parametrize("name", registry.names())
def test_boundaries_are_modelled_everywhere(name, arithmetic):
    model = _small(name)
    if "certify" not in registry.task_of(model).modes or certificate_refusal(model, arithmetic) is not None:
        pytest.skip(f"no {arithmetic} certificate covers {name}")
    _check(name, arithmetic)


def _check(name: str, arithmetic: str) -> int:
    """How many of the model and its boundary mutants are certified in ``arithmetic`` (each also
    answered right by torch in that dtype on every input)."""
    model = _small(name)
    proved = 0
    for what, mutant in [("as built", model)] + list(boundary_mutants(model, BITS[arithmetic])):
        cert = verify(mutant, "certify", arithmetic=arithmetic)
        assert "internal error" not in cert.reason, (what, cert.reason)
        if cert.passed:
            run = verify(mutant, "exhaustive", arithmetic=arithmetic)
            assert run.passed, f"{name} ({what}) certified in {arithmetic}, but torch answers {run.counterexample}"
            proved += 1
    return proved


def test_equal_large_readout_biases_are_not_certified_in_float32():
    """The audit's case: two equal large readout biases keep the exact margin of the recurrent
    Dyck model, but torch's float32 readout rounds the logits onto a grid coarser than the margin."""
    model = _small("dyck-rnn")
    big = dataclasses.replace(model, b_U=_plus(model.b_U, Fraction(1 << 26)))
    cert = verify(big, "certify", arithmetic="float32")
    assert not cert.passed and "readout" in cert.reason
    assert not verify(big, "exhaustive", arithmetic="float32").passed  # torch does answer wrong
    assert verify(big, "certify", arithmetic="float64").passed  # 2^26 is exact in float64
