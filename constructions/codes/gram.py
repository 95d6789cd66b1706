"""Exact maximum off-diagonal Gram entry of a set of integer vectors (CPU; CUDA in
:mod:`position_codes_cuda`).

Everything here computes ``max_{i<j} |<x_i, x_j>|`` for int8 vectors with entries in {-1, 0, 1}
and returns an exact integer. Floating point is used only where it is provably exact:

* float32 holds every integer of magnitude <= 2^24 exactly, products of entries in {-1, 0, 1}
  are exact, and every partial sum of a dot product of length k is an integer of magnitude <= k,
  so a float32 GEMM (any summation order, FMA or not) returns the exact integers while k <= 2^24.

* **Row packing** (CPU). The GEMM is the cost (2 cores give ~100 GFLOP/s), so two rows share one
  float32: with c a power of two, c > 2k, the packed row ``p = x_a + c * x_b`` gives
  ``<p, y> = S_a + c * S_b`` with ``|S_a|, |S_b| <= k < c/2``. Its partial sums are bounded by
  ``k(c + 1) < 2^22``, so the packed GEMM is still exact and computes two dot products per
  multiply-add. Decoding: ``S_b`` is extreme exactly where ``<p, y>`` is (consecutive S_b differ
  by c > 2k in the packed value), so ``max |S_b|`` comes from the min and max of the packed tile;
  ``S_a + c/2`` is the low log2(c) bits of the float's integer representation after adding
  ``1.5 * 2^23 + c/2`` (which puts every value in [2^23, 2^24), where the ulp is 1).

Tiles are visited once per unordered pair of blocks (symmetry), tiles that straddle the diagonal
are computed unpacked and masked to i < j. Only the first tile that attains the running maximum is
remembered; the worst pair is located at the end by recomputing that one tile.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that use it: importing it takes seconds, and most users of
# position codes (building, certifying a model) never run the Gram kernels.

BlockFn = Callable[[int, int], np.ndarray]  # (start, stop) -> int8 [stop - start, k]

K_EXACT_MAX = 1 << 24  # float32 GEMM of {-1,0,1} vectors is exact up to this length
NUMPY_WORK = 1 << 30  # n^2 k up to which one numpy product beats starting torch (whose import takes ~2 s)
_MAGIC = float(3 << 22)  # 1.5 * 2^23


@dataclass
class GramMax:
    """``max_dot = max |<x_i, x_j>|`` over the pairs i < j examined; ``pair`` attains it.

    ``complete`` is False when the scan stopped early because the running maximum exceeded
    ``stop_above`` (then ``max_dot`` is only a lower bound on the true maximum)."""

    max_dot: int
    pair: tuple[int, int]
    seconds: float
    complete: bool
    pairs_examined: int


def pack_base(k: int) -> Optional[int]:
    """The packing base c (a power of two > 2k), or None when packing would not be exact."""
    c = 1 << (2 * k).bit_length()
    if k * (c + 1) + c // 2 < (1 << 22):
        return c
    return None


def _progress(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="tile", leave=False)


class _Rows:
    """Float32 row panels, materialised once when they fit in ``cache_bytes``, else regenerated."""

    def __init__(self, block_fn: BlockFn, n: int, k: int, cache_bytes: int):
        import torch
        self.block_fn, self.n, self.k = block_fn, n, k
        self.full = None
        if n * k * 4 <= cache_bytes:
            full = torch.empty((n, k), dtype=torch.float32)
            step = max(1, (1 << 24) // max(k, 1))
            for s in range(0, n, step):
                e = min(n, s + step)
                full[s:e] = torch.from_numpy(np.asarray(block_fn(s, e), dtype=np.int8)).float()
            self.full = full

    def get(self, start: int, stop: int) -> torch.Tensor:
        import torch
        if self.full is not None:
            return self.full[start:stop]
        return torch.from_numpy(np.asarray(self.block_fn(start, stop), dtype=np.int8)).float()


def _packed_tile_max(P: torch.Tensor, Xj: torch.Tensor, c: int) -> int:
    import torch
    V = torch.mm(P, Xj.T)
    vmin, vmax = torch.aminmax(V)
    s_hi = max(abs(round(vmin.item() / c)), abs(round(vmax.item() / c)))
    V.add_(_MAGIC + c // 2)
    L = V.view(torch.int32).bitwise_and_(c - 1)
    lmin, lmax = torch.aminmax(L)
    s_lo = max(c // 2 - int(lmin.item()), int(lmax.item()) - c // 2)
    return max(s_lo, s_hi)


def _masked_abs(G: torch.Tensor, row0: int, col0: int, n: int) -> torch.Tensor:
    """|G| with entries whose (row0 + r, col0 + s) is not a pair i < j < n set to -1."""
    import torch
    r = torch.arange(row0, row0 + G.shape[0]).unsqueeze(1)
    s = torch.arange(col0, col0 + G.shape[1]).unsqueeze(0)
    A = G.abs()
    A.masked_fill_(~((r < s) & (s < n)), -1)
    return A


def gram_absmax_cpu(
    block_fn: BlockFn,
    n: int,
    k: int,
    *,
    progress: bool = False,
    stop_above: Optional[int] = None,
    block: int = 2048,
    cache_bytes: int = 1 << 30,
    pack: bool = True,
    workers: Optional[int] = None,
    desc: str = "certify",
) -> GramMax:
    """Exact ``max_{i<j<n} |<x_i, x_j>|`` where ``x_i = block_fn(i, i+1)[0]`` (see module doc).

    Row blocks are shared out to ``workers`` Python threads (default: torch's thread count) that
    each run single-threaded torch/MKL kernels (torch releases the GIL). Compared with one thread
    issuing multi-threaded kernels this avoids an OpenMP barrier per small op, which under CPU
    contention (other processes on the cores) cost up to 5x. torch's thread count is set to 1
    for the duration of the call and restored afterwards. The reported pair comes from the
    first tile (in (I, J) order) attaining the maximum, so it does not depend on scheduling.
    Small problems (n <= ``block`` and n^2 k <= :data:`NUMPY_WORK`) are one numpy product instead
    (:func:`_gram_absmax_numpy`): the same result, without importing torch."""
    if n < 2:
        raise ValueError("need at least two vectors")
    if k > K_EXACT_MAX:
        raise ValueError(f"k must be <= 2^24 for exact float32 accumulation (got {k})")
    t0 = time.perf_counter()
    if n <= block and n * n * k <= NUMPY_WORK:
        return _gram_absmax_numpy(np.asarray(block_fn(0, n), dtype=np.float32), max(1, block // 2), t0)
    import torch
    c = pack_base(k) if pack else None
    BI = block
    BJ = max(1, block // 2)
    rows = _Rows(block_fn, n, k, cache_bytes)
    n_tiles = sum(len(range(I, n, BJ)) for I in range(0, n, BI))
    i_blocks = iter(range(0, n, BI))
    lock = threading.Lock()
    stop = threading.Event()
    results: list = []
    errors: list = []
    bar = _progress(n_tiles, progress, desc)

    def work() -> None:
        best, tile, examined = -1, None, 0
        try:
            while not stop.is_set():
                with lock:
                    I = next(i_blocks, None)
                if I is None:
                    break
                Xi = rows.get(I, min(n, I + BI))
                P = None
                for J in range(I, n, BJ):
                    if stop.is_set():
                        break
                    Xj = rows.get(J, min(n, J + BJ))
                    if J < I + Xi.shape[0] or c is None:
                        m = int(_masked_abs(torch.mm(Xi, Xj.T), I, J, n).max().item())
                        i = np.arange(I, I + Xi.shape[0])
                        examined += int(np.clip(min(n, J + Xj.shape[0]) - np.maximum(J, i + 1), 0, None).sum())
                    else:
                        if P is None:
                            Xe = Xi if Xi.shape[0] % 2 == 0 else torch.cat([Xi, torch.zeros(1, k)])
                            P = Xe[0::2] + float(c) * Xe[1::2]
                        m = _packed_tile_max(P, Xj, c)
                        examined += Xi.shape[0] * Xj.shape[0]
                    if m > best:  # tiles arrive in increasing (I, J) order within a worker
                        best, tile = m, (I, Xi.shape[0], J, Xj.shape[0])
                    bar.update(1)
                    if stop_above is not None and m > stop_above:
                        stop.set()
                        break
        except BaseException as e:  # pragma: no cover - re-raised in the caller
            errors.append(e)
            stop.set()
        with lock:
            results.append((best, tile, examined))

    nw = max(1, workers if workers is not None else torch.get_num_threads())
    prev = torch.get_num_threads()
    try:
        if nw > 1:
            torch.set_num_threads(1)
            threads = [threading.Thread(target=work, daemon=True) for _ in range(nw)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            work()
    finally:
        torch.set_num_threads(prev)
        bar.close()
    if errors:
        raise errors[0]
    best = max(r[0] for r in results)
    I, ni, J, nj = min(r[1] for r in results if r[0] == best and r[1] is not None)
    examined = sum(r[2] for r in results)
    complete = not (stop_above is not None and best > stop_above)
    A = _masked_abs(torch.mm(rows.get(I, I + ni), rows.get(J, J + nj).T), I, J, n)
    flat = int(torch.argmax(A).item())
    pair = (I + flat // nj, J + flat % nj)
    if int(A.max().item()) != best:  # pragma: no cover - internal consistency check
        raise AssertionError("packed and unpacked tile maxima disagree")
    return GramMax(best, pair, time.perf_counter() - t0, complete, examined)


def _gram_absmax_numpy(X: np.ndarray, bj: int, t0: float) -> GramMax:
    """:func:`gram_absmax_cpu` of the float32 rows ``X`` [n, k] in one product (exact: integer
    entries, |sums| <= k <= 2^24); the pair is the first in the order of the blocked scan (column
    blocks of ``bj``, then row-major within the block)."""
    n = X.shape[0]
    A = np.abs(X @ X.T)
    A[np.tril_indices(n)] = -1
    best = int(A.max())
    J = next(J for J in range(0, n, bj) if A[:, J:J + bj].max() == best)
    tile = A[:, J:J + bj]
    i, j = np.unravel_index(int(np.argmax(tile)), tile.shape)
    return GramMax(best, (int(i), J + int(j)), time.perf_counter() - t0, True, n * (n - 1) // 2)


def prefix_absmax(X: np.ndarray, step: int) -> np.ndarray:
    """``M[g] = max_{i<j} |<X_i[:k_g], X_j[:k_g]>|`` for ``k_g = (g+1)*step`` and all g with
    ``k_g <= X.shape[1]`` (exact: float32 sums of integers below 2^24; for the small subsets used
    to bound the random search)."""
    X = np.asarray(X, dtype=np.float32)
    n0, K = X.shape
    G = np.zeros((n0, n0), dtype=np.float32)
    lower = np.tril(np.ones((n0, n0), dtype=bool))
    out = []
    for g in range(K // step):
        Xc = X[:, g * step : (g + 1) * step]
        G += Xc @ Xc.T
        out.append(int(np.abs(np.where(lower, 0, G)).max()))
    return np.array(out, dtype=np.int64)
