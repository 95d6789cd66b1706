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
