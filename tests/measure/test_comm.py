"""memlab.measure.comm: which dispatcher ops are communication, and what one rank's counter records (a real
one-rank gloo group: c10d calls run, nothing leaves the process)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from memlab.measure.comm import CommCounter, op_kind


@pytest.mark.parametrize(("name", "kind"), [
    ("c10d.send.default", "send"), ("c10d.recv_.default", "recv"), ("c10d.allreduce_.default", "all_reduce"),
    ("_c10d_functional.all_reduce.default", "all_reduce"),
    ("_c10d_functional.reduce_scatter_tensor.default", "reduce_scatter"),
    ("c10d._reduce_scatter_base_.default", "reduce_scatter"),
    ("_c10d_functional.all_gather_into_tensor.default", "all_gather"), ("c10d.allgather_.default", "all_gather"),
    ("_c10d_functional.all_to_all_single.default", "all_to_all"), ("c10d.broadcast_.default", "broadcast"),
    ("c10d.reduce_.default", "reduce"),
    ("_c10d_functional.wait_tensor.default", None), ("c10d.barrier.default", None), ("aten.mm.default", None),
    ("aten.all.default", None),
])
def test_op_kind_names_every_data_moving_call_and_nothing_else(name: str, kind: str | None) -> None:
    assert op_kind(name) == kind


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")
def test_counter_records_calls_and_buffer_bytes_on_a_one_rank_group(tmp_path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with CommCounter() as comm:
            dist.all_reduce(torch.ones(3, 5))            # 60 B
            dist.all_reduce(torch.ones(7, dtype=torch.float64))  # 56 B
            dist.broadcast(torch.ones(2, dtype=torch.int32), 0)
            torch.ones(4) @ torch.ones(4)                # computation: not counted
        got = comm.totals()
    finally:
        dist.destroy_process_group()
    assert got.calls == {"all_reduce": 2, "broadcast": 1}
    assert got.bytes == {"all_reduce": 116, "broadcast": 8}
