"""FLOP counts (PaLM, Megatron/Korthikanti, explicit matmul counting) and MFU/HFU."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.errors import ConfigError, MemlabError, SetupError, UnknownNameError
from memlab.predict.compute import flops as F
from memlab.predict.hardware import gpus as hw
from memlab.predict.spec.model import TransformerConfig, preset


def gpt(h: int, layers: int, heads: int, vocab: int = 51200, seq: int = 2048) -> TransformerConfig:
    """GPT layout of the Megatron papers: d_ff = 4h, multi-head, gelu; biases off (they are not matmuls anyway)."""
    return TransformerConfig(d_model=h, n_layers=layers, n_heads=heads, vocab_size=vocab, max_seq=seq, bias=False)


# -- building blocks ---------------------------------------------------------------------------------------------
def test_matmul_flops_is_two_m_n_k():
    assert F.matmul_flops(3, 5, 7) == 210
    with pytest.raises(SetupError):
        F.matmul_flops(0, 5, 7)


def test_attention_flops_full_and_causal():
    full = F.attention_flops(2, 128, 64)
    assert full == 4 * 2 * 128 * 128 * 64
    assert F.attention_flops(2, 128, 64, causal=True) * 2 == full
    assert F.attention_flops(2, 128, 64, 8) == full  # heads split h, they do not change the work
    with pytest.raises(ConfigError, match="divide"):
        F.attention_flops(2, 128, 64, 7)


def test_palm_540b_on_6144_tpu_v4_is_46_2_percent_mfu():
    # Chowdhery et al. 2022 (PaLM), Appendix B: N = 540.35B, L = 118, H = 48, Q = 256, T = 2048;
    # 238.3K tokens/s on 6144 TPU v4 chips at 275 TFLOP/s bf16 each -> MFU 46.2 % (Table 3).
    fpt = 6 * 540.35e9 + 12 * 118 * 48 * 256 * 2048  # 6N + 12 L H Q T (PaLM Appendix B)
    res = F.mfu(540.35e9, 238.3e3, accelerator=hw.gpu("tpu-v4"), num_devices=6144, dtype="bf16",
                model_flops_per_token=fpt)
    assert round(res.mfu, 3) == 0.462
    assert res.peak_flops_per_s == 6144 * 275e12
    assert res.peak_source.startswith("table: Google Cloud TPU v4")
    # Without the attention term (6N only) the figure would be 45.7 %: the 12LHQT term matters.
    assert round(F.mfu(540.35e9, 238.3e3, accelerator="tpu-v4", num_devices=6144).mfu, 3) == 0.457


# -- explicit counting vs the formulas ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-llama", "gpt2", "llama-2-7b", "llama-3-8b", "gpt-3-175b"])
def test_forward_flops_is_two_n_tokens_plus_attention(name):
    cfg = preset(name)
    b, s = 2, 256
    expected = 2 * cfg.matmul_param_count() * b * s + cfg.n_layers * F.attention_flops(b, s, cfg.d_model)
    assert F.forward_flops(cfg, b, s) == expected
    parts = F.forward_flops_breakdown(cfg, b, s)
    assert parts["head"] == 2 * b * s * cfg.vocab_size * cfg.d_model


def test_gqa_and_swiglu_widths_are_counted():
    mha = TransformerConfig(d_model=64, n_layers=1, n_heads=8, d_ff=128, mlp="swiglu", bias=False)
    gqa = mha.with_(n_kv_heads=2)
    t = 10
    proj_mha = F.forward_flops_breakdown(mha, 1, t)["attention_proj"]
    proj_gqa = F.forward_flops_breakdown(gqa, 1, t)["attention_proj"]
    assert proj_mha - proj_gqa == 2 * (2 * t * 64 * (64 - 16))  # K and V shrink from 64 to 2 * 8 wide
    assert F.forward_flops_breakdown(mha, 1, t)["mlp"] == 3 * 2 * t * 64 * 128  # gate, up, down


@settings(max_examples=60, deadline=None)
@given(h_per_head=st.sampled_from([8, 16, 32]), heads=st.sampled_from([1, 2, 4, 8]), kv_div=st.sampled_from([1, 2, 4]),
       layers=st.integers(1, 6), vocab=st.integers(10, 5000), seq=st.integers(1, 512),
       mlp=st.sampled_from(["gelu", "swiglu"]), tied=st.booleans())
def test_palm_per_token_equals_three_forwards_per_token(h_per_head, heads, kv_div, layers, vocab, seq, mlp, tied):
    kv = max(1, heads // kv_div)
    cfg = TransformerConfig(d_model=h_per_head * heads, n_layers=layers, n_heads=heads, n_kv_heads=kv,
                            vocab_size=vocab, max_seq=max(seq, 8), mlp=mlp, tied_embeddings=tied)
    assert F.flops_per_token(cfg, seq) * seq == 3 * F.forward_flops(cfg, 1, seq)
    assert F.megatron_iteration_flops(cfg, 1, seq, "none") == 3 * F.forward_flops(cfg, 1, seq)
    none, sel, full = (F.megatron_iteration_flops(cfg, 1, seq, r) for r in ("none", "selective", "full"))
    assert none < sel < full


def test_flops_per_token_options():
    cfg = preset("llama-2-7b")
    n = cfg.matmul_param_count()
    assert F.flops_per_token(cfg, 4096, include_attention=False) == 6 * n
    assert F.flops_per_token(cfg, 4096, exclude_embeddings=False, include_attention=False) == 6 * cfg.param_count()
    assert F.flops_per_token(cfg, 4096) - 6 * n == 12 * 32 * 4096 * 4096


# GPT-3-like sizes as in Korthikanti et al. 2022, Table 3 (s = 2048, V = 51200)
GPT3 = gpt(12288, 96, 96)


def test_no_recompute_and_full_recompute_equal_the_megatron_closed_forms():
    b, s = 8, 2048
    for recompute in ("none", "full"):
        counted = F.megatron_iteration_flops(GPT3, b, s, recompute)
        closed = F.megatron_closed_form(b, s, 96, 12288, 51200, recompute)
        # Both count the same matmuls and ignore the same non-matmul work: equal up to float rounding.
        assert counted == pytest.approx(closed, rel=1e-12)


def test_full_recompute_reruns_the_blocks_but_not_the_head():
    b, s = 1, 2048
    parts = F.forward_flops_breakdown(GPT3, b, s)
    extra = F.megatron_iteration_flops(GPT3, b, s, "full") - F.megatron_iteration_flops(GPT3, b, s, "none")
    assert extra == sum(parts.values()) - parts["head"]


def test_selective_recompute_adds_one_attention_core_forward():
    b, s, L, h = 4, 2048, 96, 12288
    extra = F.megatron_iteration_flops(GPT3, b, s, "selective") - F.megatron_iteration_flops(GPT3, b, s, "none")
    assert extra == L * F.attention_flops(b, s, h) == 4 * b * s * s * h * L
    # Korthikanti's printed s/(3h) counts 12 B s^2 h L extra: 8 B s^2 h L more than the recompute executes.
    printed = F.megatron_closed_form(b, s, L, h, 51200, "selective")
    assert printed - F.megatron_iteration_flops(GPT3, b, s, "selective") == pytest.approx(8 * b * s * s * h * L,
                                                                                         rel=1e-9)


@pytest.mark.parametrize(("h", "L", "paper_mfu", "paper_hfu"), [(6144, 48, 41.5, 43.7), (12288, 96, 51.4, 52.8)])
def test_korthikanti_table5_hfu_over_mfu_follows_their_printed_equation(h, L, paper_mfu, paper_hfu):
    ratio = F.megatron_closed_form(1, 2048, L, h, 51200, "selective") / F.megatron_closed_form(1, 2048, L, h, 51200)
    assert ratio == pytest.approx(paper_hfu / paper_mfu, abs=2e-3)


# Korthikanti et al. 2022, Tables 3 and 5 ("present work": sequence parallel + selective recompute), A100 at
# 312 TFLOP/s bf16, s = 2048, V = 51200: iteration time -> model FLOPs utilisation. The paper prints step
# times to 0.01 s and MFU to 0.1 %, so the check allows exactly that rounding (for 22B, 1.10 s spans 0.4146-0.4184).
@pytest.mark.parametrize(("h", "L", "heads", "gpus", "step_s", "paper_mfu"), [
    (6144, 48, 64, 8, 1.10, 0.415),
    (12288, 96, 96, 64, 13.75, 0.514),
    (20480, 105, 128, 280, 37.83, 0.560),
    (25600, 128, 160, 512, 71.49, 0.563),
])
def test_korthikanti_table5_mfu_is_reproduced(h, L, heads, gpus, step_s, paper_mfu):
    batch = {8: 4, 64: 64, 280: 280, 512: 512}[gpus]
    tps = F.step_time_to_tokens_per_second(step_s, batch, 2048)
    res = F.mfu(gpt(h, L, heads), tps, accelerator="a100-80gb-sxm", num_devices=gpus, seq=2048,
                recompute="selective")
    lo = res.mfu * step_s / (step_s + 0.005) - 0.0005
    hi = res.mfu * step_s / (step_s - 0.005) + 0.0005
    assert lo <= paper_mfu <= hi
    assert res.hfu > res.mfu


def test_korthikanti_gpt3_mfu_rounds_to_the_paper():
    tps = F.step_time_to_tokens_per_second(13.75, 64, 2048)
    res = F.mfu(GPT3, tps, accelerator="a100-80gb-sxm", num_devices=64, seq=2048, recompute="selective")
    assert round(res.mfu, 3) == 0.514


# -- mfu() --------------------------------------------------------------------------------------------------------
def test_mfu_with_unknown_accelerator_is_unknown_with_a_reason():
    res = F.mfu(preset("gpt2"), 10_000, accelerator=None, seq=1024)
    assert res.mfu is None and res.hfu is None and not res.known
    assert res.reason.startswith("unknown peak")
    assert res.peak_flops_per_s is None and res.achieved_flops_per_s > 0
    assert json.dumps(res.to_dict())


def test_mfu_with_a_dtype_the_device_lacks_is_unknown():
    res = F.mfu(preset("gpt2"), 10_000, accelerator="v100-sxm2-32gb", seq=1024, dtype="bf16")
    assert res.mfu is None and "bf16" in res.reason and "V100" in res.reason


def test_mfu_with_a_device_info_of_an_unknown_gpu_keeps_its_reason():
    info = hw.DeviceInfo("cuda", "NVIDIA Future GPU", None, 10**11, {}, "unknown",
                         "GPU 'NVIDIA Future GPU' is not in memlab's table", "2.13.0", "12.8", None, 16)
    res = F.mfu(preset("gpt2"), 10_000, accelerator=info, seq=1024)
    assert res.mfu is None and "not in memlab's table" in res.reason


def test_mfu_with_a_measured_cpu_peak():
    info = hw.DeviceInfo("cpu", "Some CPU", None, 10**10, {"fp32": 1e11}, "measured: fake", None,
                         "2.13.0", None, None, 2)
    cfg = preset("tiny-gpt")
    res = F.mfu(cfg, 1000, accelerator=info, seq=128, dtype="fp32")
    assert res.mfu == pytest.approx(1000 * F.flops_per_token(cfg, 128) / 1e11)
    assert res.peak_source == "measured: fake"


def test_mfu_hfu_and_recompute():
    cfg, s = preset("llama-2-7b"), 4096
    base = F.mfu(cfg, 3000, accelerator="h100-sxm", num_devices=8, seq=s)
    assert base.hfu == base.mfu
    sel = F.mfu(cfg, 3000, accelerator="h100-sxm", num_devices=8, seq=s, recompute="selective")
    full = F.mfu(cfg, 3000, accelerator="h100-sxm", num_devices=8, seq=s, recompute="full")
    assert sel.mfu == full.mfu == base.mfu  # model FLOPs do not change with recomputation
    assert base.hfu < sel.hfu < full.hfu
    assert base.mfu == pytest.approx(3000 * F.flops_per_token(cfg, s) / (8 * 989.5e12))


def test_mfu_with_a_bare_parameter_count_uses_6n():
    res = F.mfu(1_000_000_000, 1000, accelerator="a100-80gb-sxm")
    assert res.model_flops_per_token == 6e9 and "attention FLOPs excluded" in res.formula
    assert F.mfu(1e9, 1000, accelerator="a100-80gb-sxm", recompute="full").hfu == pytest.approx(res.mfu * 8 / 6)
    assert F.mfu(1e9, 1000, accelerator="a100-80gb-sxm", recompute="selective").hfu is None


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"tokens_per_second": 0}, SetupError, "tokens_per_second"),
    ({"tokens_per_second": float("nan")}, SetupError, "tokens_per_second"),
    ({"num_devices": 0}, SetupError, "num_devices"),
    ({"dtype": "fp64"}, UnknownNameError, "dtype"),
    ({"recompute": "some"}, SetupError, "recompute"),
    ({"seq": None}, SetupError, "seq is required"),
    ({"model": "gpt2"}, ConfigError, "TransformerConfig"),
    ({"model": -5}, ConfigError, "parameter count"),
    ({"accelerator": "a100"}, UnknownNameError, "ambiguous"),
    ({"accelerator": 3.0}, SetupError, "accelerator"),
])
def test_mfu_rejects_bad_input_with_one_clear_error(kwargs, error, match):
    args = {"model": preset("gpt2"), "tokens_per_second": 1000.0, "accelerator": "h100-sxm", "seq": 1024, **kwargs}
    model, tps = args.pop("model"), args.pop("tokens_per_second")
    with pytest.raises(error, match=match) as err:
        F.mfu(model, tps, **args)
    assert isinstance(err.value, MemlabError)


def test_step_time_to_tokens_per_second():
    assert F.step_time_to_tokens_per_second(0.5, 8, 1024, num_devices=4) == 8 * 1024 * 4 / 0.5
    with pytest.raises(SetupError, match="step_time_s"):
        F.step_time_to_tokens_per_second(0, 8, 1024)


def test_every_shipped_full_config_counts_the_same_flops_both_ways() -> None:
    """6N + attention (PaLM) equals 3 x the counted forward per token for every published config, including the
    ones whose heads are wider or narrower than d_model (Gemma, Qwen3-MoE: n_heads * head_dim != d_model)."""
    pytest.importorskip("transformers")
    from memlab.course.hf_configs import config_names, load_config
    from memlab.predict.families.reader import from_hf

    for name in config_names("full"):
        config = from_hf(load_config(name, "full"))
        assert F.flops_per_token(config, 512) == 3 * F.forward_flops(config, 1, 512) / 512, name


def test_decode_flops_is_the_counted_forward_of_one_token_plus_attention_over_the_cache() -> None:
    """One token against one cached token is the forward of a one-token sequence, matmul for matmul; each further
    cached token adds QK^T and AV of one query per layer (4 x n_heads*head_dim FLOPs)."""
    pytest.importorskip("transformers")
    from memlab.course.hf_configs import config_names, load_config
    from memlab.predict.families.reader import from_hf

    configs = [from_hf(load_config(n, "full")) for n in config_names("full")] + [preset("tiny-gpt")]
    for i, config in enumerate(configs):
        batch, context = 1 + i % 3, 1 + 97 * i
        assert F.decode_flops(config, batch, 1) == F.forward_flops(config, batch, 1), config.name
        assert F.decode_flops(config, batch, context) - F.decode_flops(config, batch, 1) == \
            config.n_layers * 4 * batch * (context - 1) * config.q_dim
    with pytest.raises(ConfigError):
        F.decode_flops("llama", 1, 1)
