"""A recurrent model's forward pass as symbolic values (verify/smt), as the executor runs it
(:mod:`exactformer.verify.executor.recurrent`)::

    x_t      = E[token_t]
    h_t      = relu(sat(sum rnd([x_t, h_{t-1}, one] * [W_ih | W_hh | b]^T)))    one = the format's 1
    logits_t = sat(sum rnd([h_t, one] * [W_U; b_U]))                          at the answer positions

(every product rounded, the rounded products summed exactly and saturated once, as the format's
``matmul``; W_hh read densely from its stored rows). The hidden state stays a table over the tokens
read so far while that table is small, then becomes terms.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactformer.constructions.core.recurrent import RNNModel
from exactformer.verify.smt.sym import Enc, Sym, const
from exactformer.verify.smt.vectors import Formats, Vec, evaluator, matmul, relu_vec


@evaluator.register
def _recurrent(model: RNNModel, fmt: Any, T: int):
    fm = Formats(fmt)
    raw = model.weights_raw(fmt)
    one = int(np.asarray(fmt.quantize(np.array([1], dtype=object)))[0])
    step = np.concatenate([raw["W_ih"], model.W_hh.dense().raw(fmt), raw["b"][:, None]], axis=1).T  # [I + H + 1, H]
    readout = np.concatenate([raw["W_U"], raw["b_U"][None]], axis=0)  # [H + 1, A]
    E, h0 = raw["embed"], raw["h0"]

    def make(enc: Enc, shared: dict, split: bool):
        states = [Vec([const(int(v)) for v in h0])]

        def logits(pos: int) -> list[Sym]:
            while len(states) <= pos + 1:
                t = len(states) - 1
                tok = enc.token(t)
                x = Vec(deps=tok.deps, arr=E[tok.arr.reshape(-1)].reshape(tok.arr.shape + (E.shape[1],)))
                z = Vec(x.syms + states[-1].syms + [const(one)])
                states.append(relu_vec(enc, matmul(enc, fm, z, step)))
            return matmul(enc, fm, Vec(states[pos + 1].syms + [const(one)]), readout).syms

        return logits

    return make
