"""docs/mpc.md: the worked example runs as written, and the generated tables are current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "mpc.md"


@pytest.mark.parametrize("marker", ["worked example", "registered example"])
def test_examples_run(marker):
    text = DOC.read_text()
    block = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", text, re.S)
    assert block is not None, f"docs/mpc.md lost its {marker}"
    exec(compile(block.group(1), str(DOC), "exec"), {})


def test_tables_are_current():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mpc_tables", DOC.parents[1] / "benchmarks" / "mpc_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    text = DOC.read_text()
    for name, fn in tables.TABLES.items():
        block = re.search(rf"<!-- table:{name} -->\n(.*?)\n<!-- end table -->", text, re.S)
        assert block is not None and block.group(1) == fn(), f"table {name}: run benchmarks/mpc_tables.py --write"


def _block(name: str) -> str:
    return re.search(rf"<!-- table:{name} -->\n(.*?)\n<!-- end table -->", DOC.read_text(), re.S).group(1)


def test_k_hop_lower_bound_is_stated_whole_with_its_vacuous_cells():
    """The recurrent / low-rank row states the theorem whole (depth Ω(k) *or* memory Ω(N/k⁶)) and
    marks every cell where the memory alternative is vacuous (N <= k⁶), counted here by hand."""
    text = _block("layers")
    assert "depth Ω(k) or memory Ω(N/k⁶)" in text
    head, *rows = [l for l in text.splitlines() if l.startswith("| 2^") or l.startswith("| N ")]
    ks = [int(c.split("=")[1]) for c in head.strip("|").split("|")[1:-1]]
    marked = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        n = 1 << int(cells[0].removeprefix("2^"))
        for k, cell in zip(ks, cells[1:-1]):
            assert cell.endswith("°") == (n <= k ** 6), (n, k, cell)
            marked += cell.endswith("°")
    assert marked == 39 and f"vacuous in {marked} of the table's {len(rows) * len(ks)} cells" in text


def test_k_hop_widths_say_the_per_token_maps_are_not_counted():
    text = _block("sizes")
    head = text.splitlines()[0]
    assert "m (words; per-token maps not counted)" in head and "residual (words; per-token maps not counted)" in head
    assert "they are not counted here" in text
