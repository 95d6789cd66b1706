"""docs/api.md runs as written: every python block, in order, each in a fresh namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", DOC, re.S)


def test_the_api_doc_has_examples():
    assert len(BLOCKS) >= 4


#: blocks left to the slow suite (.ci/run runs it), named by a line they hold
SLOW = (
    # slow: index-lookup at n = 64 saved (certified in three arithmetics) and loaded by
    # test_float_arithmetics.py::test_saved_manifest_records_certified_arithmetics, exported to torch and
    # TransformerLens by test_export.py
    "xf.save(m, d)",
)


def test_the_slow_blocks_are_in_the_doc():
    """Every SLOW entry still names a block of the doc (a changed block would otherwise run unmarked)."""
    assert all(any(s in b for b in BLOCKS) for s in SLOW)


@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.slow) if any(s in b for s in SLOW) else i
                               for i, b in enumerate(BLOCKS)])
def test_api_doc_block_runs(i: int, capsys):
    if "to_transformer_lens" in BLOCKS[i]:
        pytest.importorskip("transformer_lens")
    exec(compile(BLOCKS[i], f"docs/api.md block {i}", "exec"), {})
    assert capsys.readouterr().out
