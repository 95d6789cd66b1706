"""The frontier's results on disk, one JSON file per job, keyed by (construction, builder
keywords, arithmetic, N, code version).

The code version is a digest of the source files a result depends on (the number formats, the
constructions, the certificates, the executors, the verifier, and the frontier's job and grid
modules: what a job runs and which design it asks for) and the package version: any edit there
makes every cached result stale, an edit elsewhere (the command line, the docs, the tables, the
engine) none. Files are written atomically (a temporary file, then a rename), so an interrupted
run leaves only whole results, and a re-run computes only the jobs it has no result for.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import exactformer
from exactformer.verify.frontier.grid import Job

CACHE_ENV = "EXACTFORMER_CACHE"
#: the source folders (relative to the package roots) whose files the results depend on
_SOURCES = (("precision", ""), ("constructions", ""), ("verify", "certify"), ("verify", "executor"),
            ("verify", "verifier.py"), ("verify", "frontier/jobs.py"), ("verify", "frontier/grid.py"))


def default_dir() -> Path:
    """``$EXACTFORMER_CACHE/frontier``, else ``$XDG_CACHE_HOME/exactformer/frontier``, else
    ``~/.cache/exactformer/frontier``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "frontier"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "exactformer" / "frontier"


def code_version() -> str:
    """A digest (16 hex digits) of the package version and the source files of :data:`_SOURCES`."""
    import exactformer.constructions
    import exactformer.precision
    import exactformer.verify

    roots = {"precision": Path(exactformer.precision.__file__).parent,
             "constructions": Path(exactformer.constructions.__file__).parent,
             "verify": Path(exactformer.verify.__file__).parent}
    h = hashlib.sha256(exactformer.__version__.encode())
    for pkg, sub in _SOURCES:
        path = roots[pkg] / sub if sub else roots[pkg]
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        for f in files:
            h.update(str(f.relative_to(roots[pkg])).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


class Cache:
    """Results by job under ``root`` (None: nothing is read or written)."""

    def __init__(self, root: Path | None, version: str):
        self.root, self.version = root, version

    def key(self, job: Job) -> str:
        text = json.dumps({"job": job.to_dict(), "code": self.version}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, job: Job) -> Path:
        k = self.key(job)
        return self.root / k[:2] / f"{k}.json"

    def get(self, job: Job) -> dict[str, Any] | None:
        if self.root is None:
            return None
        try:
            return json.loads(self._path(job).read_text())
        except (OSError, ValueError):
            return None

    def put(self, job: Job, result: dict[str, Any]) -> None:
        if self.root is None:
            return
        path = self._path(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, default=str))
        os.replace(tmp, path)
