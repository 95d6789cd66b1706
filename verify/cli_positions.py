"""``exactformer positions``: build (and optionally certify) a near-orthogonal position code.

Registered by verify/cli.py as ``app.command("positions")(positions)``. Errors in the arguments
(PositionCodeError) print one line to stderr and exit with status 2. With ``--json`` stdout holds
exactly one JSON object; progress bars go to stderr.
"""

from __future__ import annotations

import json as _json
import sys
import time

import typer

from exactformer.constructions.position_codes import PositionCodeError, position_codes


def _fs(f):
    return None if f is None else f"{f.numerator}/{f.denominator}"


def positions(
    n: int = typer.Option(..., "--n", help="number of positions (codes cover 0..n-1)"),
    max_inner: str = typer.Option("1/4", "--max-inner", help="largest allowed |<T(i),T(j)>|, i != j, in (0, 1)"),
    family: str = typer.Option("auto", "--family", help="auto | reed-solomon | random | onehot"),
    seed: int = typer.Option(0, "--seed", help="seed of the random family"),
    certify: bool = typer.Option(False, "--certify", help="compute the exact maximum inner product"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda (certification kernels)"),
    json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Build a position code and print family, k, q, d, bound, paper_k (and the certificate)."""
    t0 = time.perf_counter()
    try:
        code = position_codes(n, max_inner, family, seed, device=device, progress=not json)
        build_s = time.perf_counter() - t0
        cert = code.certify(device=device, progress=True) if certify else None
    except PositionCodeError as e:
        if json:
            print(_json.dumps({"error": str(e)}))
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    total_s = time.perf_counter() - t0
    out = {
        "family": code.family,
        "n": code.n,
        "k": code.k,
        "q": code.q,
        "d": code.d,
        "seed": code.seed,
        "max_inner": _fs(code.max_inner),
        "bound": _fs(code.bound),
        "paper_k": code.paper_k,
        "certified_max": _fs(cert.max_inner) if cert else None,
        "pair": list(cert.pair) if cert else None,
        "passed": cert.passed if cert else None,
        "method": cert.method if cert else None,
        "device": device,
        "build_seconds": round(build_s, 6),
        "certify_seconds": round(cert.seconds, 6) if cert else None,
        "seconds": round(total_s, 6),
    }
    if code.certificate is not None and cert is None:  # random codes carry their search certificate
        out["search_certified_max"] = _fs(code.certificate.max_inner)
    if json:
        print(_json.dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"position code, n = {code.n}", show_header=False)
    rows = [
        ("family", code.family),
        ("k", str(code.k)),
        ("q", str(code.q)),
        ("d", str(code.d)),
        ("seed", str(code.seed)),
        ("max_inner (requested)", _fs(code.max_inner)),
        ("bound (proved)", str(_fs(code.bound))),
        ("paper_k = ceil(8 ln(2n)/gamma^2)", str(code.paper_k)),
    ]
    if code.certificate is not None:
        rows.append(("certified max (search)", _fs(code.certificate.max_inner)))
    if cert is not None:
        rows += [
            ("certified max", f"{_fs(cert.max_inner)} ({'<=' if cert.passed else '>'} {_fs(code.max_inner)})"),
            ("worst pair", f"{cert.pair[0]}, {cert.pair[1]}"),
            ("method / device", f"{cert.method} / {device}"),
            ("certification time", f"{cert.seconds:.3f} s"),
        ]
    rows.append(("total time", f"{total_s:.3f} s"))
    for a, b in rows:
        table.add_row(a, b)
    Console(file=sys.stdout).print(table)
