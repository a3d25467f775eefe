"""A real 2-rank gloo run on CPU (torchrun): memlab's accounting reports each rank's LOCAL shard under FSDP2
(DTensor parameters, gradients and optimizer states) and ZeRO-1 (ZeroRedundancyOptimizer's partition).

Expected sizes come from the sharding rules, computed here from the config's parameter shapes:

- FSDP2 (``torch.distributed.fsdp.fully_shard``) shards every parameter on dim 0 as ``torch.chunk`` does: rank r
  holds rows [r*c, (r+1)*c) with c = ceil(d0 / world). Parameter and gradient storage is padded to c rows on
  every rank; optimizer states are created like the unpadded local shard.
- ZeRO-1 (``ZeroRedundancyOptimizer``) gives whole parameters to ranks: largest first, each to the rank with the
  fewest elements so far (torch/distributed/optim/zero_redundancy_optimizer.py, ``_partition_parameters``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch.distributed as dist

from memlab.predict.spec.model import TransformerConfig, preset
from memlab.run.distributed.launch import run_script

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "scripts" / "dist_states.py"
WORLD = 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                       reason="this torch build has no torch.distributed gloo backend"),
]


CONFIG = preset("tiny-gpt").with_(vocab_size=511, max_seq=33)
"""The script's model (it reports its config; the first test checks they agree): dim 0 of the embedding (511)
and of the position table (33) does not divide by 2, so FSDP2 pads."""


def _shapes() -> list[tuple[int, ...]]:
    return [shape for _, shape, _ in CONFIG.param_shapes()]  # tied head: the embedding once


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("dist")
    run_script(SCRIPT, [out], WORLD, timeout_s=180)  # memlab's launcher: killed on timeout, the log on failure
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_every_rank_reported(ranks: list[dict]) -> None:
    assert [r["rank"] for r in ranks] == list(range(WORLD))
    assert all(r["world_size"] == WORLD and r["fsdp_params_are_dtensors"] for r in ranks)
    assert all(TransformerConfig(**r["config"]) == CONFIG for r in ranks)


def test_fsdp2_params_and_grads_are_the_padded_local_shards(ranks: list[dict]) -> None:
    shapes = _shapes()
    full = 4 * sum(math.prod(s) for s in shapes)
    padded = 4 * sum(math.ceil(s[0] / WORLD) * math.prod(s[1:]) for s in shapes)
    assert any(s[0] % WORLD for s in shapes)  # the config really needs padding
    for r in ranks:
        st = r["fsdp"]
        assert st["params_bytes"] == padded and st["grads_bytes"] == padded
        assert 0.5 <= st["params_bytes"] / full < 0.51


def test_fsdp2_optimizer_states_follow_the_unpadded_local_rows(ranks: list[dict]) -> None:
    shapes = _shapes()
    for r in ranks:
        rows = 0
        for s in shapes:
            c = math.ceil(s[0] / WORLD)
            local = max(0, min(c, s[0] - r["rank"] * c))  # torch.chunk: the last rank may hold fewer rows
            rows += local * math.prod(s[1:])
        by_key = r["fsdp"]["optimizer_by_key"]
        assert by_key == {"step": 4 * len(shapes), "exp_avg": 4 * rows, "exp_avg_sq": 4 * rows}
    full = 4 * sum(math.prod(s) for s in shapes)
    assert sum(r["fsdp"]["optimizer_by_key"]["exp_avg"] for r in ranks) == full  # shards tile the whole


def test_zero1_keeps_full_params_and_grads_and_a_partition_of_the_states(ranks: list[dict]) -> None:
    numels = sorted((math.prod(s) for s in _shapes()), reverse=True)
    sizes, counts = [0] * WORLD, [0] * WORLD
    for n in numels:
        k = sizes.index(min(sizes))
        sizes[k] += n
        counts[k] += 1
    full = 4 * sum(numels)
    for r in ranks:
        st = r["zero1"]
        assert st["params_bytes"] == full and st["grads_bytes"] == full  # stage 1 shards only the states
        k = r["rank"]
        assert st["optimizer_by_key"] == {"step": 4 * counts[k], "exp_avg": 4 * sizes[k], "exp_avg_sq": 4 * sizes[k]}
        assert 0.45 < st["optimizer_bytes"] / (2 * full) < 0.55


def test_fsdp1_counts_its_flat_parameter_shard(ranks: list[dict]) -> None:
    total = sum(math.prod(s) for s in _shapes())
    local = math.ceil(total / WORLD)  # FSDP1 pads the flat parameter to a multiple of the world size
    for r in ranks:
        st = r["fsdp1"]
        assert st["flat_numel"] == [local]
        assert st["params_bytes"] == 4 * local and st["grads_bytes"] == 4 * local
        assert st["optimizer_by_key"] == {"step": 4, "exp_avg": 4 * local, "exp_avg_sq": 4 * local}
