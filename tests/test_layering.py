"""The house rules of the layout (DESIGN.md), enforced: the math imports no torch, measurement and running never
import the course, no import cycles, no module over 500 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "memlab"
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, *, top_level_only: bool) -> set[str]:
    """memlab modules that ``path`` imports (``from memlab.x import y`` counts memlab.x.y when that is a module)."""
    tree = ast.parse(path.read_text())
    nodes: list[ast.AST] = []
    if top_level_only:
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            nodes.append(node)
        nodes = [n for n in nodes if isinstance(n, ast.Import | ast.ImportFrom)]
    else:
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("memlab"))
        elif node.module and node.module.startswith("memlab") and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
    return {m for m in found if m in MODULES}


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


@pytest.mark.parametrize("room", ["memlab.measure", "memlab.run", "memlab.predict"])
def test_lower_rooms_never_import_the_course_or_the_cli(room: str) -> None:
    offenders = {
        name: sorted(m for m in _imports(path, top_level_only=False) if m.startswith(("memlab.course", "memlab.cli")))
        for name, path in MODULES.items() if name.startswith(room)
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_predict_never_imports_run_or_measure() -> None:
    offenders = {
        name: sorted(m for m in _imports(path, top_level_only=False) if m.startswith(("memlab.run", "memlab.measure")))
        for name, path in MODULES.items() if name.startswith("memlab.predict")
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_no_import_cycles_among_memlab_modules() -> None:
    graph = {name: _imports(path, top_level_only=True) - {name} for name, path in MODULES.items()}
    # importing memlab.a.b runs memlab.a's __init__ first: that is not a dependency of memlab.a.b on memlab.a's
    # other modules, so packages' own __init__ edges are kept but parents are not added implicitly.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_no_module_over_500_lines() -> None:
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by concept: {long}"


def test_every_room_has_a_docstring_that_says_what_it_holds() -> None:
    for room in ("predict", "run", "measure", "compare", "course", "cli"):
        doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"memlab/{room}/__init__.py needs a docstring naming what the room holds"


def test_every_public_name_of_memlab_resolves() -> None:
    import memlab

    missing = [name for name in memlab.__all__ if not hasattr(memlab, name)]
    assert not missing, f"memlab exports names its modules do not define: {missing}"
