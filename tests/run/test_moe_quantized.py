"""The reference GPT's MoE MLP (names, resident bytes, counted FLOPs of the active experts) and measured int8."""

from __future__ import annotations

import torch

from memlab.labs.inference import expert_load, int8_linear_bytes
from memlab.measure.accounting import model_states
from memlab.model.gpt import GPT
from memlab.predict import flops
from memlab.predict.models import preset
from memlab.predict.sharding import shape_summary
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
