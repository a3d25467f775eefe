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


MODULE_GROUPS = ("tests/course/test_report.py", "tests/run/test_distributed.py", "tests/run/test_dist_runner.py",
                 "tests/run/test_parallel_ranks.py",
                 "tests/compare/test_ledger.py")
"""Modules whose tests share a session- or module-scoped fixture (the course built once, torchrun ranks launched
once): under ``pytest -n 2 --dist loadgroup`` (``make test``) each runs on one worker, so the fixture runs once."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Pin each MODULE_GROUPS module's tests to one xdist worker (a no-op without xdist)."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path in MODULE_GROUPS:
            item.add_marker(pytest.mark.xdist_group(path))


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A stable test id for values whose repr carries a memory address (``<object object at 0x7f...>``): xdist's
    workers must collect the same ids, and an address differs from process to process."""
    text = repr(val)
    return f"{type(val).__name__}-object" if " at 0x" in text else None
