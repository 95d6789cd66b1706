"""Every registered construction saved, loaded in a fresh process, run and verified.

The reported failure: a saved nearest-neighbour or MQAR model could not be loaded in a fresh
process (``unknown block 'RetrieveNearest'``): nothing imported the content blocks on load. Every
block class of the package now carries the decorator ``@block`` (the table
``exactformer.constructions.blocks.BLOCKS``), the package imports them all, and this test covers
every registered construction, not one fixture.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys

import pytest

import exactformer as xf
from exactformer.constructions import blocks
from exactformer.constructions.blocks import BLOCKS, Block, block_from_json
from exactformer.constructions.core.registry import task_of
from registered import small_build, weight_constructions


def test_every_construction_loads_runs_and_verifies_in_a_fresh_process(tmp_path):
    names = weight_constructions()
    assert {"nearest-neighbor", "mqar", "index-lookup", "match2"} <= set(names)
    here = {}
    for name in names:
        m = small_build(name)
        xf.save(m, tmp_path / name, certify=False)
        task = task_of(m.compiled)
        batches = list(task.sample(m.compiled, 4, 0)) + list(task.adversarial(m.compiled, 4, 1))
        inputs = [[b.example(i) for i in range(len(b))] for b in batches]
        here[name] = {"inputs": inputs, "answers": [m.run(x).answers for x in inputs]}
    (tmp_path / "cases.json").write_text(json.dumps(here, default=str))
    code = (
        "import json, sys\n"
        "import exactformer as xf\n"
        "root = sys.argv[1]\n"
        "cases = json.load(open(root + '/cases.json'))\n"
        "out = {}\n"
        "for name, case in cases.items():\n"
        "    m = xf.load(root + '/' + name)\n"
        "    r = xf.verify(m)\n"  # the strongest mode each has: certify, else every input, else samples
        "    out[name] = {'answers': [m.run(xs).answers for xs in case['inputs']], 'passed': r.passed, "
        "'reason': r.reason}\n"
        "print(json.dumps(out, default=str))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    there = json.loads(proc.stdout)
    assert set(there) == set(names)
    for name in names:
        assert there[name]["passed"], (name, there[name]["reason"])
        assert json.loads(json.dumps(here[name]["answers"], default=str)) == there[name]["answers"], name


def test_every_block_class_is_in_the_table():
    """A block that is not in BLOCKS could be built but not loaded: every concrete subclass of
    Block in the package is in the table under its own name (its @block), and round-trips through
    JSON."""
    def concrete(cls):
        for sub in cls.__subclasses__():
            yield from concrete(sub)
            if not inspect.isabstract(sub) and not sub.__name__.startswith("_") and sub.__module__.startswith(blocks.__name__):
                yield sub

    found = {cls.__name__: cls for cls in concrete(Block)}
    assert found == {k: v for k, v in BLOCKS.items() if v.__module__.startswith(blocks.__name__)}


def test_saved_plans_name_blocks_by_the_table():
    m = small_build("nearest-neighbor").compiled
    for p in m.plan:
        d = p.block.to_json()
        assert block_from_json(json.loads(json.dumps(d))) == p.block
    with pytest.raises(ValueError, match="unknown block 'Nope'"):
        block_from_json({"block": "Nope"})
    assert dataclasses.is_dataclass(BLOCKS["RetrieveNearest"])


def test_an_abstract_block_cannot_be_made():
    class Half(blocks.HeadBlock):  # no emit, no certify_head
        pass

    with pytest.raises(TypeError):
        Half()
