"""The tree shows the architecture (docs/architecture.md, "Files"), imports point down only, and no
module reaches into another's private names."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: source folder -> the installed package
PACKAGES = {"precision": "exactformer.precision", "constructions": "exactformer.constructions",
            "verify": "exactformer.verify", "exactformer": "exactformer"}
#: layers, lowest first: a module may import from its own layer and the ones below
LAYERS = ["exactformer.precision", "exactformer.constructions", "exactformer.verify",
          "exactformer.api|exactformer.arguments", "exactformer.cli"]


@functools.cache
def _modules() -> tuple[tuple[str, Path, ast.Module], ...]:
    """(module name, path, syntax tree) of every source module, parsed once for the tests below (which
    only read the trees)."""
    found = []
    for folder, pkg in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((pkg, *[p for p in parts if p != "__init__"]))
            found.append((name, path, ast.parse(path.read_text())))
    return tuple(found)


def _layer(module: str) -> int | None:
    for i, alternatives in reversed(list(enumerate(LAYERS))):
        if any(module == a or module.startswith(a + ".") for a in alternatives.split("|")):
            return i
    return None


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_imports_point_down_only():
    wrong = []
    for name, path, tree in _modules():
        mine = _layer(name)
        for module, _ in _imports(tree):
            theirs = _layer(module)
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert wrong == []


def test_no_module_imports_another_modules_private_names():
    wrong = [f"{path.relative_to(ROOT)}: {name} from {module}"
             for _, path, tree in _modules() for module, names in _imports(tree) if module.startswith("exactformer")
             for name in names if name.startswith("_")]
    assert wrong == []


def test_the_architecture_doc_lists_every_folder():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## Files"):]
    rows = set(re.findall(r"^\| `([\w/]+/)` \|", table, re.M))
    folders = {f"{p.parent.relative_to(ROOT).as_posix()}/" for folder in PACKAGES for p in (ROOT / folder).rglob("__init__.py")}
    folders |= {"tests/", "benchmarks/", "docs/"}
    assert rows == folders



def test_no_layer_asks_which_kind_of_model_it_has():
    """One model world: the verifier, the API and the command line never test for a program type or
    for a transformer or recurrent model (the kinds dispatch: functools.singledispatch on the model's
    class, registered next to each implementation)."""
    pattern = re.compile(r"isinstance\(.*(ProgramModel|MPCModel|CompiledModel|RNNModel)")
    found = [f"{p.relative_to(ROOT)}:{i + 1}" for folder in ("verify", "exactformer") for p in (ROOT / folder).rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines()) if pattern.search(line)]
    assert found == []
