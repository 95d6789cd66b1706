"""The frontier's tables: JSON (the schema in docs/precision-frontier.md), CSV (one row per job) and
Markdown (the heat map of largest N per construction and arithmetic, and the fewest fixed-point
bits per N beside the paper's precision).

A largest N is "open" (written >= 2^k) when the chain stopped at the grid's largest N or at the
time budget with that N certified, so the frontier may lie beyond it; otherwise the N after it
that ran are not certified (refused, unproven or an error) and 2^k is the frontier on this grid.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from exactformer.verify.frontier.grid import FIXED_BITS, FIXED_BITS_SHOWN, Chain, paper_bits

SCHEMA = "exactformer-frontier/1"
_CELL_KEYS = ("n", "status", "precision", "bits", "eta", "designed_for", "min_margin", "seconds", "peak_rss",
              "reason")


def _log2(n: int | None) -> int | None:
    return None if n is None else n.bit_length() - 1


def _open(chain: Chain, budget: float) -> bool:
    """Whether the chain stopped at the grid's top or the budget with its last N certified."""
    stop, ran = chain.stop(budget), chain.ran()
    return stop is not None and stop["why"] in ("top", "budget") and bool(ran) and ran[-1]["status"] == "certified"


def bits_frontier(chain: Chain, budget: float) -> dict[int, dict[str, Any]]:
    """For a fixed-point chain and each budget p of FIXED_BITS: the largest N at which a build of at
    most p bits is certified, and whether it is open (the chain stopped at its top or the budget
    while such builds were still certified)."""
    cells = chain.certified()
    is_open = _open(chain, budget)
    out = {}
    for p in FIXED_BITS:
        fit = [c["n"] for c in cells if c["bits"] <= p]
        out[p] = {"largest_n": fit[-1] if fit else None,
                  "open": bool(fit) and is_open and fit[-1] == cells[-1]["n"]}
    return out


def to_dict(f: Any) -> dict[str, Any]:
    """The JSON object of a :class:`~exactformer.verify.frontier.run.Frontier`."""
    out: dict[str, Any] = {
        "schema": SCHEMA, "n": f.ns, "log2_n": [_log2(f.ns[0]), _log2(f.ns[-1])], "budget_seconds": f.budget,
        "code_version": f.code_version, "where": f.where, "computed": f.computed, "cached": f.cached,
        "seconds": round(f.seconds, 3), "ran_ahead": dict(f.ran_ahead), "cache_dir": f.cache_dir,
        "arithmetics": list(dict.fromkeys(c.arithmetic for c in f.chains)), "constructions": {}}
    for chain in f.chains:
        entry = out["constructions"].setdefault(chain.name, {"theorem": f.theorems.get(chain.name),
                                                             "params": dict(chain.params), "arithmetics": {}})
        largest = chain.largest()
        entry["arithmetics"][chain.arithmetic] = {
            "largest_n": largest, "largest_log2_n": _log2(largest), "open": _open(chain, f.budget),
            "gaps": chain.gaps(), "stop": chain.stop(f.budget),
            "cells": [{k: c.get(k) for k in _CELL_KEYS} for c in chain.ran()]}
        if chain.arithmetic == "fixed":
            entry["fixed_bits"] = [{"n": c["n"], "bits": c["bits"], "precision": c["precision"],
                                    "paper_bits": paper_bits(c["n"])}
                                   for c in chain.certified()]
            entry["largest_n_by_bits"] = {str(p): v for p, v in bits_frontier(chain, f.budget).items()}
    return out


def to_csv(f: Any) -> str:
    """One row per job that ran (or was read from the cache), chain by chain."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["construction", "arithmetic", "n", "log2_n", "status", "precision", "bits", "paper_bits", "eta",
                "seconds", "reason"])
    for chain in f.chains:
        for c in chain.ran():
            w.writerow([chain.name, chain.arithmetic, c["n"], _log2(c["n"]), c["status"], c.get("precision") or "",
                        "" if c.get("bits") is None else c["bits"], paper_bits(c["n"]), c.get("eta") or "",
                        f"{c['seconds']:.3f}", " ".join(str(c.get("reason", "")).split())])
    return buf.getvalue()


def largest_text(n: int | None, is_open: bool) -> str:
    """A largest N as a table shows it: 2^k, >= 2^k when open, a dash when none."""
    if n is None:
        return "—"
    return ("≥ " if is_open else "") + f"2^{_log2(n)}"


def heat_rows(f: Any) -> tuple[list[str], list[list[str]]]:
    """The heat map as a table: one row per construction; fixed point at the budgets of
    FIXED_BITS_SHOWN, then each float arithmetic (* marks a frontier with gaps below it)."""
    ariths = list(dict.fromkeys(c.arithmetic for c in f.chains))
    head = ["construction"] + [f"fixed ≤ {p} bits" for p in FIXED_BITS_SHOWN if "fixed" in ariths] \
        + [a for a in ariths if a != "fixed"]
    rows = []
    for name in dict.fromkeys(c.name for c in f.chains):
        row = [name]
        mine = {c.arithmetic: c for c in f.chains if c.name == name}
        if "fixed" in mine:
            bits = bits_frontier(mine["fixed"], f.budget)
            row += [largest_text(bits[p]["largest_n"], bits[p]["open"]) for p in FIXED_BITS_SHOWN]
        row += [largest_text(mine[a].largest(), _open(mine[a], f.budget)) + ("*" if mine[a].gaps() else "")
                for a in ariths if a != "fixed"]
        rows.append(row)
    return head, rows


def bits_rows(f: Any) -> tuple[list[str], list[list[str]]]:
    """The fewest fixed-point bits per N (certified builds), one column per construction, beside the
    paper's p = ceil(log2(2 N^2 + 1)) (App. B.2, Kc = 1)."""
    fixed = [c for c in f.chains if c.arithmetic == "fixed"]
    head = ["N", "paper p (Kc = 1)"] + [c.name for c in fixed]
    rows = []
    for n in f.ns:
        cells = [next((x for x in c.certified() if x["n"] == n), None) for c in fixed]
        rows.append([f"2^{_log2(n)}", str(paper_bits(n))] + ["—" if x is None else str(x["bits"]) for x in cells])
    return head, rows


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    line = lambda values: "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "---|" * len(head)] + [line(r) for r in rows])


def stops(f: Any) -> list[tuple[str, str, str, str]]:
    """(construction, arithmetic, gaps, why the chain stopped) for every chain."""
    return [(c.name, c.arithmetic, ", ".join(f"2^{_log2(n)}" for n in c.gaps()) or "—",
             " ".join(str((c.stop(f.budget) or {}).get("reason", "running")).split())) for c in f.chains]


def to_markdown(f: Any) -> str:
    """The heat map, the bits table, and each chain's gaps and why it stopped, as Markdown."""
    parts = [f"Largest certified N per construction and arithmetic (N = 2^{_log2(f.ns[0])} .. 2^{_log2(f.ns[-1])}; "
             f"≥: the chain stopped at the grid's top or the {f.budget:.0f} s budget, not at a failure; *: some "
             "smaller N are not certified, see the gaps):", "",
             markdown_table(*heat_rows(f))]
    if any(c.arithmetic == "fixed" for c in f.chains):
        parts += ["", "Fewest fixed-point bits of a certified build per N:", "", markdown_table(*bits_rows(f))]
    parts += ["", "Where each chain stops:", "",
              markdown_table(["construction", "arithmetic", "gaps", "stops"], [list(s) for s in stops(f)])]
    return "\n".join(parts) + "\n"
