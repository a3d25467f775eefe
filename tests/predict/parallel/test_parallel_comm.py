"""Tensor-, pipeline- and context-parallel bytes sent per rank (memlab.predict.parallel.communication), against the
collectives enumerated one by one, on generated shapes."""

from __future__ import annotations

import random

import pytest

from memlab.errors import SetupError
from memlab.predict.parallel.communication import cp_sent_bytes, pp_sent_bytes, ring_wire_bytes, tp_sent_bytes

RNG = random.Random(5)
SHAPES = [(RNG.randint(1, 9000), RNG.choice([64, 768, 4096, 8192]), RNG.randint(1, 96), RNG.choice([1, 2, 4, 8]),
           RNG.choice([2, 4])) for _ in range(20)]


@pytest.mark.parametrize(("tokens", "h", "layers", "tp", "width"), SHAPES)
def test_tp_is_four_ring_all_reduces_per_block(tokens: int, h: int, layers: int, tp: int, width: int) -> None:
    # each ring all-reduce: N - 1 reduce-scatter steps and N - 1 all-gather steps, one 1/N chunk sent per step
    per_all_reduce = 2 * (tp - 1) * (tokens * h * width / tp)
    assert tp_sent_bytes(tokens, h, layers, tp, width) == pytest.approx(4 * layers * per_all_reduce)
    assert tp_sent_bytes(tokens, h, layers, 1, width) == 0


@pytest.mark.parametrize("pp", [2, 3, 5, 8])
@pytest.mark.parametrize("m", [1, 4, 7])
def test_pp_crosses_every_boundary_twice_per_micro_batch(pp: int, m: int) -> None:
    boundary = RNG.randint(1, 10**9)
    sent = [pp_sent_bytes(boundary, m, pp, r) for r in range(pp)]
    assert sum(sent) == 2 * (pp - 1) * m * boundary  # forward and backward over each of the pp - 1 boundaries
    assert sent[0] == sent[-1] == m * boundary
    assert max(sent) == (2 if pp > 2 else 1) * m * boundary


def test_cp_ring_passes_cp_minus_one_chunks_three_times() -> None:
    assert cp_sent_bytes(1000, 4, 1) == 0
    assert cp_sent_bytes(1000, 4, 8) == 4 * 3 * 7 * 1000
    assert ring_wire_bytes(8, 8) == 7  # the ring's (N - 1)/N: the same factor, per chunk


@pytest.mark.parametrize("call", [lambda: tp_sent_bytes(0, 8, 1, 2), lambda: tp_sent_bytes(8, 8, 1, True),
                                  lambda: pp_sent_bytes(8, 2, 1, 0), lambda: pp_sent_bytes(8, 2, 4, 4),
                                  lambda: pp_sent_bytes(8, 0, 4, 1), lambda: cp_sent_bytes(8, 2, 0)])
def test_bad_input_is_one_setup_error(call) -> None:
    with pytest.raises(SetupError):
        call()


@pytest.mark.parametrize("seed", range(4))
def test_tp_all_reduce_buffers_are_the_wire_bytes_before_the_ring(seed: int) -> None:
    """Megatron's four all-reduces a block (column_modules=2), as buffers, give tp_sent_bytes once each all-reduce's
    2x volume and the ring's (t-1)/t are applied; every further column-parallel module adds one buffer a block."""
    from memlab.predict.parallel.communication import tp_allreduce_buffer_bytes

    rng = random.Random(seed)
    t, h, n, tp, vb = rng.randint(1, 9000), rng.randint(1, 8192), rng.randint(1, 96), rng.randint(1, 64), rng.choice(
        (1, 2, 4))
    fused = tp_allreduce_buffer_bytes(t, h, n, vb)
    assert ring_wire_bytes(2 * fused, tp) == pytest.approx(tp_sent_bytes(t, h, n, tp, vb))
    assert tp_allreduce_buffer_bytes(t, h, n, vb, column_modules=5) - fused == 3 * n * t * h * vb
    with pytest.raises(SetupError):
        tp_allreduce_buffer_bytes(t, h, n, vb, column_modules=0)


def test_comm_floor_sends_one_gpus_slice_across_nodes_and_matches_nccl_tests() -> None:
    from memlab.predict.parallel.communication import comm_time_floor_s

    size = 8 * 2**30  # nccl-tests all_reduce_perf, 2 nodes x 8 H100, 25 GB/s NIC per GPU: 47.5 ms measured
    floor = comm_time_floor_s(2 * size, gpus_per_node=8, nodes=2, nic_bytes_per_s=25e9)
    assert floor["across nodes"] == pytest.approx(2 * size * 0.5 / 8 / 25e9)
    assert floor["floor"] < 47.5e-3 < comm_time_floor_s(2 * size, gpus_per_node=1, nodes=16,
                                                         nic_bytes_per_s=25e9)["floor"]
    inside = comm_time_floor_s(100.0, gpus_per_node=8, nodes=1, nic_bytes_per_s=1.0, nvlink_bytes_per_s=7.0)
    assert inside == {"inside the node": 100 * 7 / 8 / 7.0, "across nodes": 0.0, "floor": 100 * 7 / 8 / 7.0}
    with pytest.raises(SetupError):
        comm_time_floor_s(1.0, gpus_per_node=0, nodes=1, nic_bytes_per_s=1.0)
