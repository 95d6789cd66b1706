"""docs/api.md runs as written: every python block, in order, each in a fresh namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", DOC, re.S)


def test_the_api_doc_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_api_doc_block_runs(i: int, capsys):
    if "to_transformer_lens" in BLOCKS[i]:
        pytest.importorskip("transformer_lens")
    exec(compile(BLOCKS[i], f"docs/api.md block {i}", "exec"), {})
    assert capsys.readouterr().out
