"""Pipeline and tensor parallelism on 2 real gloo ranks (torchrun, CPU; memlab.compare.parallel_ranks), against
memlab.predict.parallel and memlab.predict.estimate: each pipeline rank's bytes after the step are the prediction's
exactly and its peak lies within the named bound; each tensor-parallel rank's local parameters and gradients are the
estimate's tp=2 shards plus the traced plan's replicated embedding, exactly."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from memlab.compare.parallel_ranks import SCHEDULES, measure_parallel_ranks, parallel_ranks_ledger, pp_setup
from memlab.predict.models import preset
from memlab.predict.parallel import parallel_estimate

WORLD = 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                       reason="this torch build has no torch.distributed gloo backend"),
]


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return measure_parallel_ranks("tiny-gpt", WORLD)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_ranks_end_exactly_and_peak_within_the_bound(ranks: list[dict], schedule: str) -> None:
    rows = parallel_estimate(preset("tiny-gpt"), pp_setup(schedule, WORLD), device_type="cpu").rows
    assert [r["rank"] for r in ranks] == list(range(WORLD))
    for got in ranks:
        row, measured = rows[got["rank"]], got[f"pp_{schedule}"]
        assert measured["end_bytes"] == row.end_bytes
        assert 0 <= row.peak_bytes - measured["peak_bytes"] <= row.states_bytes // 2 + row.transient_bytes


def test_ledger_is_exact_where_it_says_so(ranks: list[dict]) -> None:
    """The ledger's exact rows (held after the step; tensor-parallel parameters and gradients) match exactly."""
    df = parallel_ranks_ledger(ranks)
    exact = df[df["quantity"] != "peak"]
    assert len(exact) == WORLD * (len(SCHEDULES) + 2)
    assert (exact["predicted"] == exact["measured"]).all()
