"""``Model.run_with_cache``'s Cache is a read-only Mapping by hook name, like TransformerLens's
ActivationCache: iteration over the names, ``len``, ``keys``/``values``/``items``, ``in``, ``get``."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import exactformer as xf
from exactformer.constructions.core.ir import ExactTensor


def test_cache_is_a_mapping_of_hook_names():
    m = xf.build("index-lookup", n=16, alphabet=4)
    logits, cache = m.run_with_cache([([1, 2, 3, 0] * 4, 3)])
    assert isinstance(cache, Mapping)
    names = list(cache)  # `for k in cache` raised KeyError: 0 before
    assert names[:3] == ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre"] and names[-1] == "unembed.hook_logits"
    assert len(cache) == len(names) == len(set(names)) == 16
    assert list(cache.keys()) == names and "blocks.0.attn.hook_pattern" in cache and "nope" not in cache
    for name, value in cache.items():
        assert isinstance(value, ExactTensor) and np.array_equal(value.num, cache.raw[name])
    assert len(list(cache.values())) == 16 and cache.get("nope") is None
    assert np.array_equal(cache["unembed.hook_logits"].num, logits)
    assert dict(cache).keys() == cache.raw.keys()
