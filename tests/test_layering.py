"""The house rules of the layout (DESIGN.md), enforced: the math imports no torch, each room imports only what its
"may import" column names (imports inside functions count), no import cycles, no function over 60 lines (but the
few listed, each with why), and each room's docstring names what it holds."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "memlab"
MAX_FUNCTION_LINES = 60


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under an ``if TYPE_CHECKING:`` block (anywhere): annotations only, never run."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    return skip


def _imports(path: Path) -> dict[str, list[int]]:
    """memlab modules that ``path`` imports, with the lines: at the top, inside functions and ``try`` blocks alike
    (a deferred import is still a dependency); only ``if TYPE_CHECKING:`` imports do not count. ``from memlab.x
    import y`` counts memlab.x, and memlab.x.y too when that is a module."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            if name in MODULES:
                found.setdefault(name, []).append(node.lineno)
    return found


GRAPH = {name: set(_imports(path)) - {name} for name, path in MODULES.items()}


LIGHT = sorted(
    [m for m in MODULES if m.startswith("memlab.predict")]
    + ["memlab", "memlab.errors", "memlab.units", "memlab.device", "memlab.compare.ledger", "memlab.course.exercises"]
)


def test_the_math_and_the_checks_import_without_torch() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {LIGHT!r}:\n"
        "    importlib.import_module(name)\n"
        "    heavy = [m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules]\n"
        "    assert not heavy, f'{name} imports {heavy}'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def _room(module: str) -> str:
    """The room of a module: ``predict`` for memlab.predict.*, ``device`` for memlab.device, ``memlab`` for the
    package itself (run/distributed is part of ``run``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "memlab"


ROOMS = sorted({_room(m) for m in MODULES})
_ALL = set(ROOMS) - {"memlab", "__main__"}

MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "units": set(),
    "predict": {"errors", "units"},
    "device": {"predict", "errors", "units"},  # DTYPE_BYTES from predict.spec.precision; torch lazily
    "model": {"predict", "device", "errors", "units"},
    "measure": {"predict", "device", "errors", "units"},
    "tracing": {"model", "predict", "device", "errors", "units"},
    "run": {"model", "measure", "predict", "device", "errors", "units"},
    "compare": {"predict", "tracing", "run", "measure", "device", "errors", "units"},
    "studies": {"compare", "model", "predict", "tracing", "run", "measure", "device", "errors", "units"},
    "labs": _ALL - {"labs", "course", "cli"},  # studies included: everything below labs
    "course": _ALL - {"course", "cli"},
    "cli": _ALL - {"cli"},
    "memlab": _ALL,  # the package re-exports names from the rooms (lazily, by name)
    "__main__": {"cli"},
}
"""DESIGN.md's "may import" column, room by room (the room itself is always allowed). Nothing below ``labs``
imports ``labs``; nothing below ``course`` imports ``course`` or ``cli``. ``studies`` (the campaigns that run
models, traces and steps) sits above ``compare`` (the machinery that compares their results): compare never
imports a study."""

ROOM_ALLOWANCES: dict[tuple[str, str], str] = {}
"""(module, imported module) pairs that break :data:`MAY_IMPORT` today, each with why; the list can only shrink
(an allowance nothing needs any more fails the test: delete it)."""


def test_the_room_table_names_every_room() -> None:
    assert set(MAY_IMPORT) == set(ROOMS), f"rooms without a row: {set(ROOMS) - set(MAY_IMPORT)}"


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_imports_only_what_its_row_allows(room: str) -> None:
    allowed = MAY_IMPORT[room] | {room}
    offenders = [
        f"{name}:{line} imports {imported}"
        for name, path in MODULES.items() if _room(name) == room
        for imported, lines in sorted(_imports(path).items())
        if _room(imported) not in allowed and (name, imported) not in ROOM_ALLOWANCES
        for line in lines
    ]
    assert not offenders, f"{room} may import {sorted(MAY_IMPORT[room])} only:\n" + "\n".join(offenders)


def test_every_room_allowance_is_still_needed() -> None:
    stale = [pair for pair in ROOM_ALLOWANCES if pair[1] not in GRAPH.get(pair[0], set())]
    assert not stale, f"these imports are gone: delete their ROOM_ALLOWANCES entries {stale}"


PREDICT_FLOORS: tuple[tuple[str, ...], ...] = (
    ("spec",), ("families",), ("hardware",), ("compute",), ("memory",), ("gpu",), ("parallel",), ("coverage",),
    ("estimate",), ("fit", "paging"),
)
"""predict's sub-rooms, bottom-up: what a run is, the families, hardware, compute, the single-rank memory model, what
the device adds (the caching allocator replayed), the parallelisms whose ranks differ, the coverage table, the
estimate, and what answers questions with it. A sub-room imports only its own floor's and those below."""


def _predict_floor(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "predict":
        return None
    return next(i for i, floor in enumerate(PREDICT_FLOORS) if parts[2] in floor)


def test_predict_sub_rooms_import_only_their_floor_and_below() -> None:
    named = {name for floor in PREDICT_FLOORS for name in floor}
    unplaced = sorted({m.split(".")[2] for m in MODULES if m.startswith("memlab.predict.")} - named)
    assert not unplaced, f"predict sub-rooms without a floor in PREDICT_FLOORS: {unplaced}"
    upward = [f"{name} imports {imported}" for name in MODULES if (floor := _predict_floor(name)) is not None
              for imported in sorted(GRAPH[name]) if (other := _predict_floor(imported)) is not None and other > floor]
    assert not upward, "predict sub-rooms import upwards:\n" + "\n".join(upward)


KNOWN_CYCLES: set[frozenset[str]] = set()
"""Import cycles that exist today and are being removed (none: keep it that way); the test fails on a new one."""


def find_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): every import cycle lies in one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while (top := stack.pop()) != node:
                component.add(top)
            if component:
                found.append({*component, node})

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_import_cycles_among_memlab_modules() -> None:
    # importing memlab.a.b runs memlab.a's __init__ first: that is not a dependency of memlab.a.b on memlab.a's
    # other modules, so packages' own __init__ edges are kept but parents are not added implicitly.
    cycles = find_cycles(GRAPH)
    new = [sorted(c) for c in cycles if frozenset(c) not in KNOWN_CYCLES]
    assert not new, "import cycles (function-level imports count): " + "; ".join(" <-> ".join(c) for c in new)
    gone = [sorted(c) for c in KNOWN_CYCLES if set(c) not in cycles]
    assert not gone, f"these cycles are gone: delete them from KNOWN_CYCLES {gone}"


def test_the_import_check_sees_imports_inside_functions_but_not_type_checking_ones(tmp_path: Path) -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    path = tmp_path / "probe.py"
    path.write_text(
        "def f():\n    from memlab.units import GiB\n"
        "if TYPE_CHECKING:\n    from memlab.errors import MemlabError\n"
    )
    assert _imports(path) == {"memlab.units": [2]}


def _function_lengths(path: Path) -> dict[str, int]:
    """``qualified name -> lines`` of each function in ``path``: its body from the first statement after the
    docstring to its last line (a docstring is documentation, not length)."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = child.body
                docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str) and len(body) > 1
                start = body[1].lineno if docstring else body[0].lineno
                lengths[name] = child.end_lineno - start + 1
            visit(child, f"{name}." if name != prefix else prefix)

    visit(ast.parse(path.read_text()), "")
    return lengths


LONG_FUNCTIONS: dict[str, str] = {
    "memlab.tracing.hf.trace_hf": "one Hugging Face trace, set-up to verdict: each step reads the one before",
    "memlab.predict.memory.finetune.finetune_rows": "LoRA's and QLoRA's rows, each a sourced one-liner",
    "memlab.course.report.build": "the book build in its order: cache, execute, render, check",
    "memlab.predict.spec.model.TransformerConfig.param_shapes": "every parameter's shape, in registration order",
    "memlab.run.runner._train": "the measured loop: allocator, meters and steps in the order they must run",
    "memlab.predict.memory.activations.term_rows": "a block's saved tensors, in the order autograd saves them",
    "memlab.predict.memory.activations._core_terms": "attention's rows, one trait each",
    "memlab.predict.parallel.experts.expert_estimate": "an expert-parallel rank's terms, each sourced in turn",
    "memlab.predict.parallel.pipeline.parallel_estimate": "a pipeline rank's terms, stage by stage, each sourced",
}
"""Functions allowed over :data:`MAX_FUNCTION_LINES`, each with why it reads better whole; the list can only shrink
(an entry that is short now fails the test: delete it)."""


def test_no_function_over_the_limit_but_the_listed() -> None:
    lengths = {f"{name}.{fn}": n for name, path in MODULES.items() for fn, n in _function_lengths(path).items()}
    long = {fn: n for fn, n in lengths.items() if n > MAX_FUNCTION_LINES and fn not in LONG_FUNCTIONS}
    assert not long, f"split these (or list them in LONG_FUNCTIONS with why): {long}"
    short = [fn for fn in LONG_FUNCTIONS if lengths.get(fn, 0) <= MAX_FUNCTION_LINES]
    assert not short, f"these are short now (or gone): delete their LONG_FUNCTIONS entries {short}"


PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


@pytest.mark.parametrize("package", PACKAGES, ids=[_module_name(p / "__init__.py") for p in PACKAGES])
def test_every_room_has_a_docstring_that_names_what_it_holds(package: Path) -> None:
    """Each package's docstring says what it holds and names each of its modules and subpackages (``runner``,
    :mod:`memlab.run.runner`, ``predict/`` or ``device.py``), so the docstring follows the folder."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    assert doc and len(doc) > 40, f"{package.relative_to(ROOT)}/__init__.py needs a docstring naming what it holds"
    held = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__" and not p.stem.startswith("_"))
    held += sorted(p.name for p in package.iterdir() if (p / "__init__.py").exists())
    unnamed = [m for m in held if not re.search(rf"\b{re.escape(m)}(``|`|/|\.py\b)", doc)]
    assert not unnamed, f"{package.relative_to(ROOT)}/__init__.py's docstring does not name {unnamed}"


@pytest.mark.torch  # resolves every lazily exported name, the torch ones too
def test_every_public_name_of_memlab_resolves() -> None:
    import memlab

    missing = [name for name in memlab.__all__ if not hasattr(memlab, name)]
    assert not missing, f"memlab exports names its modules do not define: {missing}"
