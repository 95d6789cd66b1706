"""The sum of the tokens at positions a and b: two retrieval heads and a readout block of one's own."""
from dataclasses import dataclass

import numpy as np

from exactformer.construct import (BitThreshold, Claim, FunctionOf, Layout, ModelBuilder, NoRows, ReadoutBlock,
                                   RetrieveByPosition, SequenceTask, SymbolReadout, block, construction,
                                   position_codes)


@block
@dataclass(frozen=True)
class SumReadout(ReadoutBlock):
    """Answer c = s + t for the bits of two symbols s, t in the slots ``first`` and ``second``:
    with v = s + t = sum_j 2^j (first_j + second_j), the logit 2 c v - c^2 = v^2 - (v - c)^2 is
    largest at c = v, by 1 over every other c."""

    first: str
    second: str
    alphabet: int

    def emit(self, mb):
        c = np.arange(2 * self.alphabet - 1)  # the answers 0 .. 2 (alphabet - 1)
        W = 2 * (1 << np.arange(mb.layout.width(self.first)))[:, None] * c[None, :]  # bit j of a symbol: 2^j
        mb.unembed(self, W_U=[(self.first, W), (self.second, W)], b_U=-c * c)

    def design(self, fmt, mb):
        """The format must hold the logits' partial sums 2 c v, up to 2 (2 (alphabet - 1))^2."""
        return self if fmt.represents(2 * (2 * self.alphabet - 2) ** 2) else None


class SumTask(SequenceTask):
    """Inputs x_0 .. x_{N-1} over 0 .. alphabet-1; the answer is x_a + x_b."""

    def truth(self, model, x):
        return x[:, model.task_params["a"]] + x[:, model.task_params["b"]]

    def rule(self, model):
        return FunctionOf(model.task_params["a"], model.task_params["b"])


@construction("sum-of-two", task=SumTask(), theorem="tutorial: the sum of the tokens at positions a and b",
              claim=Claim("docs/your-construction.md", layers="1", heads="2", width="O(log N)",
                          precision="O(log N)", size="O((log N)^3)"),
              sizes=NoRows("index-lookup", "a tutorial construction"), example=dict(n=5, a=0, b=3, alphabet=3))
def sum_of_two(n: int, a: int = 0, b: int = 1, alphabet: int = 4):
    """x_a + x_b, read at the last position: one head retrieves each, a readout adds them.

    Parameters
    ----------
    n : int >= 2. The input length N.
    a : int in [0, N). The first position.
    b : int in [0, N). The second position.
    alphabet : int >= 2. The tokens are 0 .. alphabet-1.
    """
    code, m = position_codes(n), SymbolReadout.width(alphabet)
    layout = Layout(token=m, key=code.k, qa=code.k, qb=code.k, xa=m, xb=m, bits_a=m, bits_b=m)
    mb = ModelBuilder(layout, n_layers=1, d_vocab=alphabet, n_ctx=n)
    mb.token_rows(range(alphabet), "token", SymbolReadout.rows(alphabet))
    mb.position_code("key", 0, n, code)
    for query, at in (("qa", a), ("qb", b)):  # the last position asks for T(a) and T(b)
        mb.position_code(query, n - 1, 1, code, code_start=at)
    RetrieveByPosition("qa", "key", "token", "xa").emit(mb, 0)
    RetrieveByPosition("qb", "key", "token", "xb").emit(mb, 0)
    BitThreshold("xa", "bits_a").emit(mb, 0)
    BitThreshold("xb", "bits_b").emit(mb, 0)
    SumReadout("bits_a", "bits_b", alphabet).emit(mb)
    return mb.build(answers=list(range(2 * alphabet - 1)), n=n, task_params={"a": a, "b": b, "alphabet": alphabet})
