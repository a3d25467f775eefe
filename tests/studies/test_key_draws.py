"""Every config key of every family, flipped alone and drawn jointly (memlab.studies.key_draws): memlab's parameter
count and the estimate's states equal the real model's, or the config is refused; never off (issue 36, States)."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from memlab.course.hf_configs import config_names, load_config
from memlab.errors import ConfigError, MemlabError
from memlab.predict.families.reader import SUPPORTED, from_hf
from memlab.predict.families.registry import account
from memlab.studies.key_draws import (
    count_verdict,
    drawn_value,
    family_keys,
    flipped_booleans,
    key_draws,
    real_param_count,
    verdict_counts,
)

TINY = {name: load_config(name) for name in config_names("tiny")}
BY_TYPE = {str(c["model_type"]): {k: v for k, v in c.items() if not k.startswith("_")} for c in TINY.values()}


@pytest.mark.parametrize("family", sorted(SUPPORTED))
def test_every_boolean_key_flipped_counts_as_the_real_model_or_is_refused(family: str) -> None:
    flips = flipped_booleans(family, BY_TYPE[family])
    assert flips, family  # every family has boolean keys (tie_word_embeddings at least)
    verdicts = [count_verdict(cfg, {key: cfg[key]}) for key, cfg in flips]
    bad = [f"{v.label()}: {v.verdict} {v.reason}" for v in verdicts if v.verdict not in ("exact", "refused")]
    assert not bad, bad
    assert any(v.verdict == "exact" for v in verdicts)


def test_a_seeded_joint_sample_of_every_family_counts_as_the_real_model() -> None:
    verdicts = key_draws(TINY, 6, seed=36)  # several keys changed at once; the bench runs hundreds per family
    counts = verdict_counts(verdicts)
    assert counts["off"] == 0, [f"{v.label()}: {v.reason}" for v in verdicts if v.verdict == "off"]
    assert counts["exact"] >= len(verdicts) // 5, counts  # the sample reaches the accepted space
    assert all("\n" not in v.reason for v in verdicts if v.verdict == "refused")


@pytest.mark.parametrize(("family", "change"), [
    ("opt", {"enable_bias": False}),  # the linears lose their biases, the LayerNorms keep theirs
    ("starcoder2", {"use_bias": False}),  # the same: nn.LayerNorm(hidden_size, eps) has a bias
    ("gptj", {"hidden_size": 96}),  # attribute_map spellings: given, they replace n_embd ...
    ("gptj", {"n_embd": 32, "hidden_size": 96, "num_hidden_layers": 3, "n_layer": 1}),  # ... whatever the order
    ("gpt2", {"hidden_size": 96, "n_embd": 32, "max_position_embeddings": 64}),
    ("qwen3_moe", {"num_local_experts": 2}),  # Qwen3MoeConfig: the field is num_experts, the alias wins
    ("mixtral", {"num_experts": 2}),  # MixtralConfig: the field is num_local_experts, the alias wins
])
def test_the_keys_issue_36_found_count_as_the_real_model(family: str, change: dict) -> None:
    cfg = {**BY_TYPE[family], **change}
    assert from_hf(cfg).param_count() == real_param_count(cfg)
    assert count_verdict(cfg, change).verdict == "exact"


def test_falcon_two_norms_without_the_new_architecture_is_refused() -> None:
    # FalconDecoderLayer builds ln_attn and ln_mlp but its forward calls input_layernorm (AttributeError)
    with pytest.raises(ConfigError, match="num_ln_in_parallel_attn=2 without new_decoder_architecture"):
        from_hf({**BY_TYPE["falcon"], "new_decoder_architecture": False, "num_ln_in_parallel_attn": 2})


def test_gemma_reads_hidden_act_as_transformers_does() -> None:
    gemma = BY_TYPE["gemma"]
    assert from_hf({**gemma, "hidden_act": "relu"}).impl.activation == "relu"
    assert from_hf({**gemma, "hidden_act": "gelu"}) == from_hf(gemma)  # GemmaConfig: gelu -> gelu_pytorch_tanh
    assert from_hf({**gemma, "hidden_activation": "relu"}) == from_hf(gemma)  # not a field of GemmaConfig in 5.x


INERT = {
    ("falcon", "multi_query"): "read only without new_decoder_architecture (the tiny falcon has it)",
    ("gemma2", "attn_logit_softcapping"): "its presence is modelled; the cap's value changes no tensor",
    **{(f, k): "a window applies only with use_sliding_window, a sliding layer and a window below max_seq"
       for f in ("qwen2_moe", "qwen3", "qwen3_moe") for k in ("layer_types", "sliding_window", "use_sliding_window")},
}
"""Modelled keys that no value changes alone on the tiny config, each with why (their effect needs another key)."""


@pytest.mark.parametrize("family", sorted(SUPPORTED))
def test_a_modelled_key_is_read(family: str) -> None:
    """A key the account calls modelled changes what from_hf gives (or is refused) for some drawn value: a
    modelled key the builder never reads is a claim the estimate does not keep (GPT-J's hidden_size, Gemma's
    hidden_act were such)."""
    base = BY_TYPE[family]
    values, aliases = family_keys(family, base)
    ref, rng = from_hf(base), random.Random(f"read {family}")
    inert = []
    for key in sorted(account(family).modelled):
        if "." in key or key == "model_type" or (family, key) in INERT:
            continue
        now = values.get(key, values.get(aliases.get(key, "")))
        moved = False
        for _ in range(8):
            try:
                moved = moved or from_hf({**base, key: drawn_value(rng, key, now, 2)}) != ref
            except MemlabError:
                moved = True
        if not moved:
            inert.append(key)
    assert not inert, inert
