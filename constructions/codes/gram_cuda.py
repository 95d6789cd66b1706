"""Exact ``max_{i<j} |<x_i, x_j>|`` on a CUDA device (imported only when device="cuda").

The whole ``[n, k]`` int8 matrix lives on the device (2^20 x 256 is 256 MiB). A Triton kernel
computes the Gram matrix tile by tile on the int8 tensor cores and reduces every tile to its
maximum |entry| in registers, so nothing of size n^2 is ever written to memory (a blocked
``torch._int_mm`` that writes int32 tiles and reduces them afterwards took 4.4 s at n = 2^20,
k = 256; the int32 output alone is 2 TB of traffic). int8 x int8 products accumulated in int32 are
exact integer arithmetic, so the kernel is exact by construction (for k < 2^31).

Measured on an H200 (benchmarks/bench_position_codes.py --device cuda, 2026-11-30): n = 2^20,
k = 256 in 0.45 s (623 dense int8 TOPS counting only the i <= j half); end to end (vector generation
on the device included) 0.48 s. A bf16 variant of the same kernel ran out of shared memory at this
tile configuration and an fp8 variant did not compile under Triton 3.6; both were dropped (fp8
accumulation on Hopper is also not documented to be exact).

Only tiles (bi, bj) with bi <= bj are visited (symmetry). Tiles are enumerated in super-blocks of
``GS x GS`` tiles (a triangular walk over super-block pairs) so that the programs running at the
same time share ~2*GS row panels in L2; the kernel is persistent (2 programs per SM loop over the
tiles). Each tile writes one int32 (its max |entry| over valid pairs i < j < n, or -1); the maximum
and its first tile are found with torch on the device and the worst pair is located by recomputing
that single tile.

Without Triton (or with ``backend="torch"``), :func:`_gram_absmax_torch` does the same with
blocked float32 GEMMs (exact: entries in {-1, 0, 1} are exact in fp32 and in TF32, which cuBLAS may
use, products are exact and the fp32 accumulation of integers of magnitude <= k <= 2^24 is exact),
writing each [8192, 8192] tile to memory: correct but several times slower.
"""

from __future__ import annotations

import math
import time
import torch

try:  # pragma: no cover - exercised on GPU machines only
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover
    HAVE_TRITON = False


if HAVE_TRITON:  # pragma: no cover - GPU only

    @triton.jit
    def _tri(sp):
        # inverse of sp = sj*(sj+1)/2 + si with 0 <= si <= sj (fp32 sqrt, then corrected)
        f = sp.to(tl.float32)
        sj = ((tl.sqrt(8.0 * f + 1.0) - 1.0) * 0.5).to(tl.int32)
        sj = tl.where(sj * (sj + 1) // 2 > sp, sj - 1, sj)
        sj = tl.where((sj + 1) * (sj + 2) // 2 <= sp, sj + 1, sj)
        si = sp - sj * (sj + 1) // 2
        return si, sj

    @triton.jit
    def _gram_absmax_kernel(
        x_ptr,
        out_ptr,
        n,
        tile_start,
        tile_stop,
        stride_x,
        K: tl.constexpr,
        BM: tl.constexpr,
        BK: tl.constexpr,
        GS: tl.constexpr,
        NUM_PROGS: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs = tl.arange(0, BM)
        offk = tl.arange(0, BK)
        for t in tl.range(tile_start + pid, tile_stop, NUM_PROGS):
            sp = t // (GS * GS)
            loc = t % (GS * GS)
            si, sj = _tri(sp)
            bi = si * GS + loc // GS
            bj = sj * GS + loc % GS
            rows = bi * BM + offs
            cols = bj * BM + offs
            rmask = rows[:, None] < n
            cmask = cols[:, None] < n
            roff = rows.to(tl.int64)[:, None] * stride_x  # n * k may exceed 2^31
            coff = cols.to(tl.int64)[:, None] * stride_x
            acc = tl.zeros((BM, BM), dtype=tl.int32)
            if K <= 2 * BK:  # short K: unrolled (shared memory grows with the unrolled loads)
                for kk in tl.static_range(0, K, BK):
                    a = tl.load(x_ptr + roff + (kk + offk)[None, :], mask=rmask, other=0)
                    b = tl.load(x_ptr + coff + (kk + offk)[None, :], mask=cmask, other=0)
                    acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
            else:  # long K: a pipelined loop (num_stages buffers of BM x BK per operand)
                for kk in range(0, K, BK):
                    a = tl.load(x_ptr + roff + (kk + offk)[None, :], mask=rmask, other=0)
                    b = tl.load(x_ptr + coff + (kk + offk)[None, :], mask=cmask, other=0)
                    acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
            val = tl.abs(acc)
            valid = (rows[:, None] < cols[None, :]) & (cols[None, :] < n)
            val = tl.where(valid, val, -1)
            tl.store(out_ptr + t, tl.max(tl.max(val, axis=1), axis=0))


def tile_coords(t: int, GS: int) -> tuple[int, int]:
    """Python mirror of the kernel's tile enumeration: tile id -> (bi, bj) block indices."""
    sp, loc = divmod(t, GS * GS)
    sj = (math.isqrt(8 * sp + 1) - 1) // 2
    si = sp - sj * (sj + 1) // 2
    return si * GS + loc // GS, sj * GS + loc % GS


def num_tiles(n: int, BM: int, GS: int) -> int:
    nb = -(-n // BM)
    ns = -(-nb // GS)
    return ns * (ns + 1) // 2 * GS * GS


def prepare(X: torch.Tensor, BK: int = 128) -> torch.Tensor:
    """Pad the columns of an int8 [n, k] device tensor with zeros to a multiple of BK (zero
    columns do not change dot products)."""
    n, k = X.shape
    kp = -(-k // BK) * BK
    if kp != k:
        X = torch.cat([X, torch.zeros((n, kp - k), dtype=X.dtype, device=X.device)], dim=1)
    return X.to(torch.int8).contiguous()


def gram_absmax_cuda(
    X: torch.Tensor,
    *,
    backend: str = "triton",
    BM: int = 128,
    BK: int = 128,
    GS: int = 16,
    num_warps: int = 8,
    num_stages: int = 3,
    progress: bool = False,
    chunks: int = 16,
    prepared: bool = False,
):
    """Returns ``(max_dot, (i, j), seconds)`` for the int8 [n, k] CUDA tensor ``X`` (see module doc).

    ``backend``: "triton" (the fused kernel) or "torch" (the blocked bf16 fallback).

    ``prepared=True``: X is already the output of :func:`prepare` (benchmarks time the kernel
    alone)."""
    n = X.shape[0]
    t0 = time.perf_counter()
    Xp = X if prepared else prepare(X, BK)
    if backend == "torch" or not HAVE_TRITON:
        return _gram_absmax_torch(Xp, n, progress, t0)
    T = num_tiles(n, BM, GS)
    out = torch.empty(T, dtype=torch.int32, device=X.device)
    sm = torch.cuda.get_device_properties(X.device).multi_processor_count
    progs = sm * 2
    bounds = [T * c // chunks for c in range(chunks + 1)] if progress else [0, T]
    from tqdm.auto import tqdm

    with tqdm(total=T, disable=not progress, desc="certify (cuda)", unit="tile", leave=False) as bar:
        for a, b in zip(bounds[:-1], bounds[1:]):
            _gram_absmax_kernel[(progs,)](
                Xp, out, n, a, b, Xp.stride(0),
                K=Xp.shape[1], BM=BM, BK=BK, GS=GS, NUM_PROGS=progs,
                num_warps=num_warps, num_stages=num_stages,
            )
            if progress:
                torch.cuda.synchronize(X.device)
                bar.update(b - a)
    best = torch.max(out)
    t_best = int(torch.argmax(out).item())  # first tile attaining the maximum
    best = int(best.item())
    bi, bj = tile_coords(t_best, GS)
    pair = _locate(Xp, n, bi * BM, bj * BM, BM, best)
    return best, pair, time.perf_counter() - t0


def _locate(Xp: torch.Tensor, n: int, r0: int, c0: int, size: int, best: int) -> tuple[int, int]:
    A = Xp[r0 : min(n, r0 + size)].float()
    B = Xp[c0 : min(n, c0 + size)].float()
    G = (A @ B.T).abs()
    r = torch.arange(r0, r0 + A.shape[0], device=Xp.device)[:, None]
    s = torch.arange(c0, c0 + B.shape[0], device=Xp.device)[None, :]
    G.masked_fill_(~(r < s), -1)
    flat = int(torch.argmax(G).item())
    if int(G.max().item()) != best:  # pragma: no cover - consistency check
        raise AssertionError("kernel tile maximum and recomputed tile disagree")
    return r0 + flat // B.shape[0], c0 + flat % B.shape[0]


def _gram_absmax_torch(Xp: torch.Tensor, n: int, progress: bool, t0: float, block: int = 8192):
    """Fallback without Triton: blocked fp32 GEMMs (exact, see module doc) and on-device maxima."""
    Xb = Xp.to(torch.float32)
    best = torch.tensor(-1.0, device=Xp.device)
    best_tile = (0, 0)
    for I in range(0, n, block):
        for J in range(I, n, block):
            G = (Xb[I : I + block] @ Xb[J : J + block].T).abs()
            if J == I:
                G = torch.triu(G, diagonal=1)
            m = G.max()
            if bool(m > best):
                best, best_tile = m, (I, J)
    best = int(best.item())
    pair = _locate(Xp, n, best_tile[0], best_tile[1], block, best)
    return best, pair, time.perf_counter() - t0
