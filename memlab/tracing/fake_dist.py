"""Sharded training traced in ONE process: FSDP2 over a fake process group, as torchtitan's memory estimator does.

:func:`fake_process_group` initialises ``torch.distributed`` with the ``fake`` backend
(``torch.testing._internal.distributed.fake_pg.FakeStore``: collectives return at once, nothing is sent) for
``world_size`` ranks, this process being rank 0, and yields a 1-D device mesh; it tears the group down after.
:func:`memlab.model.fsdp.shard_model` (the one FSDP2 plan the gloo ranks run too) shards the model over that mesh, so
a trace (:mod:`memlab.tracing.tracer`) sees rank 0's bytes: its parameter, gradient and optimizer-state shards, and the
full parameters of the units FSDP holds gathered at each moment. ZeRO-3 is ``reshard_after_forward=True``
(FULL_SHARD), ZeRO-2 ``False`` (SHARD_GRAD_OP: gathered parameters stay from forward to backward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn

from memlab.errors import SetupError


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[Any]:
    """A fake ``world_size``-rank process group (this process is ``rank``, 0 by default) and its 1-D CPU device mesh,
    for one process."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise SetupError("a torch.distributed process group is already initialised: trace sharded setups in a "
                         "process without one (the fake group would replace it)")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))  # made outside any fake mode: it reads its rank values
    finally:
        dist.destroy_process_group()


def shard_blocks(model: nn.Module, mesh: Any, zero_stage: int) -> nn.Module:
    """``fully_shard`` every block and the root over ``mesh`` (:func:`memlab.model.fsdp.shard_model`'s ``blocks``
    plan); ``zero_stage`` 3 reshards after forward, 2 does not."""
    from memlab.model.fsdp import shard_model

    return shard_model(model, zero_stage=zero_stage, mesh=mesh)
