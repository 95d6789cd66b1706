"""The frontier's figures and the generated parts of docs/precision-frontier.md.

* ``frontier-bits.png``: the fewest fixed-point bits of a certified build against log2 N, one line
  per construction, beside the paper's p = ceil(log2(2 N^2 + 1)) (P1 App. B.2, Kc = 1);
* ``frontier-heatmap.png``: construction x arithmetic, the colour the largest certified log2 N
  (fixed point at the budgets of FIXED_BITS_SHOWN), each cell labelled as the tables write it;
* ``frontier.json`` / ``frontier.csv``: the data (report.py's schema);
* a Markdown file's blocks between ``<!-- frontier:NAME -->`` and ``<!-- /frontier:NAME -->``
  (NAME: heatmap, bits, stops) rewritten from the same run.

matplotlib is imported here, when a figure is drawn.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from exactformer.verify.frontier import report
from exactformer.verify.frontier.grid import paper_bits


def _log2_cell(text: str) -> float:
    m = re.search(r"2\^(\d+)", text)
    return float(m.group(1)) if m else np.nan


def bits_figure(f: Any, path: Path) -> Path:
    """Bits against log2 N per construction, with the paper's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [n.bit_length() - 1 for n in f.ns]
    ax.plot(xs, [paper_bits(n) for n in f.ns], "k--", lw=1.5, label="paper: ceil(log2(2N^2 + 1)) (App. B.2, Kc = 1)")
    markers = "os^vD<>phX*P"
    for i, c in enumerate(ch for ch in f.chains if ch.arithmetic == "fixed"):
        cells = c.certified()
        if cells:
            ax.plot([x["n"].bit_length() - 1 for x in cells], [x["bits"] for x in cells], marker=markers[i % len(markers)],
                    ms=4, lw=1, label=c.name)
    ax.set_xlabel("log2 N")
    ax.set_ylabel("bits of a certified fixed-point build")
    ax.set_title("Fewest fixed-point bits per N (certified builds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def heatmap_figure(f: Any, path: Path) -> Path:
    """Construction x arithmetic, coloured by the largest certified log2 N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    head, rows = report.heat_rows(f)
    cols = head[1:]
    values = np.array([[_log2_cell(v) for v in r[1:]] for r in rows]) if rows else np.zeros((0, len(cols)))
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(cols), 0.8 + 0.45 * len(rows)))
    lo, hi = f.ns[0].bit_length() - 1, f.ns[-1].bit_length() - 1
    im = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", vmin=lo, vmax=hi, aspect="auto")
    ax.set_xticks(range(len(cols)), [c.replace("fixed ≤ ", "fixed ≤\n") for c in cols], fontsize=7, rotation=45,
                  ha="right")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    for i, r in enumerate(rows):
        for j, v in enumerate(r[1:]):
            ax.text(j, i, v.replace("≥ ", "≥"), ha="center", va="center", fontsize=6,
                    color="white" if not np.isnan(values[i, j]) and values[i, j] < (lo + hi) / 2 else "black")
    fig.colorbar(im, ax=ax, label="largest certified log2 N")
    ax.set_title(f"Precision frontier, N = 2^{lo} .. 2^{hi} (— : none; ≥ : not reached; * : gaps)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def rewrite_doc(f: Any, doc: Path) -> Path:
    """Rewrite the generated blocks of ``doc`` (see the module docstring) from ``f``."""
    blocks = {"heatmap": report.markdown_table(*report.heat_rows(f)),
              "bits": report.markdown_table(*report.bits_rows(f)),
              "stops": report.markdown_table(["construction", "arithmetic", "gaps", "stops"],
                                              [list(s) for s in report.stops(f)])}
    text = doc.read_text()
    for name, table in blocks.items():
        pattern = re.compile(rf"(<!-- frontier:{name} -->\n).*?(\n<!-- /frontier:{name} -->)", re.S)
        text = pattern.sub(lambda m: m.group(1) + table + m.group(2), text)
    doc.write_text(text)
    return doc


def write_figures(f: Any, out: Path, doc: Path | None = None) -> list[Path]:
    """The figures and the data into ``out`` (created), and ``doc``'s generated blocks."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "frontier.json").write_text(f.to_json() + "\n")
    (out / "frontier.csv").write_text(f.to_csv())
    paths = [out / "frontier.json", out / "frontier.csv", bits_figure(f, out / "frontier-bits.png"),
             heatmap_figure(f, out / "frontier-heatmap.png")]
    if doc is not None:
        paths.append(rewrite_doc(f, doc))
    return paths
