"""Operations on views shared by the blocks' local certificates.

* :func:`value_tables`: an attention head's values at every key position, as tables over each
  group's variables, and their hull (the range of any key's value);
* :func:`import_target`: the output of a head whose rows have one target key, at every query:
  the target's value (a table over the target's view) times the target weight, plus the
  stray keys' contribution -- the query's view gains the target's variables (or a pointer variable
  when the target depends on the query's token);
* :func:`join`: views of the same positions from several sources (the residual, each head)
  brought onto common variables, identical variables unified (the same input position), so that
  tables can be combined entrywise.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from exactformer.constructions.core.proof import CertContext, Unproven
from exactformer.constructions.core.views import Box, Group, State, Var, broadcast, refine, unique_rows


def value_tables(ctx: CertContext, state: State, hw: dict, where: str) -> dict[str, Any]:
    """The head's values [*, dv] per group (dv = its nonzero value dims) and their hull [dv]."""
    arith = ctx.arith
    vdims = np.flatnonzero(np.any(hw["W_V"] != 0, axis=0) | (hw["b_V"] != 0))
    rows = np.flatnonzero(np.any(hw["W_V"] != 0, axis=1))
    untracked = np.setdiff1d(rows, state.cols)
    if untracked.size:
        raise Unproven(f"{where}: the values read column(s) {untracked[:4].tolist()}, which no view tracks "
                       "(code columns may be read only by queries and keys)")
    ci = state.col_index(rows)
    if any(isinstance(g, Group) and g.follows_any(ci) for g in state.groups):  # run segments hold no code-held pointer
        raise Unproven(f"{where}: the values read a column that follows a code-held content pointer")
    W = hw["W_V"][np.ix_(rows, vdims)]
    b = hw["b_V"][vdims]
    tables = [arith.affine(g.table[..., ci], W, b) for g in state.groups]
    lo = np.min(np.stack([np.asarray(t.lo).reshape(-1, vdims.size).min(axis=0) for t in tables]), axis=0)
    hi = np.max(np.stack([np.asarray(t.hi).reshape(-1, vdims.size).max(axis=0) for t in tables]), axis=0)
    return {"tables": tables, "hull": Box(lo, hi), "vdims": vdims}


def head_output(arith: Any, w_t: Box, val: Box, w_l: Box, counts: np.ndarray, hull: Box) -> Box:
    """The head output for one row class: w_t * value + sum_l counts_l * (w_l * any value), the
    products rounded and the sum taken as the forward pass takes it (``arith.sum``).
    ``val``: [..., dv]; w_t scalar box; w_l, counts [L]; hull [dv]."""
    main = arith.mul(Box(np.asarray(w_t.lo)[..., None], np.asarray(w_t.hi)[..., None]), val)  # [..., dv]
    stray = arith.mul(Box(np.asarray(w_l.lo)[:, None], np.asarray(w_l.hi)[:, None]), hull)  # [L, dv]
    lead = np.shape(main.lo)[:-1]
    L, dv = np.shape(stray.lo)
    terms_lo = np.concatenate([np.asarray(main.lo)[..., None, :], np.broadcast_to(stray.lo, lead + (L, dv))], axis=-2)
    terms_hi = np.concatenate([np.asarray(main.hi)[..., None, :], np.broadcast_to(stray.hi, lead + (L, dv))], axis=-2)
    c = np.concatenate([[1], np.asarray(counts)]).reshape((L + 1, 1))
    return arith.sum(Box(terms_lo, terms_hi), axis=-2, counts=c)


def import_target(ctx: CertContext, state: State, need: np.ndarray, q_t: np.ndarray, q_u: np.ndarray,
                  target: np.ndarray, cls: np.ndarray, w_t: Box, w_l: Box, counts: np.ndarray,
                  V: dict[str, Any]) -> list[tuple[Group, Box]]:
    """Head outputs at ``need`` (see the module docstring). Queries are (q_t, q_u) pairs with a
    target key position and a row class each."""
    arith = ctx.arith
    g_of, m_of = state.group_of(np.arange(ctx.T))
    out: list[tuple[Group, Box]] = []
    # per need position: is the target (and row class) the same for every token of its domain?
    start = np.searchsorted(q_t, need) if np.all(np.diff(q_t) >= 0) else None
    if start is None:
        raise Unproven("internal: queries must be ordered by position")
    end = np.append(start[1:], q_t.size)
    lens = end - start
    same = (target == np.repeat(target[start], lens)) & (cls == np.repeat(cls[start], lens))
    fixed = np.logical_and.reduceat(same, start) if same.size else np.zeros(0, dtype=bool)
    # ---- fixed target: the query's view gains the target's view ------------------------------------
    fp = need[fixed]
    if fp.size:
        tgt, c = target[start[fixed]], cls[start[fixed]]
        key = np.stack([g_of[fp], g_of[tgt], c], axis=1)
        ukey, inv = unique_rows(key)
        for i, (gq, gt, ci) in enumerate(ukey):
            sel = np.flatnonzero(inv.reshape(-1) == i)
            t_group = state.groups[gt].take(m_of[tgt[sel]])
            z = head_output(arith, w_t[ci], V["tables"][gt], w_l[ci], counts[ci], V["hull"])
            out.append((Group(fp[sel], t_group.vars, z), z))
    # ---- pointer: the target depends on the query's own token --------------------------------------
    for j in np.flatnonzero(~fixed):
        p = int(need[j])
        a, b = int(start[j]), int(end[j])
        gq = state.groups[g_of[p]].take(np.array([m_of[p]]))
        own = [i for i, v in enumerate(gq.vars) if v.kind == "tok" and int(v.at[0]) == p]
        if len(own) != 1:
            raise Unproven(f"position {p}: its query depends on its token, but its view has no variable for it")
        base = own[0]
        bv = gq.vars[base]
        if not np.array_equal(np.asarray(q_u[a:b]), bv.domain):
            raise Unproven("internal: query tokens differ from the position's domain")
        tg = target[a:b]
        tgroups = np.unique(g_of[tg])
        t_tab = V["tables"][tgroups[0]]
        for g in tgroups:
            G = state.groups[g]
            if len(G.vars) != 1 or G.vars[0].kind != "tok" or not np.array_equal(G.pos[m_of[tg[g_of[tg] == g]]],
                                                                                  G.vars[0].at[m_of[tg[g_of[tg] == g]]]):
                raise Unproven(f"position {p}: a looked-up position's view depends on more than its own token")
            if not (np.array_equal(G.vars[0].domain, state.groups[tgroups[0]].vars[0].domain)
                    and np.array_equal(G.vars[0].cls, state.groups[tgroups[0]].vars[0].cls)
                    and V["tables"][g].lo.shape == t_tab.lo.shape
                    and np.array_equal(V["tables"][g].lo, t_tab.lo) and np.array_equal(V["tables"][g].hi, t_tab.hi)):
                raise Unproven(f"position {p}: the looked-up positions do not all hold the same kind of value")
        tv = state.groups[tgroups[0]].vars[0]
        # refine the base variable's classes by row class, and tabulate z per (row class, target class)
        rc = cls[a:b]
        nv, _ = refine(bv, rc, [])
        ncls = nv.ncls
        row_of_cls = np.zeros(ncls, dtype=np.int64)
        row_of_cls[nv.cls] = rc
        zs = [head_output(arith, w_t[int(r)], t_tab, w_l[int(r)], counts[int(r)], V["hull"]) for r in row_of_cls]
        z = Box(np.stack([np.asarray(x.lo) for x in zs]), np.stack([np.asarray(x.hi) for x in zs]))  # [ncls_base, ncls_t, dv]
        ptr = Var("ptr", tg[None, :].astype(np.int64), tv.domain, tv.cls, base=0)
        out.append((Group(gq.pos, [nv, ptr], z), z))
    return out


# ------------------------------------------------------------------------------------------------
# joining views
# ------------------------------------------------------------------------------------------------


def _same(a: Var, b: Var) -> np.ndarray | bool:
    """Whether two variables are the same input: tok variables per member (same position), the
    others by identity."""
    if a.kind == "tok" or b.kind == "tok":
        return (a.at == b.at) if a.kind == b.kind and np.array_equal(a.domain, b.domain) else False
    return a.uid == b.uid


def join_views(parts: list[tuple[Group, Box]]) -> list[tuple[Group, list[Box]]]:
    """Views of the same members (the parts' groups have equal ``pos``) from several sources, on
    common variables: one (group, tables) per subset of members on which the variables coincide
    in the same way; ``tables[i]`` is part i's table broadcast to the group's variables, and the
    group's own table is ``tables[0]``. Identical variables are unified, their class maps refined
    to the common refinement."""
    pos = parts[0][0].pos
    for g, _ in parts:
        if not np.array_equal(g.pos, pos):
            raise ValueError("join_views: the parts must list the same positions in the same order")
    entries = [(pi, vi) for pi, (g, _) in enumerate(parts) for vi in range(len(g.vars))]
    pats = [np.broadcast_to(np.asarray(_same(parts[a][0].vars[va], parts[b][0].vars[vb]), dtype=bool), pos.shape)
            for i, (a, va) in enumerate(entries) for (b, vb) in entries[i + 1:]]
    pattern = np.stack(pats, axis=1) if pats else np.zeros((pos.size, 0), dtype=bool)
    upat, pinv = unique_rows(pattern.astype(np.int64))
    out = []
    for k in range(upat.shape[0]):
        members = np.flatnonzero(pinv.reshape(-1) == k)
        sub = [(g.take(members), t) for g, t in parts]
        jvars, tables = _join_consistent(sub, upat[k], entries)
        out.append((Group(pos[members], jvars, tables[0]), tables))
    return out


def _join_consistent(parts: list[tuple[Group, Box]], pattern: np.ndarray, entries: list) -> tuple[list[Var], list[Box]]:
    n = len(entries)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    q = 0
    for i in range(n):
        for j in range(i + 1, n):
            if pattern[q]:
                parent[find(j)] = find(i)
            q += 1
    roots = sorted({find(i) for i in range(n)})
    joint = [roots.index(find(i)) for i in range(n)]
    entry_of = {e: i for i, e in enumerate(entries)}
    var = [parts[pi][0].vars[vi] for pi, vi in entries]
    jvars = []
    for j, r in enumerate(roots):
        members = [i for i in range(n) if joint[i] == j]
        stacked = np.stack([var[i].cls for i in members], axis=1)
        _, jc = unique_rows(stacked)
        v = replace(var[r], cls=jc.reshape(-1).astype(np.int64))
        if v.kind == "ptr":  # its base, in joint terms
            v = replace(v, base=joint[entry_of[(entries[r][0], var[r].base)]])
        jvars.append(v)
    tables = []
    for pi, (g, tab) in enumerate(parts):
        axes = []
        for vi, v in enumerate(g.vars):
            J = joint[entry_of[(pi, vi)]]
            rep = np.zeros(jvars[J].ncls, dtype=np.int64)  # a domain value of each joint class
            rep[jvars[J].cls] = np.arange(jvars[J].cls.size)
            own = v.cls[rep]
            tab = Box(np.take(tab.lo, own, axis=vi), np.take(tab.hi, own, axis=vi))
            axes.append(J)
        tables.append(broadcast(tab, axes, len(jvars)))
    return jvars, tables
