"""A certificate proves the task's specification; nothing but this check makes it the task's truth.

A new user's task whose ``truth`` returns indices instead of values, or whose specification names
the wrong answers, is refused by ``certify`` with the first input where the two differ -- at the
model's own N and at the construction's small build -- while the unchanged catalogue passes and
says what it checked.
"""

from __future__ import annotations

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.core import registry
from exactformer.constructions.theorems.index_lookup import IndexLookupTask, index_lookup
from exactformer.verify.certify import spec_check
from registered import TEST_CLAIM


class PositionTruth(IndexLookupTask):
    """A user's slip: the truth returns the looked-up position (an index), not the symbol there."""

    def truth(self, model, symbols, p):
        return np.asarray(p) - 1


class ReversedValues(IndexLookupTask):
    """A specification naming the wrong answers: index s stands for symbol S - 1 - s."""

    def spec(self, model):
        spec = super().spec(model)
        spec.values = tuple(reversed(spec.values))
        return spec


@pytest.fixture(params=[PositionTruth, ReversedValues], ids=["truth-returns-positions", "values-reversed"])
def wrong(request):
    name = f"test-{request.param.__name__.lower()}"

    def build(n: int, alphabet: int = 4):
        """Index Lookup under a wrong task.

        Parameters
        ----------
        n : int in [2, 64]. N.
        alphabet : int in [2, 8]. |Sigma|.
        """
        model = index_lookup(n, alphabet)
        model.construction = name
        return model

    registry.names()
    registry._REGISTRY[name] = registry.Construction(name, build, request.param(), "test", TEST_CLAIM,
                                                      example={"n": 8, "alphabet": 4}, small={"n": 4, "alphabet": 4})
    try:
        yield name
    finally:
        registry._REGISTRY.pop(name, None)
        spec_check._SMALL_DONE.pop(name, None)


@pytest.mark.parametrize("n", [4, 300])  # 300: inputs of 301 tokens, checked at the small build only
def test_a_specification_that_is_not_the_truth_is_refused(wrong, n):
    m = xf.build(wrong, n=n, alphabet=4)
    r = xf.verify(m, mode="certify")
    assert not r.passed
    assert "specification disagrees with its truth" in r.reason and "on input" in r.reason, r.reason
    # a wrong truth: the model is wrong for that task; a wrong specification: the model is right, the proof refused
    assert xf.verify(xf.build(wrong, n=4, alphabet=4), mode="exhaustive").passed == wrong.endswith("reversedvalues")


def test_the_catalogue_says_what_was_checked():
    small = xf.verify(xf.build("index-lookup", n=4, alphabet=2), mode="certify")
    assert small.passed and small.details["spec_check"] == "specification = truth on every input at N = 4 (64)"
    big = xf.verify(xf.build("index-lookup", n=1024, alphabet=8), mode="certify")
    assert big.passed
    assert big.details["spec_check"] == ("specification = truth on every input at N = 4 (64); "
                                         "not at N = 1024 (inputs of 1025 tokens)")
    mid = xf.verify(xf.build("index-lookup", n=64, alphabet=8), mode="certify")
    assert "64 adversarial and 64 random inputs (seed 0) at N = 64" in mid.details["spec_check"]
