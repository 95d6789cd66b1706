"""Library protocols (level L1): P2's applications and the building blocks users need.

Every builder returns a :class:`~exactformer.constructions.mpc.protocol.Protocol` for one ``n``; positions and
machines are 0-based (P2 is 1-based; the docs translate). ⊥ is the word −1.

* :func:`match2` — P2 Def. 5.1 / Thm 5.2: one round, one ``exists`` table.
* :func:`k_hop` — P2 Def. 5.5 / Thm 5.6 (and Def. 5.3 / Thm 5.4 for ``hops = 1``, see
  :func:`induction_heads`): σ by a B-ary block search in two rounds, then pointer doubling.
* :func:`prefix_sums` — push-only (a Def-2.3 MPC protocol): B-ary up-sweep and down-sweep.
* :func:`sort` — push-only Columnsort (Leighton 1985): gather, four local sorts with three fixed
  permutations, scatter; 5 rounds.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from exactformer.constructions.mpc.protocol import Memory, Protocol, Publish, Round, Send, Step, Table, bits_for, check_count

# ------------------------------------------------------------------------------------------------
# small helpers shared by the protocols
# ------------------------------------------------------------------------------------------------


def levels(n: int, branching: int) -> int:
    """L = ceil(log_B n), at least 1 (integer arithmetic)."""
    L, size = 1, branching
    while size < n:
        L, size = L + 1, size * branching
    return L


def _ids(n: int) -> np.ndarray:
    """Machine ids as a [1, n] row (broadcasts against [B, n])."""
    return np.arange(n, dtype=np.int64)[None, :]


# ------------------------------------------------------------------------------------------------
# Match2 (P2 Def. 5.1, Thm 5.2)
# ------------------------------------------------------------------------------------------------


def match2(n: int, modulus: int) -> Protocol:
    """Match2(X)_i = 1{∃ j ∈ [N]: x_i + x_j ≡ 0 (mod M)} for X ∈ [0, M)^N (j = i allowed).

    One round: every machine publishes its residue x mod M into an ``exists`` table and looks up
    (M − x) mod M. Compiled: one layer, one head, key width 1, value width 1 (P2 Thm 5.2: one layer,
    one head, embedding dimension 1). Up to n publishers share a key, so the fixed-point step must
    satisfy S >= n."""
    n = check_count(n, "n", 1, "sequence length N")
    M = check_count(modulus, "modulus", 1, "M: inputs are residues in [0, M)")

    def init(x: np.ndarray) -> Memory:
        return {"x": x}

    def step(mem: Memory) -> Step:
        x = mem["x"]
        return Step({"x": x}, publish={"residues": Publish(key=x % M)}, lookup={"residues": ((M - x) % M)[..., None]})

    rounds = (Round("match", step, tables=(Table("residues", "exists", "match"),)),)
    return Protocol("match2", n, bits_for(M), 2, init, rounds, lambda mem: mem["match"][..., 0].copy(),
                    {"n": n, "modulus": M})


# ------------------------------------------------------------------------------------------------
# induction heads and k-hop (P2 Defs. 5.3, 5.5; Thms 5.4, 5.6)
# ------------------------------------------------------------------------------------------------


def _sigma_rounds(n: int, B: int) -> tuple[list[Round], Callable[[Memory], np.ndarray]]:
    """Two rounds (one if n <= B) computing σ, and the local map that reads σ from the memory after
    them (0-based: σ(p) = 1 + last q < p with w_q = w_p, −1 if none).

    Blocks: L = ceil(log_B n) levels; the level-ℓ block of position p is a_ℓ(p) = ⌊p / B^{L−ℓ}⌋
    (level L = single positions). [0, p) is the disjoint union over ℓ of p's *left siblings*
    a_ℓ(p) − t, 1 <= t <= a_ℓ(p) mod B, deeper levels to the right of shallower ones; likewise the
    rest of p's level-ℓ block after p is the union of its *right siblings* a_ℓ′(p) + t at the levels
    ℓ′ > ℓ, t <= B − 1 − a_ℓ′(p) mod B.

    * round ``next`` (exists tables R_ℓ′, ℓ′ = 2..L, key (w_j, a_ℓ′(j))): machine j asks for w_j in
      each right sibling. With ℓ_j the deepest level of a hit (0 if none), j is the last occurrence
      of w_j in its level-ℓ block exactly for ℓ >= ℓ_j.
    * round ``prev`` (unique tables U_ℓ, ℓ = 1..L): j publishes key (w_j, a_ℓ(j)) with record j for
      every ℓ >= ℓ_j — one publisher per key: the last occurrence of w_j in that block; machine p
      looks up (w_p, a_ℓ(p) − t) for its left siblings. The hit at the deepest level, nearest
      sibling (smallest t) is the last earlier occurrence prev(p); σ(p) = prev(p) + 1.

    This replaces a level-by-level descent (L − 1 further rounds; docs/mpc.md) by one round of
    unique reads: 2 rounds for every B, with (L − 1)(B − 1) and L(B − 1) heads."""
    L = levels(n, B)
    span = [B ** (L - lev) for lev in range(L + 1)]  # span[ℓ] = block size at level ℓ
    us = np.arange(1, B, dtype=np.int64)  # siblings t = 1..B−1

    def pairs(w: np.ndarray, blocks: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Keys (w, block) [B, n, B−1, 2], ⊥ where not ``ok`` ([1, n, B−1])."""
        q = np.empty(w.shape + (B - 1, 2), dtype=np.int64)
        q[..., 0] = np.where(ok, w[..., None], -1)
        q[..., 1] = np.where(ok, blocks, -1)
        return q

    def nxt(mem: Memory) -> Step:
        ids = _ids(n)
        w = mem["w"]
        pub, look = {}, {}
        for lev in range(2, L + 1):
            a = ids // span[lev]
            pub[f"R{lev}"] = Publish(key=np.stack(np.broadcast_arrays(w, a), axis=-1))
            look[f"R{lev}"] = pairs(w, a[..., None] + us, us <= B - 1 - (a % B)[..., None])
        return Step({"w": w}, publish=pub, lookup=look)

    def prev(mem: Memory) -> Step:
        ids = _ids(n)
        w = mem["w"]
        deepest = np.zeros(w.shape, dtype=np.int64)
        for lev in range(2, L + 1):
            deepest = np.where((mem[f"right{lev}"] == 1).any(axis=-1), lev, deepest)
        pub, look = {}, {}
        for lev in range(1, L + 1):
            a = ids // span[lev]
            pub[f"U{lev}"] = Publish(words=np.broadcast_to(ids, w.shape), key=np.stack(np.broadcast_arrays(w, a), axis=-1),
                                     present=deepest <= lev)
            look[f"U{lev}"] = pairs(w, a[..., None] - us, us <= (a % B)[..., None])
        return Step({"w": w}, publish=pub, lookup=look)

    rounds = []
    if L >= 2:
        rounds.append(Round("next", nxt, tables=tuple(
            Table(f"R{lev}", "exists", f"right{lev}", lookups=B - 1, key_words=2, max_matches=min(n, span[lev]))
            for lev in range(2, L + 1))))
    rounds.append(Round("prev", prev, tables=tuple(
        Table(f"U{lev}", "unique", f"left{lev}", lookups=B - 1, key_words=2, value_words=1) for lev in range(1, L + 1))))

    def sigma(mem: Memory) -> np.ndarray:
        out = np.full(mem["w"].shape, -1, dtype=np.int64)
        for lev in range(1, L + 1):  # deeper levels overwrite: they lie closer to p
            left = mem[f"left{lev}"]  # [B, n, B−1]: last occurrence in sibling t = 1..B−1
            hit = left >= 0
            t = hit.argmax(axis=-1)
            out = np.where(hit.any(axis=-1), np.take_along_axis(left, t[..., None], axis=-1)[..., 0] + 1, out)
        return out

    return rounds, sigma


def _token_round(name: str, into: str, pointer: Callable[[Memory], np.ndarray]) -> Round:
    """Read w at position ``pointer(mem)`` (⊥ stays ⊥) from a positional unique table."""

    def step(mem: Memory) -> Step:
        w = mem["w"]
        return Step({"w": w}, publish={"tok": Publish(words=w)}, lookup={"tok": pointer(mem)[..., None]})

    return Round(name, step, tables=(Table("tok", "unique", into, key_words=0, value_words=1),))


def k_hop(n: int, hops: int, alphabet: int, branching: int = 2, name: str = "k-hop") -> Protocol:
    """k-hop induction heads (P2 Def. 5.5): answer w_{σ^k(p)} at every position p (⊥ = −1).

    σ(p) = 1 + (last q < p with w_q = w_p), ⊥ if none (0-based; P2's σ(w, i) = 1 + last j < i with
    w_j = w_i, with w_0 = ⊥); σ^k is the k-fold composition with ⊥ absorbing, so the second hop
    searches before σ(p), not before p. Rounds:

    * min(L, 2) rounds computing σ (:func:`_sigma_rounds`; L = ceil(log_B n));
    * pointer doubling over the bits b_0..b_T of k (T = ⌊log₂ k⌋): P = σ^{2^t}, A = σ^{k mod 2^t};
      rounds ``double-j`` (j = 1..T) read P at P(p) (P ← P∘P) and, if b_{j−1} (j >= 2), P at A(p)
      (A ← P∘A) from a positional unique table; round ``final`` reads P at A(p) for the top bit;
      bit 0 is local (A = σ or the identity);
    * round ``token`` reads w at σ^k(p).

    Rounds: min(L, 2) + 1 for k = 1 and min(L, 2) + T + 2 for k >= 2 — at most
    ceil(log_B N) + ⌊log₂ k⌋ + 2. Heads per round: (L−1)(B−1) (``next``), L(B−1) (``prev``), at most
    2 (doubling), 1 (token). Tokens enter only through equality of key words, so every input is
    covered by its equality pattern."""
    n = check_count(n, "n", 1, "sequence length N")
    k = check_count(hops, "hops", 1, "number of hops k")
    S = check_count(alphabet, "alphabet", 1, "|Σ|: tokens are integers in [0, |Σ|)")
    B = check_count(branching, "branching", 2, "B of the B-ary existence search")
    L = levels(n, B)
    T = k.bit_length() - 1
    bit = [(k >> j) & 1 for j in range(T + 1)]
    rounds, sigma = _sigma_rounds(n, B)

    def init(x: np.ndarray) -> Memory:
        return {"w": x}

    if T == 0:
        rounds.append(_token_round("token", "answer", sigma))
    else:
        def doubling(j: int):
            def step(mem: Memory) -> Step:
                ids = _ids(n)
                w = mem["w"]
                if j == 1:
                    P = sigma(mem)
                    A = P if bit[0] else np.broadcast_to(ids, P.shape).copy()
                else:
                    P = mem["ptr"][..., 0]
                    A = mem["ptr"][..., 1] if (j >= 3 and bit[j - 2]) else mem["A"]
                look = [P] if j <= T else []
                if j > T or (j >= 2 and bit[j - 1]):
                    look.append(A)
                keep = {"w": w, "A": A} if j <= T else {"w": w}
                return Step(keep, publish={"ptr": Publish(words=P)}, lookup={"ptr": np.stack(look, axis=-1)})

            return step

        for j in range(1, T + 1):
            lam = 2 if (j >= 2 and bit[j - 1]) else 1
            rounds.append(Round(f"double-{j}", doubling(j), tables=(
                Table("ptr", "unique", "ptr", lookups=lam, key_words=0, value_words=1),)))
        rounds.append(Round("final", doubling(T + 1), tables=(
            Table("ptr", "unique", "ptr", lookups=1, key_words=0, value_words=1),)))
        rounds.append(_token_round("token", "answer", lambda mem: mem["ptr"][..., 0]))

    memory = max(3 * L, 1 + L * (B - 1), 6)
    p = bits_for(max(S, n + B))
    return Protocol(name, n, p, memory, init, tuple(rounds), lambda mem: mem["answer"][..., 0].copy(),
                    {"n": n, "hops": k, "alphabet": S, "branching": B})


def induction_heads(n: int, alphabet: int, branching: int = 2) -> Protocol:
    """Induction heads (P2 Def. 5.3, Thm 5.4): w_{σ(p)} at every position — :func:`k_hop` with k = 1:
    3 rounds (2 if n <= B) for every n, with at most L(B − 1) heads per round."""
    return k_hop(n, 1, alphabet, branching, name="induction-heads")


# ------------------------------------------------------------------------------------------------
# prefix sums (push-only MPC)
# ------------------------------------------------------------------------------------------------


def up_route(n: int, B: int, lev: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round ``up-ℓ`` of :func:`prefix_sums` (ℓ = ``lev``): (lead [n] bool, dest [n], slot [n]) —
    the level-(ℓ−1) leaders (i mod B^{ℓ−1} = 0) send to their level-ℓ leader ⌊i / B^ℓ⌋·B^ℓ, slot
    = their index among its children; dest −1 for the others. A function of the ids only: the
    routing is oblivious (the weights put it in the position embedding)."""
    ids = np.arange(n, dtype=np.int64)
    lead = ids % B ** (lev - 1) == 0
    return lead, np.where(lead, (ids // B**lev) * B**lev, -1), (ids // B ** (lev - 1)) % B


def down_route(n: int, B: int, lev: int) -> tuple[np.ndarray, np.ndarray]:
    """The down round at level ℓ = ``lev`` of :func:`prefix_sums`: (lead [n, B−1] bool, dest
    [n, B−1]) — a level-ℓ leader i (i mod B^ℓ = 0) sends to its child u = 1..B−1, machine
    i + u·B^{ℓ−1}, where that exists (dest −1 elsewhere); slot 0. Oblivious, like :func:`up_route`."""
    ids = np.arange(n, dtype=np.int64)[:, None]
    child = ids + np.arange(1, B, dtype=np.int64) * B ** (lev - 1)
    lead = (ids % B**lev == 0) & (child < n)
    return lead, np.where(lead, child, -1)


def prefix_sums(n: int, word_bits: int, fan_in: int = 2) -> Protocol:
    """y_i = (x_0 + … + x_i) mod 2^p by a B-ary tree (B = ``fan_in``), push-only: 2L rounds,
    L = ceil(log_B n).

    The level-ℓ block of i is ⌊i / B^ℓ⌋ (bottom-up; level 0 = single machines); its leader is its
    first machine. Round ``up-ℓ`` (ℓ = 1..L): each level-(ℓ−1) leader sends its block sum to the
    level-ℓ leader, slot = its index among the siblings; the receiver keeps the B sums. Round
    ``down-m`` (m = 1..L, level ℓ = L − m + 1): each level-ℓ leader, knowing the sum of everything
    before its block (0 at the root), sends child u = 1..B−1 its offset: the leader's offset plus
    the sums of children 0..u−1 (child 0 is the leader itself). ψ: y_i = offset_i + x_i.
    Resources: s = L·B + 3 words, α = 1 (up) and B − 1 (down) destinations, B inbox slots."""
    n = check_count(n, "n", 1, "number of words N")
    p = check_count(word_bits, "word_bits", 1, "p, bits per word")
    B = check_count(fan_in, "fan_in", 2, "B, children per tree node")
    L = levels(n, B)
    mod = 1 << p

    def init(x: np.ndarray) -> Memory:
        return {"x": x}

    def kept(mem: Memory) -> Memory:
        return {k: v for k, v in mem.items() if k.startswith("kids") or k in ("x", "off")}

    def up(lev: int):
        lead, dest, slot = up_route(n, B, lev)

        def step(mem: Memory) -> Step:
            new = kept(mem)
            if lev == 1:
                value = mem["x"]
            else:
                kids = mem["inbox"]
                new[f"kids{lev - 1}"] = kids
                value = np.where(kids >= 0, kids, 0).sum(axis=-1) % mod
            shape = mem["x"].shape
            return Step(new, send=Send(np.broadcast_to(dest, shape), np.broadcast_to(slot, shape),
                                       np.where(lead, value, 0)))

        return step

    def down(lev: int):
        lead, dest = down_route(n, B, lev)

        def step(mem: Memory) -> Step:
            new = kept(mem)
            if lev == L:
                new[f"kids{L}"] = mem["inbox"]
                off = np.where(_ids(n) == 0, 0, -1) + np.zeros_like(mem["x"])
            else:
                got = mem["inbox"][..., 0]
                off = np.where(got >= 0, got, mem["off"])
            new["off"] = off
            kids = np.where(new[f"kids{lev}"] >= 0, new[f"kids{lev}"], 0)
            before = (np.cumsum(kids, axis=-1) - kids)[..., 1:]  # [B, n, B−1], u = 1..B−1
            shape = before.shape
            word = np.where(lead, (off[..., None] + before) % mod, 0)
            del new[f"kids{lev}"]
            return Step(new, send=Send(np.broadcast_to(dest, shape), np.zeros(shape, dtype=np.int64), word))

        return step

    rounds = [Round(f"up-{lev}", up(lev), sends=1, slots=B) for lev in range(1, L + 1)]
    rounds += [Round(f"down-{L - lev + 1}", down(lev), sends=B - 1, slots=1) for lev in range(L, 0, -1)]

    def output(mem: Memory) -> np.ndarray:
        got = mem["inbox"][..., 0]
        off = np.where(got >= 0, got, mem["off"])
        return (off + mem["x"]) % mod

    return Protocol("prefix-sums", n, p, L * B + 3, init, tuple(rounds), output,
                    {"n": n, "word_bits": p, "fan_in": B})


# ------------------------------------------------------------------------------------------------
# sorting: Columnsort (Leighton 1985), push-only
# ------------------------------------------------------------------------------------------------


def columnsort_shape(n: int) -> tuple[int, int]:
    """(rows r, columns c) for n items: r·c >= n, c | r, r even, r >= 2(c − 1)² (Leighton's
    condition), c + 1 <= n machines when c >= 2; the smallest r (then the largest c)."""
    best = None
    for c in range(1, n + 1):
        if c >= 2 and c + 1 > n:
            break
        step = c * 2 // (2 if c % 2 == 0 else 1)  # lcm(c, 2)
        r = max(-(-n // c), 2 * (c - 1) ** 2, 1)
        r = -(-r // step) * step
        if best is None or r <= best[0]:
            best = (r, c)
        if 2 * (c - 1) ** 2 > n:
            break
    return best


def sort(n: int, value_bits: int) -> Protocol:
    """Sort n words x_i in [0, 2^value_bits) ascending: machine k ends with the k-th smallest.

    Push-only Columnsort: items are the distinct words x_i·n + i (p = bits of 2^value_bits·n, so
    INF = 2^p − 1 exceeds every item and pads the r × c matrix, r, c from :func:`columnsort_shape`);
    column j lives on machine j. Rounds (local sorts of a column are local computation):

    1. ``gather``: machine i sends its item to column i // r, slot i mod r (column-major order);
    2. ``transpose``: sort each column; the item of column-major index k goes to row-major place k:
       column k mod c, row k // c;
    3. ``untranspose``: sort; the inverse permutation;
    4. ``shift``: sort; column-major index k moves to k + r/2 (columns 0..c; the missing top half of
       column 0 is −∞, the bottom half of column c is +∞);
    5. ``scatter``: sort; the item at shifted column-major index K has rank K − r/2; ranks < n go
       to machine K − r/2 (the INF padding has the top ranks and is dropped).

    With one column (c = 1) only ``gather`` and ``scatter`` remain. Leighton's theorem: after the
    fourth sort the matrix is sorted in column-major order when r >= 2(c − 1)² and c | r.
    Resources: s = r + 2 words; α = 1, c, c, 2, r destinations; inbox r (1 in ``scatter``)."""
    n = check_count(n, "n", 1, "number of words N")
    vb = check_count(value_bits, "value_bits", 1, "bits of the words to sort")
    r, c = columnsort_shape(n)
    p = ((1 << vb) * n).bit_length()
    INF = (1 << p) - 1
    BIG = np.int64(1) << 62
    half = r // 2

    def init(x: np.ndarray) -> Memory:
        return {"x": x}

    def gather(mem: Memory) -> Step:
        ids = _ids(n)
        x = mem["x"]
        item = x * n + ids
        shape = x.shape
        return Step({"x": x}, send=Send(np.broadcast_to(ids // r, shape), np.broadcast_to(ids % r, shape), item))

    def column(mem: Memory, pad: bool) -> np.ndarray:
        """Sorted columns [B, c+1, r] of machines 0..c; empty slots sort last (BIG) or are INF padding."""
        col = mem["inbox"][:, : c + 1, :]
        if pad:  # after gather: column-major indices >= n are padding
            k = np.arange(c + 1)[:, None] * r + np.arange(r)[None, :]
            col = np.where((k >= n) & (np.arange(c + 1)[:, None] < c), INF, col)
        return np.sort(np.where(col >= 0, col, BIG), axis=-1)

    def permute(mem: Memory, cols: np.ndarray, dest_of, slot_of, width: int) -> Step:
        """Send item (column j, row i) of ``cols`` to (dest_of(j, i), slot_of(j, i))."""
        x = mem["x"]
        B = x.shape[0]
        j = np.arange(cols.shape[1])[:, None]
        i = np.arange(r)[None, :]
        ok = cols < BIG
        dest = np.full((B, n, width), -1, dtype=np.int64)
        slot = np.zeros((B, n, width), dtype=np.int64)
        word = np.zeros((B, n, width), dtype=np.int64)
        dest[:, : cols.shape[1], :r] = np.where(ok, dest_of(j, i), -1)
        slot[:, : cols.shape[1], :r] = np.where(ok, slot_of(j, i), 0)
        word[:, : cols.shape[1], :r] = np.where(ok, cols, 0)
        return Step({"x": x}, send=Send(dest, slot, word))

    def transpose(mem: Memory) -> Step:
        k = lambda j, i: j * r + i  # noqa: E731  (column-major index)
        return permute(mem, column(mem, True)[:, :c], lambda j, i: k(j, i) % c, lambda j, i: k(j, i) // c, r)

    def untranspose(mem: Memory) -> Step:
        k = lambda j, i: i * c + j  # noqa: E731  (row-major index)
        return permute(mem, column(mem, False)[:, :c], lambda j, i: k(j, i) // r, lambda j, i: k(j, i) % r, r)

    def shift(mem: Memory) -> Step:
        K = lambda j, i: j * r + i + half  # noqa: E731
        return permute(mem, column(mem, False)[:, :c], lambda j, i: K(j, i) // r, lambda j, i: K(j, i) % r, r)

    def scatter(mem: Memory) -> Step:
        cols = column(mem, c == 1)[:, : c + 1 if c > 1 else 1]
        j = np.arange(cols.shape[1])[:, None]
        i = np.arange(r)[None, :]
        # column 0's items sit below its r/2 empty (−∞) rows: rank = shifted index − r/2
        rank = np.where(j == 0, i, j * r + i - half)
        cols = np.where(rank < n, cols, BIG)  # the INF padding has the top ranks
        return permute(mem, cols, lambda j, i: rank, lambda j, i: np.zeros_like(rank), r)

    if c == 1:
        rounds = (Round("gather", gather, sends=1, slots=r), Round("scatter", scatter, sends=r, slots=1))
    else:
        rounds = (Round("gather", gather, sends=1, slots=r), Round("transpose", transpose, sends=c, slots=r),
                  Round("untranspose", untranspose, sends=c, slots=r), Round("shift", shift, sends=2, slots=r),
                  Round("scatter", scatter, sends=r, slots=1))

    def output(mem: Memory) -> np.ndarray:
        got = mem["inbox"][..., 0]
        return np.where(got >= 0, got // n, -1)

    return Protocol("sort", n, p, r + 2, init, rounds, output, {"n": n, "value_bits": vb, "rows": r, "columns": c})
