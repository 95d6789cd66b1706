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
LAYERS = ["exactformer.precision", "exactformer.constructions|exactformer.construct", "exactformer.verify",
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


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules it imports (at the top or inside a function: a circle through an import
    in a function is still a circle), each with the packages whose ``__init__`` that import runs
    first; an import of a package that holds the importer is left out (it is always loaded
    before the importer)."""
    names = {name for name, _, _ in _modules()}

    def resolve(target: str) -> str | None:
        while target and target not in names:
            target = target.rpartition(".")[0]
        return target or None

    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, _, tree in _modules():
        for module, imported in _imports(tree):
            if not module.startswith("exactformer"):
                continue
            for target in [f"{module}.{a}" if f"{module}.{a}" in names else module for a in imported] or [module]:
                target = resolve(target)
                while target:
                    if target != name and not name.startswith(target + "."):
                        graph[name].add(target)
                    target = resolve(target.rpartition(".")[0]) if "." in target else None
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack, on, out = [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circles():
    """Any module imports first (``import exactformer.constructions.core.spec`` failed with a
    circular import: the specifications imported the blocks package, whose blocks import them)."""
    assert _circles(_import_graph()) == []


def test_the_circle_finder_finds_circles():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _import_graph()
    # importing blocks.mlp runs the blocks package's __init__ first
    assert "exactformer.constructions.blocks" in graph["exactformer.verify.certify.layers"]


def test_modules_import_first_in_a_fresh_process():
    import subprocess
    import sys

    for module in ("exactformer.constructions.core.spec", "exactformer.construct", "exactformer.verify.distributed.shards"):
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (module, proc.stderr[-2000:])
