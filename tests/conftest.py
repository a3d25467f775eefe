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
