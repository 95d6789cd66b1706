"""Vectors of symbolic values at one position, and the format's matrix products on them (verify/smt).

A :class:`Vec` holds the values at one position -- one table block when they all read the same
positions (the embedding: the token there), else a list of values. :func:`matmul` is the format's
``matmul`` (docs/precision.md: every product rounded, the rounded products summed exactly, the sum
saturated once), :func:`affine` adds the bias with the format's ``add`` (saturated again), as the
transformer's and the recurrent model's forward passes do.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from exactformer.verify.smt.sym import (Acc, Enc, NotCovered, Sym, Tab, add, as_int, clip, const, is_zero, mul_const,
                                        prune, rnd, rnd_arr, wide)

CHUNK = 1 << 22  # entries of one numpy product block


@functools.singledispatch
def evaluator(model: Any, fmt: Any, T: int) -> Callable[[Enc, dict, bool], Callable[[int], list[Sym]]]:
    """A factory ``(enc, shared, split) -> logits_at(position)`` for the model's kind (registered next
    to each implementation: :mod:`exactformer.verify.smt.transformer`, :mod:`exactformer.verify.smt.recurrent`).
    ``shared``: a cache kept across the cases of one run; ``split``: whether a case split may be asked for."""
    raise NotCovered(f"smt: no encoding of a {type(model).__name__}")


class Vec:
    """The values at one position: a block (``deps``, ``arr`` [cells..., d]) when every entry is a table
    over the same positions, else a list of values."""

    __slots__ = ("deps", "arr", "_syms")

    def __init__(self, syms: list[Sym] | None = None, deps: tuple[int, ...] | None = None, arr: np.ndarray | None = None):
        if arr is not None:
            deps, arr = prune(deps, arr)
        self.deps, self.arr, self._syms = deps, arr, syms
        if syms is not None and arr is None:
            if syms and all(isinstance(s, Tab) and s.deps == syms[0].deps for s in syms):
                self.deps = syms[0].deps
                self.arr = as_int(np.stack([s.arr for s in syms], axis=-1))

    def __len__(self) -> int:
        return int(self.arr.shape[-1]) if self.arr is not None else len(self._syms)

    @property
    def syms(self) -> list[Sym]:
        if self._syms is None:
            self._syms = [Tab(self.deps, self.arr[..., c]) for c in range(self.arr.shape[-1])]
        return self._syms

    @property
    def block(self) -> bool:
        return self.arr is not None


def bound(a: np.ndarray) -> int:
    return int(np.max(np.abs(a))) if a.size else 0


class Formats:
    """The format's numbers: scale S, range, rounding, and its rounded exp (the format's own)."""

    def __init__(self, fmt: Any):
        self.fmt = fmt
        self.S, self.lo, self.hi = int(fmt.scale), int(fmt.min_raw), int(fmt.max_raw)
        self.nearest = fmt.rounding == "nearest-even"
        self.e_max = min(self.S, self.hi)  # exp(0) saturated

    @functools.cached_property
    def exp_window(self) -> tuple[int, int]:
        """(d0, 0): exp(d) = 0 for every raw d < d0 (monotone; checked at d0 - 1)."""
        step = self.S
        d0 = -1
        while d0 - step >= self.lo and int(self.exp(np.array([d0 - step]))[0]) > 0:
            d0 -= step
        lo = max(self.lo, d0 - step)
        while lo < d0 and int(self.exp(np.array([lo]))[0]) == 0:
            lo += 1
        return lo, 0

    def exp(self, d: np.ndarray) -> np.ndarray:
        """The format's rounded, saturated exp of raw values d <= 0."""
        d = np.asarray(d)
        return as_int(np.asarray(self.fmt.exp(np.asarray(d, dtype=np.int64 if d.dtype != object else object))))


def affine(enc: Enc, fm: Formats, x: Vec, W: np.ndarray, b: np.ndarray) -> Vec:
    """sat(sat(sum_i rnd(x_i W_ij)) + b_j): the format's matmul, then its add."""
    y = matmul(enc, fm, x, W)
    if y.block:
        arr = np.clip(wide(y.arr, bound(y.arr) + bound(b)) + b, fm.lo, fm.hi)
        return Vec(deps=y.deps, arr=as_int(arr))
    return Vec([clip(enc, add(enc, s, const(int(b[j]))), fm.lo, fm.hi) if b[j] else s
                for j, s in enumerate(y.syms)])

def matmul(enc: Enc, fm: Formats, x: Vec, W: np.ndarray) -> Vec:
    """sat(sum_i rnd(x_i W_ij)): rounded products summed exactly, saturated once."""
    d_out = W.shape[1]
    live = np.flatnonzero(np.any(W != 0, axis=1))
    if x.block:
        live = live[np.any(x.arr[..., live] != 0, axis=tuple(range(x.arr.ndim - 1)))] if live.size else live
        out = block_matmul(x.arr[..., live], W[live], fm.S, fm.nearest)
        return Vec(deps=x.deps, arr=as_int(np.clip(out, fm.lo, fm.hi)))
    acc = Acc(enc, d_out)
    syms = x.syms
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in live:
        s = syms[i]
        if is_zero(s):
            continue
        if isinstance(s, Tab):
            groups.setdefault(s.deps, []).append(int(i))
        else:
            for j in np.flatnonzero(W[i]):
                acc.add_sym(int(j), rnd(enc, mul_const(enc, s, int(W[i, j])), fm.S, fm.nearest))
    for deps, idx in groups.items():
        arr = as_int(np.stack([syms[i].arr for i in idx], axis=-1))
        acc.add(deps, block_matmul(arr, W[idx], fm.S, fm.nearest))
    return Vec([clip(enc, s, fm.lo, fm.hi) for s in acc.result()])

def add_vec(enc: Enc, fm: Formats, x: Vec, y: Vec) -> Vec:
    if x.block and y.block and x.deps == y.deps:
        return Vec(deps=x.deps, arr=as_int(np.clip(wide(x.arr, bound(x.arr) + bound(y.arr)) + y.arr, fm.lo, fm.hi)))
    return Vec([b if is_zero(a) else a if is_zero(b) else clip(enc, add(enc, a, b), fm.lo, fm.hi)
                for a, b in zip(x.syms, y.syms)])

def relu_vec(enc: Enc, x: Vec) -> Vec:
    if x.block:
        return Vec(deps=x.deps, arr=np.maximum(x.arr, 0))
    return Vec([clip(enc, s, 0, max(s.hi, 0)) for s in x.syms])


def block_matmul(x: np.ndarray, W: np.ndarray, S: int, nearest: bool) -> np.ndarray:
    """sum_i rnd(x[..., i] W[i, j]) for a block x [cells..., k] and raw weights W [k, d_out] (exact)."""
    lead = x.shape[:-1]
    k, d_out = W.shape
    if k == 0:
        return np.zeros(lead + (d_out,), dtype=np.int64)
    big = bound(x) * bound(W) * k
    if W.dtype != object and x.dtype != object and not np.any(W % S) and big < 1 << 53:
        return (x.reshape(-1, k).astype(np.float64) @ (W // S).astype(np.float64)).astype(np.int64).reshape(lead + (d_out,))
    xf = wide(x.reshape(-1, k), big)
    out = np.zeros((xf.shape[0], d_out), dtype=xf.dtype if xf.dtype == object else np.int64)
    rows = max(1, CHUNK // max(1, xf.shape[0] * d_out))
    for r0 in range(0, k, rows):
        blk = xf[:, r0 : r0 + rows, None] * W[None, r0 : r0 + rows, :]
        out = out + rnd_arr(blk, S, nearest).sum(axis=1)
    return out.reshape(lead + (d_out,))
