"""The public API: ``import exactformer as xf``.

::

    m = xf.build("index-lookup", n=65536, alphabet=64)      # or xf.index_lookup(65536, 64)
    m([([3, 1, 4, 1, 5, 9, 2, 6], 3)])                        # answers (the exact executor, the model's format)
    logits, cache = m.run_with_cache(inputs)                  # every activation by TransformerLens hook name
    r = xf.verify(m, mode="certify"); r.passed; r.to_dict(); r.to_json()
    h = xf.build("k-hop", n=64, k=3); h([w]); xf.verify(h)  # P2's k-hop: weights, certified
    xf.save(m, "dir"); xf.load("dir"); xf.FixedPoint.binary(4, 5); xf.constructions()

:class:`Model` wraps the exact model (:class:`~exactformer.constructions.core.ir.CompiledModel`,
``m.compiled``) with its task; it lives here, above the three subpackages, because running a model
needs the executor (verify) and its task (constructions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from exactformer.constructions.core import registry
from exactformer.constructions.export import load as _load
from exactformer.constructions.export import save as _save
from exactformer.constructions.core.ir import CompiledModel
from exactformer.precision import Format, parse_format
from exactformer.arguments import BuildError
from exactformer.arguments import build as _build
from exactformer.verify.executor.exact import RunResult, run
from exactformer.verify.executor.forward import Cache, forward_with_cache
from exactformer.verify.verifier import Report, VerifyError, certified_arithmetics, check_model, shown_progress
from exactformer.verify.verifier import verify as _verify
from exactformer.verify.frontier import frontier

__all__ = ["Model", "build", "builder", "frontier", "load", "save", "BuildError", "VerifyError"]


class Model:
    """A built construction: its exact weights (``compiled``) and its task. Attributes of the
    compiled model (``n``, ``params``, ``summary()``, ``d_model`` ...) are available directly."""

    def __init__(self, compiled: CompiledModel):
        self.compiled = compiled
        self.task = registry.task_of(compiled)

    def __getattr__(self, name: str) -> Any:
        if name in ("compiled", "task"):
            raise AttributeError(name)
        return getattr(self.compiled, name)

    def __repr__(self) -> str:
        c = self.compiled
        return (f"<exactformer.Model {c.construction} n={c.n} layers={c.n_layers} heads={c.n_heads} "
                f"width={c.width} precision={c.precision}>")

    # ---- inputs ---------------------------------------------------------------------------------------
    def encode(self, example: Any) -> np.ndarray:
        """One natural input -> token ids [T]."""
        return self.task.encode(self.compiled, example)

    def encode_batch(self, examples: list) -> np.ndarray:
        """Natural inputs -> token ids [B, T]."""
        return self.task.encode_batch(self.compiled, list(examples))

    @staticmethod
    def _is_batch(inputs: Any) -> bool:
        return isinstance(inputs, list) and len(inputs) > 0 and isinstance(inputs[0], (list, tuple, np.ndarray, str))

    def _format(self, precision: Format | str | None) -> Format:
        p = precision if precision is not None else (self.compiled.precision or "float64")
        return parse_format(p) if isinstance(p, str) else p

    # ---- running ------------------------------------------------------------------------------------------
    def run(self, inputs: Any, precision: Format | str | None = None, device: str = "cpu") -> RunResult:
        """The executor's result for natural inputs (a list of them, or one). Inputs the task runs
        apart (``task.groups``: Dyck strings of different lengths) run group by group; the result
        holds them in the order given."""
        batch = inputs if self._is_batch(inputs) else [inputs]
        fmt = self._format(precision)
        groups = self.task.groups(self.compiled, batch)
        if len(groups) == 1:
            return run(self.compiled, self.encode_batch(batch), fmt, device=device)
        parts = [run(self.compiled, self.encode_batch([batch[i] for i in g]), fmt, device=device) for g in groups]
        order = np.argsort(np.concatenate([np.asarray(g, dtype=np.int64) for g in groups]), kind="stable")
        answers = [a for p in parts for a in p.answers]
        counts: dict[str, int] = {}
        for p in parts:
            for k, v in p.counts.items():
                counts[k] = counts.get(k, 0) + v
        return RunResult(np.concatenate([p.logits for p in parts])[order], [answers[i] for i in order],
                         np.concatenate([p.margin for p in parts])[order], counts)

    def __call__(self, inputs: Any, precision: Format | str | None = None, device: str = "cpu") -> Any:
        """Answers: one per input for a list of inputs, one for a single input; a model answering
        at several positions gives a list per input (None where the logits tie)."""
        res = self.run(inputs, precision, device)
        single = len(self.compiled.answer_positions_for(self.task.length(self.compiled))) == 1
        answers = [a[0] if single else a for a in res.answers]
        return answers if self._is_batch(inputs) else answers[0]

    def run_with_cache(self, inputs: Any, precision: Format | str | None = None) -> tuple[np.ndarray, Cache]:
        """All logits [B, T, d_vocab_out] (raw values) and every activation by TransformerLens hook
        name (``cache[name]`` is exact: an ExactTensor for fixed-point formats)."""
        batch = inputs if self._is_batch(inputs) else [inputs]
        return forward_with_cache(self.compiled, self.encode_batch(batch), self._format(precision))

    # ---- verification, files, other frameworks -------------------------------------------------------------
    def verify(self, mode: str | None = None, **kwargs: Any) -> Report:
        """``xf.verify`` of this model (:func:`exactformer.verify.verifier.verify`; no ``mode``: its
        strongest; a progress bar on a terminal for a long run: :func:`shown_progress`)."""
        with shown_progress(self, mode, kwargs) as kw:
            return _verify(self, mode=mode, **kw)

    def save(self, out_dir: str | Path, **kwargs: Any) -> Path:
        return save(self, out_dir, **kwargs)

    def to_torch(self, dtype: Any = None, device: Any = None, **kwargs: Any):
        """``to_torch(m, dtype, device, positions=None, query_chunk=None)`` (docs/exports.md, "Plain torch")."""
        from exactformer.constructions.export.torch_module import to_torch  # torch is imported here, when used

        return to_torch(self.compiled, dtype=dtype, device=device, **kwargs)

    def to_transformer_lens(self, dtype: Any = None, device: Any = None):
        from exactformer.constructions.export.lens import to_transformer_lens

        return to_transformer_lens(self.compiled, dtype=dtype, device=device)


def build(name: str, **kwargs: Any) -> Model:
    """Build construction ``name`` (see :func:`constructions`) with its builder's keyword arguments
    (:func:`exactformer.arguments.build`: an argument it does not take is a
    :class:`BuildError`; a list such as ``features`` may be a JSON file's name, a ``precision`` a
    format name, as on the command line)."""
    return Model(_build(name, (), kwargs))


def load(path: str | Path, trust_code: bool = False) -> Model:
    """A model saved by :func:`save` (every file checked against the manifest's digests). A model
    whose construction or blocks were defined in a module of one's own (docs/your-construction.md)
    needs that module: registered already (imported by the caller), or imported from the module
    the manifest records when ``trust_code`` is True (importing runs its code: allow it for files you
    trust); otherwise the refusal names the module and the option."""
    if not isinstance(trust_code, bool):
        raise VerifyError("trust_code", f"must be True or False, got {trust_code!r}")
    return Model(_load(path, trust_code=trust_code))


def save(model: Model | CompiledModel, out_dir: str | Path, certify: bool = True, **kwargs: Any) -> Path:
    """Write ``model`` to ``out_dir`` (see :func:`exactformer.constructions.export.save` for
    ``dense`` / ``materialize_limit``). ``certify`` (default True) certifies it in its fixed-point
    format, float64 and float32 first and records the outcome as the manifest's
    ``certified_arithmetics``; False records nothing, and so does a construction without a
    certificate (its task's modes lack "certify": it is verified by running it)."""
    compiled = check_model(model)
    if not isinstance(certify, bool):
        raise VerifyError("certify", f"must be True or False, got {certify!r}")
    if certify and "certified_arithmetics" not in kwargs and "certify" in registry.task_of(compiled).modes:
        kwargs["certified_arithmetics"] = certified_arithmetics(compiled)
    return _save(compiled, out_dir, **kwargs)


def builder(name: str):
    """``xf.index_lookup(...)`` etc.: the builder of a construction, returning a :class:`Model`."""
    fn = registry.get(name).builder

    def build_model(*args: Any, **kwargs: Any) -> Model:
        return Model(_build(name, args, kwargs))

    build_model.__name__ = fn.__name__
    build_model.__doc__ = fn.__doc__
    return build_model
