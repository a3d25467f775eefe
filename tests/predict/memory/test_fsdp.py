"""FSDP2's moments per phase (memlab.predict.memory.fsdp) against memlab's trace and the torchtitan peer, on small
generated models at 2 and 8 ranks (issue 36: the peer's small-model FSDP2 moments)."""

from __future__ import annotations

import pytest

from memlab.predict.estimate import estimate
from memlab.predict.memory.fsdp import fsdp_plan, moments
from memlab.predict.spec.setup import Setup
from memlab.studies.titan import TITAN_SMALL
from memlab.tracing.gpt import trace_gpt
from memlab.tracing.peer import titan_setup

SMALL = TITAN_SMALL


def _steady(rows: tuple, phase: str) -> int:
    return int(next(r.held_bytes for r in rows if r.step == "steady" and r.phase == phase))


@pytest.mark.parametrize(("ranks", "recompute"), [(2, "full"), (8, "full"), (2, "none"), (8, "none")])
def test_titan_plan_phases_hold_the_trace(ranks: int, recompute: str) -> None:
    """The forward is exact under full recompute (the last block's copy-out beside the previous unit's all-gather
    buffer); the backward's peak within 0.5 % of the trace (issue 36 asks 1 %: it was -2.0 % at 8 ranks without
    recompute, before the bottom block's down projection gradient was FSDP2's unsharded one, in the gathered dtype,
    and kept at block k's moment too), and inside the printed range."""
    s = titan_setup(Setup(batch=1, seq=32, attention="flash", recompute=recompute, world_size=ranks,
                          optimizer_impl="fused"))
    bd, t = estimate(SMALL, s, device_type="cpu"), trace_gpt(SMALL, s, device_type="cpu")
    if recompute == "full":
        assert _steady(bd.phases, "forward") == _steady(t.phases, "forward")
    assert abs(_steady(bd.phases, "backward") - _steady(t.phases, "backward")) <= 0.005 * t.peak_bytes
    assert abs(bd.peak_bytes - t.peak_bytes) <= 0.005 * t.peak_bytes
    assert bd.peak_range.low <= t.peak_bytes <= bd.peak_range.high, (bd.peak_range, t.peak_bytes)


def test_mid_backward_moment_prefetches_a_block_not_the_embedding() -> None:
    """ZeRO-3 under the torchtitan plan: block k >= 1 prefetches block k - 1's all-gather buffer (the bottom block
    the embedding's, smaller): the difference is the moment's constant; not modelled under ZeRO-2."""
    z3 = fsdp_plan(SMALL, 8, 3, "torchtitan", "outside", 2, 4)
    m = moments(z3)
    block, embed = z3.of_kind("block")[0], z3.of_kind("embed")[0]
    assert m["mid"] == z3.buffer(block) - z3.buffer(embed)
    assert m["mid_blocks"] == SMALL.n_layers - 2
    assert m["copy_out"] == z3.full(z3.units[-2]) + 2 * z3.buffer(block)
    z2 = moments(fsdp_plan(SMALL, 8, 2, "torchtitan", "outside", 2, 4))
    assert z2["mid"] == 0 and z2["mid_blocks"] == 0
