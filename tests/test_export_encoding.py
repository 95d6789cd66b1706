"""A client that uses the exported files alone: it encodes natural inputs from manifest.json's
``encoding`` and ``vocab`` and runs model.safetensors with plain torch (docs/exports.md); its
token ids must equal the task's ``encode`` and its logits the float forward pass of ``to_torch``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from exactformer.constructions.core import registry
from exactformer.constructions.theorems.equality import equality, inequality
from exactformer.constructions.export import MANIFEST_FILE, WEIGHTS_FILE, save, to_torch
from exactformer.constructions.theorems.index_lookup import IndexLookupTask, index_lookup
from exactformer.constructions.theorems.thresholds import disjointness, k_cnf, threshold_features


# ------------------------------------------------------------------------------------------------
# the client: no exactformer below this line
# ------------------------------------------------------------------------------------------------


def client_encode(man: dict, example) -> list[int]:
    """Token ids of one natural input from the manifest alone (schema in docs/exports.md)."""
    enc = man["encoding"]
    names = [i["name"] for i in enc["inputs"]]
    parts = dict(zip(names, example if len(names) > 1 else (example,)))
    ids = {name: i for i, name in enumerate(man["vocab"])}
    out: list[int] = []
    for seg in enc["tokens"]:
        if "interleave" in seg:  # one token per element of each part in turn, until they run out
            seqs = [list(parts[p]) for p in seg["interleave"]]
            for i in range(max(len(q) for q in seqs)):
                out += [ids[t.format(q[i])] for q, t in zip(seqs, seg["token"]) if i < len(q)]
        elif "for_each" in seg:
            out += [ids[seg["token"].format(v)] for v in parts[seg["for_each"]]]
        elif "of" in seg:
            out.append(ids[seg["token"].format(parts[seg["of"]])])
        else:
            out.append(ids[seg["token"]])
    return out


def client_forward(sd: dict, man: dict, tokens: torch.Tensor) -> torch.Tensor:
    """The documented plain-torch forward pass of model.safetensors: logits [B, T, d_vocab_out]."""
    x = sd["embed.W_E"][tokens] + sd["pos_embed.W_pos"][: tokens.shape[1]]
    for l, layer in enumerate(man["layers"]):
        p = lambda n: sd[f"blocks.{l}.{n}"]  # noqa: E731
        q = torch.einsum("btd,hde->bhte", x, p("attn.W_Q")) + p("attn.b_Q")[:, None]
        k = torch.einsum("btd,hde->bhte", x, p("attn.W_K")) + p("attn.b_K")[:, None]
        v = torch.einsum("btd,hde->bhte", x, p("attn.W_V")) + p("attn.b_V")[:, None]
        s = q @ k.transpose(-1, -2)
        if layer["causal"]:
            T = s.shape[-1]
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        x = x + torch.einsum("bhte,hed->btd", s.softmax(-1) @ v, p("attn.W_O")) + p("attn.b_O")
        x = x + torch.relu(x @ p("mlp.W_in") + p("mlp.b_in")) @ p("mlp.W_out") + p("mlp.b_out")
    return x @ sd["unembed.W_U"] + sd["unembed.b_U"]


def client_answers(man: dict, logits: torch.Tensor) -> list:
    return [man["answers"]["values"][int(i)] for i in logits[:, -1, :].argmax(-1)]


# ------------------------------------------------------------------------------------------------
# the tests
# ------------------------------------------------------------------------------------------------


def _examples(model, B: int, rng) -> list:
    n = model.n
    if model.construction == "index-lookup":
        S = len(model.answers)
        return [(rng.integers(0, S, n).tolist(), int(rng.integers(1, n + 1))) for _ in range(B)] + \
               [([S - 1] * n, 1), ([0] * n, n)]
    if model.construction in ("equality", "inequality"):
        half = rng.choice([-1, 1], (B, n // 2))
        return [list(h) + list(h) for h in half.tolist()] + rng.choice([-1, 1], (B, n)).tolist()
    return rng.integers(0, 2, (B, n)).tolist() + [[0] * n, [1] * n]


MODELS = {
    "index-lookup": lambda: index_lookup(16, 5),
    "equality": lambda: equality(12, positions="reed-solomon"),
    "inequality": lambda: inequality(8, positions="reed-solomon"),
    "disjointness": lambda: disjointness(10, positions="reed-solomon"),
    "cnf": lambda: k_cnf(8, clauses=[[1, -2], [3, 4, -5]], positions="reed-solomon"),
    "threshold": lambda: threshold_features(6, [[1, 2], [3], [4, 5, 6]], b=1, g=lambda *b: int(sum(b) == 1)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_client_encodes_and_runs_from_files_alone(name: str, tmp_path: Path):
    model = MODELS[name]()
    out = save(model, tmp_path / "m")
    man = json.loads((out / MANIFEST_FILE).read_text())
    sd = load_file(str(out / WEIGHTS_FILE))
    rng = np.random.default_rng(0)
    examples = _examples(model, 16, rng)
    ids = [client_encode(man, e) for e in examples]
    task = registry.task_of(model)
    for e, t in zip(examples, ids):
        assert t == task.encode(model, e).tolist()
    tokens = torch.tensor(ids)
    assert np.array_equal(tokens.numpy(), task.encode_batch(model, examples))
    for batch in (tokens[:1], tokens[:2], tokens[:7], tokens):  # batch sizes 1, 2, 7, all
        logits = client_forward(sd, man, batch)
        ref = to_torch(model, positions="all")(batch)  # every position, as the recipe computes
        assert torch.allclose(logits, ref, rtol=0, atol=1e-9)
        assert client_answers(man, logits) == to_torch(model).decode(ref)


def test_every_construction_declares_its_encoding():
    """Every registered construction's task declares ENCODING in the schema of docs/exports.md."""
    for name in registry.names():
        enc = registry.get(name).task.ENCODING
        assert {"inputs", "tokens"} <= set(enc) and enc["tokens"], name
        known = {i["name"] for i in enc["inputs"]}
        assert all(set(s) <= {"token", "for_each", "of"} and s.get("for_each", s.get("of", next(iter(known)))) in known
                   or (set(s) == {"interleave", "token"} and set(s["interleave"]) <= known
                       and len(s["token"]) == len(s["interleave"]))
                   for s in enc["tokens"]), name


def test_wrong_encoding_is_caught_by_the_client_check(tmp_path: Path, monkeypatch):
    """The client check can fail: a declaration with the index token first disagrees with
    model.encode although every name it produces is in the vocabulary."""
    bad = json.loads(json.dumps(IndexLookupTask.ENCODING))
    bad["tokens"] = bad["tokens"][::-1]
    monkeypatch.setattr(IndexLookupTask, "ENCODING", bad)
    model = index_lookup(8, 3)
    man = json.loads((save(model, tmp_path / "m") / MANIFEST_FILE).read_text())
    example = ([0, 1, 2, 0, 1, 2, 0, 1], 3)
    assert man["encoding"] == bad
    tokens = IndexLookupTask().encode(model, example).tolist()
    assert sorted(client_encode(man, example)) == sorted(tokens)
    assert client_encode(man, example) != tokens
