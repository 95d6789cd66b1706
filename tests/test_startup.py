"""Start-up: heavy libraries are imported where they are used, not by ``import exactformer``.

Importing torch takes seconds; building, running, certifying, saving and loading a model in its
fixed-point format never needs it (only the float exports and the float runs do). The timing goals
(``import exactformer`` and ``exactformer --help`` <= 0.5 s) are measured in docs/benchmarks.md;
these tests check the cause, not the clock.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _modules_after(code: str) -> set[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_fixed_point_work_never_imports_torch(tmp_path):
    mods = _modules_after(
        "import exactformer as xf\n"
        "m = xf.build('index-lookup', n=16, alphabet=4)\n"
        "assert xf.verify(m).passed\n"
        f"xf.save(m, {str(tmp_path / 'm')!r}, certify=False)\n"
        f"assert xf.verify(xf.load({str(tmp_path / 'm')!r})).passed\n")
    assert "torch" not in mods


@pytest.mark.slow
def test_float_runs_import_torch_when_asked():
    mods = _modules_after(
        "import exactformer as xf\n"
        "m = xf.build('index-lookup', n=16, alphabet=4)\n"
        "assert xf.verify(m, mode='sample', samples=4, arithmetic='float32').passed\n")
    assert "torch" in mods


def test_help_and_import_load_nothing_heavy():
    """``import exactformer`` and ``exactformer --help`` import no numpy, no construction and no
    torch (the API's names and the commands are imported when used)."""
    mods = _modules_after("import exactformer")
    assert not {"numpy", "torch", "exactformer.api"} & mods
    mods = _modules_after("from exactformer.cli.main import app\n"
                          "try:\n    app(['--help'])\nexcept SystemExit:\n    pass")
    assert not {"numpy", "torch", "exactformer.constructions.core.registry", "exactformer.cli.commands"} & mods


def test_the_api_names_resolve_when_used():
    mods = _modules_after("import exactformer as xf\nassert callable(xf.build) and callable(xf.verify)\n"
                          "assert 'index-lookup' in xf.constructions()")
    assert "exactformer.api" in mods and "torch" not in mods
