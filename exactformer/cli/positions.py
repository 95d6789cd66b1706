"""``exactformer positions``: build (and optionally certify) a near-orthogonal position code.

Registered by exactformer/cli/main.py as ``app.command("positions")(positions)``. Conventions of
:mod:`exactformer.cli.output`: a bad argument prints one line ``error: ...`` on stderr (and
``{"error": ...}`` on stdout under --json) and exits 2; with ``--json`` stdout holds exactly one
JSON object (schema in docs/cli.md); progress bars go to stderr, on a terminal only.

``--certify`` first measures a slice of the certificate's own work and extrapolates; above
``CERTIFY_LIMIT_S`` it refuses with the estimate unless ``--force`` is given.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import typer

from exactformer.constructions.codes.positions import PositionCode, PositionCodeError, position_codes
from exactformer.arguments import ArgumentError, parse_int
from exactformer.cli.output import fail, print_json, print_table
from exactformer.verify.verifier import VerifyError, check_device

CERTIFY_LIMIT_S = 600.0  # --certify beyond this estimate needs --force


def _fs(f):
    return None if f is None else f"{f.numerator}/{f.denominator}"


def certify_estimate(code: PositionCode, device: str) -> float:
    """Seconds ``code.certify(device)`` will take, from a timed slice of the same work: the
    algebraic scan's agreement counts (reed-solomon: 2^ceil(log2 n) of them), or one Gram tile of
    the all-pairs scan (random; n(n-1)/2 pairs of length k); 0 for onehot (nothing to compute)."""
    if code.family == "onehot":
        return 0.0
    if code.family == "reed-solomon":
        L = 1 << (code.n - 1).bit_length()
        m = min(L - 1, 1 << 16)
        code.agreements(np.arange(1, m + 1))  # builds the tables
        t0 = time.perf_counter()
        code.agreements(np.arange(1, m + 1))
        return (time.perf_counter() - t0) * (L - 1) / m
    import torch  # imported here: the other commands' start-up does not wait for it

    rows = min(code.n, 2048)
    X = torch.ones(rows, code.k, device=device)
    for _ in range(2):  # the first product warms up the kernels
        t0 = time.perf_counter()
        (X @ X.T).sum().item()
        dt = time.perf_counter() - t0
    return dt * code.n * (code.n - 1) / 2 / (rows * rows)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} hours" if seconds >= 3600 else f"{seconds / 60:.1f} minutes"


def positions(
    n: str = typer.Option(..., "--n", metavar="N", help="number of positions (codes cover 0..n-1): an integer or 2^k"),
    max_inner: str = typer.Option("1/4", "--max-inner", metavar="MU",
                                  help="largest allowed |<T(i),T(j)>|, i != j, in (0, 1)"),
    family: str = typer.Option("auto", "--family", metavar="FAMILY", help="auto | reed-solomon | random | onehot"),
    seed: int = typer.Option(0, "--seed", metavar="SEED", help="seed of the random family"),
    certify: bool = typer.Option(False, "--certify", help="compute the exact maximum inner product; refused when "
                                                          "the measured estimate exceeds 10 minutes, unless --force"),
    force: bool = typer.Option(False, "--force", help="with --certify: run however long the estimate says"),
    device: str = typer.Option("cpu", "--device", metavar="DEVICE", help="cpu | cuda (certification kernels)"),
    json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Build a position code and print family, k, q, d, bound, paper_k (and the certificate)."""
    if force and not certify:
        fail("--force: only with --certify", json)
    try:
        check_device(device)
    except VerifyError as e:
        fail(f"--device: {e.reason}", json)
    tty = sys.stderr.isatty()
    t0 = time.perf_counter()
    estimate = None
    try:
        code = position_codes(parse_int(n, "--n", "an integer >= 2 or 2^k"), max_inner, family, seed, device=device,
                              progress=tty)
        build_s = time.perf_counter() - t0
        if certify:
            estimate = certify_estimate(code, device)
            if estimate > CERTIFY_LIMIT_S and not force:
                fail(f"--certify: certifying n = {code.n} ({code.family}) would take about {_duration(estimate)} "
                     f"on this machine (measured on a slice); pass --force to run it anyway", json)
        cert = code.certify(device=device, progress=tty) if certify else None
    except (PositionCodeError, ArgumentError) as e:
        fail(str(e), json)
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
        "certify_estimate_seconds": None if estimate is None else round(estimate, 3),
        "seconds": round(total_s, 6),
    }
    if code.certificate is not None and cert is None:  # random codes carry their search certificate
        out["search_certified_max"] = _fs(code.certificate.max_inner)
    if json:
        print_json(out)
        return
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
    print_table(f"position code, n = {code.n}", ["quantity", "value"], rows, header=False)
