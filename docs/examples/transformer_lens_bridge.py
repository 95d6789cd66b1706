"""Run a saved exactformer model in TransformerLens 4.x from its files alone (docs/exports.md).

Usage:
    python docs/examples/transformer_lens_bridge.py MODEL_DIR INPUTS.json [--dtype float64|float32]

MODEL_DIR is a dense export (``exactformer build ... --out MODEL_DIR``: ``manifest.json`` and
``model.safetensors`` with ``W_E`` and ``W_pos``); INPUTS.json is a JSON list of natural inputs in
the form ``manifest.encoding`` describes (Index Lookup: ``[[3, 0, 2, 1], 2]`` for symbols and p).
Prints one JSON line: the answers, one per input (a list per input when the model answers at
several positions), ``null`` where the largest logit is tied. Needs ``torch``, ``safetensors`` and
``transformer-lens>=4`` only: nothing here imports exactformer.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def load_bridge(model_dir: Path, dtype: torch.dtype) -> tuple[dict[str, Any], Any]:
    """The manifest and a ``TransformerBridge`` holding ``model.safetensors``: the weights are under
    TransformerLens's HookedTransformer state-dict names, which ``convert_tl_checkpoint`` turns into
    the native bridge's. The bridge divides attention scores by sqrt(d_head) whatever the config
    says, and exactformer's scores are unscaled, so sqrt(d_head) is folded into W_Q and b_Q."""
    from transformer_lens.config import TransformerBridgeConfig  # imported here: encode and read_answers
    from transformer_lens.model_bridge import TransformerBridge  # serve docs/examples/plain_torch.py too
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    man = json.loads((model_dir / "manifest.json").read_text())
    sd = load_file(str(model_dir / "model.safetensors"))
    if "embed.W_E" not in sd or "pos_embed.W_pos" not in sd:
        raise SystemExit(f"{model_dir}: W_E or W_pos was too large to write (manifest 'embedding'); "
                         "use exactformer's to_transformer_lens(load(dir)), which generates them")
    c = man["transformer_lens_config"]
    if c["attention_dir"] == "mixed":
        raise SystemExit(f"{model_dir}: TransformerLens cannot mix causal and bidirectional layers")
    for l in range(c["n_layers"]):
        for name in ("W_Q", "b_Q"):
            sd[f"blocks.{l}.attn.{name}"] = sd[f"blocks.{l}.attn.{name}"] * math.sqrt(c["d_head"])
    cfg = TransformerBridgeConfig(
        d_model=c["d_model"], d_head=c["d_head"], n_layers=c["n_layers"], n_ctx=c["n_ctx"],
        n_heads=c["n_heads"], d_mlp=c["d_mlp"], d_vocab=c["d_vocab"], d_vocab_out=c["d_vocab_out"],
        act_fn="relu", normalization_type=None, attention_dir=c["attention_dir"],
        positional_embedding_type="standard", architecture="TransformerLensNative",
        dtype=dtype, init_weights=False,
    )
    bridge = TransformerBridge.boot_native(cfg, dtype=dtype)
    bridge.load_state_dict(convert_tl_checkpoint({k: v.to(dtype) for k, v in sd.items()}, cfg), strict=True)
    return man, bridge.eval()


def token_ids(vocab: Any) -> Any:
    """``ids(pattern, values)``: the token ids of the names ``pattern.format(v)`` in ``manifest.vocab``
    -- a list of names, or ``{"runs": [[pattern, first, count], ...]}`` where run r names the ids
    ``start_r .. start_r + count - 1`` ``pattern.format(first + j)`` (then read off the run, no name formed)."""
    if isinstance(vocab, list):
        index = {name: i for i, name in enumerate(vocab)}
        return lambda pattern, values: [index[pattern.format(v)] for v in values]
    runs, start = {}, 0
    for pattern, first, count in vocab["runs"]:
        runs.setdefault(pattern, []).append((first, count, start))
        start += count

    def ids(pattern: str, values: list) -> list[int]:
        out = []
        for v in values:
            for first, count, at in runs.get(pattern, []):
                if not isinstance(v, (bool, str, type(None))) and int(v) == v and first <= v < first + count:
                    out.append(at + int(v) - first)
                    break
            else:
                raise KeyError(pattern.format(v))
        return out
    return ids


def encode(man: dict[str, Any], example: Any) -> tuple[list[int], list[list[float]] | None]:
    """Token ids of one natural input by ``manifest.encoding``, and the input vectors of the tokens
    that carry one (``manifest.vector_input``; None for a model without vector inputs)."""
    enc, ids = man["encoding"], token_ids(man["vocab"])
    names = [part["name"] for part in enc["inputs"]]
    parts = dict(zip(names, example if len(names) > 1 else (example,)))
    found: list[int] = []
    carried: list[Any] = []  # the input element each token came from
    for seg in enc["tokens"]:
        if "for_each" in seg:
            values = list(parts[seg["for_each"]])
            found += ids(seg["token"], values)
            carried += values
        elif "of" in seg:
            found += ids(seg["token"], [parts[seg["of"]]])
            carried.append(parts[seg["of"]])
        elif "interleave" in seg:
            runs = [list(parts[p]) for p in seg["interleave"]]
            for i in range(max(len(r) for r in runs)):
                for r, t in zip(runs, seg["token"]):
                    if i < len(r):
                        found += ids(t, [r[i]])
                        carried.append(r[i])
        else:
            found += ids(seg["token"].replace("{", "{{").replace("}", "}}"), [None])
            carried.append(None)
    vi = man["vector_input"]
    if vi is None:
        return found, None
    zero = [0.0] * vi["width"]
    return found, [[float(x) for x in v] if t in vi["tokens"] else zero for t, v in zip(found, carried)]


def read_answers(man: dict[str, Any], logits: torch.Tensor, at_answers: bool = False) -> list[Any]:
    """``manifest.readout``: the logits at each answer position (``answer_positions``; null: the
    last position); the answer is ``answers.values[i]`` for the largest logit i, and a tie for the
    largest is no answer (None), as the exact executor decides. ``at_answers``: ``logits`` hold
    the answer positions only, in order."""
    positions = man["answer_positions"] or [logits.shape[1] - 1]
    if at_answers:
        positions = list(range(logits.shape[1]))
    values = man["answers"]["values"]
    out = []
    for row in logits[:, positions, :]:
        best = [row_a.max() for row_a in row]
        got = [values[int(r.argmax())] if int((r == b).sum()) == 1 else None for r, b in zip(row, best)]
        out.append(got if len(positions) > 1 else got[0])
    return out


def run(model_dir: Path, examples: list[Any], dtype: str = "float64") -> list[Any]:
    """The answers of the saved model to ``examples`` through TransformerLens in ``dtype``."""
    man, bridge = load_bridge(model_dir, DTYPES[dtype])
    encoded = [encode(man, e) for e in examples]
    tokens = torch.tensor([t for t, _ in encoded])
    hooks = []
    if man["vector_input"] is not None:  # hook_embed = W_E[token] + vector (the vector_input columns)
        vi = man["vector_input"]
        vectors = torch.tensor([v for _, v in encoded], dtype=DTYPES[dtype])

        def add_vectors(x: torch.Tensor, hook: Any) -> torch.Tensor:
            x = x.clone()
            x[..., vi["col"] : vi["col"] + vi["width"]] += vectors
            return x

        hooks.append(("hook_embed", add_vectors))
    with torch.no_grad():
        logits = bridge.run_with_hooks(tokens, fwd_hooks=hooks)  # [B, T, d_vocab_out]
    return read_answers(man, logits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("inputs", type=Path, help="a JSON list of natural inputs")
    ap.add_argument("--dtype", choices=list(DTYPES), default="float64")
    a = ap.parse_args(argv)
    print(json.dumps(run(a.model_dir, json.loads(a.inputs.read_text()), a.dtype)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
