"""Docs cite what a reader has: the papers' sections, theorems, lemmas, appendices — never line
numbers of our transcripts of the papers ("L242", "line 123"), issue numbers or files outside the
repository (the transcripts, the design study). Checked on every doc page, every committed figure
data file and example, and on the text the code generates for docs and help: the size tables'
blocks, the bound registry, the k-hop resource tables, the builders' help."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from exactformer.constructions.core import registry
from exactformer.verify.bounds import lower_bounds as lb
from exactformer.verify.bounds import sizes as sz

ROOT = Path(__file__).resolve().parents[1]

#: what a reader does not have, with why
FORBIDDEN = {
    r"\bL\d{2,4}\b": "a line number of a paper transcript",
    r"\b[Ll]ines? \d+": "a line number",
    r"\b[Ii]ssues? #?\d+|(?<![\w/&])#\d+\b": "an issue number",
    r"shared/(?:papers|specs|notes)|design study|\bspec (?:D\.\d|§)": "a file outside the repository",
    r"\btranscripts?\b": "the transcripts",
}


def offences(text: str) -> list[str]:
    """Every forbidden reference in ``text``, with a little context and why."""
    out = []
    for pattern, why in FORBIDDEN.items():
        for m in re.finditer(pattern, text):
            out.append(f"{why}: ...{text[max(0, m.start() - 40): m.end() + 20]!r}...")
    return out


def _doc_files() -> list[Path]:
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(docs.rglob("*.md")), *sorted((docs / "figures").glob("*.csv")),
            *sorted((docs / "figures").glob("*.json")),
            *sorted(p for p in (docs / "examples").rglob("*") if p.is_file() and "__pycache__" not in p.parts)]


@pytest.mark.parametrize("path", _doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_files_cite_what_a_reader_has(path: Path):
    assert offences(path.read_text()) == []


def _generated() -> dict[str, str]:
    committed = json.loads(sz.COMMITTED_DATA.read_text())
    texts = {f"docs/sizes.md block {k}": v for k, v in sz.doc_blocks(committed, "figures").items()}
    texts["bound registry"] = json.dumps({k: b.describe() for k, b in lb.BOUNDS.items()}, ensure_ascii=False)
    texts["family notes"] = json.dumps({k: f.__dict__ for k, f in lb.FAMILIES.items()}, ensure_ascii=False)
    texts["claims"] = json.dumps({k: registry.get(k).claim.to_json() for k in registry.names()}, ensure_ascii=False)
    texts["size specs"] = json.dumps({k: sz.spec_json(s) for k, s in sz.SIZE_SPECS.items()}, ensure_ascii=False)
    texts["sizes: not built"] = json.dumps(sz.NOT_BUILT, ensure_ascii=False)
    spec = importlib.util.spec_from_file_location("mpc_tables", ROOT / "benchmarks" / "mpc_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    texts.update({f"mpc table {k}": fn() for k, fn in tables.TABLES.items()})
    for name in registry.names():
        texts[f"help of {name}"] = registry.get(name).builder.__doc__ or ""
    return texts


def test_generated_text_cites_what_a_reader_has():
    bad = {where: found for where, text in _generated().items() if (found := offences(text))}
    assert bad == {}


@pytest.mark.parametrize("text,found", [
    ("Thm 3 (L50, L242-244)", 2), ("see line 12", 1), ("quoted in issue 14", 1), ("fixed in #17", 1),
    ("shared/papers/x.md", 1), ("spec D.1.7", 1), ("the transcript says", 1),
    ("P1 Thm 3 (Sec. 3; App. C.1), L1 protocols, layers L = 2, 2^10, step #", 0),
])
def test_the_check_finds_what_it_forbids(text: str, found: int):
    assert len(offences(text)) == found
