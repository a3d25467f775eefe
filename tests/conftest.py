"""Suite-wide settings for the tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> Iterator[None]:
    """Run torch single-threaded in the test process, then restore.

    The tests train tiny models, which gain nothing from intra-op threads; on a shared 2-core CI machine spinning
    threads slow them down several times. Notebooks run in their own kernels and keep the default.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


MODULE_GROUPS = ("tests/course/test_report.py", "tests/run/distributed/test_distributed.py",
                 "tests/run/distributed/test_dist_runner.py", "tests/run/test_parallel_ranks.py",
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
