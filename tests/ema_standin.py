"""STAND-IN for ``exactformer.verify.ema`` (branch ``ema``, written by another helper, not merged yet).

A tiny dense Exact-Match Attention following that module's contract, installed into ``sys.modules``
only when the real kernel is missing, so that the L2 tests run before the merge. Delete this file
once ``verify/ema.py`` has landed. Not part of the package.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass

import numpy as np


@dataclass
class EMAResult:
    count: np.ndarray
    total: np.ndarray
    weight: np.ndarray | None


def exact_match_attention(queries, keys, values, *, query_mask=None, key_mask=None, fmt=None) -> EMAResult:
    q, k, v = (np.asarray(a, dtype=np.int64) for a in (queries, keys, values))
    B, Nq, Nk = q.shape[0], q.shape[1], k.shape[1]
    qm = np.ones((B, Nq), bool) if query_mask is None else np.asarray(query_mask, bool)
    km = np.ones((B, Nk), bool) if key_mask is None else np.asarray(key_mask, bool)
    eq = (q[:, :, None, :] == k[:, None, :, :]).all(-1) & qm[:, :, None] & km[:, None, :]
    count = eq.sum(-1).astype(np.int64)
    if fmt is None:
        return EMAResult(count, np.einsum("bqk,bkd->bqd", eq.astype(np.int64), v), None)
    weight = np.where(count > 0, fmt.scale // np.maximum(count, 1), 0)
    terms = np.asarray(fmt.mul(weight[:, :, None, None], v[:, None, :, :])) * eq[..., None]
    return EMAResult(count, np.clip(terms.sum(2), fmt.min_raw, fmt.max_raw), weight)


def install() -> None:
    if importlib.util.find_spec("exactformer.verify.ema") is None:
        mod = types.ModuleType("exactformer.verify.ema")
        mod.EMAResult, mod.exact_match_attention = EMAResult, exact_match_attention
        mod.STANDIN = True
        sys.modules["exactformer.verify.ema"] = mod


install()
