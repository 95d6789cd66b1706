"""Hand-built adversarial models: builder output changed the way a careless or hostile author might.

Every mutant keeps the builder's plan (the certificate's witness), so the certificate is tempted to
trust it; what the mutant changes is only in the weights and the embedding. The kinds:

* ``bias_column``: a new residual column that nothing writes but b_O sets to a constant, read by W_U
  (a constant logit bonus);
* ``dead_value``: a value coordinate that is identically zero but owns a new residual column
  through W_O, with a b_O constant there, read by W_U;
* ``dup_code``: the positional code block replaced by a view that maps two positions to one
  vector (the view keeps the base code's family label);
* ``swap_code``: two positions' code vectors swapped (a view with a permuted table);
* ``zero_head``: one head's W_O set to zero;
* ``perturb``: one random nonzero weight entry moved by +-1 grid step or scaled by a power of two;
* ``unread_bias``: a bias added to a residual column that no later weight reads;
* ``extra_read``: W_U (or an MLP) made to read a column it did not read, with a small weight.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.core.ir import CodeBlock, CompiledModel, Embedding, ExactTensor
from exactformer.constructions.codes.positions import CodeView

KINDS = ("bias_column", "dead_value", "dup_code", "swap_code", "zero_head", "perturb", "unread_bias", "extra_read")


def _pad(t: ExactTensor, axis: int, extra: int) -> ExactTensor:
    pad = [(0, 0)] * t.num.ndim
    pad[axis] = (0, extra)
    return ExactTensor(np.pad(t.num, pad), t.den)


def widen(model: CompiledModel, extra: int = 1) -> CompiledModel:
    """The same model with ``extra`` new residual columns (all weights zero there)."""
    blocks = []
    for b in model.blocks:
        a, m = b.attn, b.mlp
        a = dataclasses.replace(a, W_Q=_pad(a.W_Q, 1, extra), W_K=_pad(a.W_K, 1, extra), W_V=_pad(a.W_V, 1, extra),
                                W_O=_pad(a.W_O, 2, extra), b_O=_pad(a.b_O, 0, extra))
        m = dataclasses.replace(m, W_in=_pad(m.W_in, 0, extra), W_out=_pad(m.W_out, 1, extra), b_out=_pad(m.b_out, 0, extra))
        blocks.append(dataclasses.replace(b, attn=a, mlp=m))

    def emb(e: Embedding) -> Embedding:
        return Embedding(e.n_rows, e.d_model + extra, _pad(e.table, 1, extra), e.table_first_row, e.blocks)

    return dataclasses.replace(model, embed=emb(model.embed), pos_embed=emb(model.pos_embed), blocks=blocks,
                               W_U=_pad(model.W_U, 0, extra))


def _set(t: ExactTensor, idx: tuple, value: Fraction) -> ExactTensor:
    value = Fraction(value)
    den = t.den * value.denominator // np.gcd(t.den, value.denominator)
    num = t.num * (den // t.den)
    num = num.astype(np.int64).copy()
    num[idx] = value.numerator * (den // value.denominator)
    return ExactTensor(num, den)


def _replace_attn(model: CompiledModel, layer: int, **kw: Any) -> CompiledModel:
    blocks = list(model.blocks)
    blocks[layer] = dataclasses.replace(blocks[layer], attn=dataclasses.replace(blocks[layer].attn, **kw))
    return dataclasses.replace(model, blocks=blocks)


def _replace_mlp(model: CompiledModel, layer: int, **kw: Any) -> CompiledModel:
    blocks = list(model.blocks)
    blocks[layer] = dataclasses.replace(blocks[layer], mlp=dataclasses.replace(blocks[layer].mlp, **kw))
    return dataclasses.replace(model, blocks=blocks)


def _with(model: CompiledModel, **kw: Any) -> CompiledModel:
    return dataclasses.replace(model, **kw)


def mutate(model: CompiledModel, kind: str, rng: np.random.Generator, step: Fraction) -> CompiledModel:
    """One mutant of ``kind`` (see the module docstring); ``step`` is the format's grid step."""
    d, V = model.d_model, len(model.answers)
    if kind == "bias_column":
        m = widen(model)
        l = int(rng.integers(len(m.blocks)))
        m = _replace_attn(m, l, b_O=_set(m.blocks[l].attn.b_O, (d,), Fraction(int(rng.integers(1, 4)))))
        return _with(m, W_U=_set(m.W_U, (d, int(rng.integers(V))), Fraction(int(rng.choice([-1, 1])))))
    if kind == "dead_value":
        m = widen(model)
        l = int(rng.integers(len(m.blocks)))
        a = m.blocks[l].attn
        h = int(rng.integers(a.n_heads))
        dead = np.flatnonzero(~np.any(a.W_V.num[h] != 0, axis=0) & (a.b_V.num[h] == 0))
        if dead.size == 0:
            return mutate(model, "bias_column", rng, step)
        m = _replace_attn(m, l, W_O=_set(a.W_O, (h, int(dead[0]), d), Fraction(1)),
                          b_O=_set(a.b_O, (d,), Fraction(int(rng.integers(1, 3)))))
        return _with(m, W_U=_set(m.W_U, (d, int(rng.integers(V))), Fraction(1)))
    if kind in ("dup_code", "swap_code"):
        pe = model.pos_embed
        if not pe.blocks:
            return mutate(model, "perturb", rng, step)
        bi = int(rng.integers(len(pe.blocks)))
        b = pe.blocks[bi]
        table = np.arange(b.code_start, b.code_start + b.count)
        if table.size < 2:
            return mutate(model, "perturb", rng, step)
        i, j = rng.choice(table.size, size=2, replace=False)
        if kind == "dup_code":
            table[i] = table[j]
        else:
            table[[i, j]] = table[[j, i]]
        view = CodeView(b.code, "table", np.concatenate([np.zeros(b.code_start, np.int64), table]))
        view.family = getattr(b.code, "family", "")  # the label lies: the view is not the family's code
        blocks = list(pe.blocks)
        blocks[bi] = CodeBlock(view, b.first_row, b.count, b.col, b.code_start, b.scale)
        return _with(model, pos_embed=dataclasses.replace(pe, blocks=tuple(blocks)))
    if kind == "zero_head":
        l = int(rng.integers(len(model.blocks)))
        a = model.blocks[l].attn
        h = int(rng.integers(a.n_heads))
        W_O = a.W_O.num.copy()
        W_O[h] = 0
        return _replace_attn(model, l, W_O=ExactTensor(W_O, a.W_O.den))
    if kind == "unread_bias":
        m = widen(model)
        l = int(rng.integers(len(m.blocks)))
        return _replace_mlp(m, l, b_out=_set(m.blocks[l].mlp.b_out, (d,), Fraction(int(rng.integers(1, 5)))))
    if kind == "extra_read":
        col = int(rng.integers(d))
        if rng.random() < 0.5:
            return _with(model, W_U=_set(model.W_U, (col, int(rng.integers(V))), step * int(rng.choice([-1, 1]))))
        l = int(rng.integers(len(model.blocks)))
        mlp = model.blocks[l].mlp
        u = int(rng.integers(mlp.d_mlp))
        return _replace_mlp(model, l, W_in=_set(mlp.W_in, (col, u), step * int(rng.choice([-1, 1]))))
    if kind == "perturb":
        names = [n for n, t in model.tensors().items() if np.any(t.num != 0)]
        name = names[int(rng.integers(len(names)))]
        t = model.tensors()[name]
        nz = np.argwhere(t.num != 0)
        idx = tuple(nz[int(rng.integers(len(nz)))])
        old = Fraction(int(t.num[idx]), t.den)
        new = old + step * int(rng.choice([-1, 1])) if rng.random() < 0.5 else old * Fraction(2) ** int(rng.choice([-1, 1]))
        return model.replace_weight(name, _set(t, idx, new))
    raise ValueError(f"unknown mutation kind {kind!r}")


def mutants(model: CompiledModel, count: int, seed: int, step: Fraction) -> list[tuple[str, CompiledModel]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        out.append((kind, mutate(model, kind, rng, step)))
    return out

