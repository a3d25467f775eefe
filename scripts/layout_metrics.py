"""The package's layout in figures: files and lines per room, import cycles and private names imported across
modules (imports inside functions counted, TYPE_CHECKING-only ones too: this is a census, the rules are
tests/test_layering.py).

Usage: ``python scripts/layout_metrics.py [ROOT]`` (ROOT: a checkout, default this one). Prints one line per room,
then the cycles and the private imports, each listed.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``memlab/**/*.py`` under ``root``."""
    out = {}
    for path in sorted((root / "memlab").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def room_of(name: str, root: Path) -> str:
    """``model`` for memlab.model.gpt; ``top-level modules`` for memlab.units and the package itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and (root / "memlab" / parts[1]).is_dir() else "top-level modules"


def graph(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """(module -> memlab modules it imports, [(importer, module, private name)])."""
    edges: dict[str, set[str]] = {}
    private = []
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memlab") and not node.level:
                if node.module in mods:
                    deps.add(node.module)
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in mods:
                        deps.add(f"{node.module}.{alias.name}")
                    elif alias.name.startswith("_") and node.module != name:
                        private.append((name, node.module, alias.name))
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
        edges[name] = deps - {name}
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``edges``, found by the house rules' own finder (``find_cycles`` in
    ``tests/test_layering.py``, Tarjan's strongly connected components), loaded from this checkout so that the census
    and the test cannot disagree."""
    spec = importlib.util.spec_from_file_location("memlab_layering_rules", HERE / "tests" / "test_layering.py")
    rules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rules)
    return [sorted(c) for c in rules.find_cycles(edges)]


def main(root: Path) -> None:
    mods = modules(root)
    rooms: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, path in mods.items():
        rooms[room_of(name, root)][0] += 1
        rooms[room_of(name, root)][1] += len(path.read_text().splitlines())
    for room, (files, lines) in sorted(rooms.items()):
        print(f"{room:20s} {files:3d} files {lines:6d} lines")
    edges, private = graph(mods)
    found = cycles(edges)
    print(f"import cycles (imports inside functions counted): {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    print(f"private names imported across modules: {len(private)}")
    for importer, module, name in private:
        print(f"  {importer} imports {module}.{name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
