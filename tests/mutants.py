"""Model mutants shared by the verifier tests."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from exactformer.constructions.core.ir import CodeBlock
from exactformer.constructions.codes.positions import CodeView


def shift_keys(model, by: int = 1):
    """A copy whose first positional code block reads T(j + by) instead of T(j) (a wrong key offset)."""
    pe = model.pos_embed
    kb = pe.blocks[0]
    T = pe.n_rows
    nb = CodeBlock(CodeView(kb.code, "table", (np.arange(T) + by) % T), kb.first_row, kb.count, kb.col, 0, kb.scale)
    m = copy.copy(model)
    m.pos_embed = dataclasses.replace(pe, blocks=(nb,) + pe.blocks[1:])
    return m


def weight_mutants(model, seed: int = 0, per_tensor: int = 2):
    """(name, mutant) pairs of ``model`` (a transformer's or a recurrent model's exact weights): in every
    tensor ``per_tensor`` seeded entries (nonzero ones first) set to 0, negated and doubled (a zero entry
    set to 1 instead), W_hh's stored entries likewise; every causal flag flipped; the first two answer
    labels swapped; the answer positions shifted one to the left."""
    from exactformer.constructions.core.ir import ExactTensor

    rng = np.random.default_rng(seed)
    tensors = model.tensors()
    if hasattr(model, "W_hh"):
        tensors = tensors | {"W_hh": model.W_hh.vals}

    def replaced(name, t):
        if name == "W_hh":
            return dataclasses.replace(model, W_hh=dataclasses.replace(model.W_hh, vals=t))
        if hasattr(model, "replace_weight"):
            return model.replace_weight(name, t)
        return dataclasses.replace(model, **{name: t})

    for name, t in tensors.items():
        flat = t.num.reshape(-1)
        nz = np.flatnonzero(flat)
        picks = list(rng.choice(nz, size=min(per_tensor, nz.size), replace=False)) if nz.size else []
        picks += [int(rng.integers(flat.size))] if flat.size else []
        for i in picks:
            for how, value in (("zero", 0), ("negated", -flat[i]), ("doubled", 2 * flat[i] if flat[i] else t.den)):
                if value == flat[i]:
                    continue
                num = flat.copy()
                num[i] = value
                yield f"{name}[{int(i)}] {how}", replaced(name, ExactTensor(num.reshape(t.num.shape), t.den))
    for l, b in enumerate(getattr(model, "blocks", [])):
        m = copy.copy(model)
        m.blocks = list(model.blocks)
        m.blocks[l] = dataclasses.replace(b, attn=dataclasses.replace(b.attn, causal=not b.attn.causal))
        yield f"blocks.{l}.attn.causal flipped", m
    if len(model.answers) > 1:
        answers = list(model.answers)
        answers[0], answers[1] = answers[1], answers[0]
        yield "answers 0 and 1 swapped", dataclasses.replace(model, answers=answers)
    if model.answer_positions is not None and min(model.answer_positions) > 0:
        yield "answer positions - 1", dataclasses.replace(model, answer_positions=tuple(p - 1 for p in model.answer_positions))
