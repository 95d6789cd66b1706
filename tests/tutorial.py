"""The constructions of docs/your-construction.md (the modules of docs/examples/tutorial/), registered
for the duration of a test and removed afterwards, so that no other test sees them (the command
line's tables, ``verify all`` and the field-coverage test read the registry).

    with registered() as names:          # {"copy-token": <module copy_token>, ...}
        for name in names:
            xf.build(name, **registry.get(name).example)
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator

from exactformer.constructions.blocks import BLOCKS
from exactformer.constructions.core import registry

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "examples" / "tutorial"
#: module -> the construction it registers, in the order of the tutorial
MODULES = {"copy_token": "copy-token", "sum_of_two": "sum-of-two", "mean_over_set": "mean-over-set"}
#: more N each is built, certified and exported at (its registered example is the smallest)
SIZES = {"copy-token": [dict(n=16, j=11), dict(n=64, j=40)],
         "sum-of-two": [dict(n=16, a=3, b=12), dict(n=64, a=1, b=50)],
         "mean-over-set": [dict(n=16, positions=[0, 4, 8, 12]), dict(n=32, positions=[1, 2, 5, 7, 11, 30])]}


@contextlib.contextmanager
def registered() -> Iterator[dict[str, object]]:
    """Import the tutorial's modules from their files (as ``--module FILE`` does); yield construction
    name -> module; then remove the constructions, their blocks and the modules again."""
    registry.names()  # the built-in constructions first: they stay
    before, blocks = dict(registry._REGISTRY), dict(BLOCKS)
    try:
        yield {MODULES[m]: registry.import_code(str(TUTORIAL / f"{m}.py")) for m in MODULES}
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)
        BLOCKS.clear()
        BLOCKS.update(blocks)
        for m in MODULES:
            sys.modules.pop(m, None)
