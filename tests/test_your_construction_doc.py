"""docs/your-construction.md runs as written: every block, in order, in one scratch directory.

* a python block marked ``<!-- file: PATH -->`` is exactly the file PATH (the tutorial's
  constructions are those files, importable from one place: docs/examples/tutorial/);
* every other python block runs (a fresh namespace each, the tutorial's modules importable), and
  what it prints contains what its comments say;
* every line of a bash block runs as a fresh process (``python -m exactformer.cli.main ...``: a model
  saved by one block is loaded by the next in another process) and must exit 0;
* the toml block is the entry-point group the registry reads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

from exactformer.constructions.core import registry
from tutorial import ROOT, TUTORIAL, registered

DOC = (ROOT / "docs" / "your-construction.md").read_text()
BLOCKS = re.findall(r"(?:<!-- file: (\S+) -->\n)?```(python|bash|toml)\n(.*?)```", DOC, re.S)

#: what a block's output must contain, by a line of the block
PRINTED = {
    "for n in (8, 64, 1024):": ["8 binary:int=2,frac=1", "[True, True, True]", "\n3\n"],
    'print(m.precision, m.n_heads)': ["binary:int=7,frac=1 2", "(('tok', 7), ('tok', 200)) (0, 1, 2, 3, 4, 5, 6)"],
    'for n, S in ((8, [1, 3, 4, 6])': ["4 binary:int=6,frac=2 ['1/4', '1/4'] 0", "5 binary:int=6,frac=8 ['51/256', '51/256'] 0",
                                       "\n3/4\n"],
    "def error(f):": [
        "RetrieveByPosition in layer 0: no slot 'query' in the layout; its slots: token, key",
        "token_rows values on slot 'token' has shape (4, 3), expected (4, 2) [rows, slot width]",
        "weight unembed.W_U[1, 4] = 16 (block SumReadout, slot 'a', answer 4) is not a grid value of binary:int=4,frac=1 "
        "(range [-16, 31/2], step 1/2); the smallest binary format holding every weight is binary:int=6,frac=0 -- or "
        "leave precision out: the build then searches the fewest-bit format that every block's condition and every "
        "weight allow",
        "sum-of-two: got an unexpected keyword argument 'c'; its parameters are n, a, b, alphabet"],
    "r = causal.verify(search_seconds=1)": [
        "counterexample found (the features the model counts differ from the task's",
        "unproven: blocks.0.attn head 0: SetAverage is proved for bidirectional attention, the layer is causal; no "
        "counterexample among 4096 candidate inputs (constant, alternating 2048, sample 2048) in "],
}


def test_the_page_has_its_blocks():
    files = [path for path, lang, _ in BLOCKS if path]
    assert files == [f"docs/examples/tutorial/{m}.py" for m in ("copy_token", "sum_of_two", "mean_over_set")]
    assert sum(lang == "bash" for _, lang, _ in BLOCKS) >= 3
    for key in PRINTED:  # every expectation names a block of the page
        assert any(key in body for _, lang, body in BLOCKS if lang == "python"), key


def test_the_file_blocks_are_the_files():
    for path, _, body in BLOCKS:
        if path:
            assert (ROOT / path).read_text() == body, f"{path} differs from its block in docs/your-construction.md"


def test_the_entry_point_group_is_the_registrys():
    toml = next(body for _, lang, body in BLOCKS if lang == "toml")
    groups = tomllib.loads(toml)["project"]["entry-points"]
    assert list(groups) == [registry.ENTRY_POINTS]


def test_every_block_runs_in_order(tmp_path):
    lens = importlib.util.find_spec("transformer_lens") is not None  # else its block is left out
    shutil.copytree(ROOT / "docs" / "examples", tmp_path / "docs" / "examples")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    here = os.getcwd()
    os.chdir(tmp_path)
    sys.path.insert(0, str(TUTORIAL))
    try:
        with registered():
            for path, lang, body in BLOCKS:
                if path or lang == "toml" or ("to_transformer_lens" in body and not lens):
                    continue
                if lang == "bash":
                    for line in body.splitlines():
                        if line.startswith("exactformer "):
                            proc = subprocess.run([sys.executable, "-m", "exactformer.cli.main", *shlex.split(line)[1:]],
                                                  capture_output=True, text=True, timeout=600, env=env)
                            assert proc.returncode == 0, (line, proc.stdout[-2000:], proc.stderr[-2000:])
                    continue
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    exec(compile(body, "docs/your-construction.md", "exec"), {})
                text = "\n" + out.getvalue()
                for key, wanted in PRINTED.items():
                    if key in body:
                        for w in wanted:
                            assert w in text, (key, w, text)
    finally:
        sys.path.remove(str(TUTORIAL))
        os.chdir(here)
