"""Suite-wide settings for the tests."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> Iterator[None]:
    """Run torch single-threaded in the test process, then restore.

    The tests train tiny models, which gain nothing from intra-op threads; on a shared 2-core CI machine spinning
    threads slow them down several times. Notebooks run in their own kernels and keep the default. Without torch
    installed (the torch-free suite, ``-m "not torch"``) there is nothing to set.
    """
    try:
        import torch
    except ImportError:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


MODULE_GROUPS = ("tests/course/test_report.py", "tests/run/distributed/test_distributed.py",
                 "tests/run/distributed/test_dist_runner.py", "tests/studies/test_parallel_ranks.py",
                 "tests/compare/test_ledger.py")
"""Modules whose tests share a session- or module-scoped fixture (the course built once, torchrun ranks launched
once): under ``pytest -n 2 --dist loadgroup`` (``make test``) each runs on one worker, so the fixture runs once."""


def module_scope(nodeid: str) -> str:
    """The xdist work unit of a test: its module for a MODULE_GROUPS module, the test itself otherwise."""
    path = nodeid.split("::", 1)[0]
    return path if path in MODULE_GROUPS else nodeid


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pragma: no cover - without xdist the suite runs in one process and needs no groups
    pass
else:
    class ModuleGroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with :func:`module_scope` as the scope: the biggest units (the course's module)
        are handed out first (xdist's ``loadscopereorder``), every other test on its own.

        Not ``xdist_group`` marks: pytest 9.2 keeps a node id in ``Node._id``, and xdist 3.8 tags a marked item by
        assigning ``item._nodeid``, which pytest no longer reads; the marks then pin nothing and each worker builds
        the course at ci scale again (measured: the build ran twice, 531 s and 502 s, in one make test)."""

        def _split_scope(self, nodeid: str) -> str:
            return module_scope(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling | None:
        """Under ``--dist loadgroup`` (``make test``), :class:`ModuleGroupScheduling`; other modes as xdist has them."""
        if config.getvalue("dist") != "loadgroup":
            return None
        return ModuleGroupScheduling(config, log)  # type: ignore[arg-type]


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A stable test id for values whose repr carries a memory address (``<object object at 0x7f...>``): xdist's
    workers must collect the same ids, and an address differs from process to process."""
    text = repr(val)
    return f"{type(val).__name__}-object" if " at 0x" in text else None


TORCH_LIBRARIES = frozenset({"torch", "peft", "bitsandbytes", "accelerate", "deepspeed"})
"""Libraries that do not import without torch: importing one needs torch as much as ``import torch`` does."""


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports, at the top or inside functions alike (a deferred import runs when the test calls
    it), but not under ``if TYPE_CHECKING:``; ``from a import b`` gives ``a`` and ``a.b`` (b may be a module), and a
    name ``memlab`` re-exports lazily gives the module that defines it."""
    found: set[str] = set()
    for node in _statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(_lazy_exports().get(a.name, f"{node.module}.{a.name}") if node.module == "memlab"
                         else f"{node.module}.{a.name}" for a in node.names)
    return found


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement in ``body`` and in the blocks nested in it (functions, classes, if/try/with/for/match), but
    not the body of an ``if TYPE_CHECKING:``; expressions are not walked (an import is a statement)."""
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _statements(node.orelse)
            continue
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, block, ()):
                yield from _statements(child.body if isinstance(child, (ast.excepthandler, ast.match_case))
                                       else [child])


@cache
def _lazy_exports() -> dict[str, str]:
    """``memlab``'s lazily re-exported names (its ``_EXPORTS``), each to the module that defines it, read from the
    source so that working this out imports nothing."""
    tree = ast.parse((ROOT / "memlab" / "__init__.py").read_text())
    (table,) = [n.value for n in tree.body if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "_EXPORTS"]
    return {name: module for module, names in ast.literal_eval(table).items() for name in names}


@cache
def _memlab_torch_modules() -> frozenset[str]:
    """The memlab modules that import torch when imported or called into: those that import torch (or a library
    built on it) themselves, and those that import one of them, or sit in a package that does, at any depth."""
    modules = {}
    for path in sorted((ROOT / "memlab").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    imported = {name: _imports(path) for name, path in modules.items()}
    heavy = {name for name, names in imported.items() if any(n.split(".")[0] in TORCH_LIBRARIES for n in names)}
    packages = {name: {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)} for name in modules}
    uses = {name: {n for n in names if n in modules} | packages[name] for name, names in imported.items()}
    while grown := {name for name, used in uses.items() if name not in heavy and used & heavy}:
        heavy |= grown
    return frozenset(heavy)


@cache
def module_needs_torch(path: Path) -> bool:
    """Whether a test module needs torch: it imports torch (or peft, bitsandbytes, ...), or a memlab module that does,
    directly or through the modules it imports (:func:`_memlab_torch_modules`)."""
    return any(n.split(".")[0] in TORCH_LIBRARIES or n in _memlab_torch_modules() for n in _imports(path))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of a module that needs torch (:func:`module_needs_torch`) ``torch``, before ``-m`` selects:
    ``pytest -m "not torch"`` is the torch-free suite. A test that needs torch without importing it (a notebook
    kernel, a module imported by name, ``pytest.importorskip("torch")``) says so itself: ``@pytest.mark.torch``, or
    ``pytestmark = pytest.mark.torch`` for its whole module."""
    for item in items:
        if module_needs_torch(Path(item.path)):
            item.add_marker(pytest.mark.torch)


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """Without torch installed, a module that needs it is not even imported (its import would fail before ``-m``
    could deselect it), so ``pytest -m "not torch"`` runs there as it does here."""
    if (collection_path.suffix == ".py" and collection_path.name.startswith("test_")
            and importlib.util.find_spec("torch") is None and module_needs_torch(collection_path)):
        return True
    return None
