"""P2's string applications as registered constructions: EMA programs.

Each builder returns a :class:`~exactformer.constructions.mpc.applications.ProgramModel`: the protocol
(L1), its compiled EMA program (L2, Thm 4.1: round r -> layer r) and their resources. ``xf.build``
wraps it in :class:`exactformer.verify.mpc.check.MPCModel` (``model(inputs)`` answers per
position, None for ⊥); ``xf.verify`` and ``exactformer verify <name>`` run the four-way
differential check (modes exhaustive and sample; an EMA program has no certificate, its
element-wise maps being arbitrary functions, P2 Def. 2.2).

| name | theorem | protocol |
|---|---|---|
| ``induction-heads`` | P2 Thm 5.4 (Def. 5.3) | B-ary existence search, 3 rounds (docs/mpc.md) |
| ``k-hop`` | P2 Thm 5.6 (Def. 5.5) | σ in 2 rounds, pointer doubling over the bits of k, the token |

Match2 (P2 Thm 5.2) is registered as its softmax lowering (:mod:`exactformer.constructions.theorems.match2`);
its EMA program is the check's L1/L2 (``exactformer.verify.mpc.check.build("match2", n)``). The
library protocols are not registered constructions -- no paper claims them, and the registry,
the sizes tables and ``verify all`` are about the papers' constructions: prefix sums and Columnsort
run through ``exactformer.verify.mpc.check.build("prefix-sums" | "sort", n)`` (Columnsort at
N <= 1024: its send heads hold Θ(N^{4/3}) value words per layer).
"""

from __future__ import annotations

from exactformer.constructions.mpc.protocol import check_count
from exactformer.constructions.mpc.applications import APPLICATIONS, ProgramModel
from exactformer.constructions.core.registry import Claim, NoRows, construction


_NO_ROWS = NoRows("k-hop", "Induction heads and k-hop are built as EMA programs (P2 Thm 4.1 compilation: words in memory "
                  "slots, not stored weight matrices), so this page, which counts stored weights, has no row for "
                  "them, and the figure above shows bounds only. Their layers, heads per layer, words per head and "
                  "memory per N and k are tabulated in "
                  "[docs/mpc.md](mpc.md#resource-tables-generated-by-benchmarksmpc_tablespy---write), beside P2's "
                  "O(log k)-layer bound; those widths count the words heads read and write, not the per-token maps "
                  "between heads (arbitrary functions in P2's model).")


@construction("induction-heads", task=APPLICATIONS["induction-heads"], theorem=APPLICATIONS["induction-heads"].theorem,
              claim=Claim("P2 Thm 5.4 (Sec. 5.2)", "O(1)", "O(N^((eps'-eps)/4))", "O(N^eps')", "p-bit words",
                          "sub-linear width (ANNA)"),
              sizes=_NO_ROWS)
def induction_heads(n: int, alphabet: int | None = None, branching: int = 2) -> ProgramModel:
    """Induction heads (P2 Def. 5.3, Thm 5.4) as an EMA program: the answer at position p is
    w_{σ(p)}, σ(p) = 1 + (the last q < p with w_q = w_p), None where there is none.

    Parameters
    ----------
    n : int >= 1. Sequence length N.
    alphabet : int >= 1. |Σ|: tokens are integers in [0, |Σ|). Default: N.
    branching : int >= 2. B of the B-ary existence search (heads (L - 1)(B - 1) and L(B - 1),
        L = ceil(log_B N)).
    """
    return APPLICATIONS["induction-heads"].build(n, alphabet=alphabet, branching=branching)


@construction("k-hop", task=APPLICATIONS["k-hop"], theorem=APPLICATIONS["k-hop"].theorem,
              claim=Claim("P2 Thm 5.6 (Sec. 5.2)", "O(log k)", "O(N^((eps'-eps)/4))", "O(N^eps')", "p-bit words",
                          "sub-linear width (ANNA), |Sigma| = O(N)"),
              sizes=_NO_ROWS)
def k_hop(n: int, k: int = 2, alphabet: int | None = None, branching: int = 2) -> ProgramModel:
    """k-hop induction heads (P2 Def. 5.5, Thm 5.6) as an EMA program: the answer at position p is
    w_{σ^k(p)} (σ composed k times, ⊥ absorbing), None where σ^k(p) = ⊥.

    Parameters
    ----------
    n : int >= 1. Sequence length N.
    k : int >= 1. The number of hops (layers: min(L, 2) + floor(log2 k) + 2 for k >= 2).
    alphabet : int >= 1. |Σ|: tokens are integers in [0, |Σ|). Default: N.
    branching : int >= 2. B of the B-ary existence search that computes σ.
    """
    check_count(k, "k", 1, "the number of hops")
    return APPLICATIONS["k-hop"].build(n, hops=k, alphabet=alphabet, branching=branching)
