"""The newer families' published configs (memlab/predict/families/configs/full) have the parameter counts their papers
and model cards publish, at the precision they publish them; each names its source. With transformers installed, the
count equals the HF model's, built on the meta device (no memory, nothing downloaded)."""

from __future__ import annotations

import pytest

from memlab.course.hf_configs import config_source, load_config
from memlab.predict.families.reader import from_hf

# name -> (what is compared, the published value, digits it is published to) [SOURCES.md keys in the comments]
PUBLISHED = {
    "qwen3-8b": [("total", 8.2e9, 1), ("non-embedding", 6.95e9, 2)],  # qwen3-2025: model card
    "phi-3-mini-4k": [("total", 3.8e9, 1)],  # abdin2024
    "starcoder2-3b": [("total", 3e9, 0)],  # lozhkov2024
    "olmo-2-7b": [("total", 7e9, 0)],  # olmo2-2024
    "stablelm-2-1.6b": [("total", 1.6e9, 1)],  # stablelm2-2024
    "gemma-2-9b": [("non-embedding", 8_324_201_984, None)],  # gemma2-2024 Table 2, exact
    "gemma-3-1b": [("embedding", 302e6, -6), ("non-embedding", 698e6, -6)],  # gemma3-2025 Table 1, millions
    "gpt-j-6b": [("total", 6e9, 0)],  # wang2021
    "falcon-40b": [("total", 40e9, -1)],  # almazrouei2023: "40B", to the nearest 10B
    "mixtral-8x7b": [("total", 46.7e9, 1), ("active", 12.9e9, 1)],  # mistral-mixtral-2023; jiang2024: 47B, 13B
    "qwen3-30b-a3b": [("total", 30.5e9, 1), ("non-embedding", 29.9e9, 1)],  # qwen3-2025: Qwen3-30B-A3B card
    "qwen1.5-moe-a2.7b": [("total", 14.3e9, 1), ("active", 2.7e9, 1)],  # qwen-moe-2024: model card
}


def _counts(name: str) -> dict[str, int]:
    config = from_hf(load_config(name, "full"))
    total = config.param_count()
    embedding = config.vocab_size * config.d_model
    head = 0 if config.tied_embeddings else embedding
    return {"total": total, "embedding": embedding, "non-embedding": total - embedding - head,
            "active": config.active_param_count()}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_full_configs_have_the_published_parameter_counts(name: str) -> None:
    counts = _counts(name)
    assert "config.json" in config_source(name)
    for what, value, digits in PUBLISHED[name]:
        if digits is None:
            assert counts[what] == value
        else:
            scale = 1e9 if digits >= 0 or value >= 1e10 else 1.0
            assert round(counts[what] / scale, digits) == round(value / scale, digits), (what, counts[what])


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_full_configs_count_what_transformers_builds(name: str) -> None:
    pytest.importorskip("transformers")
    import torch
    import transformers

    from memlab.model.hf import hf_config

    cfg = hf_config(load_config(name, "full"))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert from_hf(cfg.to_dict()).param_count() == n == from_hf(load_config(name, "full")).param_count()


def _flat(d: dict, prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in d.items():
        if isinstance(v, dict) and v and k not in ("id2label", "label2id"):
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append(prefix + k)
    return out


def test_every_key_of_the_new_families_is_accounted_for() -> None:
    """Each key of AutoConfig.for_model(model_type).to_dict() is in exactly one of modelled, neutral, refused."""
    pytest.importorskip("transformers")
    import transformers

    from memlab.predict.families.registry import ACCOUNTS, FAMILIES

    assert set(ACCOUNTS) == set(FAMILIES)
    for family, account in ACCOUNTS.items():
        keys = set(_flat(transformers.AutoConfig.for_model(family).to_dict()))
        lists = [set(account.modelled), set(account.neutral), set(account.refused)]
        assert not (lists[0] & lists[1] or lists[0] & lists[2] or lists[1] & lists[2]), family
        assert {k for k in keys if account.kind(k) is None} == set(), family


def test_deepseek_v3_is_refused_in_one_line_naming_the_trace() -> None:
    """Multi-head latent attention (q/kv LoRA ranks, split rope/nope heads) and grouped routing are not modelled:
    from_hf refuses and names the trace, which runs transformers' own code."""
    from memlab.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        from_hf({"model_type": "deepseek_v3", "hidden_size": 7168, "kv_lora_rank": 512, "q_lora_rank": 1536})
    assert "deepseek_v3" in str(err.value) and "memlab trace --hf" in str(err.value) and "\n" not in str(err.value)
