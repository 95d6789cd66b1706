"""docs/mpc.md: the worked example runs as written, and the generated tables are current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "mpc.md"


@pytest.mark.parametrize("marker", ["worked example", "registered example", "thm42 example", "thm42 round trip",
                                    "thm44 example"])
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


def _resource_rows() -> dict[tuple, list[str]]:
    """The committed Thm 4.2 resource table's rows by ((ε, ε′, c), N) -> cells."""
    out = {}
    for line in _block("anna-resources").splitlines():
        if line.startswith("| (") and "| 2^" in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[(cells[0], cells[1])] = cells
    return out


def _plan_cells(eps: float, ep: float, c: float, e: int) -> list[str]:
    from exactformer.verify.mpc.anna_resources import row

    r = row(1 << e, eps, ep, c, run_words=0)  # built, not run: rounds, s and P do not depend on the input
    return [str(r.tables), str(r.width), str(r.rounds), str(r.memory), str(r.machines), str(r.sort_levels)]


def _committed_cells(cells: list[str]) -> list[str]:
    return [cells[2], cells[3], cells[4], cells[6], cells[8], cells[12]]


def test_thm42_resource_table_is_current_at_2_8():
    """The rows at N = 2^8 (the whole table: slow test below and `exactformer mpc --kind resources`)."""
    from exactformer.verify.mpc.anna_resources import CONFIGS

    rows = _resource_rows()
    assert len(rows) == 5 * len(CONFIGS)
    for eps, ep, c in CONFIGS:
        cells = rows[(f"({eps}, {ep}, {c:g})", "2^8")]
        assert _committed_cells(cells) == _plan_cells(eps, ep, c, 8), (eps, ep, c)
        assert cells[-1].endswith("equal")  # run on the MPC runtime and compared with Alg. 1


@pytest.mark.slow
def test_thm42_resource_table_is_current():
    from exactformer.verify.mpc.anna_resources import CONFIGS, LOG_NS

    rows = _resource_rows()
    for eps, ep, c in CONFIGS:
        for e in LOG_NS:
            assert _committed_cells(rows[(f"({eps}, {ep}, {c:g})", f"2^{e}")]) == _plan_cells(eps, ep, c, e)


@pytest.mark.slow
def test_thm44_table_is_current():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_anna_mpc", DOC.parents[1] / "benchmarks" / "bench_anna_mpc.py")
    bench = importlib.util.module_from_spec(spec)
    import sys

    sys.path.insert(0, str(DOC.parents[1] / "benchmarks"))
    spec.loader.exec_module(bench)
    assert _block("low-rank") == bench.low_rank_table(), "run benchmarks/bench_anna_mpc.py --case low-rank --write"
