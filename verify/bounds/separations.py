"""P1's four separations whole (docs/separations.md): for each task the winner built, the loser's
lower bound, the loser built where it can be, and the protocol the bound comes from, run.

The numbers come from the size report (:mod:`exactformer.verify.bounds.sizes`, the committed data)
at N = :data:`SEPARATION_N`, and from protocol runs (:mod:`exactformer.verify.bounds.protocols`) on
the built models at that N (one seeded input each: the messages' length is the same on every
input) and, for Lemma 1, the fooling set built and checked at N = :data:`FOOLING_N`. The page's
generated block is rewritten with the figures by ``exactformer sizes --figures docs/figures --doc
docs/sizes.md --doc docs/separations.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactformer.constructions.core import registry
from exactformer.precision import parse_format
from exactformer.verify.bounds import lower_bounds as lb
from exactformer.verify.bounds.protocols import distinct_messages, one_layer_protocol, recurrent_protocol
from exactformer.verify.bounds.sizes import SizesError, fmt_n, markdown, reference_p, row_units
from exactformer.verify.executor.exact import run

SEPARATION_N = 1 << 10  # the N of the table
FOOLING_N = 10  # the N at which the table builds and checks Lemma 1's fooling set (512 strings, 2^18 pairs)
BLOCK = "separations"
_BLOCK = re.compile(r"(<!-- BEGIN GENERATED (?P<name>[\w:-]+) -->\n)(?P<body>.*?)(<!-- END GENERATED (?P=name) -->)", re.S)


@dataclass(frozen=True)
class Separation:
    """One separation of P1: who wins, who loses and by which bound, and how the loser's bound is
    shown (the protocol run on a built model, or the fooling set computed)."""

    task: str
    family: str  # the size family whose figure draws it
    winner: str  # a size spec
    winner_kind: str
    loser_kind: str
    bound: str  # a key of lower_bounds.BOUNDS
    loser: str | None  # a size spec, or None
    why_no_loser: str = ""


SEPARATIONS = (
    Separation("Index Lookup", "index-lookup", "index-lookup", "1-layer transformer (Thm 1)", "RNN", "rnn-index-lookup",
               "index-lookup-rnn"),
    Separation("Dyck-(2, 2)", "dyck", "dyck-rnn", "RNN (App. E: a 7-state DFA)", "1-layer transformer", "one-layer-dyck",
               None, "none built: P1 gives no one-layer construction for Dyck-(2, 2) (two-layer transformers of "
                     "sublinear size suffice, P1 Sec. 4.1 citing earlier work)"),
    Separation("Equality", "equality", "equality", "2-layer transformer (Thm 6)", "RNN", "rnn-equality", "equality-rnn"),
    Separation("Nearest neighbour / MQAR, every query", "nearest-neighbor", "mqar-all", "2-layer transformer (Thm 7, "
               "App. G)", "RNN", "rnn-nearest-neighbor", "mqar-rnn"),
)


def _row(doc: dict[str, Any], spec: str, n: int) -> dict[str, Any]:
    rows = [r for r in doc["rows"] if r["spec"] == spec and r["n"] == n]
    if not rows or not rows[0]["built"]:
        raise SizesError(f"--doc: the size report has no built row of {spec} at N = {fmt_n(n)} (the separations need it)")
    return rows[0]


def _size(row: dict[str, Any]) -> str:
    b = row["built"]
    what = f"m = {b['width']}" if b.get("architecture") == "recurrent" else f"{b['layers']} layer{'s' if b['layers'] > 1 else ''}, mH = {row_units(row)}"
    return f"{what}, p = {b['precision_bits']}, {b['size_bits']} bits"


def _protocol(sep: Separation, n: int) -> str:
    """The protocol behind the loser's bound, run: Thm 2 on the built RNN (the split of the
    reduction: the symbols | the index; the halves; the pairs | the queries), or Lemma 1's fooling
    set computed; each run checked against the executor."""
    if sep.loser is None:  # the winner is the RNN: its Thm 2 message, and Lemma 1's bound computed at small N
        cc = lb.cc_dyck22_from_fooling_set(FOOLING_N)
        model = registry.get("dyck-rnn").builder(n)
        w = _thm2(model, n // 2)
        strings = lb.dyck22_fooling_set(FOOLING_N)
        states = distinct_messages(model, strings[:, : FOOLING_N // 2])
        return (f"Lemma 1: fooling set of {2 ** cc} strings built and checked at N = {FOOLING_N}: C >= {cc} = N - 1 bits; "
                f"the RNN's Thm 2 message at N/2: {w} bits ({states} distinct states over the set's halves)")
    c = registry.get(sep.loser)
    model = c.builder(n, **dict(c.sizes[0].kwargs))
    split = {"index-lookup-rnn": n, "equality-rnn": n // 2, "mqar-rnn": n}[sep.loser]
    return f"Thm 2: Alice's message {_thm2(model, split)} bits = m p (C = {_cc(sep, n)} bits)"


def _thm2(model: Any, split: int) -> int:
    task = registry.task_of(model)
    batch = next(task.sample(model, 1, 0))
    r = recurrent_protocol(model, batch.tokens[0], split)
    _same(r, model, batch.tokens[:1])
    return r.bits


def _same(r: Any, model: Any, tokens: np.ndarray) -> None:
    """The protocol's logits are the executor's, or SizesError (the table never shows a run that differs)."""
    if not np.array_equal(r.logits, run(model, tokens, parse_format(model.precision)).logits[0]):
        raise SizesError(f"the protocol's answer on {model.construction} differs from the executor's")


def _cc(sep: Separation, n: int) -> int:
    return {"rnn-index-lookup": lb.cc_index, "rnn-equality": lb.cc_halves, "rnn-nearest-neighbor": lb.cc_halves}[sep.bound](n)


#: the N at which Thm 4's protocol runs on the Index Lookup winner (its messages against INDEX's N bits)
THM4_NS = (1 << 10, 1 << 12, 1 << 14)


def thm4_on_the_winner(n: int) -> tuple[int, int]:
    """The bits of Thm 4's messages on the one-layer Index Lookup winner at N (Alice: the symbols, Bob: the
    index), checked against the executor: INDEX is easy both ways (App. F, first paragraph); and the
    head's width d_head, Thm 4's m (the messages carry m-entry parts of the head's output)."""
    c = registry.get("index-lookup")
    model = c.builder(n, **dict(c.sizes[0].kwargs))
    batch = next(registry.task_of(model).sample(model, 1, 0))
    alice = np.r_[np.ones(n, dtype=bool), False]
    r = one_layer_protocol(model, batch.tokens[0], alice)
    _same(r, model, batch.tokens[:1])
    return r.bits, model.d_head


def separations_block(doc: dict[str, Any], fig_dir: str, n: int = SEPARATION_N) -> str:
    """The generated block of docs/separations.md: the table at N = ``n`` and one figure per task."""
    head = ["task", "winner, built", f"winner's size at N = {fmt_n(n)}", "loser", "loser's lower bound (at p: the built loser's, else App. B.2's)",
            "loser, built", "the bound's protocol, run"]
    cells, figures = [], []
    for sep in SEPARATIONS:
        win = _row(doc, sep.winner, n)
        b = lb.BOUNDS[sep.bound]
        if sep.loser is not None:
            lose = _row(doc, sep.loser, n)
            p = lose["built"]["precision_bits"]
            loser = f"`{sep.loser}`: {_size(lose)}, state {lose['built']['width'] * p} bits"
        else:  # no loser built: its bound at App. B.2's precision p = ceil(log2(2 N^2 + 1)), as in the figures
            p = reference_p(n)
            loser = sep.why_no_loser
        units, _ = lb.evaluate(b, n, p)
        cells.append([sep.task, f"`{registry.get(doc['specs'][sep.winner]['construction']).name}`: {sep.winner_kind}",
                      _size(win), sep.loser_kind, f"{b.short}: {b.formula} = {units} at p = {p}", loser,
                      _protocol(sep, n)])
        figures.append(f"![{sep.task}]({fig_dir}/sizes-{sep.family}.png)")
    runs = {m: thm4_on_the_winner(m) for m in THM4_NS}
    below = next((m for m, (bits, _) in runs.items() if bits < m), None)
    heads = sorted({d for _, d in runs.values()})
    win = _row(doc, "index-lookup", n)
    note = ("Thm 4's protocol run on the Index Lookup winner itself (Alice the symbols, Bob the index; each run equal to "
            "the executor's answer): " + ", ".join(f"{bits} bits at N = {fmt_n(m)}" for m, (bits, _) in runs.items())
            + ". Its messages grow as m(p + log N) with m = d_head = " + " and ".join(map(str, heads))
            + ", O(log N): the projection rows, whose m-entry partial sums step 4 sends (the table's mH = "
            + f"{row_units(win)} is P1's width max(m, d) = d_model at N = {fmt_n(n)})"
            + (f", so it falls below INDEX's N bits (from N = {fmt_n(below)} on here)" if below else "")
            + ": Index Lookup is easy when both parties may speak, which is why its bound is for RNNs only "
            "(P1 App. F, first paragraph).")
    return "\n\n".join([markdown(head, cells), note, "\n\n".join(figures)])


def update_doc(text: str, doc: dict[str, Any], fig_dir: str) -> str:
    """``text`` (docs/separations.md) with its generated block rewritten; its generated blocks must be
    exactly this one."""
    present = [m.group("name") for m in _BLOCK.finditer(text)]
    if present != [BLOCK]:
        raise SizesError(f"--doc: a separations page holds exactly the generated block {BLOCK!r}, got {present}")
    body = separations_block(doc, fig_dir)
    return _BLOCK.sub(lambda m: f"{m.group(1)}{body}\n{m.group(4)}", text)


def holds_separations(text: str) -> bool:
    """Whether a page is the separations page (it holds the separations block)."""
    return f"<!-- BEGIN GENERATED {BLOCK} -->" in text
