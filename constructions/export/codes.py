"""Position codes in an export: recorded by their recipe, rebuilt on load.

Every code object an embedding block reads (and ``model.position_code``) is recorded once in the
manifest's ``codes`` list, in first-use order, as one of

* ``{"generator": {family, n, k, m, d, seed, max_inner}, "describe": ...}``: a position-code family
  and its parameters; the vectors are generated from them on demand (App. B.3). ``save`` checks on
  a sample of indices that the generator reproduces the code.
* ``{"view": {"base": i, "kind": "identity" | "constant" | "table", "index": j | null}}``: a
  :class:`~exactformer.constructions.theorems.equality.CodeView` of the recorded code ``i < `` its own
  position (vector ``t`` of the view is vector ``t`` of the base, vector ``j`` of the base, or
  vector ``table[t]`` with the index table ``codes.{c}.table`` in the exact file).
* ``{"runs": {"n": n, "k": k}, "describe": ...}``: a code constant on runs of indices
  (:class:`~exactformer.constructions.core.runs.RunConstantCode`, e.g. Theorem 13's type signs):
  vector i is row r of ``codes.{c}.rows`` (int8 ``[R, k]``) for ``starts[r] <= i < starts[r+1]``,
  ``codes.{c}.starts`` (int64 ``[R]``) in the exact file (R runs, whatever n is).
* ``{"stored": {"n": n, "k": k}, "describe": ...}``: any other code; its vectors ``0..n-1`` are
  ``codes.{c}.numerators`` (int8 ``[n, k]``) in the exact file.

``describe`` is the code's own description (certificates included), kept for information. Codes
shared by several blocks are shared again after loading (the certificates compare them by
identity).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.codes import positions as pc
from exactformer.constructions.codes.positions import CodeView
from exactformer.constructions.core.runs import RunConstantCode, run_constant

SAMPLE_INDICES = 256  # random indices compared when checking a generator (plus the ends and middle)
_GENERATOR_KEYS = ("family", "n", "k", "m", "d", "seed", "max_inner")


def regenerate(gen: dict[str, Any]) -> Any:
    """The position code a ``generator`` entry describes (see docs/exports.md)."""
    fam = gen.get("family")
    n = int(gen["n"])
    mi = Fraction(str(gen["max_inner"])) if gen.get("max_inner") is not None else Fraction(1, 4)
    if fam == "reed-solomon":
        code = pc.ReedSolomonCode(n, int(gen["m"]), int(gen["d"]), mi)
    elif fam == "random":
        code = pc.RandomSignCode(n, int(gen["k"]), int(gen["seed"] or 0), mi)
    elif fam == "onehot":
        code = pc.OneHotCode(n, mi)
    elif fam == "binary":
        code = pc.BinaryCode(n)
    else:
        code = pc.position_codes(n, max_inner=mi, family=fam, seed=int(gen.get("seed") or 0))
    if int(code.k) != int(gen["k"]):
        raise ValueError(f"regenerated code has k = {code.k}, the manifest says {gen['k']}")
    return code


def _sample_indices(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = {0, n - 1, n // 2}
    idx.update(int(i) for i in rng.integers(0, n, size=min(n, SAMPLE_INDICES)))
    return np.array(sorted(i for i in idx if 0 <= i < n), dtype=np.int64)


def _generator(code: Any) -> dict[str, Any] | None:
    """The ``generator`` entry of ``code`` when its describe() regenerates it (checked on a sample
    of indices), else None."""
    try:
        desc = code.describe()
        if not isinstance(desc, dict) or not {"family", "n", "k"} <= set(desc) or desc["family"] == "view":
            return None
        gen = {k: desc.get(k) for k in _GENERATOR_KEYS}
        idx = _sample_indices(int(desc["n"]))
        if not np.array_equal(np.asarray(regenerate(gen).numerators(idx)), np.asarray(code.numerators(idx))):
            return None
    except Exception:  # noqa: BLE001 - any code object whose describe() does not regenerate it is stored
        return None
    return {"generator": gen, "describe": desc}


class StoredCode:
    """A code rebuilt from its stored vectors: ``numerators(idx)`` -> int8 ``[len(idx), k]``."""

    bound = None

    def __init__(self, numerators: np.ndarray, describe: dict[str, Any] | None):
        self.table = np.asarray(numerators, dtype=np.int8)
        self.n, self.k = self.table.shape
        self._describe = describe or {}
        self.family = self._describe.get("family", "stored")
        self.is_sign_code = bool(np.all(np.abs(self.table) == 1))
        self.gram_scale = Fraction(1, self.k) if self.is_sign_code else Fraction(1)

    def numerators(self, idx) -> np.ndarray:
        return self.table[np.asarray(idx, dtype=np.int64)]

    signs = numerators

    def describe(self) -> dict[str, Any]:
        return self._describe


class CodeRecord:
    """The ``codes`` list of a manifest and the arrays it refers to, built by :meth:`ref`."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.arrays: dict[str, np.ndarray] = {}  # exact-file key -> array
        self._index: dict[int, int] = {}
        self._keep: list[Any] = []  # keeps recorded objects alive while their id() is a key

    def ref(self, code: Any, n_used: int) -> int:
        """Index of ``code`` in ``entries`` (recorded on first use). ``n_used``: how many of its
        vectors the model reads (stored codes keep exactly those)."""
        if id(code) in self._index:
            return self._index[id(code)]
        if isinstance(code, CodeView):
            if code.kind == "identity":
                base_used = n_used
            elif code.kind == "constant":
                base_used = int(code.data) + 1
            else:
                base_used = int(code.data.max()) + 1 if code.data.size else 0
            entry: dict[str, Any] = {"view": {"base": self.ref(code.base, base_used), "kind": code.kind,
                                              "index": int(code.data) if code.kind == "constant" else None}}
        elif run_constant(code):
            entry = {"runs": {"n": int(code.n), "k": int(code.k)}, "describe": _describe_or_none(code)}
        else:
            entry = _generator(code) or {"stored": {"n": int(n_used), "k": int(code.k)},
                                         "describe": _describe_or_none(code)}
        c = len(self.entries)
        if "view" in entry and code.kind == "table":
            self.arrays[f"codes.{c}.table"] = np.ascontiguousarray(code.data, dtype=np.int64)
        if "runs" in entry:
            self.arrays[f"codes.{c}.starts"] = np.ascontiguousarray(code.starts, dtype=np.int64)
            self.arrays[f"codes.{c}.rows"] = np.ascontiguousarray(code.rows, dtype=np.int8)
        if "stored" in entry:
            self.arrays[f"codes.{c}.numerators"] = np.ascontiguousarray(code.numerators(np.arange(n_used)), dtype=np.int8)
        self.entries.append(entry)
        self._index[id(code)] = c
        self._keep.append(code)
        return c


def _describe_or_none(code: Any) -> dict[str, Any] | None:
    try:
        d = code.describe()
    except Exception:  # noqa: BLE001 - describe() is informational only
        return None
    return d if isinstance(d, dict) else None


def rebuild(entries: list[dict[str, Any]], arrays: dict[str, np.ndarray]) -> list[Any]:
    """The code objects of a manifest's ``codes`` list (``arrays``: the exact file's tensors)."""
    codes: list[Any] = []
    for c, e in enumerate(entries):
        if "generator" in e:
            codes.append(regenerate(e["generator"]))
        elif "view" in e:
            v = e["view"]
            base = int(v["base"])
            if not 0 <= base < c:
                raise ValueError(f"codes[{c}]: view base {base} must be an earlier code")
            kind = v["kind"]
            data = arrays[f"codes.{c}.table"] if kind == "table" else v["index"] if kind == "constant" else None
            codes.append(CodeView(codes[base], kind, data))
        elif "runs" in e:
            codes.append(RunConstantCode(arrays[f"codes.{c}.starts"], arrays[f"codes.{c}.rows"], int(e["runs"]["n"])))
        elif "stored" in e:
            table = arrays[f"codes.{c}.numerators"]
            if list(table.shape) != [int(e["stored"]["n"]), int(e["stored"]["k"])]:
                raise ValueError(f"codes[{c}]: stored vectors have shape {list(table.shape)}")
            codes.append(StoredCode(table, e.get("describe")))
        else:
            raise ValueError(f"codes[{c}] is neither a generator, a view, runs nor stored")
    return codes
