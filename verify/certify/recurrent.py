"""The certificate of a recurrent model against a finite automaton, for every string of every length.

A recurrent model is a deterministic machine: its hidden state after a prefix is a function of the
state before and the last token (:func:`exactformer.verify.executor.recurrent.step`, the executor's
own step in the model's arithmetic). The task states its ground truth as a finite automaton
(:class:`~exactformer.constructions.core.spec.Automaton`, e.g. bounded Dyck: P1 App. E, "each
Dyck-(n, k) is a regular language"). The proof explores the product of the two, breadth first:

1. start from the pair (h_0, the automaton's start state);
2. for every pair reached and every token, compute the model's next hidden state once (exactly, in
   the model's arithmetic) and the automaton's next state: the pair they form is reached;
3. at every pair reached, the start pair included (the empty string, answered from h_0), the
   model's readout must give the automaton's answer with a strict margin (the correct logit above
   every other).

When the exploration closes (no new pair), induction on the length proves that after every string
the pair (hidden state, automaton state) is one of those explored, so the model answers as the
automaton on every string of every length >= 0. For the bounded Dyck RNN the explored hidden states
are the one-hot (state, last bracket) vectors and the zero vector, and each pairs with one automaton
state: the invariant "the hidden state is exactly the automaton's state after each prefix", proved
once for every (state, symbol) pair (``details``). A pair that answers wrong gives the shortest string
leading to it, which the executor runs: a counterexample. More than :data:`MAX_PAIRS` pairs (a model
whose reachable states grow with the input, such as the recurrent Index Lookup) is "unproven".

Arithmetics: "fixed" is the model's format. "real", "float64" and "float32" (the exported
``torch.nn.RNN``) are proved for models with integer weights: the steps are computed in exact
integers, and every product and partial sum of every step explored, and of the readout
``W_U h + b_U`` at every hidden state explored, must be an integer of magnitude below 2^53
(float64), 2^24 (float32), 2^11 (float16) or 2^8 (bfloat16), so that the float run equals the exact
one in any order of summation.

The model's answer labels are read (``model.answers``, mapped to the automaton's answers by value)
and its answer position must be the last token's (``answer_positions`` None), as the executor and
the exported module read them.

Registered on :func:`exactformer.verify.certify.composed.certify` for :class:`RNNModel`.
"""

from __future__ import annotations

import time
from collections import deque
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from exactformer.constructions.core.proof import Unproven
from exactformer.constructions.core.recurrent import RNNModel
from exactformer.constructions.core.spec import REJECT, Automaton
from exactformer.precision import FixedPoint, Format
from exactformer.verify.certify.composed import SEARCH_SECONDS, CertificateResult, certify, refuted
from exactformer.verify.certify.layers import answer_map
from exactformer.verify.certify.spec_check import check_spec
from exactformer.verify.executor.recurrent import Weights, step

MAX_PAIRS = 1 << 16  # (hidden state, automaton state) pairs the exploration may reach
#: exact integers of magnitude below this are exact in each float arithmetic, whatever the order of summation
FLOAT_EXACT = {"float64": 1 << 53, "float32": 1 << 24, "float16": 1 << 11, "bfloat16": 1 << 8}
INTEGER_RANGE = 1 << 60  # the exact-integer arithmetic of the real and float proofs


class _Product:
    """The explored pairs: hidden states (raw rows, deduplicated), pairs (state index, automaton
    state) with the (parent pair, token) each was first reached from."""

    def __init__(self, h0: np.ndarray, start: int):
        self.rows: list[np.ndarray] = [h0]
        self.index: dict[bytes, int] = {h0.tobytes(): 0}
        self.pairs: dict[tuple[int, int], tuple[tuple[int, int] | None, int]] = {(0, start): (None, -1)}

    def state(self, h: np.ndarray) -> tuple[int, bool]:
        key = h.tobytes()
        if key in self.index:
            return self.index[key], False
        self.index[key] = len(self.rows)
        self.rows.append(h)
        return self.index[key], True

    def string(self, pair: tuple[int, int]) -> list[int]:
        out = []
        while self.pairs[pair][0] is not None:
            pair, token = self.pairs[pair]
            out.append(token)
        return out[::-1]


def _arithmetic(model: RNNModel, fmt: Format, arithmetic: str) -> Format:
    """The format the proof steps in: the model's for "fixed"; exact integers for the others (which
    need integer weights)."""
    if arithmetic == "fixed":
        return fmt
    if arithmetic not in ("real", *FLOAT_EXACT):
        raise Unproven(f"the recurrent certificate covers the arithmetics fixed, real, {', '.join(FLOAT_EXACT)}; "
                       f"not {arithmetic}")
    dens = [t.den for t in model.tensors().values()] + [model.W_hh.vals.den]
    if any(d != 1 for d in dens):
        raise Unproven(f"the {arithmetic} certificate of a recurrent model needs integer weights")
    return FixedPoint(1, -INTEGER_RANGE, INTEGER_RANGE)


def prove(model: RNNModel, fmt: Format, spec: Automaton, arithmetic: str, details: dict,
          progress: Callable[[str], None]) -> tuple[Fraction, None] | tuple[None, list[int]]:
    """Explore the product (module docstring): (min margin, None) when every pair answers right,
    (None, a shortest string) when one does not. Raises Unproven past :data:`MAX_PAIRS` or when a
    float arithmetic is not exact."""
    afmt = _arithmetic(model, fmt, arithmetic)
    w = Weights(model, afmt)
    V = model.d_vocab
    if spec.delta.shape[1] != V:
        raise Unproven(f"the automaton reads {spec.delta.shape[1]} tokens, the model {V}")
    if model.answer_positions is not None:
        raise Unproven(f"the model reads its answer at positions {list(model.answer_positions)[:4]}; the certificate "
                       "proves the answer after the last token of every string")
    labels = answer_map(spec.values, model.answers)  # the task's index of each logit's answer
    want = np.array(spec.answer_index)
    prod = _Product(np.asarray(w.h0, dtype=np.int64), int(spec.start))
    verdicts: dict[int, tuple[int | None, int]] = {}  # state index -> (answer index or None on a tie, margin)
    queue = deque([(0, int(spec.start))])
    tokens = np.arange(V)
    min_margin, bound = None, 0
    fresh = [0]
    while queue:
        progress(f"closure: {len(prod.pairs)} pairs")
        frontier = [queue.popleft() for _ in range(len(queue))]
        states = sorted({s for s, _ in frontier})
        h = np.stack([prod.rows[s] for s in states])
        reps = np.repeat(h, V, axis=0)
        toks = np.tile(tokens, len(states))
        nxt = step(w, reps, toks)
        if arithmetic in FLOAT_EXACT:
            bound = max(bound, w.magnitude(reps, toks))
            if bound >= FLOAT_EXACT[arithmetic]:
                raise Unproven(f"a step's sum of |products| reaches {bound}, not exact in {arithmetic} (< 2^"
                               f"{FLOAT_EXACT[arithmetic].bit_length() - 1} needed)")
        where = {s: i for i, s in enumerate(states)}
        moves = []  # (pair it leaves, token, hidden state reached, automaton state reached)
        for s, q in frontier:
            for a in range(V):
                idx, new = prod.state(nxt[where[s] * V + a])
                if new:
                    fresh.append(idx)
                moves.append(((s, q), a, idx, REJECT if q == REJECT else int(spec.delta[q, a])))
        if fresh:
            if arithmetic in FLOAT_EXACT:  # the readout's sums are rounded in the float too
                bound = max(bound, w.readout_magnitude(np.stack([prod.rows[i] for i in fresh])))
                if bound >= FLOAT_EXACT[arithmetic]:
                    raise Unproven(f"a readout's sum of |products| reaches {bound}, not exact in {arithmetic} (< 2^"
                                   f"{FLOAT_EXACT[arithmetic].bit_length() - 1} needed)")
            logits = w.readout(np.stack([prod.rows[i] for i in fresh]))
            order = np.argsort(-logits, axis=1, kind="stable")
            top = np.take_along_axis(logits, order[:, :2], axis=1)
            verdicts.update({i: (int(labels[o]) if l1 > l2 else None, int(l1 - l2))
                             for i, o, (l1, l2) in zip(fresh, order[:, 0], top)})
            fresh = []
        if min_margin is None:  # the first round: the start pair, i.e. the empty string read from h_0
            answer, min_margin = verdicts[0]
            if answer != want[int(spec.accepts(np.array([int(spec.start)]))[0])]:
                return None, []
        for parent, a, idx, q2 in moves:
            answer, margin = verdicts[idx]
            if answer != want[int(spec.accepts(np.array([q2]))[0])]:
                return None, prod.string(parent) + [a]
            min_margin = margin if min_margin is None else min(min_margin, margin)
            if (idx, q2) not in prod.pairs:
                prod.pairs[(idx, q2)] = (parent, a)
                queue.append((idx, q2))
                if len(prod.pairs) > MAX_PAIRS:
                    raise Unproven(f"more than {MAX_PAIRS} pairs (hidden state, automaton state) are reachable: "
                                   "the model's states do not close under the automaton's")
    rows = np.stack(prod.rows)
    partners: dict[int, set[int]] = {}
    for s, q in prod.pairs:
        partners.setdefault(s, set()).add(q)
    details.update({
        "reachable_hidden_states": len(prod.rows),
        "pairs": len(prod.pairs),
        "automaton_states": spec.states,
        "one_hot_or_zero": bool(np.all(np.isin(rows, [0, w.one[0]])) and np.all((rows != 0).sum(axis=1) <= 1)),
        "each_state_one_automaton_state": all(len(v) == 1 for v in partners.values()),
        "lengths": "every length >= 0 (induction over the closed product; the empty string from h_0)",
    })
    if arithmetic in FLOAT_EXACT:
        details["largest_sum_of_products"] = bound
    step_ = afmt.step if afmt.is_exact else Fraction(1)
    return Fraction(min_margin) * step_, None


@certify.register
def certify_recurrent(model: RNNModel, fmt: Format, task: Any, device: str = "cpu",
                      run_candidates: Callable[[Any, Any], dict | None] | None = None,
                      progress: Callable[[str], None] | None = None, arithmetic: str | None = None,
                      search_seconds: float = SEARCH_SECONDS) -> CertificateResult:
    """Prove ``model`` answers as the task's automaton on every string of every length (module
    docstring), or return the counterexample the exploration finds, or "unproven" with the reason.
    Never raises on a model."""
    t0 = time.perf_counter()
    arithmetic = arithmetic or ("fixed" if fmt.is_exact else fmt.name)
    details: dict[str, Any] = {"arithmetic": arithmetic if arithmetic != "fixed" else fmt.name}
    try:
        spec = task.spec(model)
        if not isinstance(spec, Automaton):
            raise Unproven(f"the recurrent certificate compares a model with a finite automaton; the task's "
                           f"specification is a {type(spec).__name__}")
        details["spec_check"] = check_spec(task, model)
        margin, string = prove(model, fmt, spec, arithmetic, details, progress or (lambda s: None))
        if string is None:
            return CertificateResult(True, True, "proved for every string of every length", margin, None, details,
                                     time.perf_counter() - t0)
        batch = task.batch(model, *task.to_arrays(model, [string]), kind="closure")
        return refuted(model, task, f"the string {string} leads to a pair that answers wrong", {}, run_candidates,
                       details, t0, candidates=[batch], search_seconds=search_seconds, progress=progress)
    except Unproven as e:
        reason = e.reason
    except (ValueError, NotImplementedError) as e:
        reason = f"{type(e).__name__}: {e}"
    except KeyError as e:
        reason = f"a field the certificate reads is missing: {e}"
    except Exception as e:  # a certificate never raises on a model; a bug here is reported, never a pass
        reason = f"internal error {type(e).__name__}: {e}"
    return refuted(model, task, reason, {}, run_candidates, details, t0, search_seconds=search_seconds,
                   progress=progress)
