"""The average of 0/1 tokens over a chosen set of positions: one SetAverage head."""
from fractions import Fraction

import numpy as np

from exactformer.construct import (AverageReadout, Claim, CountOver, Layout, ModelBuilder, NoRows, SequenceTask,
                                   SetAverage, construction)


class MeanTask(SequenceTask):
    """Inputs x_0 .. x_{N-1} in {0, 1}; the answer is the mean of x over the set S (a Fraction)."""

    def truth(self, model, x):
        S = model.task_params["positions"]
        return [Fraction(int(v), len(S)) for v in x[:, S].sum(axis=1)]

    def rule(self, model):
        return CountOver(model.task_params["positions"], feature={1})


@construction("mean-over-set", task=MeanTask(), theorem="tutorial: the mean of bits over a set of positions",
              claim=Claim("docs/your-construction.md", layers="1", heads="1", width="O(1)",
                          precision="O(log |S|)", size="O(log |S|)"),
              sizes=NoRows("index-lookup", "a tutorial construction"), example=dict(n=6, positions=[0, 2, 3]))
def mean_over_set(n: int, positions: list[int] = (0, 1)):
    """The mean of the bits at the positions S, read at the last position.

    Parameters
    ----------
    n : int >= 2. The input length N.
    positions : a JSON list of positions in [0, N): the set S.
    """
    S = sorted(set(positions))
    mb = ModelBuilder(Layout(x=1, member=1, mean=1), n_layers=1, d_vocab=2, n_ctx=n)
    mb.token_rows([0, 1], "x", np.array([[0], [1]]))  # token 0 or 1 writes its value
    mb.position_rows(S, "member", np.ones((len(S), 1), dtype=np.int64))  # the set: 1 at its positions
    SetAverage("member", "x", "mean").emit(mb, 0)  # eta and the format: chosen at build
    AverageReadout("mean", len(S)).emit(mb)
    return mb.build(answers=[Fraction(k, len(S)) for k in range(len(S) + 1)], n=n,
                    task_params={"alphabet": 2, "positions": S})
