"""Sphinx roles in memlab's docstrings point at names that exist: ``:func:`memlab.tracing.gpt.trace_gpt``` must
import and resolve, so a module that moves takes its references with it.

A dotted ``memlab.`` target is imported (its longest importable module prefix) and the rest walked with getattr; a
short target resolves in the enclosing classes, then the globals of the module the docstring is in, then builtins,
then as an importable module (``:mod:`platform```, ``:func:`os.replace```). ``~`` and ``!`` prefixes and the
``title <target>`` form are read as Sphinx reads them.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.torch  # imports every memlab module by name, the torch ones too

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "memlab"
ROLE = re.compile(r":(func|class|meth|data|mod|attr|exc|obj|const):`([^`]+)`")
_MISSING = object()


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(text: str) -> str:
    """The object a role's text names: ``title <x.y>`` -> ``x.y``; ``~`` / ``!`` / ``.`` prefixes stripped."""
    if (m := re.search(r"<([^>]+)>\s*$", text)) is not None:
        text = m.group(1)
    return text.strip().lstrip("~!.").removesuffix("()")


def _walk(obj: Any, attrs: list[str]) -> Any:
    """``obj.a.b...``; a last name that is an instance attribute of a class (a dataclass field without a default,
    or ``self.<name> = ...`` in its methods) counts as found, as Sphinx's autodoc documents those."""
    for i, attr in enumerate(attrs):
        found = getattr(obj, attr, _MISSING)
        if found is _MISSING and i == len(attrs) - 1 and isinstance(obj, type):
            return attr if _instance_attribute(obj, attr) else _MISSING
        if found is _MISSING:
            return _MISSING
        obj = found
    return obj


def _instance_attribute(cls: type, attr: str) -> bool:
    if any(isinstance(a := vars(k).get("__annotations__"), dict) and attr in a for k in cls.__mro__):
        return True
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return re.search(rf"\bself\.{re.escape(attr)}\s*(:[^=]+)?=[^=]", source) is not None


def _import_walk(dotted: str) -> Any:
    """``dotted`` as the longest importable module prefix plus getattr on the rest; _MISSING if it does not exist.
    A module that exists but fails to import raises (that is a bug to see, not a missing name)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        candidate = ".".join(parts[:cut])
        try:
            module = importlib.import_module(candidate)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (candidate == exc.name or candidate.startswith(f"{exc.name}.")):
                raise
            continue
        return _walk(module, parts[cut:])
    return _MISSING


def resolves(target: str, module: str, classes: tuple[str, ...] = ()) -> bool:
    """Whether the role target ``target`` written in ``module`` (inside the classes ``classes``, outermost first)
    names an object that exists."""
    name = _target(target)
    if name.startswith("memlab.") or name == "memlab":
        return _import_walk(name) is not _MISSING
    mod = importlib.import_module(module)
    parts = name.split(".")
    scopes = [_walk(mod, list(classes[:i])) for i in range(len(classes), 0, -1)] + [mod, builtins]
    for scope in scopes:
        if scope is not _MISSING and _walk(scope, parts) is not _MISSING:
            return True
    return _import_walk(name) is not _MISSING


def _texts(source: str) -> Iterator[tuple[str, tuple[str, ...], int]]:
    """Every string statement in ``source`` (docstrings, attribute docstrings) with its enclosing classes and line."""

    def visit(node: ast.AST, classes: tuple[str, ...]) -> Iterator[tuple[str, tuple[str, ...], int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant) and isinstance(
                child.value.value, str
            ):
                yield child.value.value, classes, child.lineno
            yield from visit(child, (*classes, child.name) if isinstance(child, ast.ClassDef) else classes)

    yield from visit(ast.parse(source), ())


def broken_references(source: str, module: str) -> list[str]:
    """``line :role:`target``` for every role in the docstrings of ``source`` (the text of ``module``) whose target
    does not resolve."""
    return [
        f"{line} :{role}:`{target}`"
        for text, classes, line in _texts(source)
        for role, target in ROLE.findall(text)
        if not resolves(target, module, classes)
    ]


MODULE_FILES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULE_FILES, ids=[_module_name(p) for p in MODULE_FILES])
def test_every_docstring_reference_resolves(path: Path) -> None:
    broken = broken_references(path.read_text(), _module_name(path))
    where = path.relative_to(ROOT)
    assert not broken, "docstring references to names that do not exist:\n" + "\n".join(f"{where}:{b}" for b in broken)


def test_the_checker_flags_a_moved_name_and_passes_a_real_one() -> None:
    source = (
        '"""Moved: :func:`memlab.run.trace.trace_gpt`; here: :func:`memlab.tracing.gpt.trace_gpt`."""\n'
        "class Trace:\n"
        '    """Short names: :func:`trace`, :meth:`components`, :class:`~memlab.predict.spec.setup.Setup`,\n'
        '    :func:`os.replace`, :exc:`ValueError`, :func:`the title <memlab.tracing.tracer.trace>`;\n'
        '    gone: :func:`tracer`."""\n'
    )
    assert broken_references(source, "memlab.tracing.tracer") == [
        "1 :func:`memlab.run.trace.trace_gpt`", "3 :func:`tracer`",
    ]
