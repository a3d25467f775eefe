"""Pipeline and tensor parallelism on 2 real gloo ranks (torchrun, CPU; tests/scripts/dist_parallel.py), against
memlab.predict.parallel and memlab.predict.estimate: each pipeline rank's bytes after the step are the prediction's
exactly and its peak lies within the named bound; each tensor-parallel rank's local parameters and gradients are the
estimate's tp=2 shards plus the traced plan's replicated embedding, exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from memlab.predict.estimate import estimate
from memlab.predict.models import preset
from memlab.predict.parallel import parallel_estimate
from memlab.predict.setup import Setup
from memlab.run.distributed.launch import run_script
from memlab.tracing.tensor_parallel import replicated_terms

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "dist_parallel.py"
WORLD = 2
CONFIG = preset("tiny-gpt")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                       reason="this torch build has no torch.distributed gloo backend"),
]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("dist-parallel")
    run_script(SCRIPT, [out], WORLD, timeout_s=240)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_ranks_end_exactly_and_peak_within_the_bound(ranks: list[dict], schedule: str) -> None:
    setup = Setup(batch=2, seq=64, pp=WORLD, micro_batches=3, pp_schedule=schedule, optimizer="sgd")
    rows = parallel_estimate(CONFIG, setup, device_type="cpu").rows
    for got in ranks:
        row, measured = rows[got["rank"]], got[f"pp_{schedule}"]
        assert measured["end_bytes"] == row.end_bytes
        assert 0 <= row.peak_bytes - measured["peak_bytes"] <= row.states_bytes // 2 + row.transient_bytes


def test_tensor_parallel_ranks_hold_the_estimated_shards(ranks: list[dict]) -> None:
    setup = Setup(batch=2, seq=64, tp=WORLD)
    bd = estimate(CONFIG, setup, device_type="cpu")
    extra = replicated_terms(CONFIG, setup)["replicated embedding/head parameters"]
    for got in ranks:
        assert got["tp"]["params_bytes"] == bd.params_bytes + extra
        assert got["tp"]["grads_bytes"] == bd.grads_bytes + extra
