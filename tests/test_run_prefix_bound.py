"""The prefix bound a causal run certificate would rest on (docs/positions.md, "Causal rows: a prefix
of the code"): a causal row's keys are a prefix of the positions, so its histogram of code inner
products is at most the whole code's, level by level. In fixed point that bound is sound only in
one direction: the other keys must enter ``FixedArithmetic.row_weights`` as *optional* keys (each
may be absent), so that the target's weight is bounded below with the largest sum and every other
key's weight above with the smallest. Checked here against the rounded softmax the exact executor
computes (``FixedPoint.softmax``) on every causal prefix of a Reed--Solomon∘Hadamard code, in a
format whose sum saturates and one where it does not; entering the whole histogram as keys that
are present is shown to be unsound on short prefixes (the trap the bound must avoid)."""

from __future__ import annotations

import numpy as np
import pytest

from exactformer.constructions.codes.positions import ReedSolomonCode
from exactformer.constructions.codes.products import histograms, pair_inner
from exactformer.precision import parse_format
from exactformer.precision.boxes import Box, FixedArithmetic

CODE = ReedSolomonCode(128, 3, 3)  # 128 vectors of length 64; inner products 0, 8, 16 (and 64 with itself)


def _rows(fmt_name: str, P: int, c: int) -> tuple[FixedArithmetic, np.ndarray, np.ndarray, np.ndarray]:
    """(arithmetic, logits [n, n] raw = sat(P I + c), the whole code's levels [L] and histogram [n, L]
    of each vector against every other vector)."""
    arith = FixedArithmetic(parse_format(fmt_name))
    n = CODE.n
    idx = np.arange(n)
    inner = pair_inner(CODE, np.repeat(idx, n), CODE, np.tile(idx, n)).reshape(n, n)
    logits = np.asarray(arith.saturate(P * inner.astype(object) + c)).astype(np.int64)
    levels, hist = histograms(CODE, idx, CODE, idx)
    self_at = np.searchsorted(levels, CODE.k)
    assert np.all(hist[:, self_at] == 1)  # distinct codewords: the target alone at the top level
    hist = hist.copy()
    hist[:, self_at] = 0
    return arith, logits, levels, hist


def _bound(arith: FixedArithmetic, P: int, c: int, levels: np.ndarray, hist_row: np.ndarray,
           as_optional: bool) -> tuple[Box, Box, np.ndarray]:
    lv = np.asarray(arith.saturate(P * levels.astype(object) + c)).astype(np.int64)
    top = np.asarray(arith.saturate(np.array([P * CODE.k + c], dtype=object))).astype(np.int64)
    keep = hist_row > 0
    zero = np.zeros((1, int(keep.sum())), np.int64)
    counts, optional = (zero, hist_row[keep][None, :]) if as_optional else (hist_row[keep][None, :], zero)
    w_t, w_l = arith.row_weights(Box.point(arith.array(top)), Box.point(arith.array(lv[keep][None, :])), counts, optional)
    return w_t, w_l, lv[keep]


@pytest.mark.parametrize("fmt_name, P, c", [("binary:int=4,frac=12", 40, 0),     # the sum of e saturates
                                            ("binary:int=12,frac=12", 40, -300),  # it does not
                                            ("binary:int=4,frac=12", 90, 7)])
def test_optional_keys_enclose_every_causal_prefix(fmt_name, P, c):
    arith, logits, levels, hist = _rows(fmt_name, P, c)
    fmt, n = arith.fmt, CODE.n
    saturated = 0
    for j in range(0, n, 3):
        w_t, w_l, lv = _bound(arith, P, c, levels, hist[j], as_optional=True)
        stray_max = int(np.sum(np.asarray(w_l.hi)[0].astype(object) * hist[j][hist[j] > 0]))
        for L in range(j, n):
            row = np.asarray(fmt.softmax(logits[j, : L + 1][None, :]))[0]
            saturated += int(np.sum(np.asarray(fmt.exp(logits[j, : L + 1] - logits[j, j])).astype(object)) > fmt.max_raw)
            assert w_t.lo[0] <= row[j] <= w_t.hi[0], (j, L)
            others = np.delete(np.arange(L + 1), j)
            at = np.searchsorted(lv, logits[j, others])
            assert np.all(lv[at] == logits[j, others])
            assert np.all(np.asarray(w_l.lo)[0, at] <= row[others]) and np.all(row[others] <= np.asarray(w_l.hi)[0, at]), (j, L)
            assert int(np.sum(row[others].astype(object))) <= stray_max, (j, L)
    if fmt_name == "binary:int=4,frac=12" and P == 40:
        assert saturated > 0  # the saturating case is exercised


def test_present_keys_are_the_wrong_direction():
    """The whole histogram entered as keys that are present bounds each other key's weight with the
    largest sum: a short prefix (fewer keys, a smaller sum) gives its keys more weight than that."""
    arith, logits, levels, hist = _rows("binary:int=12,frac=12", 40, -300)
    fmt, j = arith.fmt, 0
    w_t, w_l, lv = _bound(arith, P=40, c=-300, levels=levels, hist_row=hist[j], as_optional=False)
    row = np.asarray(fmt.softmax(logits[j, :2][None, :]))[0]  # the prefix [0, 1]: the target and one key
    at = int(np.searchsorted(lv, logits[j, 1]))
    assert row[1] > np.asarray(w_l.hi)[0, at]
    assert row[0] >= w_t.lo[0]  # the target's lower bound stays valid (a larger sum only lowers it)
    w_t2, w_l2, _ = _bound(arith, P=40, c=-300, levels=levels, hist_row=hist[j], as_optional=True)
    assert row[1] <= np.asarray(w_l2.hi)[0, at] and w_t2.lo[0] <= row[0]
