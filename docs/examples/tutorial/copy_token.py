"""Copy: the answer, read at the last position, is the token at position j (one layer, one head)."""
from exactformer.construct import (BitThreshold, Claim, Layout, ModelBuilder, NoRows, RetrieveByPosition,
                                   SequenceTask, SymbolReadout, TokenAt, construction, position_codes)


class CopyTask(SequenceTask):
    """Inputs x_0 .. x_{N-1} over 0 .. alphabet-1; the answer is x_j."""

    def truth(self, model, x):
        return x[:, model.task_params["j"]]

    def rule(self, model):
        return TokenAt(model.task_params["j"])


@construction("copy-token", task=CopyTask(), theorem="tutorial: copy the token at position j",
              claim=Claim("docs/your-construction.md", layers="1", heads="1", width="O(log N)",
                          precision="O(log N)", size="O((log N)^3)"),
              sizes=NoRows("index-lookup", "a tutorial construction"), example=dict(n=6, j=1))
def copy_token(n: int, j: int = 0, alphabet: int = 4):
    """The token at position j, read at the last position.

    Parameters
    ----------
    n : int >= 2. The input length N.
    j : int in [0, N). The position copied.
    alphabet : int >= 2. The tokens are 0 .. alphabet-1.
    """
    code, m = position_codes(n), SymbolReadout.width(alphabet)
    layout = Layout(token=m, query=code.k, key=code.k, copied=m, bits=m)
    mb = ModelBuilder(layout, n_layers=1, d_vocab=alphabet, n_ctx=n)
    mb.token_rows(range(alphabet), "token", SymbolReadout.rows(alphabet))  # token s writes its bits
    mb.position_code("key", 0, n, code)  # position i holds the code vector T(i)
    mb.position_code("query", n - 1, 1, code, code_start=j)  # the last position asks for T(j)
    RetrieveByPosition("query", "key", "token", "copied").emit(mb, 0)  # eta: chosen with the format
    BitThreshold("copied", "bits").emit(mb, 0)
    SymbolReadout("bits", alphabet).emit(mb)
    return mb.build(answers=list(range(alphabet)), n=n, task_params={"j": j, "alphabet": alphabet})
