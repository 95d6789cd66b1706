"""The registry of constructions: everything a construction declares, in one place.

A construction registers with one decorator beside its builder::

    @construction("index-lookup", task=IndexLookupTask(), theorem="Thm 1 (App. C.2)",
                  claim=Claim("P1 Thm 1 (Sec. 3, App. C.2)", layers="1", heads="1", width="O(log N)",
                              precision="O(log N)", size="O((log N)^3)"),
                  sizes=SizeRows("index-lookup", kwargs=(("alphabet", 64),)),
                  example=dict(n=16, alphabet=4))
    def index_lookup(n: int, alphabet: int = 64, ...) -> CompiledModel: ...

and everything else finds it here: ``xf.build``, the command line's options (from the builder's
signature and docstring), ``verify all``, the verifier and the certificate (the task), the size
tables (``sizes``: the rows to build, or the reason there are none) and the claims set beside them
(``claim``), the state tests (``example``: a small build). The constructions of the two papers are
the modules of :mod:`exactformer.constructions.theorems` (one module per theorem), imported when the
registry is first read, with the modules that installed packages name in the entry-point group
:data:`ENTRY_POINTS` (``[project.entry-points."exactformer.constructions"]``). A construction defined
elsewhere -- a researcher's own module -- registers with the same decorator when its module is
imported (:func:`import_code` imports one by name or file: the command line's ``--module``); the
saved manifest records that module, and :func:`exactformer.api.load` imports it again only when the
caller allows it (``trust_code``). A name is registered by one module: registering it from another
is refused (re-running the same module, as a notebook does, registers it anew).

Order: paper 1 before paper 2, then by theorem number (read from ``theorem``), then by registration.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import itertools
import pkgutil
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType
from dataclasses import dataclass, field
from typing import Any, Callable

from exactformer.constructions.core.builder import building
from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.core.task import Task


@dataclass(frozen=True)
class Claim:
    """What a theorem claims for the model it constructs (asymptotic, as stated), set beside the
    built sizes in the size tables."""

    source: str
    layers: str
    heads: str
    width: str
    precision: str
    size: str
    note: str = ""

    def to_json(self) -> dict[str, str]:
        return dict(self.__dict__)


BUILD_MAX_N = 1 << 20  # the default largest N the size tables build
BUILT_TO = 1 << 12  # the default largest N whose size rows are full builds (above: the builder shapes-only)


@dataclass(frozen=True)
class SizeRows:
    """One row source of the size tables: the construction built with ``kwargs`` at N = 2^4 ...
    ``max_n``, in the lower-bound family ``family`` (a key of
    :data:`exactformer.verify.bounds.lower_bounds.FAMILIES`), compared with ``bounds`` (keys of its
    BOUNDS; None: the family's) and with ``claim`` (None: the construction's). ``name`` defaults
    to the construction's; ``build_max_n`` is the largest N checked against a full build; rows up
    to ``built_to`` (at most ``build_max_n``) are measured from full builds, rows above it come from
    the builder run shapes-only."""

    family: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    bounds: tuple[str, ...] | None = None
    name: str | None = None
    claim: Claim | None = None
    build_max_n: int = BUILD_MAX_N
    max_n: int = BUILD_MAX_N
    note: str = ""
    built_to: int = BUILT_TO


@dataclass(frozen=True)
class NoRows:
    """Why a construction has no rows in the size tables (said under the family's figure)."""

    family: str
    reason: str


@dataclass
class Construction:
    """A registered construction (see the module docstring). ``sizes`` holds its size-table rows;
    ``no_sizes`` the reason it has none."""

    name: str
    builder: Callable[..., CompiledModel]
    task: Task
    theorem: str
    claim: Claim
    sizes: tuple[SizeRows, ...] = ()
    no_sizes: NoRows | None = None
    example: dict[str, Any] = field(default_factory=lambda: {"n": 8})
    order: int = 0
    #: the largest n ``verify all`` builds it at (None: any); a larger --n is lowered to it, noted
    all_max_n: int | None = None
    #: a small build whose inputs the specification is checked against the truth on
    #: (:mod:`exactformer.verify.certify.spec_check`; None: ``example``)
    small: dict[str, Any] | None = None

    @property
    def parameters(self) -> dict[str, inspect.Parameter]:
        return dict(inspect.signature(self.builder).parameters)

    @property
    def module(self) -> str:
        """The module that defines the builder (and registered it)."""
        return self.builder.__module__

    @property
    def sort_key(self) -> tuple:
        """(paper, theorem number, registration order): "P2 Thm 5.4" -> (2, (5, 4), ...)."""
        m = re.search(r"Thm (\d+(?:\.\d+)*)", self.theorem)
        number = tuple(int(x) for x in m.group(1).split(".")) if m else (1 << 30,)
        return (2 if self.theorem.startswith("P2") else 1, number, self.order)


_REGISTRY: dict[str, Construction] = {}
_COUNTER = itertools.count()


class UnknownConstruction(ValueError):
    pass


class RegistryError(ValueError):
    """A registration that does not declare what every construction must."""


def construction(name: str, task: type | Task, theorem: str, claim: Claim,
                 sizes: SizeRows | tuple[SizeRows, ...] | NoRows, example: dict[str, Any] | None = None,
                 all_max_n: int | None = None, small: dict[str, Any] | None = None) -> Callable:
    """Decorator registering a builder ``f(n, ...) -> CompiledModel`` under ``name``: its task, the
    theorem it builds, the theorem's claim, the size-table rows (or :class:`NoRows`: the reason it
    has none), a small example build (default ``n=8``), the largest n ``verify all`` builds it
    at (``all_max_n``: for a construction verified by running it, whose cost per input grows fast)
    and the smallest build (``small``, default ``example``: the task's specification is checked
    against its truth on every input of it before a certificate passes)."""
    if not isinstance(claim, Claim):
        raise RegistryError(f"{name}: claim must be a Claim (what the theorem claims), got {claim!r}")
    rows = (sizes,) if isinstance(sizes, SizeRows) else sizes
    reason = rows if isinstance(rows, NoRows) else None
    if reason is not None:
        rows = ()
    elif not rows or not all(isinstance(r, SizeRows) for r in rows):
        raise RegistryError(f"{name}: sizes must be SizeRows, a tuple of them, or NoRows (the reason there are none)")

    def wrap(fn: Callable[..., CompiledModel]) -> Callable[..., CompiledModel]:
        known = _REGISTRY.get(name)
        if known is not None and (known.module, known.builder.__qualname__) != (fn.__module__, fn.__qualname__):
            raise RegistryError(f"construction {name!r} is already registered by {known.module}.{known.builder.__qualname__}; "
                                f"{fn.__module__}.{fn.__qualname__} must use another name")

        @functools.wraps(fn)
        def builder(*args: Any, **kwargs: Any) -> CompiledModel:
            with building(entry):  # ModelBuilder.build names the model after its registration
                return fn(*args, **kwargs)

        entry = Construction(name, builder, task() if isinstance(task, type) else task, theorem, claim, tuple(rows),
                             reason, dict(example or {"n": 8}), next(_COUNTER), all_max_n, None if small is None else dict(small))
        _REGISTRY[name] = entry
        builder.construction_name = name  # type: ignore[attr-defined]
        return builder

    return wrap


def names() -> list[str]:
    """Every registered construction, in the order of the module docstring."""
    _load_builtin()
    return [c.name for c in sorted(_REGISTRY.values(), key=lambda c: c.sort_key)]


def get(name: str) -> Construction:
    _load_builtin()
    if name not in _REGISTRY:
        raise UnknownConstruction(f"construction must be one of {', '.join(names())}, got {name!r}")
    return _REGISTRY[name]


def task_of(model: CompiledModel) -> Task:
    return get(model.construction).task


def _load_builtin() -> None:
    """Import every module of :mod:`exactformer.constructions.theorems` (one module per theorem, each
    registering its constructions), so that a new construction is one new module there; then the
    modules of the entry-point group :data:`ENTRY_POINTS` (a plugin that fails to import is a
    warning naming it, not a registry that cannot be read)."""
    if _LOADED:
        return
    _LOADED.append(True)
    from exactformer.constructions import theorems

    for info in pkgutil.iter_modules(theorems.__path__):
        importlib.import_module(f"{theorems.__name__}.{info.name}")
    for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
        try:
            ep.load()
        except Exception as e:  # a third party's module: report it, keep the registry usable
            warnings.warn(f"entry point {ep.name} = {ep.value} (group {ENTRY_POINTS}) failed to load: "
                          f"{type(e).__name__}: {e}", stacklevel=2)


#: the entry-point group whose modules register constructions (a package's pyproject.toml:
#: ``[project.entry-points."exactformer.constructions"]`` ``mine = "my_package.constructions"``)
ENTRY_POINTS = "exactformer.constructions"


class CodeError(ImportError):
    """A module of constructions or blocks that cannot be imported (the message names it)."""


def import_code(module: str, file: str | None = None) -> ModuleType:
    """Import a module of constructions or blocks: a dotted module name, or the path of a ``.py``
    file (imported under its stem, e.g. ``docs/examples/tutorial/copy_token.py`` as ``copy_token``).
    ``file``: where the module was found when it was saved (tried when ``module`` does not import).
    An error names the module and what failed (:class:`CodeError`)."""
    path = Path(module) if module.endswith(".py") else None
    name = path.stem if path is not None else module
    loaded = sys.modules.get(name)
    where = path or (Path(file) if file else None)
    if loaded is not None and (where is None or Path(getattr(loaded, "__file__", "") or "").resolve() == where.resolve()):
        return loaded
    if path is None:
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as e:  # the module itself (not one it imports) is not on the path: its file
            itself = e.name is not None and (module == e.name or module.startswith(e.name + "."))
            if not itself or where is None or not where.is_file():
                raise CodeError(f"module {module!r} cannot be imported: {e}") from None
        except Exception as e:
            raise CodeError(f"module {module!r} failed to import: {type(e).__name__}: {e}") from None
    if where is None or not where.is_file():
        raise CodeError(f"module {module!r}: no such file {str(where)!r}")
    spec = importlib.util.spec_from_file_location(name, where)
    if spec is None or spec.loader is None:
        raise CodeError(f"module {module!r}: {str(where)!r} is not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        sys.modules.pop(name, None)
        raise CodeError(f"module {name!r} ({where}) failed to import: {type(e).__name__}: {e}") from None
    return mod


_LOADED: list[bool] = []
