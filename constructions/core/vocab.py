"""Token names held as runs, so a vocabulary of 2^30 index tokens costs a few bytes.

A :class:`RunVocab` is a read-only sequence of strings: run ``(pattern, first, count)`` names the
next ``count`` token ids ``pattern.format(first), pattern.format(first + 1), ...`` (Index Lookup:
``("s{}", 0, |Sigma|)`` then ``("p{}", 1, N)``). It compares equal to the list it stands for. A
manifest records a vocabulary of at most :data:`LIST_LIMIT` names as the list of names (what a
client reads without exactformer), a longer one as ``{"runs": [[pattern, first, count], ...]}``
(:meth:`to_json`, :meth:`from_json`): token id i is named by the run holding it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, Iterator


class RunVocab(Sequence):
    """Token names in runs (see the module docstring)."""

    def __init__(self, runs: Sequence[tuple[str, int, int]]):
        self.runs = [(str(p), int(f), int(c)) for p, f, c in runs]
        if any(c < 0 or p.count("{}") != 1 for p, _, c in self.runs):
            raise ValueError("each run is (a pattern with one '{}', first value, count >= 0)")
        self.starts = [0]
        for _, _, c in self.runs:
            self.starts.append(self.starts[-1] + c)

    def __len__(self) -> int:
        return self.starts[-1]

    def _name(self, i: int) -> str:
        r = bisect.bisect_right(self.starts, i) - 1
        pattern, first, _ = self.runs[r]
        return pattern.format(first + i - self.starts[r])

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._name(j) for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"token id {i} outside [0, {len(self)})")
        return self._name(i)

    def __iter__(self) -> Iterator[str]:
        for pattern, first, count in self.runs:
            for j in range(count):
                yield pattern.format(first + j)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, RunVocab):
            return self.runs == other.runs
        return isinstance(other, (list, tuple)) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"RunVocab({self.runs})"

    def to_json(self) -> dict[str, Any]:
        return {"runs": [list(r) for r in self.runs]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "RunVocab":
        return RunVocab([tuple(r) for r in d["runs"]])


#: vocabularies with more names than this are written to a manifest as runs
LIST_LIMIT = 1 << 16


def vocab_json(v: Sequence[str]) -> Any:
    """A vocabulary as a manifest holds it: runs for a :class:`RunVocab` of more than
    :data:`LIST_LIMIT` names, else the list of names."""
    return v.to_json() if isinstance(v, RunVocab) and len(v) > LIST_LIMIT else [str(t) for t in v]


def vocab_from_json(d: Any) -> Sequence[str]:
    return RunVocab.from_json(d) if isinstance(d, dict) else list(d)
