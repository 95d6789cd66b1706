"""Size and eta/precision tables of the two-layer Boolean constructions (Theorems 6 and 13), written
into docs/equality.md and docs/thresholds.md between ``<!-- TABLE:{table}-{kind} -->`` markers.

Usage:
  python benchmarks/boolean_tables.py sizes KIND [--min-log-n 4] [--max-log-n 20] [--certify-up-to 20] [--write DOC]
  python benchmarks/boolean_tables.py eta KIND [--min-log-n 4] [--max-log-n 12] [--write DOC]

KIND is a registered construction: equality, inequality, disjointness, dnf, cnf, threshold. Every
number is computed here: models from the registered builders (default settings unless a column
says otherwise), proofs from the composed certificate (verify/certify/composed.py).
"""

from __future__ import annotations

import argparse
import re
import time
from fractions import Fraction
from pathlib import Path
from typing import Callable

from exactformer.constructions.core import registry
from exactformer.constructions.core.ir import CompiledModel
from exactformer.precision import FixedPoint, Format, parse_format
from exactformer.verify.certify.composed import CertificateResult, certify

KINDS = ("equality", "inequality", "disjointness", "dnf", "cnf", "threshold")
SCAN_LIMIT = 256  # grid etas below the builder's scanned one by one (else bisection)
MAX_BITS = 64


def certified(model: CompiledModel, fmt: Format) -> CertificateResult:
    return certify(model, fmt, registry.task_of(model))


def one_hot(res: CertificateResult) -> bool:
    """Every first-layer retrieval row proved exactly one-hot (target weight 1, stray weight 0)."""
    heads = [h for h in res.details.get("heads", []) if h["block"] == "RetrieveByPosition"]
    return bool(heads) and all((h["min_target_weight"], h["max_stray_weight"]) == ("1", "0") for h in heads)


def size_table(kind: str, lo: int, hi: int, certify_up_to: int = 20) -> str:
    """Markdown size table for N = 2^lo .. 2^hi (default builder settings), certified up to
    2^certify_up_to."""
    build = registry.get(kind).builder
    head = ("| N | code (family, k) | mu | eta used | eta paper | Kc | precision | p (bits) | d_model | width | "
            "d_mlp | heads | parameters | size (bits) | certificate | build s | certify s |")
    rows = [head, "|" + "---|" * 17]
    for e in range(lo, hi + 1):
        n = 1 << e
        t0 = time.perf_counter()
        m = build(n)
        tb = time.perf_counter() - t0
        P = m.params
        cert, tc = "-", 0.0
        if e <= certify_up_to:
            t1 = time.perf_counter()
            r = certified(m, parse_format(m.precision))
            tc = time.perf_counter() - t1
            cert = ("proved, one-hot" if one_hot(r) else "proved") if r.passed else "FAILED: " + r.reason
        heads = "+".join(str(b.attn.n_heads) for b in m.blocks)
        rows.append(f"| 2^{e} | {m.position_code.family}, {P['k'].value} | {P['mu'].value} | {P['eta'].value} (= {float(P['eta'].value):.4g}) | "
                    f"{P['eta_paper'].value:.4g} | {P['Kc'].value:.3g} | {m.precision} | {P['precision_bits'].value} | "
                    f"{m.d_model} | {m.width} | {m.d_mlp} | {heads} | {m.parameter_count()} | {P['size_bits'].value} | "
                    f"{cert} | {tb:.2f} | {tc:.2f} |")
    return "\n".join(rows)


def smallest_certified_eta(build: Callable[[Fraction], CompiledModel], fmt: Format, unit: Fraction,
                           j_hi: int) -> tuple[Fraction, str]:
    """The smallest eta = unit * j (j <= j_hi, and j_hi certifies) from which every larger grid eta
    up to j_hi certifies: a full downward scan when j_hi <= SCAN_LIMIT, else a bisection that
    assumes monotonicity (said so in the table)."""

    def passes(j: int) -> bool:
        try:
            return certified(build(unit * j), fmt).passed
        except ValueError:
            return False

    if j_hi <= SCAN_LIMIT:
        j_min = j_hi
        for j in range(j_hi - 1, 0, -1):
            if not passes(j):
                break
            j_min = j
        return unit * j_min, "full scan"
    lo, hi = 0, j_hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return unit * hi, "bisection"


def fewest_bit_format(build: Callable[[Format], CompiledModel]) -> tuple[Format, Fraction] | None:
    """The binary format with the fewest bits for which the builder's own eta for that format
    certifies (ties: the smallest eta, then the fewest fraction bits), and that eta."""
    for total in range(3, MAX_BITS + 1):
        found = []
        for frac in range(1, total - 1):
            fmt = FixedPoint.binary(int_bits=total - 1 - frac, frac_bits=frac)
            try:
                m = build(fmt)
            except ValueError:
                continue
            if certified(m, fmt).passed:
                found.append((m.params["eta"].value, frac, fmt))
        if found:
            eta, _, fmt = min(found, key=lambda t: (t[0], t[1]))
            return fmt, eta
    return None


def eta_precision_table(kind: str, lo: int, hi: int, positions: str = "reed-solomon") -> str:
    """Per N: the builder's eta (one-hot), the threshold-mode eta, the paper's eta, the smallest eta
    that certifies (in the default precision), and the fewest-bit binary format that certifies
    with the builder's own eta for that format."""
    build = registry.get(kind).builder
    rows = ["| N | k | default precision | eta one-hot (default) | eta threshold | eta paper | smallest certified eta | "
            "checked | fewest-bit certified format | its eta | default bits |", "|" + "---|" * 11]
    for e in range(lo, hi + 1):
        n = 1 << e
        m = build(n, positions=positions)
        code = m.position_code
        fmt = parse_format(m.precision)
        unit = fmt.step / Fraction(code.gram_scale)
        j_hi = int(m.params["eta"].value / unit)
        eta_min, checked = smallest_certified_eta(lambda eta: build(n, positions=code, precision=fmt, eta=eta),
                                                  fmt, unit, j_hi)
        best = fewest_bit_format(lambda f: build(n, positions=code, precision=f))
        rows.append(f"| 2^{e} | {code.k} | {m.precision} | {m.params['eta'].value} | {m.params['eta_threshold'].value} | "
                    f"{m.params['eta_paper'].value:.4g} | {eta_min} (= {float(eta_min):.4g}) | {checked} | "
                    f"{best[0].name if best else '-'} ({best[0].bits if best else '-'} bits) | {best[1] if best else '-'} | "
                    f"{fmt.bits} |")
    return "\n".join(rows)


def write_block(path: str | Path, tag: str, md: str) -> None:
    """Replace the text between ``<!-- TABLE:tag -->`` and ``<!-- /TABLE:tag -->`` in ``path``."""
    doc = Path(path)
    text = doc.read_text()
    block = f"<!-- TABLE:{tag} -->\n{md}\n<!-- /TABLE:{tag} -->"
    pat = re.compile(rf"<!-- TABLE:{re.escape(tag)} -->.*?<!-- /TABLE:{re.escape(tag)} -->", re.S)
    if not pat.search(text):
        raise SystemExit(f"{path}: no <!-- TABLE:{tag} --> ... <!-- /TABLE:{tag} --> markers")
    doc.write_text(pat.sub(lambda _: block, text))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", choices=["sizes", "eta"])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--min-log-n", type=int, default=4)
    ap.add_argument("--max-log-n", type=int, default=None, help="default: 20 (sizes), 12 (eta)")
    ap.add_argument("--certify-up-to", type=int, default=20)
    ap.add_argument("--write", default=None, help="replace the <!-- TABLE:{table}-{kind} --> block in this file")
    a = ap.parse_args(argv)
    if a.table == "sizes":
        md = size_table(a.kind, a.min_log_n, a.max_log_n or 20, a.certify_up_to)
    else:
        md = eta_precision_table(a.kind, a.min_log_n, a.max_log_n or 12)
    print(md, flush=True)
    if a.write:
        write_block(a.write, f"{a.table}-{a.kind}", md)


if __name__ == "__main__":
    main()
