"""``exactformer attention``: run EMA, ANNA (Alg. 1) or dense softmax attention on generated data,
check it and print time, memory and the check (docs/ema.md, "CLI").

Registered by exactformer/cli/main.py as ``app.command("attention")(attention)``. A bad option prints one line
``error: <parameter>: <what is allowed>`` on stderr and exits 2 (with ``--json`` also
``{"error": ...}`` on stdout); a failed check exits 1.
"""

from __future__ import annotations

import math
import resource
import time
import tracemalloc
from typing import Any, Optional

import numpy as np
import typer

from exactformer.precision import FixedPoint, PrecisionError, parse_format
from exactformer.verify.attention.anna import FAMILIES, ANNAError, LSHAttention, check_conditions, family, planted_data, thm34
from exactformer.cli.output import fail, print_json, print_table
from exactformer.verify.attention.ema import EMAError, ema_dense_reference, exact_match_attention, lowered_head_vectors
from exactformer.verify.verifier import VerifyError, check_device

KINDS = ("ema", "anna", "dense")
MATCHES = "unique | random | few:K | none | all"
EXHAUSTIVE_MAX = 4096  # EMA: every query is checked against the dense reference up to this N
DENSE_MAX = 1 << 16  # dense attention: N^2 scores, computed in blocks of rows
DENSE_BLOCK = 1 << 24  # scores per block


class _Bad(Exception):
    """A bad option: (parameter, what is allowed)."""


def _int(text: Optional[str], name: str, lo: int, hi: int, default: int) -> int:
    if text is None:
        return default
    try:
        v = int(text, 0)
    except ValueError:
        raise _Bad(f"{name}: must be an integer in [{lo}, {hi}], got {text!r}") from None
    if not lo <= v <= hi:
        raise _Bad(f"{name}: must be an integer in [{lo}, {hi}], got {v}")
    return v


def _only(kind: str, allowed: tuple[str, ...], **given: Any) -> None:
    for name, value in given.items():
        if value is not None and kind not in allowed:
            raise _Bad(f"--{name.replace('_', '-')}: only with --kind {' or '.join(allowed)}")


def _key_ids(matches: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(query ids, key ids) of one batch row for a --matches pattern."""
    if matches == "unique":
        return np.arange(n), rng.permutation(n)
    if matches == "random":
        return rng.integers(0, n, n), rng.integers(0, n, n)
    if matches == "none":
        return rng.integers(n, 2 * n, n), rng.integers(0, n, n)
    if matches == "all":
        return np.zeros(n, np.int64), np.zeros(n, np.int64)
    if matches.startswith("few:"):
        try:
            k = int(matches[4:])
        except ValueError:
            k = 0
        if k >= 1:
            return rng.integers(0, k, n), rng.integers(0, k, n)
    raise _Bad(f"--matches: must be one of {MATCHES} (K >= 1), got {matches!r}")


def _words(ids: np.ndarray, kw: int) -> np.ndarray:
    """kw words per id; word t > 0 is (a_t * id + b_t) mod (2^61 - 1): injective, so rows are equal iff ids are."""
    p = (1 << 61) - 1
    cols = [ids]
    for t in range(1, kw):
        a, b = 0x9E3779B97F4A7C15 % p + t, 12345 * t
        cols.append(((ids.astype(object) * a + b) % p).astype(np.int64))
    return np.stack(cols, -1)


def _memory(traced: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    out["traced_peak_mib"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 1) if traced else None
    return out


def _timed(fn, device: str):
    """Run fn once, returning (result, seconds, memory): numpy allocations traced on the CPU, the CUDA
    allocator's peak on CUDA."""
    import torch

    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        tracemalloc.start()
    t0 = time.perf_counter()
    res = fn()
    if cuda:
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    mem = _memory(not cuda)
    if cuda:
        mem["cuda_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    else:
        tracemalloc.stop()
    return res, secs, mem


def _to(device: str, *arrs):
    if device == "cpu":
        return arrs
    import torch

    return tuple(None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrs)


def _host(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


# ------------------------------------------------------------------------------------------------
# the three kinds
# ------------------------------------------------------------------------------------------------


def _run_ema(n, d, batch, kw, matches, fmt, samples, seed, device) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    ids = [_key_ids(matches, n, rng) for _ in range(batch)]
    q = np.stack([_words(a, kw) for a, _ in ids])
    k = np.stack([_words(b, kw) for _, b in ids])
    if fmt is None:
        v = rng.integers(-(1 << 20), 1 << 20, (batch, n, d))
    else:
        m = min(1 << 20, fmt.max_raw // fmt.scale)
        v = rng.integers(-m, m + 1, (batch, n, d)) * fmt.scale  # integer payloads
    data_s = time.perf_counter() - t0
    Q, K, V = _to(device, q, k, v)
    res, secs, mem = _timed(lambda: exact_match_attention(Q, K, V, fmt=fmt), device)
    count, total = _host(res.count), _host(res.total)
    t0 = time.perf_counter()
    if batch * n <= EXHAUSTIVE_MAX:
        rows, method = None, "dense reference, every query"
    else:
        flat = np.sort(np.random.default_rng(seed + 1).choice(batch * n, min(samples, batch * n), replace=False))
        rows, method = [(int(i) // n, int(i) % n) for i in flat], f"dense reference, {len(flat)} sampled queries"
    ref = ema_dense_reference(q, k, v, fmt=fmt, rows=rows)
    todo = rows if rows is not None else [(b, i) for b in range(batch) for i in range(n)]
    bad = sum(1 for b, i in todo if int(count[b, i]) != int(ref.count[b, i])
              or total[b, i].tolist() != ref.total[b, i].tolist())
    check = {"method": method, "exact": True, "queries_checked": len(todo), "sampled": rows is not None,
             "seed": seed + 1 if rows is not None else None, "mismatches": bad, "passed": bad == 0}
    return {
        "batch": batch, "key_words": kw, "matches": matches, "precision": None if fmt is None else fmt.name,
        "seconds": round(secs, 6), "data_seconds": round(data_s, 6), "check_seconds": round(time.perf_counter() - t0, 6),
        "memory": mem,
        "stats": {"matched_queries": int((count > 0).sum()), "max_count": res.preconditions.max_count},
        "preconditions": res.preconditions.as_dict(), "check": check,
        "passed": check["passed"] and res.preconditions.ok,
    }


def _run_dense(n, d, matches, samples, seed, device) -> dict[str, Any]:
    """float64 softmax attention of the B.6-lowered head (eta = ln N + 20) beside exact EMA."""
    import torch

    if n > DENSE_MAX:
        raise _Bad(f"--n: dense attention needs N^2 scores; allowed N <= {DENSE_MAX}, got {n}")
    rng = np.random.default_rng(seed)
    qi, ki = _key_ids(matches, n, rng)
    v = rng.integers(-1000, 1001, (n, d))
    bits = max(2, int(max(qi.max(), ki.max())).bit_length())
    fmt = FixedPoint(1, -(1 << 60), 1 << 60)  # the integer grid: the vectors are exact integers
    Qi, Ki = lowered_head_vectors(qi, ki, bits=bits, eta=1, fmt=fmt)
    eta = math.log(n) + 20
    dev = torch.device(device)
    Qt = torch.from_numpy(Qi.astype(np.float64) * eta).to(dev)
    Kt = torch.from_numpy(Ki.astype(np.float64)).to(dev)
    Vt = torch.from_numpy(np.concatenate([np.zeros((1, d)), v]).astype(np.float64)).to(dev)

    def dense():
        out = torch.empty((n, d), dtype=torch.float64, device=dev)
        rows = max(1, DENSE_BLOCK // (n + 1))
        for r0 in range(0, n, rows):
            s = Qt[r0:r0 + rows] @ Kt.T
            out[r0:r0 + rows] = torch.softmax(s, -1) @ Vt
        return out

    out, secs, mem = _timed(dense, device)
    t0 = time.perf_counter()
    exact = exact_match_attention(qi[:, None], ki[:, None], v)
    mean = np.where(exact.count[:, None] > 0, exact.total / np.maximum(exact.count, 1)[:, None], 0.0)
    err = float(np.abs(_host(out) - mean).max()) if n * d else 0.0
    tol = 1e-6 * 1000
    check = {"method": "float64 softmax of the lowered head vs the exact EMA mean, every query", "exact": False,
             "queries_checked": n, "max_abs_error": err, "tolerance": tol, "passed": err <= tol}
    return {"matches": matches, "eta": eta, "bits": bits, "scores": n * (n + 1), "seconds": round(secs, 6),
            "check_seconds": round(time.perf_counter() - t0, 6), "memory": mem, "check": check,
            "passed": check["passed"]}


def _run_anna(n, d, fam_name, tables, hashes, near, approx_c, samples, seed, device) -> dict[str, Any]:
    fam = family(fam_name)
    sphere = fam.on_sphere
    pd = planted_data(n, n, d, near, planted=0.9, sphere=sphere, seed=seed)
    radius_sq = d if sphere else None
    p1, p2 = (float(p) for p in fam.collision_probability(np.array([pd.r_sq, approx_c ** 2 * pd.r_sq]), d, radius_sq))
    if not 0 < p2 < p1:
        raise _Bad(f"--approx-c: c r must stay below the data's far distances: p(cr) = {p2:.3g} must be in (0, p(r))")
    th = thm34(max(n, 2), p1, p2, tables=tables, hashes=hashes)
    lsh = LSHAttention(fam, d, tables=th.tables, hashes=th.hashes, seed=seed)
    v = np.random.default_rng(seed + 2).integers(-1000, 1001, (n, 1))
    Q, K, V = _to(device, pd.queries, pd.keys, v)
    res, secs, mem = _timed(lambda: lsh(Q, K, V), device)
    t0 = time.perf_counter()
    rep = check_conditions(lsh, pd.queries, pd.keys, r_sq=pd.r_sq, approx_c=approx_c,
                           sample=samples if samples < n else None, seed=seed + 1)
    check = {k: v for k, v in rep.as_dict().items() if k != "theorem"}
    check["method"] = "Def. 3.3 conditions, exact distances and collision counts"
    check["passed"] = not rep.failed
    return {"family": fam.name, "tables": th.tables, "hashes": th.hashes, "near_flips": near, "approx_c": approx_c,
            "r_sq": pd.r_sq, "p1": p1, "p2": p2, "rho": th.rho, "theorem": th.as_dict(),
            "matched_queries": int((_host(res.den) > 0).sum()), "seconds": round(secs, 6),
            "check_seconds": round(time.perf_counter() - t0, 6), "memory": mem, "check": check,
            "passed": check["passed"]}


# ------------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------------


def attention(
    kind: str = typer.Option(..., "--kind", metavar="KIND", help="ema | anna | dense"),
    n: str = typer.Option(..., "--n", metavar="N", help="context length N (queries = keys = N per batch row)"),
    d: Optional[str] = typer.Option(None, "--d", metavar="D", help="value width (ema, dense; default 64) / point dimension (anna; default 64)"),
    matches: Optional[str] = typer.Option(None, "--matches", metavar="MATCHES", help=f"ema, dense: key pattern {MATCHES} (default random)"),
    key_words: Optional[str] = typer.Option(None, "--key-words", metavar="WORDS", help="ema: int64 words per key (default 1)"),
    batch: Optional[str] = typer.Option(None, "--batch", metavar="B", help="ema: batch size B (default 1)"),
    precision: Optional[str] = typer.Option(None, "--precision", metavar="FORMAT", help="ema: fixed point binary:int=I,frac=F (default: ideal)"),
    tables: Optional[str] = typer.Option(None, "--tables", metavar="L", help="anna: hash tables ℓ (default: Thm 3.4)"),
    hashes: Optional[str] = typer.Option(None, "--hashes", metavar="Z", help="anna: hashes per table z (default: Thm 3.4)"),
    lsh_family: Optional[str] = typer.Option(None, "--family", metavar="FAMILY", help=f"anna: {' | '.join(FAMILIES)} (default bit-sampling)"),
    near: Optional[str] = typer.Option(None, "--near", metavar="NEAR", help="anna: planted queries differ in <= NEAR bits (default d/32)"),
    approx_c: Optional[str] = typer.Option(None, "--approx-c", metavar="C", help="anna: approximation factor c (default 3)"),
    check_queries: Optional[str] = typer.Option(None, "--check-queries", metavar="COUNT", help="queries checked when N is large (default 256)"),
    seed: Optional[str] = typer.Option(None, "--seed", metavar="SEED", help="seed of the generated data and hash functions (default 0)"),
    device: str = typer.Option("cpu", "--device", metavar="DEVICE", help="cpu (numpy; dense: torch) | cuda (torch)"),
    json: bool = typer.Option(False, "--json", help="print one JSON object on stdout (schema: docs/cli.md)"),
) -> None:
    """Run EMA, ANNA (Alg. 1) or dense attention on generated data and check it."""
    try:
        out = _attention(kind, n, d, matches, key_words, batch, precision, tables, hashes, lsh_family, near,
                         approx_c, check_queries, seed, device)
    except (_Bad, EMAError, ANNAError, PrecisionError, MemoryError) as e:
        fail(str(e) if isinstance(e, _Bad) else f"{type(e).__name__}: {e}", json)
    if json:
        print_json(out)
    else:
        _print(out)
    if not out["passed"]:
        raise typer.Exit(1)


def _attention(kind, n, d, matches, key_words, batch, precision, tables, hashes, lsh_family, near, approx_c,
               check_queries, seed, device) -> dict[str, Any]:
    if kind not in KINDS:
        raise _Bad(f"--kind: must be one of {' | '.join(KINDS)}, got {kind!r}")
    try:
        check_device(device)
    except VerifyError as e:
        raise _Bad(f"--device: {e.reason}") from None
    _only(kind, ("ema", "dense"), matches=matches)
    _only(kind, ("ema",), key_words=key_words, batch=batch, precision=precision)
    _only(kind, ("anna",), tables=tables, hashes=hashes, family=lsh_family, near=near, approx_c=approx_c)
    N = _int(n, "--n", 1, 1 << 26, 0)
    D = _int(d, "--d", 1 if kind != "ema" else 0, 4096, 64)
    samples = _int(check_queries, "--check-queries", 1, 1 << 20, 256)
    s = _int(seed, "--seed", 0, 2**32 - 1, 0)
    head = {"kind": kind, "n": N, "d": D, "device": device, "seed": s}
    if kind == "ema":
        fmt = None
        if precision is not None:
            try:
                fmt = parse_format(precision)
            except ValueError as e:
                raise _Bad(f"--precision: {e}") from None
            if not isinstance(fmt, FixedPoint):
                raise _Bad(f"--precision: must be a fixed-point format (binary:int=I,frac=F), got {precision!r}")
        B = _int(batch, "--batch", 1, 1 << 16, 1)
        kw = _int(key_words, "--key-words", 1, 64, 1)
        body = _run_ema(N, D, B, kw, matches or "random", fmt, samples, s, device)
        head["backend"] = "numpy" if device == "cpu" else "torch"
    elif kind == "dense":
        body = _run_dense(N, D, matches or "random", samples, s, device)
        head["backend"] = "torch"
    else:
        near_v = _int(near, "--near", 0, D, max(1, D // 32))
        try:
            c = float(approx_c) if approx_c is not None else 3.0
        except ValueError:
            c = 0.0
        if not c > 1 or not math.isfinite(c):
            raise _Bad(f"--approx-c: must be a number > 1, got {approx_c!r}")
        fam = lsh_family or "bit-sampling"
        if fam not in FAMILIES:
            raise _Bad(f"--family: must be one of {' | '.join(FAMILIES)}, got {fam!r}")
        body = _run_anna(N, D, fam, _int(tables, "--tables", 1, 1 << 20, 0) or None,
                         _int(hashes, "--hashes", 1, 4096, 0) or None, near_v, c, samples, s, device)
        head["backend"] = "numpy" if device == "cpu" else "torch"
    return head | body


def _print(out: dict[str, Any]) -> None:
    rows = [[key, ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else value]
            for key, value in out.items()]
    print_table(f"attention --kind {out['kind']}, N = {out['n']}", ["quantity", "value"], rows, header=False)
