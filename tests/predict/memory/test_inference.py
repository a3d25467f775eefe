"""Inference as generate() runs it: the prefill's kept logits, the dynamic and static caches, the serving search and
vLLM's KV budget, the formula against the reference GPT's trace of the same setup.

The formula claims exactness under a fused attention kernel (every phase, both caches, any kept positions): checked
byte for byte on generated shapes. Under eager attention it claims a lower bound (the softmax, mask and copies are
not counted): checked as one.
"""

from __future__ import annotations

import pytest

from memlab.errors import SetupError
from memlab.predict.estimate import estimate
from memlab.predict.families.resolver import resolve
from memlab.predict.fit import max_batch, serving_table
from memlab.predict.memory.inference import kv_cache_bytes, prefill_transient_bytes, prompt_tokens
from memlab.predict.paging import VLLM_BLOCK_SIZE, VLLM_GPU_MEMORY_UTILIZATION, vllm_kv_blocks
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import GENERATE_LOGITS_TO_KEEP, Setup
from memlab.studies.inference_draws import compare_inference, draw_inference
from memlab.tracing.gpt import trace_gpt


def _phases(cfg: TransformerConfig, setup: Setup) -> tuple[dict[str, int], dict[str, int]]:
    out = compare_inference(cfg, setup)
    return out["predicted"], out["traced"]


@pytest.mark.parametrize("seed", range(16))
def test_prefill_and_decode_equal_the_trace_under_a_fused_kernel(seed: int) -> None:
    cfg, setup = draw_inference(seed, "flash")
    predicted, traced = _phases(cfg, setup)
    assert predicted == traced, (cfg, setup)


@pytest.mark.parametrize("seed", range(6))
def test_eager_prefill_and_decode_are_a_lower_bound_of_the_trace(seed: int) -> None:
    cfg, setup = draw_inference(100 + seed, "eager")
    predicted, traced = _phases(cfg, setup)
    assert all(predicted[p] <= traced[p] for p in traced), (cfg, setup, predicted, traced)


def test_generate_keeps_the_last_positions_logits_by_default() -> None:
    assert Setup(mode="inference").logits_to_keep == GENERATE_LOGITS_TO_KEEP == 1
    assert Setup().logits_to_keep == 0  # a training forward keeps every position
    assert Setup(mode="inference", logits_to_keep=0).logits_to_keep == 0  # a plain forward, asked for
    assert Setup().with_(mode="inference").logits_to_keep == 1  # the mode's default follows the mode
    assert Setup(mode="inference").with_(mode="train").logits_to_keep == 0
    assert Setup(mode="inference", logits_to_keep=4, seq=8).with_(mode="train").logits_to_keep == 4  # a choice stays
    with pytest.raises(SetupError, match="exceeds seq"):
        Setup(mode="inference", seq=4, logits_to_keep=5)
    cfg = preset("llama-3-8b")
    one, every = (estimate(cfg, Setup(mode="inference", seq=4096, attention="flash", logits_to_keep=k))
                  for k in (1, 0))
    p = prompt_tokens(4096)
    assert one.activation_detail["logits"] == (p * cfg.d_model + cfg.vocab_size) * 2  # the final norm + one row
    assert every.activation_detail["logits"] == (p * cfg.d_model + p * cfg.vocab_size) * 2
    # keeping every position makes the head llama-3's largest moment; one position leaves it to a block's MLP
    assert every.activations_bytes == every.activation_detail["logits"]
    assert one.activations_bytes == one.activation_detail["mlp"]
    assert every.peak_bytes - one.peak_bytes == every.activations_bytes - one.activations_bytes


def test_dynamic_cache_grows_in_the_phases_and_the_static_one_is_held_from_the_start() -> None:
    cfg = preset("llama-3-8b")
    dyn = estimate(cfg, Setup(mode="inference", batch=4, seq=8192, attention="flash"))
    static = estimate(cfg, Setup(mode="inference", batch=4, seq=8192, attention="flash", kv_cache="static"))
    kv = kv_cache_bytes(cfg, 4, 8192, "bf16")
    assert dyn.kv_cache_bytes == static.kv_cache_bytes == kv
    layer_token = kv // (4 * 8192 * cfg.n_layers)  # one token's K and V in one layer
    # prefill: the dynamic cache holds the prompt's seq - 1 tokens, the static one all seq
    assert static.phase_bytes("prefill") - dyn.phase_bytes("prefill") == kv - kv_cache_bytes(cfg, 4, 8191, "bf16")
    # decode: torch.cat keeps a layer's old values (seq - 1 tokens) beside the new ones for a moment
    # (the static decode's largest moment is the head: the final norm's output and one row of logits a sequence)
    moment = (3 * cfg.d_model + cfg.q_dim + 2 * cfg.kv_dim) * 4 * 2  # the token's streams, q, k and v at the cat
    head = (4 * cfg.d_model + 4 * cfg.vocab_size) * 2
    assert dyn.phase_bytes("decode") - static.phase_bytes("decode") == 4 * 8191 * layer_token // 2 + moment - head


def test_serving_table_gives_the_largest_batch_per_context() -> None:
    cfg, setup = resolve("qwen3-8b"), Setup(mode="inference", attention="flash")  # its published config
    rows = serving_table(cfg, setup, "rtx-4090", [1024, 8192, 32768])
    assert [r["context"] for r in rows] == [1024, 8192, 32768]
    batches = [r["max_batch"] for r in rows]
    # an 8B serves batches at 1k and 8k on 24 GB; at 32k its tensors fit but device-used (reserve bound, CUDA
    # context, workspaces) does not: 0, with the margin named
    assert batches == sorted(batches, reverse=True) and batches[0] >= 1
    for r in rows:
        assert r["max_batch"] == max_batch(cfg, setup.with_(seq=r["context"]), "rtx-4090").value
        assert (r["margin_bytes"] >= 0) == (r["max_batch"] >= 1) and r["device_bytes"] > r["peak_bytes"]
    with pytest.raises(SetupError, match="mode='inference'"):
        serving_table(cfg, Setup(), "rtx-4090", [1024])


def test_vllm_budget_is_the_share_of_the_card_less_weights_and_profiled_peak() -> None:
    assert (VLLM_GPU_MEMORY_UTILIZATION, VLLM_BLOCK_SIZE) == (0.9, 16)
    b = vllm_kv_blocks(80 * 2**30, 16 * 2**30, 2 * 2**30, 131072)
    pool = int(0.9 * 80 * 2**30) - 18 * 2**30
    assert b.block_bytes == 16 * 131072 and b.pool_bytes == pool and b.blocks == pool // (16 * 131072)
    assert b.tokens == 16 * b.blocks and b.sequences(4096) == b.blocks // 256 and b.sequences(4097) == b.blocks // 257
    assert vllm_kv_blocks(24 * 2**30, 30 * 2**30, 0, 131072).blocks == 0  # the weights alone do not fit: no pool
    assert vllm_kv_blocks(80 * 2**30, 16 * 2**30, 0, 131072, utilization=1.0, block_size=32).block_bytes == 32 * 131072
    for bad in ({"utilization": 0}, {"utilization": 1.5}, {"block_size": 0}):
        with pytest.raises(SetupError):
            vllm_kv_blocks(80 * 2**30, 16 * 2**30, 0, 131072, **bad)  # type: ignore[arg-type]
    with pytest.raises(SetupError, match="kv_bytes_per_token"):
        vllm_kv_blocks(80 * 2**30, 16 * 2**30, 0, 0)


def test_prefill_moments_name_the_mlp_attention_and_head() -> None:
    cfg = preset("llama-3-8b")
    m = prefill_transient_bytes(cfg, 1, 4096, 2, 1, True, keep=1)
    assert set(m) == {"mlp", "attention", "logits", "attention_scores"} and m["attention_scores"] == 0
    assert m["mlp"] == (4 * cfg.d_model + 3 * cfg.ffn) * 4096 * 2  # four streams and the gated MLP's three tensors


def test_a_mixture_of_experts_is_traced_real_and_the_estimate_stays_below() -> None:
    cfg = preset("tiny-moe")
    setup = Setup(mode="inference", batch=2, seq=32, attention="flash", inference_weights="fp32", kv_cache_dtype="fp32")
    with pytest.raises(SetupError, match="mixture of experts"):
        trace_gpt(cfg, setup)  # the router's nonzero has no fake value: one clear line, not torch's exception
    real = {r.phase: r.peak_bytes for r in trace_gpt(cfg, setup, fake=False).phases}
    predicted = {r.phase: r.peak_bytes for r in estimate(cfg, setup, device_type="cpu").phases}
    assert all(predicted[p] <= real[p] for p in real)  # the routing tensors are not counted (the coverage line)
    assert any("routing tensors" in a for a in estimate(cfg, setup).assumptions)
