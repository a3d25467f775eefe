"""The reference GPT's MoE MLP (names, resident bytes, counted FLOPs of the active experts) and measured int8."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from memlab.labs.inference import expert_load, int8_linear_bytes
from memlab.measure.accounting import model_states
from memlab.model.gpt import GPT
from memlab.predict.compute import flops
from memlab.predict.memory.sharding import shape_summary
from memlab.predict.spec.model import preset
from memlab.run.runner import count_flops


def test_moe_gpt_matches_the_config_and_keeps_every_expert_resident() -> None:
    cfg = preset("tiny-moe")
    model = GPT(cfg)
    assert sorted((n, tuple(p.shape)) for n, p in model.named_parameters()) == sorted(
        (n, s) for n, s, _ in cfg.param_shapes())
    assert model_states(model).params_bytes == 4 * cfg.param_count() > 4 * cfg.active_param_count()


def test_counted_flops_follow_the_active_experts() -> None:
    cfg = preset("tiny-moe")
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    assert count_flops(lambda: model(idx)) == flops.forward_flops(cfg, 2, 32)
    load = expert_load(model, idx)
    assert load.shape == (cfg.n_layers, cfg.n_experts) and int(load.sum()) == cfg.n_layers * 64 * cfg.top_k


def test_int8_dynamic_quantisation_packs_the_predicted_bytes() -> None:
    cfg = preset("tiny-gpt")
    q = int8_linear_bytes(GPT(cfg))
    assert q["int8_weight_bytes"] == shape_summary(cfg).quantizable_elements
    assert q["quantized_layers"] == 6 * cfg.n_layers


def test_int4_cpu_kernels_pack_half_a_byte_per_weight_and_multiply_correctly() -> None:
    from memlab.labs.inference import int4_linear_bytes

    cfg = preset("tiny-gpt")
    q = int4_linear_bytes(GPT(cfg), group_size=128)
    assert q["elements"] == shape_summary(cfg).quantizable_elements
    assert q["packed_bytes"] == q["elements"] // 2  # two 4-bit weights per byte, no padding at these shapes
    assert q["scale_zero_bytes"] == sum(4 * n * k // g for n, k, g in q["layers"])  # bf16 scale + zero per group
    assert all(k % g == 0 and g <= 128 for _, k, g in q["layers"])
    assert 0 < q["max_rel_error"] < 0.25  # 4-bit error of random weights: present, bounded


def _occupancy_by_loop(prompt, output, policy: str) -> float:
    from memlab.predict.paging import reserved_tokens

    present = reserved = 0
    for p, o in zip(prompt, output, strict=True):
        for t in range(1, o + 1):
            present += p + t
            if policy == "paged":
                reserved += int(reserved_tokens(np.array([p + t]), "paged", max_len=2048, block_tokens=16)[0])
            else:
                reserved += int(reserved_tokens(np.array([p + o]), policy, max_len=2048, block_tokens=16)[0])
    return present / reserved


@pytest.mark.parametrize("seed", range(5))
def test_serving_occupancy_matches_a_step_by_step_replay(seed: int) -> None:
    from memlab.labs.inference import serving_occupancy

    rng = np.random.default_rng(seed)
    prompt, output = rng.integers(0, 300, 12), rng.integers(1, 200, 12)
    shares = {p: serving_occupancy(prompt, output, p) for p in ("max", "pow2", "oracle", "paged")}
    for policy, share in shares.items():
        assert share == pytest.approx(_occupancy_by_loop(prompt, output, policy), rel=1e-12)
    assert shares["max"] <= shares["pow2"] <= shares["oracle"] < 1  # the oracle's slot fills only at the end
    assert shares["paged"] > shares["oracle"]


def test_experts_idle_share_matches_sampled_top_k_routing() -> None:
    from memlab.labs.inference import experts_idle_share

    gen = torch.Generator().manual_seed(0)
    for n, k, tokens in ((8, 2, 1), (8, 2, 4), (16, 4, 3)):
        picks = torch.rand(20000, tokens, n, generator=gen).argsort(-1)[..., :k]  # uniform k distinct experts
        idle = (torch.nn.functional.one_hot(picks, n).sum((1, 2)) == 0).float().mean()
        assert float(idle) == pytest.approx(experts_idle_share(n, k, tokens), abs=0.01)
