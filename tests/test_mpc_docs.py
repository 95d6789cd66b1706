"""docs/mpc.md: the worked example runs as written, and the generated tables are current."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "mpc.md"


def test_worked_example_runs():
    text = DOC.read_text()
    block = re.search(r"<!-- worked example -->\n```python\n(.*?)```", text, re.S)
    assert block is not None, "docs/mpc.md lost its worked example"
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
