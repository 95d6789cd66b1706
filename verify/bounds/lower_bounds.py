"""Lower bounds, paper-claimed sizes and alternatives for the size tables (docs/sizes.md).

Sources: P1 = Bhattamishra, Hahn, Blunsom, Kanade, *Separations in the Representational
Capabilities of Transformers and Recurrent Architectures* (NeurIPS 2024); P2 = Liu, Yu, Sanford,
Andoni, Hsu, *Fast attention mechanisms: a tale of parallelism* (ANNA, NeurIPS 2025). Citations
name the papers' sections, theorems, lemmas, facts and appendices; every formula below was checked
against the statement it cites.

Models (P1 Sec. 2). An RNN has an mp-bit hidden state: m units of p bits, arbitrary transition and
output functions. TF^L_{m,p,H}: L layers, width m = max(projection rows, d), H heads, p-bit
numbers; its representation size is Theta(m d p H) bits.

Every lower bound comes from a communication-complexity (CC) bound C in bits:

* RNN (P1 Thm 2, Sec. 3): an RNN computing f gives a one-way protocol of mp bits for every
  prefix/suffix split, so mp >= C_one-way and **m >= ceil(C / p)** hidden units.
* one-layer transformer (P1 Thm 4, Sec. 4; proof in App. D): any split of the positions gives a protocol of
  3m(p + log N)H bits, so **mH >= ceil(C / (3(p + log N)))**. The proof's itemised count is
  larger (see :func:`thm4_protocol_bits_itemised`); the conservative version
  **mH >= ceil(C / (9p + 2 log N))** follows from it. ``log N`` is read as ceil(log2 N), the bit
  count of N (equal to log2 N at the powers of two in the tables).

Units returned: hidden units m (RNN), width x heads mH (one-layer transformer), or bits. All values
are exact integers: rational bounds are rounded up (ceil) because m and H are integers. ``p`` is
the number of bits of one number; the tables evaluate every bound at the built model's own p ("the
same precision") or, where no model is built, at the paper's App. B.2 precision with Kc = 1
(:func:`paper_precision_bits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Mapping

import numpy as np

from exactformer.constructions.theorems.dyck import dyck_member


class BoundError(ValueError):
    """Arguments outside a bound's domain or conditions (N < 2, odd N where the task splits N in
    halves, p < 1, an alphabet too small for the reduction)."""


#: a bound parameter without a default: the size row must give it (:attr:`Bound.params`)
REQUIRED = object()


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------


def log2_ceil(n: int) -> int:
    """ceil(log2 n) for an integer n >= 1, exactly (the number of bits needed for n values)."""
    if n < 1:
        raise BoundError(f"n must be >= 1, got {n}")
    return (n - 1).bit_length()


def _check(n: int, p: int | None = None, even: bool = False) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise BoundError(f"n must be an integer >= 2, got {n!r}")
    if even and n % 2:
        raise BoundError(f"n must be even (the task splits N into two halves of N/2), got {n}")
    if p is not None:
        _check_p(p)


def _check_p(p: int) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise BoundError(f"p must be an integer >= 1 (bits per number), got {p!r}")


def paper_precision_bits(n: int, kc: int = 1) -> int:
    """Bits of P1 App. B.2's grid: numbers -N^Kc .. N^Kc in steps N^-Kc, i.e. 2 N^(2Kc) + 1
    values, so p = ceil(log2(2 N^(2Kc) + 1)) (= 2 Kc log2 N + 2 for N a power of two; the paper's
    p = 2 Kc log N leaves out the sign bit and the end point)."""
    _check(n)
    if isinstance(kc, bool) or not isinstance(kc, int) or kc < 1:
        raise BoundError(f"kc must be an integer >= 1, got {kc!r}")
    return log2_ceil(2 * n ** (2 * kc) + 1)


# ------------------------------------------------------------------------------------------------
# communication-complexity lower bounds C (bits) of the tasks
# ------------------------------------------------------------------------------------------------


def cc_index(n: int) -> int:
    """INDEX on N bits, one way (P1 Fact 3, App. B.1): N bits."""
    _check(n)
    return n


def cc_halves(n: int) -> int:
    """EQ or DISJ of the two N/2-bit halves of x in {0,1}^N (P1 Facts 1 and 2, App. B.1: a
    deterministic protocol on N/2-bit inputs exchanges >= N/2 bits, also one way)."""
    _check(n, even=True)
    return n // 2


def cc_dyck22(n: int) -> int:
    """Dyck-(2,2) membership with Alice holding the odd and Bob the even positions (P1 Lemma 1,
    Sec. 4.1; proof in App. E): a fooling set of size 2^(N-1) forces N - 1 bits."""
    _check(n, even=True)
    return n - 1


#: the largest N whose Lemma 1 fooling set :func:`dyck22_fooling_set` builds and checks (2^(N-1) strings, 4^(N-1) pairs)
FOOLING_MAX_N = 14
FOOLING_CHUNK = 1 << 20  # crossed strings checked at once


def dyck22_fooling_set(n: int) -> np.ndarray:
    """P1 Lemma 1's fooling set (App. E): every string of Dyck-(2, 2) of length N, as token ids
    [|S|, N] (open type i = 2i, close = 2i + 1), enumerated depth first over the language's stacks
    of at most 2 brackets."""
    _check(n, even=True)
    if n > FOOLING_MAX_N:
        raise BoundError(f"n must be at most {FOOLING_MAX_N} here (the set has 2^(N-1) strings), got {n}")
    out: list[list[int]] = []

    def extend(prefix: list[int], stack: list[int]) -> None:
        left = n - len(prefix)
        if left == 0:
            out.append(list(prefix))
            return
        if len(stack) < 2 and len(stack) < left:
            for t in range(2):
                extend(prefix + [2 * t], stack + [t])
        if stack:
            extend(prefix + [2 * stack[-1] + 1], stack[:-1])

    extend([], [])
    return np.array(out, dtype=np.int64).reshape(len(out), n)


def check_fooling_set(strings: np.ndarray) -> tuple[bool, str]:
    """Definition 1 (P1 App. E) for the odd/even split, checked on every pair with the language's
    definition (:func:`~exactformer.constructions.theorems.dyck.dyck_member`): with x = the symbols
    at odd positions (Alice's, 1-based) and y = those at even positions (Bob's), every (x_i, y_i) is
    in Dyck-(2, 2), and for i != j not both (x_i, y_j) and (x_j, y_i) are. Returns (holds, why not)."""
    s = np.asarray(strings, dtype=np.int64)
    k, n = s.shape
    x, y = s[:, 0::2], s[:, 1::2]
    if not np.all(dyck_member(s, 2, 2)):
        return False, f"string {s[~dyck_member(s, 2, 2)][0].tolist()} is not in Dyck-(2, 2)"
    crossed = np.zeros((k, k), dtype=bool)  # crossed[i, j] = (x_i, y_j) in the language
    rows_per = max(1, FOOLING_CHUNK // k)
    for i0 in range(0, k, rows_per):
        i = np.arange(i0, min(k, i0 + rows_per))
        mixed = np.empty((i.size, k, n), dtype=np.int64)
        mixed[:, :, 0::2], mixed[:, :, 1::2] = x[i][:, None, :], y[None, :, :]
        crossed[i] = dyck_member(mixed.reshape(-1, n), 2, 2).reshape(i.size, k)
    both = crossed & crossed.T
    np.fill_diagonal(both, False)
    if both.any():
        i, j = map(int, np.argwhere(both)[0])
        return False, f"pairs {i} and {j} are not distinguished: both crossings are in the language"
    return True, ""


def cc_dyck22_from_fooling_set(n: int) -> int:
    """Lemma 1's bound computed: the fooling set built and checked (:func:`check_fooling_set`), then
    Fact 4 (App. E): the communication complexity is at least log2 |S| bits (ceil for a whole
    number of bits; |S| = 2^(N-1) gives N - 1, which :func:`cc_dyck22` states)."""
    s = dyck22_fooling_set(n)
    ok, why = check_fooling_set(s)
    if not ok:
        raise BoundError(f"not a fooling set at N = {n}: {why}")
    return log2_ceil(len(s))


# ------------------------------------------------------------------------------------------------
# RNNs (Thm 2 reductions)
# ------------------------------------------------------------------------------------------------


def rnn_units(cc_bits: int, p: int) -> int:
    """P1 Thm 2 (Sec. 3): an RNN whose hidden state has mp bits yields a one-way protocol of mp bits,
    so mp >= cc_bits and m >= ceil(cc_bits / p) hidden units of p bits."""
    if cc_bits < 0:
        raise BoundError(f"cc_bits must be >= 0, got {cc_bits}")
    _check_p(p)
    return math.ceil(Fraction(cc_bits, p))


def rnn_index_lookup(n: int, p: int) -> int:
    """P1 Thm 3 (Sec. 3; proof in App. C.1): "Any recurrent model with a hidden state of width m using
    p-bits of precision that computes the Index Lookup task for all sequences of length N must have
    m >= N/p." Reduction from INDEX (Fact 3): m >= ceil(N/p) hidden units; any p."""
    _check(n, p)
    return rnn_units(cc_index(n), p)


def rnn_associative_recall(n: int, p: int) -> int:
    """P1 Prop. 9 (App. C.1): single-query associative recall over N (symbol, label) pairs with
    distinct symbols needs "m >= N/p" (reduction from INDEX): ceil(N/p) hidden units; N counts
    pairs (the sequence has 2N + 1 tokens)."""
    _check(n, p)
    return rnn_units(cc_index(n), p)


def rnn_inequality(n: int, p: int) -> int:
    """P1 Thm 11 (App. F.1): an RNN computing INEQ (equivalently EQ) on {0,1}^N "must have
    mp >= N/2" (Thm 2 + Fact 2; also via the 2^(N/2)-state DFA and Lemma 4): ceil(N/(2p))
    hidden units; N even."""
    _check(n, p, even=True)
    return rnn_units(cc_halves(n), p)


def rnn_disjointness(n: int, p: int) -> int:
    """P1 Sec. 4.2 ("Lower Bounds"): "Theorems 4 and 2 imply that both one-layer Transformers and RNNs must have
    width Omega(N)" for DISJ. Explicit: Thm 2 with Fact 1 (App. B.1) on the N/2-bit halves:
    mp >= N/2, i.e. ceil(N/(2p)) hidden units; N even."""
    _check(n, p, even=True)
    return rnn_units(cc_halves(n), p)


def rnn_nearest_neighbor(n: int, p: int) -> int:
    """P1 Thm 8 (Sec. 5.2; proof in App. G.1, on MQAR via DISJ on N/2 bits): "Any recurrent model
    with a hidden state of width m with p-bits of precision that can perform the nearest neighbor
    task for all inputs of length N must have m >= N/2p." N counts the input vectors x (2N - 1
    tokens); ceil(N/(2p)) hidden units; N even. The proof needs the model's answers at *all* N/2
    queries (Bob reads every label of Alice's vector a from them): it bounds models that answer
    every query K > N/2, not a model that answers the last query only (for those:
    :func:`rnn_nearest_neighbor_last`, :func:`rnn_mqar_last`)."""
    _check(n, p, even=True)
    return rnn_units(cc_halves(n), p)


#: Inputs of the built nearest-neighbour spec (d' = 16, margin 1/4) that are pairwise margin-separated:
#: the 2^15 even-weight sign vectors (+-1/4)^16 (unit norm; two of them differ in >= 2 coordinates, so
#: their inner product is <= 1 - 2/8 = 3/4). A lower estimate of how many such inputs d' = 16 allows.
NN_SEPARATED_INPUTS = 1 << 15


def rnn_nearest_neighbor_last(n: int, p: int, separated: int = NN_SEPARATED_INPUTS) -> int:
    """A model that answers the nearest-neighbour task at the last query x_N only (P1 Sec. 5.2's
    task at K = N) solves single-query associative recall over the N - 1 pairs before it (P1 App. G,
    "Relation to Associative Recall"), so P1 Prop. 9's reduction from INDEX (Fact 3, App. B.1)
    applies: Alice feeds r distinct, pairwise margin-separated vectors v_j with her bits as labels
    (and the zero vector with any label at the other N - 1 - r pairs), sends the mp-bit state, Bob
    feeds x_N = v_i and reads a_i. So mp >= r with r = min(N - 1, ``separated``), the number of
    separated inputs the task's input space holds (:data:`NN_SEPARATED_INPUTS` for the built spec),
    and m >= ceil(r / p). Thm 8 does not apply to such a model: its proof needs every query
    answered."""
    _check(n, p)
    if isinstance(separated, bool) or not isinstance(separated, int) or separated < 1:
        raise BoundError(f"separated must be an integer >= 1, got {separated!r}")
    return rnn_units(min(n - 1, separated), p)


def rnn_mqar_last(n: int, p: int) -> int:
    """A model that answers MQAR (P1 App. G) at the last query only: INDEX (P1 Fact 3, App. B.1) on
    the N/2 first-half labels, by P1 Prop. 9's reduction: Alice feeds the N/2 distinct first-half
    symbols with her bits as labels, sends the mp-bit state; Bob feeds the second half, a
    permutation of the first that ends with the symbol of the index he holds (the second half's
    labels are free), and reads the answer. So mp >= N/2: m >= ceil(N/(2p)) hidden units; N even.
    Thm 8 (the same value) does not apply to such a model: its proof needs every query answered."""
    _check(n, p, even=True)
    return rnn_units(n // 2, p)


def k_hop_index_bits(n: int, k: int, alphabet: int) -> int:
    """Derived here (not stated in P1 or P2; proof in docs/sizes.md, "Induction heads and k-hop"):
    the bits r of INDEX that k-hop induction heads (P2 Def. 5.5; k = 1: Def. 5.3) on length N over
    |Sigma| symbols solve one way, r = min(floor((N - 2k + 1)/2), |Sigma| - k - 1). Alice's prefix
    is x_1 a_1 .. x_r a_r (padded in front to N - 2k + 1 tokens) with distinct symbols x_j and her
    bits a_j written with two further symbols; Bob's suffix z_1 x_q z_2 z_1 .. z_{k-1} z_{k-2} z_{k-1}
    (k - 1 fresh symbols z, 2k - 1 tokens; for k = 1 just x_q) makes k - 1 hops end on x_q and the
    k-th on a_q. Conditions: N >= 2k + 1 and |Sigma| >= k + 2 (else BoundError: no instance); with
    |Sigma| >= floor((N - 2k + 1)/2) + k + 1 the alphabet does not limit r (k = 1: |Sigma| >=
    floor((N - 1)/2) + 2, r = floor((N - 1)/2))."""
    _check(n)
    for name, v, lo in (("k", k, 1), ("alphabet", alphabet, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise BoundError(f"{name} must be an integer >= {lo}, got {v!r}")
    if n < 2 * k + 1 or alphabet < k + 2:
        raise BoundError(f"the reduction needs N >= 2k + 1 and |Sigma| >= k + 2, got N = {n}, k = {k}, "
                         f"|Sigma| = {alphabet}")
    return min((n - 2 * k + 1) // 2, alphabet - k - 1)


def rnn_k_hop_index(n: int, p: int, alphabet: int, k: int = 1) -> int:
    """Thm 2 with :func:`k_hop_index_bits` (derived here): an RNN computing k-hop induction heads on
    length N over |Sigma| symbols has m >= ceil(r/p), r = min(floor((N - 2k + 1)/2), |Sigma| - k - 1).
    At a fixed alphabet r stops growing at |Sigma| - k - 1: then so does the bound, and rightly
    (:func:`k_hop_state_bits`: a recurrent model of constant state solves the task)."""
    _check_p(p)
    return rnn_units(k_hop_index_bits(n, k, alphabet), p)


def k_hop_state_bits(alphabet: int, k: int = 1) -> int:
    """Upper bound (derived here, docs/sizes.md "Induction heads and k-hop"): a recurrent model with
    arbitrary transitions (P1 Sec. 2) computes k-hop induction heads over |Sigma| symbols for every
    N with a state of (k |Sigma| + 1) ceil(log2(|Sigma| + 1)) bits: the previous symbol, and for
    every symbol c the answers w_{sigma^i(j_c + 1)}, i = 0 .. k - 1 (j_c the latest occurrence of
    c, or "none"). At w_p = c the answers of hops 1 .. k are c's stored list (all c when the
    previous symbol is c: then sigma(p) = p); then the previous symbol gets the list (c, the first
    k - 1 of those answers). |Sigma| = 64: 455 bits (k = 1), 7175 (k = 16)."""
    for name, v, lo in (("k", k, 1), ("alphabet", alphabet, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise BoundError(f"{name} must be an integer >= {lo}, got {v!r}")
    return (k * alphabet + 1) * log2_ceil(alphabet + 1)


def dyck22_rnn_state_bits() -> int:
    """Upper bound (P1 App. E, after Thm 10): "the language Dyck-(2, 2) considered here can be represented by a DFA
    with just 7 states", so an RNN with arbitrary transitions needs a hidden state of
    ceil(log2 7) = 3 bits for every N (the complete DFA adds a reject sink: 8 states, still
    3 bits)."""
    return log2_ceil(7)


# ------------------------------------------------------------------------------------------------
# one-layer transformers (Thm 4 reductions)
# ------------------------------------------------------------------------------------------------


def thm4_protocol_bits(m: int, p: int, heads: int, n: int) -> int:
    """P1 Thm 4 (Sec. 4 and App. D) as stated: a one-layer transformer in TF^1_{m,p,H} on N inputs gives a
    protocol of 3m(p + log N)H bits for any split of the positions (log N = ceil(log2 N))."""
    _check(n, p)
    return 3 * m * (p + log2_ceil(n)) * heads


def thm4_protocol_bits_itemised(m: int, d: int, p: int, heads: int, n: int) -> int:
    """The proof's own steps (P1 App. D, proof of Thm 4) added up: step 1 sends x_N (dp bits, once), then per head
    step 2 the maximum logit (2p), step 3 the partial softmax sums Z_A, Z_B (2(p + log N)), step 4
    the partial weighted value sums ("4mp bits"): dp + H(4mp + 4p + 2 log N). This exceeds the
    stated 3m(p + log N)H, e.g. for H = 1 and d = m whenever p > 1.5 log2 N (docs/sizes.md,
    footnote † on Thm 4)."""
    _check(n, p)
    return d * p + heads * (4 * m * p + 4 * p + 2 * log2_ceil(n))


def one_layer_width_heads(cc_bits: int, n: int, p: int) -> int:
    """Thm 4 as stated: 3m(p + log N)H >= C gives mH >= ceil(C / (3(p + log N)))."""
    _check(n, p)
    return math.ceil(Fraction(cc_bits, 3 * (p + log2_ceil(n))))


def one_layer_width_heads_itemised(cc_bits: int, n: int, p: int) -> int:
    """Thm 4 from its itemised count, with m the width (m >= d, H >= 1, m >= 1):
    dp + H(4mp + 4p + 2 log N) <= mH(9p + 2 log N), so mH >= ceil(C / (9p + 2 log N))."""
    _check(n, p)
    return math.ceil(Fraction(cc_bits, 9 * p + 2 * log2_ceil(n)))


def one_layer_dyck22(n: int, p: int, itemised: bool = False) -> int:
    """P1 Thm 5 (Sec. 4.1) = Thm 10 (App. E): a one-layer transformer deciding Dyck-(2,2) on
    length N has "mH >= (N - 1)/(3(p + log N))" (Thm 4 + Lemma 1; the sentence before Thm 5 says
    "Lemmas 4 and 1", a typo: Lemma 4 is the DFA lemma of App. F.1). ``itemised``:
    mH >= ceil((N - 1)/(9p + 2 log N)). N even."""
    cc = cc_dyck22(n)
    return one_layer_width_heads_itemised(cc, n, p) if itemised else one_layer_width_heads(cc, n, p)


def one_layer_equality(n: int, p: int, itemised: bool = False) -> int:
    """P1 Thm 12 (App. F.1): "mpH = Omega(N)" for INEQ (and EQ), from Thm 4 and Fact 2. Explicit
    from the same two: 3m(p + log N)H >= N/2, i.e. mH >= ceil(N/(6(p + log N))) (the paper's
    form is weaker; both agree for p = Theta(log N)). ``itemised``:
    mH >= ceil((N/2)/(9p + 2 log N)). N even."""
    cc = cc_halves(n)
    return one_layer_width_heads_itemised(cc, n, p) if itemised else one_layer_width_heads(cc, n, p)


def one_layer_disjointness(n: int, p: int, itemised: bool = False) -> int:
    """P1 Sec. 4.2 ("Lower Bounds"): DISJ needs width Omega(N) in one layer (Thm 4 + Fact 1). Explicit:
    mH >= ceil(N/(6(p + log N))); ``itemised``: mH >= ceil((N/2)/(9p + 2 log N)). N even."""
    cc = cc_halves(n)
    return one_layer_width_heads_itemised(cc, n, p) if itemised else one_layer_width_heads(cc, n, p)


def one_layer_size_bits(width_heads: int, p: int) -> int:
    """Bits of a one-layer transformer with width x heads = ``width_heads``: each head's W_Q, W_K,
    W_V and its block of W_O are m' x d matrices (P1 Sec. 2) with m' d >= max(m', d) = width entries, so
    the model stores >= 4 mH numbers of p bits. A weak but valid conversion of an mH bound."""
    return 4 * width_heads * p


# ------------------------------------------------------------------------------------------------
# alternatives (not lower bounds)
# ------------------------------------------------------------------------------------------------


def tracr_index_lookup_width(n: int) -> int:
    """tracr's compiled Index Lookup has residual width 3N + 9 (one-hot positions and indices), as
    reported from a tracr compilation (width 393 at N = 128); not re-measured here (tracr is not a
    dependency of exactformer)."""
    _check(n)
    return 3 * n + 9


# ------------------------------------------------------------------------------------------------
# the registry: bounds by key, task families, paper-claimed sizes
# ------------------------------------------------------------------------------------------------

UNITS_M = "hidden units m"
UNITS_MH = "width x heads (mH)"
UNITS_WIDTH = "width"
UNITS_STATE_BITS = "state bits"


@dataclass(frozen=True)
class Bound:
    """One row of the bounds table.

    ``units(n, p, **params)`` is the bound in ``unit`` (None when the statement has no explicit
    formula); ``bits(n, p, **params)`` the matching size in bits (RNN: m p, the smallest hidden
    state at precision p; one-layer transformer: 4 mH p, :func:`one_layer_size_bits`; None when
    unknown). ``kind`` is "lower" (a lower bound), "upper" (a size that suffices) or "alternative"
    (another model's size). ``model`` names the architecture, ``short`` the result ("Thm 3"),
    ``formula`` the exact expression evaluated (ceil included), ``precision`` what it assumes about p.

    ``params``: the task parameters the bound reads besides N and p, with their defaults
    (:data:`REQUIRED`: a size row must give it, from its builder arguments); ``conditions``: what
    the statement needs of (N, params), in words. Where they fail the functions raise BoundError
    and the bound has no value (:func:`evaluate`, :func:`why_not`): a table shows it only where
    its conditions hold. ``table_params``: (in words, ``fn(n)``) the parameters of the task-level
    table of bound values (None: the bound needs a size row's parameters and is not in that table).
    """

    key: str
    model: str
    kind: str
    unit: str
    short: str
    source: str
    statement: str
    formula: str
    precision: str
    units: Callable[..., int] | None = None
    bits: Callable[..., int] | None = None
    note: str = ""
    params: tuple[tuple[str, Any], ...] = ()
    conditions: str = ""
    table_params: tuple[str, Callable[[int], dict[str, Any]]] | None = None

    @property
    def explicit(self) -> bool:
        return self.units is not None

    def arguments(self, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The bound's parameters from ``params`` (others ignored), defaults where not given;
        BoundError naming a :data:`REQUIRED` one that is missing."""
        params = params or {}
        out = {name: params.get(name, default) for name, default in self.params}
        missing = [name for name, v in out.items() if v is REQUIRED]
        if missing:
            raise BoundError(f"{self.key}: needs the task parameters {', '.join(missing)}")
        return out

    @property
    def label(self) -> str:
        return f"{self.model} ({self.short}): {self.formula}"

    def describe(self) -> dict:
        return {"model": self.model, "kind": self.kind, "unit": self.unit, "short": self.short, "source": self.source,
                "statement": self.statement, "formula": self.formula, "precision": self.precision,
                "explicit": self.explicit, "note": self.note, "params": [name for name, _ in self.params],
                "conditions": self.conditions}


RNN, ONE_LAYER = "RNN", "1-layer TF"
_ANY_P = "any p: m hidden units of p bits"
_TF_P = "p-bit numbers everywhere (App. B.2 rounding, max-subtracted softmax as in App. D); log N = ceil(log2 N)"
_ITEMISED_NOTE = ("from Thm 4's itemised count dp + H(4mp + 4p + 2 log N), which exceeds the stated 3m(p + log N)H "
                  "(docs/sizes.md, footnote on Thm 4)")


def _rnn(key: str, short: str, source: str, statement: str, formula: str, fn: Callable[..., int],
         precision: str = _ANY_P, note: str = "", **extra: Any) -> Bound:
    """An RNN lower bound in hidden units; its bits are m p (the smallest hidden state at p).
    ``extra``: the parameters, conditions and table parameters of :class:`Bound`."""
    return Bound(key, RNN, "lower", UNITS_M, short, source, statement, formula, precision, fn,
                 lambda n, p, **kw: fn(n, p, **kw) * p, note, **extra)


def _one_layer(key: str, short: str, source: str, statement: str, formula: str, fn: Callable[..., int],
               itemised: bool = False) -> Bound:
    """A one-layer transformer lower bound in width x heads; bits by :func:`one_layer_size_bits`."""
    units = (lambda n, p: fn(n, p, itemised=True)) if itemised else fn
    return Bound(key, ONE_LAYER, "lower", UNITS_MH, short, source, statement, formula, _TF_P, units,
                 lambda n, p: one_layer_size_bits(units(n, p), p), _ITEMISED_NOTE if itemised else "")


_ITEMISED_SRC = "with Thm 4's itemised count (proof in App. D)"
BOUNDS: dict[str, Bound] = {b.key: b for b in (
    _rnn("rnn-index-lookup", "Thm 3", "P1 Thm 3 (Sec. 3; proof in App. C.1)",
         "m >= N/p for Index Lookup on length N", "m >= ceil(N/p)", rnn_index_lookup),
    _rnn("rnn-associative-recall", "Prop. 9", "P1 Prop. 9 (App. C.1)",
         "m >= N/p for single-query associative recall over N pairs", "m >= ceil(N/p), N pairs",
         rnn_associative_recall),
    _rnn("rnn-equality", "Thm 11", "P1 Thm 11 (App. F.1)",
         "mp >= N/2 for INEQ (and EQ) on {0,1}^N", "m >= ceil(N/(2p))", rnn_inequality),
    _rnn("rnn-disjointness", "Sec. 4.2", "P1 Sec. 4.2 with Thm 2 and Fact 1 (App. B.1)",
         "width Omega(N); explicit: mp >= N/2", "m >= ceil(N/(2p))", rnn_disjointness),
    _rnn("rnn-nearest-neighbor", "Thm 8", "P1 Thm 8 (Sec. 5.2; proof in App. G.1)",
         "m >= N/2p for nearest neighbour (and MQAR) with N input vectors, every query K > N/2 answered",
         "m >= ceil(N/(2p))", rnn_nearest_neighbor,
         note="the proof reads the answers of all N/2 queries: it bounds models that answer every query, not the "
              "last-query builds of the size tables (compared with INDEX instead)"),
    _rnn("rnn-nearest-neighbor-last", "Prop. 9, last query",
         "P1 Prop. 9 (App. C.1) with Fact 3, via App. G (\"Relation to Associative Recall\")",
         "a model answering the last query x_N solves single-query associative recall over N - 1 pairs: "
         "INDEX on min(N - 1, r) bits, r the pairwise margin-separated inputs",
         "m >= ceil(min(N - 1, 2^15)/p)", rnn_nearest_neighbor_last,
         _ANY_P + "; d' = 16, margin 1/4: r >= 2^15 (the even-weight sign vectors (+-1/4)^16)",
         "the built nearest-neighbour spec; r = 2^15 is a lower estimate, so above N = 2^15 + 1 the bound stays "
         "at 2^15/p although the truth may be larger"),
    _rnn("rnn-mqar-last", "Prop. 9, last query", "P1 Prop. 9 (App. C.1) with Fact 3, via App. G (MQAR)",
         "a model answering MQAR's last query solves INDEX on the N/2 first-half labels",
         "m >= ceil(N/(2p))", rnn_mqar_last,
         note="same value as Thm 8, but valid for a model that answers the last query only"),
    _rnn("rnn-k-hop-index", "INDEX reduction", "derived here from P1 Thm 2 and Fact 3 (App. B.1), on P2 Def. 5.3 "
         "and 5.5 (Sec. 5.2)",
         "INDEX on r = min(floor((N - 2k + 1)/2), |Sigma| - k - 1) bits reduces to k-hop induction heads (k = 1: "
         "induction heads) on length N over |Sigma| symbols",
         "m >= ceil(min(floor((N - 2k + 1)/2), |Sigma| - k - 1)/p)", rnn_k_hop_index,
         note="not a statement of either paper: the project's reduction, with its proof in docs/sizes.md; at a fixed "
              "|Sigma| it stops growing (r <= |Sigma| - k - 1), and an RNN of constant state solves the task "
              "(rnn-k-hop-state)",
         params=(("alphabet", REQUIRED), ("k", 1)), conditions="N >= 2k + 1 and |Sigma| >= k + 2",
         table_params=("k = 1, |Σ| = ⌊(N − 1)/2⌋ + 2", lambda n: {"k": 1, "alphabet": (n - 1) // 2 + 2})),
    _one_layer("one-layer-equality", "Thm 12", "P1 Thm 12 (App. F.1) with Thm 4 and Fact 2",
               "mpH = Omega(N) for INEQ (and EQ)", "mH >= ceil(N/(6(p + log N)))", one_layer_equality),
    _one_layer("one-layer-equality-itemised", "Thm 12, Thm 4 itemised †", f"P1 Thm 12 (App. F.1) {_ITEMISED_SRC}",
               "as one-layer-equality", "mH >= ceil((N/2)/(9p + 2 log N))", one_layer_equality, itemised=True),
    _one_layer("one-layer-disjointness", "Sec. 4.2", "P1 Sec. 4.2 with Thm 4 and Fact 1",
               "width Omega(N) for DISJ", "mH >= ceil(N/(6(p + log N)))", one_layer_disjointness),
    _one_layer("one-layer-disjointness-itemised", "Sec. 4.2, Thm 4 itemised †", f"P1 Sec. 4.2 {_ITEMISED_SRC}",
               "as one-layer-disjointness", "mH >= ceil((N/2)/(9p + 2 log N))", one_layer_disjointness,
               itemised=True),
    _one_layer("one-layer-dyck", "Thm 5", "P1 Thm 5 (Sec. 4.1) = Thm 10 (App. E), Lemma 1 (App. E)",
               "mH >= (N - 1)/(3(p + log N)) for Dyck-(2,2)", "mH >= ceil((N - 1)/(3(p + log N)))", one_layer_dyck22),
    _one_layer("one-layer-dyck-itemised", "Thm 5, Thm 4 itemised †", f"P1 Thm 5 (Sec. 4.1) {_ITEMISED_SRC}",
               "as one-layer-dyck", "mH >= ceil((N - 1)/(9p + 2 log N))", one_layer_dyck22, itemised=True),
    Bound("rnn-dyck-dfa", RNN, "upper", UNITS_STATE_BITS, "App. E", "P1 App. E (after Thm 10)",
          "a 7-state DFA recognises Dyck-(2,2): a constant-size RNN suffices", "3 state bits = ceil(log2 7), every N",
          "independent of N and p", lambda n, p: dyck22_rnn_state_bits(), lambda n, p: dyck22_rnn_state_bits()),
    Bound("rnn-k-hop-state", RNN, "upper", UNITS_STATE_BITS, "constant state", "derived here on P2 Def. 5.3 and 5.5 "
          "(Sec. 5.2), for P1 Sec. 2's recurrent models",
          "a recurrent model keeping, per symbol, the answers of hops 1 .. k from its latest occurrence computes k-hop "
          "induction heads at every N", "(k |Sigma| + 1) ceil(log2(|Sigma| + 1)) state bits, every N",
          "independent of N and p", lambda n, p, alphabet, k: k_hop_state_bits(alphabet, k),
          lambda n, p, alphabet, k: k_hop_state_bits(alphabet, k),
          note="not a statement of either paper (docs/sizes.md): at a fixed alphabet no RNN lower bound can grow with "
               "N; |Sigma| = 64: 455 bits (k = 1), 7175 bits (k = 16)",
          params=(("alphabet", REQUIRED), ("k", 1)), conditions="|Sigma| >= 2, k >= 1"),
    Bound("tracr-index-lookup", "tracr", "alternative", UNITS_WIDTH, "reported", "a tracr compilation (width 393 at N = 128)",
          "tracr's compiled Index Lookup has residual width 3N + 9", "width = 3N + 9", "tracr's float weights",
          lambda n, p: tracr_index_lookup_width(n), None,
          note="one-hot positions and indices; reported, not re-measured (tracr is not a dependency); heads and "
               "total size not known here, width only"),
    Bound("rnn-k-hop", "RNN / low-rank attention", "lower", "depth or memory (words)", "Sanford et al. via P2",
          "P2 Sec. 5.2, citing Sanford, Hsu, Telgarsky (ICML 2024)",
          "multi-layer RNNs and low-rank attention solve k-hop only with depth Omega(k) or memory (embedding "
          "dimension) Omega(N/k^6)", "depth Omega(k) or memory Omega(N/k^6); no constants stated", "not stated in P2",
          note="asymptotic only: no explicit formula, not tabulated; the memory alternative is vacuous where "
               "N <= k^6 (every model has memory >= 1), and then the statement says nothing"),
    Bound("transformer-k-hop-depth", "transformer / ANNA-transformer", "lower", "layers", "P2 Thm 4.2",
          "P2 Thm 4.2 (Sec. 4.2) and Sec. 1.1",
          "MPC simulates an L-layer ANNA-transformer with mH = O(N^eps) in O(L/(eps' - eps)) rounds, so MPC round "
          "lower bounds (conditional; Sanford, Hsu, Telgarsky, ICML 2024) give depth lower bounds, e.g. logarithmic "
          "depth for k-hop",
          "Omega(log k) layers, conditional on an MPC conjecture; no constant stated", "p = O(log N) words",
          note="a conditional depth bound without explicit constants: not tabulated"),
)}


@dataclass(frozen=True)
class Family:
    """A task family: the tasks it covers, the bounds that apply and a note on their scope."""

    key: str
    title: str
    bounds: tuple[str, ...]
    note: str = ""
    scope: str = ""  # said on the figure when the bounds are not about every task of the family


FAMILIES: dict[str, Family] = {f.key: f for f in (
    Family("index-lookup", "Index Lookup / associative recall",
           ("rnn-index-lookup", "rnn-associative-recall", "tracr-index-lookup"),
           "Thm 1 builds one layer of width O(log N); no one-layer lower bound applies (it is the upper bound)."),
    Family("equality", "Equality / Inequality",
           ("rnn-equality", "one-layer-equality", "one-layer-equality-itemised")),
    Family("disjointness", "Disjointness",
           ("rnn-disjointness", "one-layer-disjointness", "one-layer-disjointness-itemised")),
    Family("threshold", "k-DNF / k-CNF / thresholds of k-sparse features",
           ("rnn-disjointness", "one-layer-disjointness", "one-layer-disjointness-itemised"),
           "The class THRES_{2,N} contains DISJ (a 2-CNF with N/2 clauses) and INEQ (a 2-DNF with N/2 terms, "
           "P1 App. F.3): these bounds hold for some member of the class, not for every formula; a particular random "
           "3-DNF may need much less.",
           "bounds for the class: they hold for DISJ, not for a particular random formula"),
    Family("nearest-neighbor", "Nearest neighbour / MQAR", ("rnn-nearest-neighbor-last", "rnn-mqar-last"),
           "The built models answer the last query only: they are compared with INDEX through Prop. 9's reduction "
           "(Thm 8 needs every query answered). P1 has no one-layer bound for associative recall (App. C.2, "
           "\"Discussion\")."),
    Family("dyck", "Dyck-(2,2)", ("one-layer-dyck", "one-layer-dyck-itemised", "rnn-dyck-dfa"),
           "The separation in the other direction: a constant-size RNN suffices, one layer needs linear width. "
           "Lemma 1's split is not contiguous, so it gives no RNN bound (App. F, first paragraph)."),
    Family("k-hop", "Induction heads / k-hop",
           ("rnn-k-hop-index", "rnn-k-hop-state", "rnn-k-hop", "transformer-k-hop-depth"),
           "P2 states its k-hop bounds only asymptotically (Sec. 1.1, Sec. 4.2, Sec. 5.2). The RNN rows are the "
           "project's own (docs/sizes.md): at the tables' fixed |Sigma| = 64 the INDEX bound stops at "
           "ceil((63 - k)/p) and a recurrent model of constant state (455 bits for k = 1, 7175 for k = 16) solves "
           "the task, so these rows show no separation; one needs |Sigma| to grow with N (P2 Thm 5.6: |Sigma| = O(N)).",
           "|Sigma| = 64: no separation; the RNN bounds are the project's (docs/sizes.md)"),
    Family("match2", "Match2", (), "Neither paper states a lower bound for Match2 (P2 Sec. 5.1)."),
)}


def evaluate(bound: Bound, n: int, p: int, params: Mapping[str, Any] | None = None) -> tuple[int | None, int | None]:
    """(units, bits) of ``bound`` at N = n, precision p and the task parameters ``params`` (see
    :attr:`Bound.params`); (None, None) where the bound has no explicit formula or its conditions
    fail (e.g. odd N for a halves split, an alphabet too small for the reduction: :func:`why_not`)."""
    if bound.units is None or why_not(bound, n, p, params) is not None:
        return None, None
    kw = bound.arguments(params)
    return bound.units(n, p, **kw), (bound.bits(n, p, **kw) if bound.bits is not None else None)


def why_not(bound: Bound, n: int, p: int, params: Mapping[str, Any] | None = None) -> str | None:
    """None where ``bound``'s conditions hold at (N, p, ``params``), else the one that fails
    (BoundError's message); a REQUIRED parameter missing from ``params`` raises BoundError."""
    kw = bound.arguments(params)
    if bound.units is None:
        return None
    try:
        bound.units(n, p, **kw)
    except BoundError as e:
        return str(e)
    return None
