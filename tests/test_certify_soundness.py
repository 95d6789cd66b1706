"""The composed certificate is sound on hand-built adversarial models, not only on builder output.

For hundreds of mutants (tests/adversarial.py: extra residual columns, biases on unread columns,
duplicated or mislabelled code rows, zeroed heads, perturbed and extra weights) of small models of
every construction: whenever the certificate proves a mutant, exhaustive enumeration finds no wrong
answer; whenever it reports a counterexample, the executor answers that input wrong; it never
raises. The proven fraction is checked too, so that a certificate that declines everything fails.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from adversarial import KINDS, mutants
from exactformer.constructions.core import registry
from exactformer.precision import parse_format
from exactformer.verify.verifier import verify

BASES = [
    ("index-lookup", dict(n=4, alphabet=3, positions="reed-solomon")),
    ("index-lookup", dict(n=5, alphabet=2, positions="onehot")),
    ("index-lookup", dict(n=4, alphabet=4, positions="random")),
    ("equality", dict(n=6)),
    ("inequality", dict(n=4, positions="random")),
    pytest.param(*("disjointness", dict(n=6)), marks=pytest.mark.slow),
    pytest.param(*("dnf", dict(n=5, terms=[[1, -2], [3, 4]])), marks=pytest.mark.slow),
    pytest.param(*("threshold", dict(n=5, features=[[[1, 2], [0, 1, 1, 0]], [[3], [1, 0]], [4, 5]], g=[1, 0, 0, 1], b=1)), marks=pytest.mark.slow),
]
PER_BASE = 32  # 8 bases x 32 mutants = 256 adversarial models


@pytest.mark.parametrize("name,kw", BASES, ids=[f"{(b.values if hasattr(b, 'values') else b)[0]}-{i}" for i, b in enumerate(BASES)])
@pytest.mark.slow
def test_certificate_agrees_with_exhaustive_on_mutants(name, kw):
    base = registry.get(name).builder(**kw)
    fmt = parse_format(base.precision)
    proved = refuted = correct = 0
    for i, (kind, m) in enumerate(mutants(base, PER_BASE, seed=hash(name) % 1000 + len(kw), step=Fraction(fmt.step))):
        cert = verify(m, "certify")
        exh = verify(m, "exhaustive")
        assert "internal error" not in cert.reason, (kind, cert.reason)
        if cert.passed:
            assert exh.passed, f"mutant {i} ({kind}) certified but exhaustive finds {exh.counterexample}"
            proved += 1
        elif cert.counterexample is not None:
            assert not exh.passed, f"mutant {i} ({kind}): a counterexample for a correct model"
            refuted += 1
        correct += exh.passed
    # the certificate proves most correct mutants (it is not a refusal machine)
    assert proved >= correct // 2, (proved, correct)
    assert proved + refuted >= PER_BASE // 3


def test_every_kind_occurs():
    base = registry.get("index-lookup").builder(n=4, alphabet=3, positions="reed-solomon")
    kinds = {k for k, _ in mutants(base, 16, 0, Fraction(1, 4))}
    assert kinds == set(KINDS)


@pytest.mark.parametrize("kind", ["bias_column", "dead_value"])
def test_constant_columns_count_in_the_margin(kind):
    """The issue's first two defects: a constant logit bonus that changes the answer must not be
    certified (it is either refuted or, when it does not change the answer, proved)."""
    base = registry.get("index-lookup").builder(n=4, alphabet=4, positions="reed-solomon")
    fmt = parse_format(base.precision)
    for _, m in mutants(base, 24, 7, Fraction(fmt.step)):
        c, e = verify(m, "certify"), verify(m, "exhaustive")
        assert not c.passed or e.passed


def test_duplicated_code_rows_are_not_trusted_by_label():
    """A view mapping two positions to one vector, labelled with the base code's family: the
    certificate must derive inner products from the generator and refute (or decline) it."""
    from adversarial import mutate

    for name, kw in BASES[:3]:
        base = registry.get(name).builder(**kw)
        m = mutate(base, "dup_code", np.random.default_rng(1), Fraction(1, 4))
        c, e = verify(m, "certify"), verify(m, "exhaustive")
        assert not e.passed and not c.passed and c.counterexample is not None


@pytest.mark.slow
def test_reported_crashes_now_answer():
    """Issue 8 item 3: the certificate answers (pass, counterexample or unproven), never raises."""
    import dataclasses

    from exactformer.constructions.core.ir import ExactTensor

    m = registry.get("inequality").builder(n=2, positions="onehot", precision="binary:int=3,frac=4", eta=Fraction(3, 16))
    r = verify(m, "certify")
    assert (not r.passed or verify(m, "exhaustive").passed) and "internal error" not in r.reason
    assert "stopped" not in r.reason  # the counterexample search ran (it drew from N = 2 bits)
    m = registry.get("equality").builder(n=8)
    a = m.blocks[0].attn
    zero_v = dataclasses.replace(m, blocks=[dataclasses.replace(m.blocks[0], attn=dataclasses.replace(
        a, W_V=ExactTensor(np.zeros_like(a.W_V.num)))), m.blocks[1]])
    r = verify(zero_v, "certify")
    assert not r.passed and r.counterexample is not None and "internal error" not in r.reason


def test_counterexample_search_out_of_memory_is_an_answer():
    """A search whose inputs are too large to run (MemoryError) ends as "not proven", with the
    reason, never a traceback (found by certifying threshold N = 2^16 in float32)."""
    from exactformer.verify.certify.composed import certify

    m = registry.get("index-lookup").builder(n=16, alphabet=4, eta="minimal")
    fmt = parse_format(m.precision)

    def runner(model, batch):
        raise MemoryError

    c = certify(m, fmt, registry.task_of(m), run_candidates=runner, arithmetic="float32")
    assert not c.passed and "out of memory" in c.reason
