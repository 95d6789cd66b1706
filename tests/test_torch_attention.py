"""The torch module at scale (``to_torch``): query-chunked attention, the last layer at the answer
positions only, the dims and columns that are exactly zero left out, position-only rows kept
between calls -- every registered construction, float32 and float64, one input and many, one
module used many times and a fresh one, in this process and in a fresh one.

Chunking changes which BLAS blocks sum a dot product, so bits may differ (measured: MKL's GEMM
gives other last bits for 1-64 row blocks than for the whole matrix); the float certificates
enclose every summation order (docs/precision.md "Float arithmetics"), so the answers must agree
and the logits within a few units of the dtype's roundoff. Shapes equal -> bits equal."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.export import ExportError, to_torch
from exactformer.constructions.export.floats import ArithmeticWarning
from exactformer.verify.executor.exact import decode_logits

from registered import small_build, weight_constructions

DTYPES = (torch.float32, torch.float64)


def _transformers() -> list[str]:
    return [n for n in weight_constructions() if isinstance(small_build(n).compiled, CompiledModel)]


NAMES = _transformers()
_MODELS: dict[str, CompiledModel] = {}


def _model(name: str) -> CompiledModel:
    if name not in _MODELS:
        _MODELS[name] = small_build(name).compiled
    return _MODELS[name]


def _inputs(model: CompiledModel, count: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sampled and adversarial inputs of the task (token ids [B, T], input vectors or None)."""
    from exactformer.constructions.core import registry

    task = registry.task_of(model)
    batches = list(task.adversarial(model, count // 2, seed + 1)) + list(task.sample(model, count // 2, seed))
    tokens = [b.tokens for b in batches]
    if hasattr(tokens[0], "vectors"):  # vector inputs (nearest neighbour)
        vec = np.concatenate([t.vectors.num / t.vectors.den for t in tokens])
        return torch.as_tensor(np.concatenate([t.tokens for t in tokens])), torch.as_tensor(vec)
    return torch.as_tensor(np.concatenate(tokens)), None


def _net(model: CompiledModel, dtype, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ArithmeticWarning)
        return to_torch(model, dtype, **kw)


def _run(net, tokens, vectors):
    with torch.no_grad():
        return net(tokens, vectors) if vectors is not None else net(tokens)


@pytest.mark.parametrize("name", NAMES)
def test_chunked_rows_and_answer_positions_agree_with_one_block(name: str):
    """Every chunking of the query rows (1, 3, 5: blocks that split the rows unevenly) and the last
    layer at the answer positions only give the answers of one block over every position, with
    logits within 64 units of the dtype's roundoff (bits equal wherever the shapes are)."""
    model = _model(name)
    tokens, vectors = _inputs(model, 8)
    T = tokens.shape[1]
    for dtype in DTYPES:
        ref = _run(_net(model, dtype, positions="all", query_chunk=T), tokens, vectors)
        tol = 64 * torch.finfo(dtype).eps * max(1.0, float(ref.abs().max()))
        for positions in ("all", "answers"):
            for chunk in (1, 3, 5):
                net = _net(model, dtype, positions=positions, query_chunk=chunk)
                out = _run(net, tokens, vectors)
                want = ref[:, torch.as_tensor(net.output_positions(T))]
                assert out.shape == want.shape and out.dtype == dtype
                assert float((out - want).abs().max()) <= tol, (name, dtype, positions, chunk)
                got_answers = decode_logits(model, out.double().numpy())[0]
                assert got_answers == decode_logits(model, want.double().numpy())[0], (name, dtype, positions, chunk)
        same = _net(model, dtype, positions="all", query_chunk=T)
        assert torch.equal(_run(same, tokens, vectors), ref)  # the same shapes: the same bits


@pytest.mark.parametrize("name", NAMES)
def test_one_module_many_calls_equals_fresh_modules(name: str):
    """A module keeps the rows that depend on the position alone between calls: after other inputs
    (one at a time and batched) it gives bit for bit what a fresh module gives."""
    model = _model(name)
    tokens, vectors = _inputs(model, 8, seed=3)
    sl = lambda a, s: None if a is None else a[s]  # noqa: E731
    for dtype in DTYPES:
        net = _net(model, dtype)
        firsts = [_run(net, tokens[i : i + 1], sl(vectors, slice(i, i + 1))) for i in range(3)]
        whole = _run(net, tokens, vectors)
        for i in range(3):
            fresh = _run(_net(model, dtype), tokens[i : i + 1], sl(vectors, slice(i, i + 1)))
            assert torch.equal(firsts[i], fresh), (name, dtype, i)
            assert torch.equal(_run(net, tokens[i : i + 1], sl(vectors, slice(i, i + 1))), fresh)
        assert torch.equal(_run(_net(model, dtype), tokens, vectors), whole)
        assert decode_logits(model, whole.double().numpy())[0][:3] == [
            decode_logits(model, f.double().numpy())[0][0] for f in firsts]


def test_fresh_process_gives_the_same_bits():
    """Every construction's float32 logits in a fresh process equal this process's, bit for bit."""
    code = (
        "import json, sys, warnings, numpy as np, torch\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import test_torch_attention as t\n"
        "out = {}\n"
        "for n in t.NAMES:\n"
        "    m = t._model(n); tok, vec = t._inputs(m, 4, seed=5)\n"
        "    out[n] = t._run(t._net(m, torch.float32), tok, vec).double().numpy().tolist()\n"
        "print(json.dumps(out))\n")
    here = __import__("pathlib").Path(__file__).parent
    proc = subprocess.run([sys.executable, "-c", code, str(here)], capture_output=True, text=True, timeout=600,
                          check=True)
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    for n in NAMES:
        m = _model(n)
        tok, vec = _inputs(m, 4, seed=5)
        mine = _run(_net(m, torch.float32), tok, vec).double().numpy()
        assert np.array_equal(np.asarray(theirs[n]), mine), n


def test_default_positions_and_shapes():
    il, match2 = _model("index-lookup"), _model("match2")
    tokens, _ = _inputs(il, 4)
    net = _net(il, torch.float64)
    assert net.positions == "answers" and _run(net, tokens, None).shape == (4, 1, len(il.answers))
    assert _net(match2, torch.float64).positions == "all"  # it answers at every position
    everything = _net(il, torch.float64, positions="all")
    full = _run(everything, tokens, None)
    assert full.shape == (4, tokens.shape[1], len(il.answers))
    assert everything.decode(full) == net.decode(_run(net, tokens, None))


def test_bad_arguments_name_the_parameter():
    il = _model("index-lookup")
    with pytest.raises(ExportError, match="positions must be one of answers | all"):
        _net(il, torch.float32, positions="last")
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ExportError, match="query_chunk must be an integer >= 1"):
            _net(il, torch.float32, query_chunk=bad)
    for bad in ([], [3, 2], [0, il.n_ctx], [1.5]):
        with pytest.raises(ExportError, match="positions: increasing integers"):
            _net(il, torch.float32, positions=bad)


def test_positions_given():
    """positions=[...]: the last layer at those positions only (k-hop's last answer of 17 GB of logits at 2^16)."""
    khop = _model("k-hop")
    tokens, _ = _inputs(khop, 4)
    T = tokens.shape[1]
    full = _run(_net(khop, torch.float64, positions="all"), tokens, None)
    for pos in ([T - 1], [1, 4, T - 1]):
        net = _net(khop, torch.float64, positions=pos)
        assert list(net.output_positions(T)) == pos
        assert torch.allclose(_run(net, tokens, None), full[:, pos], rtol=0, atol=1e-12)


def test_weights_edited_in_place_are_what_runs():
    """The module derives what it leaves out from its buffers as they are now: an edited weight
    (a zeroed head value, a shifted bias) runs, as a fresh module of the edited exact model does."""
    il = _model("index-lookup")
    tokens, _ = _inputs(il, 6)
    net = _net(il, torch.float64)
    base = _run(net, tokens, None)
    state = net.state_dict()
    state["unembed.b_U"] = state["unembed.b_U"] + torch.arange(len(il.answers), dtype=torch.float64)
    net.load_state_dict(state)
    shifted = _run(net, tokens, None)
    assert torch.allclose(shifted, base + torch.arange(len(il.answers), dtype=torch.float64), rtol=0, atol=1e-12)
    assert not torch.allclose(shifted, base)
    with torch.no_grad():
        net.blocks[0].attn.W_V.zero_()
    from exactformer.constructions.core.ir import ExactTensor

    edited = il.replace_weight("blocks.0.attn.W_V", ExactTensor(np.zeros(il.blocks[0].attn.W_V.shape, np.int64)))
    fresh = _net(edited, torch.float64)
    fresh.load_state_dict(net.state_dict())
    assert torch.equal(_run(net, tokens, None), _run(fresh, tokens, None))


@pytest.mark.parametrize("name", NAMES)
def test_first_layer_projections_are_the_dense_ones(name: str):
    """Each first-layer projection, whatever its source ("position": computed once per length,
    "token": once per distinct token id then looked up, "input": at every position), is the dense
    ``(W_E[tokens] + W_pos) W + b`` at every position, within a few units of the roundoff (BLAS
    blocks by shape); the catalogue exercises all three sources."""
    from exactformer.constructions.export.floats import embedding_rows_float

    model = _model(name)
    tokens, vectors = _inputs(model, 6)
    B, T = tokens.shape
    for dtype in DTYPES:
        net = _net(model, dtype, positions="all")
        _run(net, tokens, vectors)  # derives the plan
        x = torch.as_tensor(embedding_rows_float(model.embed, tokens.reshape(-1).numpy()), dtype=dtype).reshape(B, T, -1)
        x = x + torch.as_tensor(embedding_rows_float(model.pos_embed, np.arange(T)), dtype=dtype)[None]
        if vectors is not None:
            vi = model.vector_input
            x[..., vi.col : vi.col + vi.width] += vectors.to(dtype)
        L = net._layers()[0][0]
        uniq, inv = torch.unique(tokens, return_inverse=True)
        vec = None if vectors is None else vectors.to(dtype)
        batch = {"E": torch.as_tensor(embedding_rows_float(model.embed, uniq.numpy()), dtype=dtype), "inv": inv,
                 "vectors": vec, "T": T, "B": B, "vocabulary": False}  # the rows of the batch's distinct ids
        every = {"E": torch.as_tensor(embedding_rows_float(model.embed, np.arange(model.d_vocab)), dtype=dtype),
                 "inv": tokens.long(), "vectors": vec, "T": T, "B": B, "vocabulary": True}  # of the vocabulary, kept
        for p, ctx in ((p, ctx) for p in (L.q, L.k, L.v) for ctx in (batch, every, every)):
            SOURCES.add(p.source)
            got = net._project(ctx, 0, p, slice(0, T), None)
            want = torch.einsum("btd,hde->bhte", x[..., p.rows], p.W) + p.b[None, :, None, :]
            tol = 16 * torch.finfo(dtype).eps * max(1.0, float(want.abs().max()))
            assert got.shape[1:] == want.shape[1:] and (not want.numel() or float((got - want).abs().max()) <= tol), \
                (name, dtype, p.source)


SOURCES: set[str] = set()


def test_every_projection_source_is_exercised():
    """Run after the test above (file order): the catalogue's first layers cover every source."""
    if len(SOURCES) < 3:
        for name in NAMES:
            test_first_layer_projections_are_the_dense_ones(name)
    assert SOURCES == {"position", "token", "input"}


def test_memory_estimate_grows_with_batch_and_length():
    il = _model("index-lookup")
    net = _net(il, torch.float32)
    T = il.n_ctx
    assert 0 < net.memory(T, 1) < net.memory(T, 8) and net.memory(T // 2, 4) <= net.memory(T, 4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_module_answers_as_the_cpu_module(name: str):
    model = _model(name)
    tokens, vectors = _inputs(model)
    for dtype in DTYPES:
        cpu = _run(_net(model, dtype), tokens, vectors)
        gpu = _run(_net(model, dtype, device="cuda"), tokens.cuda(), None if vectors is None else vectors.cuda())
        assert gpu.device.type == "cuda"
        assert decode_logits(model, gpu.double().cpu().numpy())[0] == decode_logits(model, cpu.double().numpy())[0]
        assert float((gpu.cpu() - cpu).abs().max()) <= 64 * torch.finfo(dtype).eps * max(1.0, float(cpu.abs().max()))


@pytest.mark.parametrize("name", NAMES)
def test_module_is_the_dense_pass_for_every_weight_edited(name: str, monkeypatch):
    """What the module leaves out (zero biases, unit weights, zero dims and columns), computes once
    (rows per token id or per position), sums through a table (``embedding_bag``) or runs in groups
    of rows is the dense pass: every construction, float64, at every position, as built and after
    each of its weights (every buffer, iterated) is edited at one entry -- a zero bias made nonzero,
    a unit weight made 1.375 -- within a few units of the roundoff. Small row groups and score
    blocks split every block."""
    import exactformer.constructions.export.torch_module as tm

    monkeypatch.setattr(tm, "ROW_GROUP", 2)
    model = _model(name)
    tokens, vectors = _inputs(model, 5, seed=7)
    net = _net(model, torch.float64, positions="all", query_chunk=2)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    edits = [None] + list(state)
    for edit in edits:
        sd = {k: v.clone() for k, v in state.items()}
        if edit is not None:
            if not sd[edit].numel():
                continue
            flat = sd[edit].view(-1)
            flat[int(torch.argmax((flat == 0).to(torch.int8) + 2 * (flat == 1).to(torch.int8)))] += 0.375
        net.load_state_dict(sd)
        got = _run(net, tokens, vectors)
        with torch.no_grad():
            want = net.dense_forward(tokens, vectors)[0]
        tol = 1e-9 * max(1.0, float(want.abs().max()))
        assert got.shape == want.shape and float((got - want).abs().max()) <= tol, (name, edit)


def test_token_values_weighted_sum_is_the_product():
    """``_TokenValues.weighted`` (a table per token id summed with the pattern's weights) is
    ``pattern @ v`` for several heads, query rows and inputs (its output order is [B, H, r, dv])."""
    from exactformer.constructions.export.torch_module import _TokenValues

    g = torch.Generator().manual_seed(0)
    for B, H, r, U, T, dv in ((1, 2, 3, 5, 7, 4), (4, 3, 1, 6, 9, 2), (3, 1, 5, 4, 6, 1)):
        tv = _TokenValues(torch.randn(U, H, dv, generator=g, dtype=torch.float64), torch.randint(0, U, (B, T), generator=g))
        pattern = torch.rand(B, H, r, T, generator=g, dtype=torch.float64)
        assert torch.allclose(tv.weighted(pattern), pattern @ tv.gathered(), rtol=0, atol=1e-12)
