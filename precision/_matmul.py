"""Exact integer matrix products and the format's rounded matmul.

``imatmul`` computes an exact integer matrix product with float64 BLAS (numpy) or cuBLAS/MKL
(torch): a float64 matmul is exact when every partial sum is an integer of magnitude <= 2^53, which
holds when k * max|A| * max|B| <= 2^53 (every product and every partial sum is then bounded by that
number, in any summation order, FMA or not). Larger operands are split along k and/or into limbs
(A = sum_i A_i 2^(w_a i), likewise B) so that every partial product satisfies the bound; the limb
products are recombined exactly in int64 when the recombination bound is below 2^63, else in Python
ints (numpy object arrays; on torch the caller falls back to the numpy path, see ``NeedObject``).

The rounded matmul (``accumulate="rounded-products"``) rounds every product a_ik*b_kj/S, sums the
rounded products exactly and saturates once. Three exact paths:

* fast path: all residues a mod S (or b mod S) are zero, so every product is on the grid and the
  result is one integer product (A/S) @ B;
* indicator path (floor rounding): with a = a_h S + a_l, b = b_h S + b_l (0 <= a_l, b_l < S),
  floor(ab/S) = a_h b + a_l b_h + floor(a_l b_l / S); the last term summed over k equals
  sum_v [a_l == v] @ floor(v b_l / S) over the distinct nonzero residues v of one operand, so the
  whole result is 2 + u integer matmuls when u (the number of distinct residues) is small;
* elementwise path: products formed in chunks, rounded exactly (``_wide.muldiv``), summed over k.
"""

from __future__ import annotations

import math

import numpy as np

from . import _wide
from ._wide import F53, F63

#: elements per chunk in the elementwise paths
CHUNK = 1 << 20
#: use the indicator path when the operand's number of distinct nonzero residues is at most this
INDICATOR_MAX = 48


class NeedObject(Exception):
    """Raised on the torch backend when exactness needs Python integers (the caller reruns the op
    through the numpy object path and converts the saturated result back)."""


def _bcast_batch(A, B):
    return tuple(np.broadcast_shapes(tuple(A.shape[:-2]), tuple(B.shape[:-2])))


def _zeros_result(A, B, xp, obj=False):
    shape = _bcast_batch(A, B) + (A.shape[-2], B.shape[-1])
    if obj:
        return np.zeros(shape, dtype=object)
    return xp.zeros(shape)


def _limbs(X, L: int, w: int, obj: bool, xp):
    """Split integers X into L limbs of w bits (the top limb signed): X = sum_i X_i 2^(w i)."""
    if L == 1:
        return [X]
    mask = (1 << w) - 1
    out = []
    for i in range(L):
        s = X >> (w * i)
        out.append(s if i == L - 1 else s & mask)
    if obj:
        out = [np.asarray(o).astype(np.int64) for o in out]
    return out


def _plan_limbs(ab: int, bb: int, k: int):
    """Choose limb counts (La, Lb) and widths (wa, wb) and a k-chunk size so that
    kchunk * magA * magB <= 2^53 with the fewest BLAS calls (La*Lb*ceil(k/kchunk))."""
    best = None
    ba, bbits = ab.bit_length(), bb.bit_length()
    for La in range(1, 9):
        wa = ba if La == 1 else -(-ba // La)
        magA = ab if La == 1 else 1 << wa
        for Lb in range(1, 9):
            wb = bbits if Lb == 1 else -(-bbits // Lb)
            magB = bb if Lb == 1 else 1 << wb
            kc = F53 // (magA * magB)
            if kc < 1:
                continue
            kc = min(kc, k)
            calls = La * Lb * -(-k // kc)
            # penalise tiny k-chunks (BLAS inefficiency) a little
            cost = La * Lb * k + calls * 64
            if best is None or cost < best[0]:
                best = (cost, La, wa, magA, Lb, wb, magB, kc)
    if best is None:  # pragma: no cover - needs max|A|*max|B| > 2^53 even at 8 limbs each (> 2^400)
        raise NeedObject("operands too large for limb splitting")
    return best[1:]


def imatmul(A, B, ab: int, bb: int, xp, obj_in: bool = False):
    """Exact A @ B for integer arrays (>= 2-D, numpy matmul semantics) with |A| <= ab, |B| <= bb.

    Returns an int64 array, or a numpy object array (Python ints) when the result may reach 2^62.
    On torch the object case raises :class:`NeedObject`. ``obj_in``: A, B are object arrays.
    """
    k = A.shape[-1]
    if ab == 0 or bb == 0 or k == 0:
        return _zeros_result(A, B, xp)
    total = k * ab * bb
    fdt = xp.float_dtype()
    if total <= F53 and not obj_in:
        C = xp.matmul(A.astype(fdt) if not xp.torch else A.to(fdt), B.astype(fdt) if not xp.torch else B.to(fdt))
        return xp.i64(C)
    La, wa, magA, Lb, wb, magB, kc = _plan_limbs(ab, bb, k)
    nchunks = -(-k // kc)
    acc_bound = k * La * (magA << (wa * (La - 1))) * Lb * (magB << (wb * (Lb - 1)))
    obj_out = acc_bound >= (1 << 62)
    if obj_out and xp.torch:
        raise NeedObject("exact matmul result may exceed int64")
    Al = _limbs(A, La, wa, obj_in, xp)
    Bl = _limbs(B, Lb, wb, obj_in, xp)
    C = _zeros_result(A, B, xp, obj=obj_out)
    for i, a_i in enumerate(Al):
        for j, b_j in enumerate(Bl):
            shift = wa * i + wb * j
            for c in range(nchunks):
                k0, k1 = c * kc, min(k, (c + 1) * kc)
                if nchunks == 1:
                    aa, bbm = a_i, b_j
                else:
                    aa, bbm = a_i[..., k0:k1], b_j[..., k0:k1, :]
                if xp.torch:
                    P = xp.i64(xp.matmul(aa.to(fdt), bbm.to(fdt)))
                else:
                    P = np.matmul(aa.astype(np.float64), bbm.astype(np.float64)).astype(np.int64)
                if obj_out:
                    C = C + P.astype(object) * (1 << shift)
                else:
                    C = C + P * (1 << shift)
    return C


def _as_obj(x):
    return x if (isinstance(x, np.ndarray) and x.dtype == object) else np.asarray(x).astype(object)


def add_exact(x, y, xp):
    """x + y for int64 / object results of imatmul (object if either is)."""
    xo = isinstance(x, np.ndarray) and x.dtype == object
    yo = isinstance(y, np.ndarray) and y.dtype == object
    if xo or yo:
        if xp.torch:
            raise NeedObject("partial results exceed int64")
        return _as_obj(x) + _as_obj(y)
    return x + y


def residues(X, S: int, xp, obj: bool):
    """(X div S, X mod S) with 0 <= X mod S < S."""
    if not obj and _wide.is_pow2(S):
        f = S.bit_length() - 1
        return X >> f, X & (S - 1)
    h = X // S
    return h, X - h * S


def all_on_grid(X, S: int, xp, obj: bool) -> bool:
    if obj:
        return not bool(np.any(X % S != 0))
    if _wide.is_pow2(S):
        return not xp.any((X & (S - 1)) != 0)
    return not xp.any((X % S) != 0)


#: testing hook: force "indicator" or "elementwise" for the general rounded-products path
FORCE_PATH: str | None = None


def _distinct_nonzero(X, xp):
    u = xp.unique(X)
    return u[u != 0]


def _distinct_residues(r, S: int, xp):
    """Distinct nonzero values of residues 0 <= r < S (a histogram when S is small, else unique)."""
    if S <= (1 << 16):
        flat = r.reshape(-1)
        if xp.torch:
            cnt = xp.t.bincount(flat, minlength=S)
            return xp.t.nonzero(cnt[1:]).reshape(-1) + 1
        cnt = np.bincount(flat, minlength=S)
        return np.flatnonzero(cnt[1:]) + 1
    return _distinct_nonzero(r, xp)


def count_underflows(A, B, S: int, nearest: bool, xp, vals, use_a: bool) -> int:
    """#{(batch, i, k, j): a_ik b_kj != 0 and round(a_ik b_kj / S) == 0}, by counting per value v of
    the small (|v| < S) entries of one operand (``vals``: its distinct values, ``use_a``: which)."""
    total = 0
    for v in vals:
        v = int(v)
        if v == 0:
            continue
        lim = (S // (2 * abs(v))) if nearest else ((S - 1) // abs(v))
        if lim < 1:
            continue
        if use_a:
            cnt_fixed = xp.sum((A == v), axis=-2)  # [..., k]
            other = B
            if v > 0:
                good = (other > 0) & (other <= lim)
            else:
                good = (other < 0) & (other >= -lim)
            cnt_other = xp.sum(good, axis=-1)  # [..., k]
        else:
            cnt_fixed = xp.sum((B == v), axis=-1)
            other = A
            if v > 0:
                good = (other > 0) & (other <= lim)
            else:
                good = (other < 0) & (other >= -lim)
            cnt_other = xp.sum(good, axis=-2)
        total += int(xp.sum(xp.i64(cnt_fixed) * xp.i64(cnt_other)).item() if xp.torch
                     else np.sum(cnt_fixed.astype(np.int64) * cnt_other.astype(np.int64), dtype=np.int64))
    return total


def _scaled_floor_matmul(X, v: int, S: int, ind, xbound: int, x_left: bool, xp):
    """Exact floor(X v / S) @ ind (x_left) or ind @ floor(X v / S), ind a 0/1 matrix."""
    k = X.shape[-1] if x_left else X.shape[-2]
    if _wide.is_pow2(S) and xbound * v < F53 and k * xbound <= F53:
        # X v < 2^53 is exact in float64 and v/S is a power-of-two scaling of it: the floor is exact,
        # and k * max|floor(X v/S)| <= k * xbound <= 2^53 keeps the BLAS product exact.
        G = xp.floor(xp.f64(X) * (v / S))
        I = xp.f64(ind)
        return xp.i64(xp.matmul(G, I) if x_left else xp.matmul(I, G))
    G = _wide.muldiv(X, v, S, False, xp, xbound, v, S)  # |.| <= xbound
    return imatmul(G, ind, xbound, 1, xp) if x_left else imatmul(ind, G, 1, xbound, xp)


def matmul_indicator(A, B, S: int, xp, ab: int, bb: int, res_a, res_b, small_first_b: bool, force: bool = False):
    """Floor-rounded-products matmul via value indicators of one operand's residues, or None when
    the elementwise path is expected to be cheaper. Returns (C, underflows).

    With b = b_h S + b_l (0 <= b_l < S): floor(a b / S) = a b_h + floor(a b_l / S), and summed over k
    the last term is sum_v floor(A v / S) @ [b_l == v] over the distinct nonzero residues v of B:
    1 + u exact integer matmuls (symmetrically for A). ``res_a``/``res_b``: (X div S, X mod S)."""
    size_a = int(np.prod(A.shape))
    size_b = int(np.prod(B.shape))
    batch = _bcast_batch(A, B)
    P = max(1, math.prod(batch)) * A.shape[-2] * A.shape[-1] * B.shape[-1]
    cost_elem = 25.0 * P
    if P == 0:
        return None

    def cost(u):
        return u * 12.0 * (size_a + size_b) + (u + 1) * 0.25 * P

    # the largest u for which the indicator path is predicted to win
    u_allow = INDICATOR_MAX if force else min(INDICATOR_MAX, int((cost_elem - 0.25 * P) / (cost(1) - 0.25 * P)))
    if u_allow < 1 and not force:
        return None
    order = ("b", "a") if small_first_b else ("a", "b")
    choice = None
    for side in order:
        r = (res_b if side == "b" else res_a)[1]
        vals = _distinct_residues(r, S, xp)
        u = int(vals.shape[0])
        if force or u <= u_allow:
            choice = (side, vals)
            break
    if choice is None:
        return None
    side, vals = choice
    vals = vals.tolist()
    if side == "a":
        a_h, a_l = res_a
        C = imatmul(a_h, B, ab // S + 1, bb, xp)
        for v in vals:
            C = add_exact(C, _scaled_floor_matmul(B, int(v), S, a_l == int(v), bb, False, xp), xp)
        src = A
    else:
        b_h, b_l = res_b
        C = imatmul(A, b_h, ab, bb // S + 1, xp)
        for v in vals:
            C = add_exact(C, _scaled_floor_matmul(A, int(v), S, b_l == int(v), ab, True, xp), xp)
        src = B
    # values with 0 < |v| < S of the same operand (at most 2u of them) for the underflow count
    small = _distinct_nonzero(xp.where((src > -S) & (src < S), src, 0), xp)
    und = count_underflows(A, B, S, False, xp, small.tolist(), side == "a")
    return C, und


def matmul_elementwise(A, B, S: int, nearest: bool, xp, ab: int, bb: int, obj: bool):
    """Rounded-products matmul by forming the products in chunks. Returns (C, underflows)."""
    batch = _bcast_batch(A, B)
    m, k = A.shape[-2], A.shape[-1]
    n = B.shape[-1]
    qb = (ab * bb) // S + 1  # bound on each rounded product
    if not obj and (qb >= (1 << 61) or k * qb >= F63):
        if xp.torch:
            raise NeedObject("rounded products or their sum exceed int64")
        A, B, obj = np.asarray(A).astype(object), np.asarray(B).astype(object), True
    C = _zeros_result(A, B, xp, obj=obj)
    nb = max(1, math.prod(batch))
    per = nb * n
    kt = max(1, min(k, CHUNK // max(1, per)))
    mt = max(1, min(m, CHUNK // max(1, per * kt)))
    und = 0
    for i0 in range(0, m, mt):
        i1 = min(m, i0 + mt)
        part = None
        for k0 in range(0, k, kt):
            k1 = min(k, k0 + kt)
            Ac = A[..., i0:i1, k0:k1, None]
            Bc = B[..., None, k0:k1, :]
            q = _wide.muldiv(Ac, Bc, S, nearest, xp, ab, bb, S, obj=obj)
            z = (q == 0) & (Ac != 0) & (Bc != 0)
            und += int(np.count_nonzero(z)) if not xp.torch else xp.count(z)
            s = q.sum(axis=-2) if not xp.torch else q.sum(dim=-2)
            part = s if part is None else part + s
        C[..., i0:i1, :] = part
    return C, und
