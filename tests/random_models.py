"""Random hand-built models for oracle tests: weights that no builder would write, with the
structure the executor's shortcuts key on (columns that only the token or only the positional
embedding fills, projections that read only some of them, columns no block writes, causal
layers, several answer positions); and random recurrent models (fractional or integer weights,
the recurrent executor's two paths)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from exactformer.constructions.core.ir import MLP, Attention, TransformerBlock, CodeBlock, CompiledModel, Embedding, ExactTensor
from exactformer.constructions.core.recurrent import RNNModel, SparseRows
from exactformer.constructions.codes.positions import position_codes


def _rand(rng, shape, den: int, mag: int, density: float) -> ExactTensor:
    num = rng.integers(-mag, mag + 1, size=shape) * (rng.random(shape) < density)
    return ExactTensor(num.astype(np.int64), den)


def _mask_rows(t: ExactTensor, keep: np.ndarray, axis: int) -> ExactTensor:
    num = t.num.copy()
    idx = [slice(None)] * num.ndim
    idx[axis] = ~keep
    num[tuple(idx)] = 0
    return ExactTensor(num, t.den)


def random_model(seed: int, n_layers: int = 2, vocab: int = 5, T: int = 6, n_answers: int = 1,
                 causal: bool | None = None, code: bool = False) -> CompiledModel:
    """A random model on T positions with d_model = 12 columns split into token columns (0-3),
    positional columns (4-7) and work columns (8-11). Each projection reads a random subset of the
    three groups; weights are multiples of 1/4 in [-2, 2]."""
    rng = np.random.default_rng(seed)
    d, H, dh, dm = 12, 2, 3, 4
    tok_cols, pos_cols = np.arange(0, 4), np.arange(4, 8)
    table = np.zeros((vocab, d), np.int64)
    table[:, tok_cols] = rng.integers(-4, 5, (vocab, 4))
    blocks_p: tuple = ()
    pos_table = np.zeros((T, d), np.int64)
    if code:  # positional columns 4-7 from a one-hot-like code block scaled by 1/2
        c = position_codes(T, family="onehot") if T <= 4 else None
        if c is not None and c.k <= 4:
            blocks_p = (CodeBlock(c, 0, T, 4, 0, Fraction(1, 2)),)
    if not blocks_p:
        pos_table[:, pos_cols] = rng.integers(-4, 5, (T, 4))
    embed = Embedding(vocab, d, ExactTensor(table, 4))
    pos_embed = Embedding(T, d, ExactTensor(pos_table, 4), 0, blocks_p)
    groups = [tok_cols, pos_cols, np.arange(8, 12)]
    blocks = []
    for _ in range(n_layers):
        def proj(shape_in_axis: int, shape):
            t = _rand(rng, shape, 4, 8, 0.6)
            keep = np.zeros(d, bool)
            for g in groups:
                if rng.random() < 0.5:
                    keep[g] = True
            return _mask_rows(t, keep, shape_in_axis)

        W_Q, W_K, W_V = proj(1, (H, d, dh)), proj(1, (H, d, dh)), proj(1, (H, d, dh))
        W_O = _rand(rng, (H, dh, d), 4, 4, 0.5)
        zeros_h = ExactTensor(np.zeros((H, dh), np.int64))
        b_Q = _rand(rng, (H, dh), 4, 4, 0.3)
        attn = Attention(W_Q, W_K, W_V, W_O, b_Q, zeros_h, _rand(rng, (H, dh), 4, 4, 0.3),
                         _rand(rng, (d,), 4, 4, 0.3),
                         causal=bool(rng.random() < 0.5) if causal is None else causal)
        mlp = MLP(proj(0, (d, dm)), _rand(rng, (dm,), 4, 4, 0.5), _rand(rng, (dm, d), 4, 4, 0.5),
                  _rand(rng, (d,), 4, 4, 0.3))
        blocks.append(TransformerBlock(attn, mlp))
    W_U = _rand(rng, (d, 3), 4, 4, 0.7)
    answers = tuple(sorted(rng.choice(T, size=n_answers, replace=False).tolist())) if n_answers > 1 else None
    return CompiledModel(construction="random", theorem="", n=T, embed=embed, pos_embed=pos_embed,
                         blocks=blocks, W_U=W_U, b_U=_rand(rng, (3,), 4, 4, 0.5),
                         vocab=[f"t{i}" for i in range(vocab)], answers=[0, 1, 2], answer_positions=answers)


def random_rnn(seed: int, vocab: int = 4, d_input: int = 3, hidden: int = 6, width: int = 3,
               den: int = 4) -> RNNModel:
    """A random recurrent model: weights multiples of 1/``den`` in [-2, 2] (``den=1``: integers,
    the executor's integer path), ``width`` stored entries per recurrent row, a random h_0, three
    answers read at the last position."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(hidden), width)
    cols = rng.integers(0, hidden, size=rows.size)
    vals = rng.integers(-2 * den, 2 * den + 1, size=rows.size)
    return RNNModel(construction="random", theorem="", n=5,
                    embed=_rand(rng, (vocab, d_input), den, 2 * den, 0.8),
                    W_ih=_rand(rng, (hidden, d_input), den, 2 * den, 0.6),
                    W_hh=SparseRows.from_entries(rows, cols, vals, (hidden, hidden), den),
                    b=_rand(rng, (hidden,), den, 2 * den, 0.5), h0=_rand(rng, (hidden,), den, 2 * den, 0.5),
                    W_U=_rand(rng, (hidden, 3), den, 2 * den, 0.7), b_U=_rand(rng, (3,), den, 2 * den, 0.5),
                    vocab=[f"t{i}" for i in range(vocab)], answers=[0, 1, 2])
