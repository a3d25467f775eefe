"""Pipeline and tensor parallelism on 2 real gloo ranks (torchrun, CPU; memlab.studies.parallel_ranks), against
memlab.predict.parallel.pipeline and memlab.predict.estimate: each pipeline rank's bytes after the step are the
prediction's exactly and its peak lies within the named bound; each tensor-parallel rank's local parameters and
gradients are the
estimate's tp=2 shards plus the traced plan's replicated embedding, exactly."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from memlab.predict.parallel.pipeline import parallel_estimate
from memlab.predict.spec.model import preset
from memlab.studies.parallel_ranks import SCHEDULES, measure_parallel_ranks, parallel_ranks_ledger, pp_setup

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
    """The ledger's exact rows (held after the step and bytes sent per pipeline rank; tensor-parallel parameters,
    gradients and all-reduce buffers) match exactly."""
    df = parallel_ranks_ledger(ranks)
    exact = df[df["quantity"] != "peak"]
    assert len(exact) == WORLD * (2 * len(SCHEDULES) + 3)
    assert (exact["predicted"] == exact["measured"]).all()


def test_ranks_count_what_torch_sends(ranks: list[dict]) -> None:
    """Every pipeline rank sends one boundary tensor per micro-batch (first rank forward, last rank backward) plus
    the int32 vote, and receives as much; every tensor-parallel rank all-reduces 2 + 4 (q, k, v, up) buffers of
    (b s, h) fp32 a block in tiny-gpt's GELU blocks."""
    config = preset("tiny-gpt")
    setup = pp_setup("1f1b", WORLD)
    boundary = setup.batch * setup.seq * config.d_model * 4
    for got in ranks:
        for schedule in SCHEDULES:
            comm = got[f"pp_{schedule}"]["comm"]
            assert comm["calls"] == {"send": setup.micro_batches + 1, "recv": setup.micro_batches + 1}
            assert comm["bytes"]["send"] == setup.micro_batches * boundary + 4 == comm["bytes"]["recv"]
        assert got["tp"]["comm"]["calls"] == {"all_reduce": 6 * config.n_layers}
