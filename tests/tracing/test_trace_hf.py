"""memlab trace for Hugging Face causal LMs built from a config: fake == real byte for byte (memlab.tracing.hf)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlab.errors import ConfigError, MemlabError, SetupError
from memlab.predict.spec.setup import Setup

pytest.importorskip("transformers")

from memlab.model.hf import hf_config
from memlab.tracing.hf import trace_hf

GPT2 = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 128, "attn_pdrop": 0.0,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0}
LLAMA = {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}


def _rows(t) -> list:
    return [(r.step, r.phase, r.peak_bytes, r.end_bytes, r.by_category) for r in t.phases]


@pytest.mark.parametrize(("family", "dims"), [("gpt2", GPT2), ("llama", LLAMA)])
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_hf_fake_trace_equals_real_run(family: str, dims: dict, attention: str) -> None:
    cfg = hf_config(family, **dims)
    setup = Setup(batch=2, seq=32, attention=attention)
    fake, real = trace_hf(cfg, setup), trace_hf(cfg, setup, fake=False)
    assert _rows(fake) == _rows(real) and fake.peak_bytes == real.peak_bytes
    assert any("unpacked batch forced" in n for n in fake.notes)


def test_qwen2_moe_fake_trace_equals_real_run() -> None:
    """Grouped experts, a shared expert and a dense layer among the MoE ones on fake tensors: the same bytes, phase
    by phase, as the real step."""
    from memlab.course.hf_configs import load_config

    cfg = {**load_config("qwen2_moe"), "mlp_only_layers": [1]}
    setup = Setup(batch=2, seq=8, attention="eager", precision="bf16")
    fake, real = trace_hf(cfg, setup, device_type="cpu"), trace_hf(cfg, setup, fake=False, device_type="cpu")
    assert _rows(fake) == _rows(real) and fake.peak_bytes == real.peak_bytes


def test_grouped_experts_under_cuda_autocast_are_one_clear_error() -> None:
    """Autocast on an fp32 model keeps the 3-D experts fp32, which CUDA grouped_mm refuses: one line, the way out."""
    from memlab.course.hf_configs import load_config

    with pytest.raises(SetupError) as err:
        trace_hf(load_config("qwen2_moe"), Setup(batch=1, seq=8, precision="amp-bf16"))
    assert "precision 'bf16'" in str(err.value) and "device_type='cpu'" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family,precision", [("qwen2_moe", "fp32"), ("mixtral", "amp-bf16"), ("qwen3_moe", "fp32")])
def test_fp32_grouped_experts_trace_on_cpu_as_the_cpu_kernel_runs_them(family: str, precision: str) -> None:
    """torch's fake grouped_mm takes bf16 only (it copies CUDA's checks); the CPU kernel multiplies fp32 experts, so
    a CPU trace lets it (memlab.tracing.hf.cpu_grouped_mm_dtypes) and equals the real CPU step phase by phase."""
    from memlab.course.hf_configs import load_config

    setup = Setup(batch=2, seq=8, attention="eager", precision=precision)
    fake = trace_hf(load_config(family), setup, device_type="cpu")
    real = trace_hf(load_config(family), setup, fake=False, device_type="cpu")
    assert _rows(fake) == _rows(real) and fake.peak_bytes == real.peak_bytes


def test_hf_config_from_json_and_recompute(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", **LLAMA}))
    setup = Setup(batch=2, seq=32, recompute="full", precision="amp-bf16")
    t = trace_hf(path, setup)
    assert _rows(t) == _rows(trace_hf(str(tmp_path), setup, fake=False))
    plain = trace_hf(path, setup.with_(recompute="none"))
    acts = [x.phase("forward").end_by_category["activations"] for x in (t, plain)]
    assert acts[0] < acts[1]


def test_a_pinned_sdpa_kernel_holds_through_the_recompute_in_backward() -> None:
    """Under checkpointing the blocks are recomputed in backward, outside the forward's context: the chosen SDPA
    backend stays pinned there (else SDPA dispatches another kernel on CPU and the checkpoint finds other tensors,
    torch.utils.checkpoint.CheckpointError); the trace equals the real step."""
    cfg = hf_config("llama", **LLAMA)
    setup = Setup(batch=2, seq=32, recompute="full", precision="bf16", attention="math")
    assert _rows(trace_hf(cfg, setup)) == _rows(trace_hf(cfg, setup, fake=False))


def test_hf_bad_input_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config file"):
        hf_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="model_type"):
        hf_config(tmp_path / "bad.json")
    with pytest.raises(MemlabError):
        hf_config("not-a-model-family")
    with pytest.raises(SetupError, match="selective"):
        trace_hf(hf_config("llama", **LLAMA), Setup(seq=32, recompute="selective"))


@pytest.mark.wide  # make bench: a fresh clone's make test was over 5 minutes
def test_an_all_ones_mask_is_traced_as_the_call_without_one_with_its_tensor_held() -> None:
    """An all-ones mask saves what no mask saves (transformers builds none for SDPA, the same causal one for eager):
    the trace holds the loop's int64 mask beside the ids, 8 b s B more in every phase."""
    import random

    rng = random.Random(3)
    for family, dims in (("gpt2", GPT2), ("llama", LLAMA)):
        b, s = rng.randint(1, 3), rng.randint(8, 40)
        for attention in ("eager", "flash"):
            setup = Setup(batch=b, seq=s, attention=attention)
            none, ones = (trace_hf(hf_config(family, **dims), setup.with_(attention_mask=m), device_type="cpu")
                          for m in ("none", "ones"))
            assert [r.held_bytes + 8 * b * s for r in none.phases] == [r.held_bytes for r in ones.phases]
            assert any("attention_mask='ones'" in n for n in ones.notes)


# FSDP2 of a peft-wrapped HF model stays in make test through test_trace_hf_qlora_fsdp
# wide (make bench): make test keeps the seeded samples beside it; a fresh clone's make test was over 5 minutes
@pytest.mark.wide
def test_fsdp2_of_a_transformers_model_and_of_its_peft_wrapper_is_traced() -> None:
    """ZeRO-2/3 over world_size > 1 traces a transformers model under FSDP2 over a fake process group (every decoder
    layer a unit, then the root), peft's LoRA wrapper included: the formula's FSDP2 phases for the full model agree
    with it where both answer (steady backward within 0.1 %), and LoRA's sharded frozen base holds less than one
    process's."""
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf

    path = str(Path(__file__).resolve().parents[2] / "memlab/predict/families/configs/tiny/llama.json")
    full = Setup(seq=32, precision="bf16", attention="flash", zero_stage=3, world_size=4)
    traced, bd = trace_hf(path, full), estimate(from_hf(path), full)
    assert abs(traced.phase("backward", "steady").held_bytes - bd.phase_bytes("backward", "steady")) \
        <= 1e-3 * bd.phase_bytes("backward", "steady")
    lora = full.with_(finetune="lora")
    assert trace_hf(path, lora).peak_bytes < trace_hf(path, lora.with_(zero_stage=0, world_size=1)).peak_bytes


# wide (make bench): make test keeps the seeded samples beside it; a fresh clone's make test was over 5 minutes
@pytest.mark.wide
def test_a_chunked_or_fused_loss_traces_under_peft() -> None:
    """The chunked and fused losses run the decoder for the hidden states and the LM head chunk by chunk; under peft's
    wrapper the decoder is the wrapped causal LM's (it once read ``last_hidden_state`` off the LM's output and
    failed): the trace answers LoRA with them, holding no full logits."""
    path = str(Path(__file__).resolve().parents[2] / "memlab/predict/families/configs/tiny/llama.json")
    plain = Setup(seq=32, precision="bf16", attention="flash", finetune="lora")
    peaks = {kind: trace_hf(path, plain.with_(loss=kind)).peak_bytes for kind in ("plain", "chunked", "fused")}
    assert all(v > 0 for v in peaks.values()) and peaks["fused"] <= peaks["plain"]


def test_cudas_memory_efficient_kernel_traces_with_grouped_kv_heads() -> None:
    """CUDA's fp32 default under SDPA is the memory-efficient kernel, which has no CPU version: the trace makes its
    op call on fake tensors, grouped K/V heads included (their backward through memlab's wrapper), and equals the
    formula's 'efficient' phase by phase on the tiny (GQA) Llama."""
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf

    path = str(Path(__file__).resolve().parents[2] / "memlab/predict/families/configs/tiny/llama.json")
    setup = Setup(seq=64, attention="efficient")
    traced, bd = trace_hf(path, setup), estimate(from_hf(path), setup)
    assert from_hf(path).n_kv_heads < from_hf(path).n_heads
    for row in traced.phases:
        assert abs(row.held_bytes - bd.phase_bytes(row.phase, row.step)) <= 1e-3 * row.held_bytes, row
    assert any("grouped K/V heads" in note for note in traced.notes)


def test_bf16_adapters_as_trl_casts_them_are_traced_where_the_formula_refuses() -> None:
    """lora_dtype='bf16' (TRL's SFTTrainer casts a k-bit model's trainable parameters to bf16): the formula refuses
    it with the trace as the way out; the trace holds half of peft's fp32 adapter states."""
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf

    path = str(Path(__file__).resolve().parents[2] / "memlab/predict/families/configs/tiny/llama.json")
    fp32 = Setup(seq=32, precision="bf16", attention="flash", finetune="qlora", lora_rank=16)
    bf16 = fp32.with_(lora_dtype="bf16")
    with pytest.raises(SetupError, match=r"lora_dtype='bf16'.*trace it"):
        estimate(from_hf(path), bf16)
    states = {s.lora_dtype: trace_hf(path, s).phase("optimizer step", "steady").by_category["optimizer states"]
              for s in (fp32, bf16)}
    assert states["bf16"] < states["fp32"]


def test_lora_on_the_embedding_and_the_head_in_peft_spelling_is_traced_where_the_formula_refuses() -> None:
    """lora_targets='q_proj,v_proj,embed_tokens,lm_head': peft's Embedding LoRA and a LoRA head, as a LoraConfig
    names them; the formula refuses (way out: the trace, or modules_to_save), the trace answers."""
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf

    path = str(Path(__file__).resolve().parents[2] / "memlab/predict/families/configs/tiny/llama.json")
    setup = Setup(seq=32, precision="bf16", attention="flash", finetune="lora",
                  lora_targets="q_proj,v_proj,embed_tokens,lm_head")
    assert setup.lora_target_kinds == ("q", "v", "embed", "head")
    with pytest.raises(SetupError, match="token embedding or the LM head"):
        estimate(from_hf(path), setup)
    plain = trace_hf(path, setup.with_(lora_targets="q_proj,v_proj"))
    assert trace_hf(path, setup).peak_bytes > plain.peak_bytes
