"""LoRA fine-tuning predicted, traced and measured with peft on CPU (memlab.predict.memory.finetune,
model.hf.apply_lora).

The measured side is a real peft model built from a config (random init, tiny shapes) through the one training step:
states counted by storage, saved activations through saved_tensors_hooks. The estimate must equal it to the byte on
configs drawn by a seeded sampler over families x precision x attention x rank x targets x dropout; QLoRA too, with
bitsandbytes' NF4 on the CPU."""

from __future__ import annotations

import random

import pytest

from memlab.errors import ConfigError, SetupError
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.finetune import (
    NF4_TENSOR_CONSTANT_BYTES,
    adapter_elements,
    nf4_tensor_bytes,
    qlora_base_bytes,
    qlora_bits_per_parameter,
    saved_module_elements,
)
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

FAMILIES = {
    "llama": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64},
    "qwen2": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64},
    "mistral": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 64},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 64, "attn_pdrop": 0.0,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0},
}


def _draw(rng: random.Random) -> tuple[str, str, bool, str, int, int, Setup]:
    family = rng.choice(sorted(FAMILIES))
    kinds = ["q", "k", "v", "o", "up", "down"] + (["gate"] if family != "gpt2" else [])
    targets = ",".join(k for k in kinds if rng.random() < 0.4) or rng.choice(kinds)
    dtype, autocast = rng.choice([("fp32", False), ("bf16", False), ("fp32", True)])
    save = rng.choice(["", "", "head", "embed", "head,embed"]) if family != "gpt2" else ""  # GPT-2 ties them
    setup = Setup(finetune="lora", lora_rank=rng.choice([2, 4, 8]), lora_dropout=rng.choice([0.0, 0.1]),
                  lora_targets=targets, lora_modules_to_save=save)
    return family, dtype, autocast, rng.choice(["eager", "sdpa"]), rng.choice([1, 2]), rng.choice([8, 16]), setup


@pytest.mark.parametrize("seed", range(4))
def test_lora_estimate_equals_a_measured_peft_step_for_states_and_saved_activations(seed: int) -> None:
    pytest.importorskip("peft")
    from memlab.run.hf import predict_hf, run_hf

    family, dtype, autocast, attn, batch, seq, setup = _draw(random.Random(seed))
    tc, m = run_hf({"model_type": family, **FAMILIES[family]}, attn_implementation=attn, dtype=dtype, batch=batch,
                   seq=seq, autocast=autocast, lora=setup)
    measured = {"activations": m.saved_bytes, "params": m.params_bytes, "grads": m.grads_bytes,
                "optimizer": m.optimizer_bytes}
    assert predict_hf(tc, m) == measured, (family, dtype, autocast, attn, batch, seq, setup.lora_targets)
    # fp32 adapters, and a copy of each module trained in full in the model's dtype
    saved = (2 if dtype == "bf16" else 4) * saved_module_elements(tc, setup)
    assert m.grads_bytes == 4 * adapter_elements(tc, setup.lora_r, setup.lora_target_kinds) + saved


def test_lora_trace_of_a_peft_model_matches_the_estimate_states_and_names_the_activation_residual() -> None:
    pytest.importorskip("peft")
    from memlab.model.hf import hf_config
    from memlab.tracing.hf import trace_hf

    dims = FAMILIES["llama"]
    setup = Setup(batch=2, seq=16, finetune="lora", lora_rank=4, lora_targets="q,v,down", precision="bf16")
    traced = trace_hf(hf_config("llama", **dims), setup, device_type="cpu").components()
    predicted = estimate(from_hf({"model_type": "llama", **dims}), setup, device_type="cpu").components()
    assert {k: traced[k] for k in ("params", "grads", "optimizer")} == \
        {k: predicted[k] for k in ("params", "grads", "optimizer")}
    # What the forward leaves alive beyond what autograd saves: the batch's input ids (a frozen embedding saves
    # none) and its labels (the loss saves a shifted copy, which the estimate counts), 8 B per token each, and the loss.
    assert traced["activations"] - predicted["activations"] == 2 * 8 * setup.tokens + 4


def test_lora_shrinks_states_and_full_fine_tuning_is_unchanged() -> None:
    cfg = preset("llama-2-7b")
    full = estimate(cfg, Setup(seq=2048, precision="bf16", attention="flash"))
    lora = estimate(cfg, Setup(seq=2048, precision="bf16", attention="flash", finetune="lora", lora_rank=16))
    n_adapters = adapter_elements(cfg, 16, ("q", "v"))
    assert n_adapters == 32 * 16 * (4096 + 4096) * 2
    assert lora.grads_bytes == 4 * n_adapters and lora.params_bytes == full.params_bytes + 4 * n_adapters
    assert lora.peak_bytes < full.peak_bytes / 2
    assert "qlora_dequantised_weight" not in full.overhead


def test_qlora_base_is_nf4_with_double_quantisation_computed_from_its_block_sizes() -> None:
    assert qlora_bits_per_parameter() == pytest.approx(0.127, abs=5e-4)  # QLoRA Sec. 3: 8/64 + 32/(64*256)
    assert qlora_bits_per_parameter(64, 1) == 8 / 64 + 32 / 64
    n = 4096 * 11008
    assert nf4_tensor_bytes(n) == n // 2 + n // 64 + 4 * (n // 64 // 256) + NF4_TENSOR_CONSTANT_BYTES
    cfg = preset("llama-2-7b")
    base, quantized = qlora_base_bytes(cfg)
    assert base == pytest.approx(quantized * (4 + qlora_bits_per_parameter()) / 8 + 2 * (cfg.param_count()
                                 - quantized), rel=1e-4)
    q = estimate(cfg, Setup(seq=2048, precision="bf16", attention="flash", finetune="qlora", lora_rank=16))
    assert q.overhead["qlora_dequantised_weight"] == 2 * 4096 * 11008
    assert any("equal to a CPU step" in a and "fake-tensor trace" in a for a in q.assumptions)


@pytest.mark.parametrize(("family", "dtype", "autocast", "frozen"), [("llama", "fp32", True, 1),
                                                                      ("mistral", "bf16", False, 2)])
def test_frozen_bottom_blocks_estimate_equals_a_measured_step(family: str, dtype: str, autocast: bool,
                                                              frozen: int) -> None:
    pytest.importorskip("transformers")
    from memlab.run.hf import predict_hf, run_hf

    setup = Setup(finetune="frozen", frozen_layers=frozen)
    tc, m = run_hf({"model_type": family, **FAMILIES[family]}, attn_implementation="eager", dtype=dtype, batch=2,
                   seq=16, autocast=autocast, lora=setup)
    assert predict_hf(tc, m) == {"activations": m.saved_bytes, "params": m.params_bytes, "grads": m.grads_bytes,
                                 "optimizer": m.optimizer_bytes}
    assert m.grads_bytes < m.params_bytes  # the embeddings and the bottom blocks have none


@pytest.mark.parametrize(("fields", "match"), [
    ({"lora_rank": 16}, "finetune='full'"),
    ({"finetune": "qlora"}, "precision='bf16'"),
    ({"finetune": "lora", "precision": "mixed-bf16"}, "master-weight"),
    ({"finetune": "lora", "lora_targets": "q,x"}, "unknown module kind 'x'"),
    ({"finetune": "lora", "lora_targets": "q,q"}, "twice"),
    ({"finetune": "lora", "recompute": "full"}, "one device"),
    ({"finetune": "lora", "lora_dropout": 1.0}, "below 1"),
    ({"lora_modules_to_save": "head"}, "finetune='full'"),
    ({"finetune": "lora", "lora_modules_to_save": "norm"}, "not a module kind"),
    ({"finetune": "frozen"}, "frozen_layers"),
    ({"frozen_layers": 2}, "frozen_layers"),
    ({"finetune": "frozen", "frozen_layers": 1, "lora_rank": 8}, "finetune='frozen'"),
    ({"finetune": "frozen", "frozen_layers": 1, "precision": "mixed-bf16"}, "frozen"),
])
def test_bad_fine_tuning_combinations_are_one_setup_error(fields: dict, match: str) -> None:
    """Contradictory fields are refused by Setup, combinations memlab does not model by the estimate
    (memlab.predict.coverage): one line either way."""
    with pytest.raises(SetupError, match=match) as info:
        estimate(from_hf({"model_type": "llama", **FAMILIES["llama"]}), Setup(**fields))
    assert "\n" not in str(info.value)


def test_a_gate_target_on_a_model_without_a_gated_mlp_is_a_config_error() -> None:
    gpt2 = from_hf({"model_type": "gpt2", **FAMILIES["gpt2"]})
    with pytest.raises(ConfigError, match="no gate"):
        estimate(gpt2, Setup(seq=16, finetune="lora", lora_targets="gate"))
    with pytest.raises(ConfigError, match="tied embeddings"):
        estimate(gpt2, Setup(seq=16, finetune="lora", lora_modules_to_save="head"))
    with pytest.raises(ConfigError, match="tied embeddings"):
        estimate(gpt2, Setup(seq=16, finetune="frozen", frozen_layers=1))
    llama = from_hf({"model_type": "llama", **FAMILIES["llama"]})
    with pytest.raises(ConfigError, match="at least one"):
        estimate(llama, Setup(seq=16, finetune="frozen", frozen_layers=2))


@pytest.mark.parametrize("seed", range(2))
def test_qlora_estimate_equals_a_measured_bitsandbytes_nf4_step(seed: int) -> None:
    """bitsandbytes 0.45+ quantises to NF4 and runs 4-bit matmuls on the CPU: the QLoRA step is measured here."""
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from memlab.run.hf import predict_hf, run_hf

    rng = random.Random(100 + seed)
    family = rng.choice(["llama", "qwen2", "mistral"])  # nn.Linear families (GPT-2's Conv1D is not quantised)
    kinds = ["q", "k", "v", "o", "gate", "up", "down"]
    targets = ",".join(k for k in kinds if rng.random() < 0.5) or "q"
    setup = Setup(finetune="qlora", precision="bf16", lora_rank=rng.choice([2, 4]), lora_targets=targets,
                  lora_dropout=rng.choice([0.0, 0.1]))
    tc, m = run_hf({"model_type": family, **FAMILIES[family]}, attn_implementation=rng.choice(["eager", "sdpa"]),
                   dtype="bf16", batch=2, seq=16, lora=setup)
    assert predict_hf(tc, m) == {"activations": m.saved_bytes, "params": m.params_bytes, "grads": m.grads_bytes,
                                 "optimizer": m.optimizer_bytes}, (family, targets)
    base, _ = qlora_base_bytes(tc)
    assert m.params_bytes == base + 4 * adapter_elements(tc, setup.lora_r, setup.lora_target_kinds)


def test_qlora_traces_on_fake_tensors_byte_for_byte_as_on_real_ones() -> None:
    """bitsandbytes' NF4 quantisation runs on its fake kernels (memlab.model.hf.fake_params4bit): the fake trace of
    a generated QLoRA setup equals the real CPU one phase by phase, and its states equal the estimate."""
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from memlab.model.hf import hf_config
    from memlab.tracing.hf import trace_hf

    rng = random.Random(200)
    family = rng.choice(["llama", "qwen2", "mistral"])
    dims = FAMILIES[family]
    targets = ",".join(k for k in ("q", "k", "v", "o", "gate", "up", "down") if rng.random() < 0.5) or "v"
    setup = Setup(batch=rng.choice([1, 2]), seq=rng.choice([8, 16]), finetune="qlora", precision="bf16",
                  lora_rank=rng.choice([2, 4]), lora_targets=targets, attention=rng.choice(["eager", "math"]))
    real = trace_hf(hf_config(family, **dims), setup, fake=False, device_type="cpu")
    fake = trace_hf(hf_config(family, **dims), setup, device_type="cpu")
    assert [(r.step, r.phase, r.peak_bytes, r.by_category) for r in fake.phases] == \
        [(r.step, r.phase, r.peak_bytes, r.by_category) for r in real.phases], (family, setup)
    traced = fake.components()
    predicted = estimate(from_hf({"model_type": family, **dims}), setup, device_type="cpu").components()
    assert {k: traced[k] for k in ("params", "grads", "optimizer")} == \
        {k: predicted[k] for k in ("params", "grads", "optimizer")}  # the NF4 constants counted as weights
    base, _ = qlora_base_bytes(from_hf({"model_type": family, **dims}))
    assert traced["params"] == base + 4 * adapter_elements(from_hf({"model_type": family, **dims}), setup.lora_r,
                                                           setup.lora_target_kinds)


@pytest.mark.gpu
def test_bitsandbytes_nf4_weight_bytes_equal_the_prediction_on_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: this checks bitsandbytes' CUDA storage (the CPU's is measured above)")
    bnb = pytest.importorskip("bitsandbytes")
    layer = bnb.nn.Linear4bit(4096, 11008, bias=False, quant_type="nf4", compress_statistics=True,
                              compute_dtype=torch.bfloat16).cuda()
    qs = layer.weight.quant_state
    stored = layer.weight.untyped_storage().nbytes() + qs.absmax.untyped_storage().nbytes() \
        + qs.state2.absmax.untyped_storage().nbytes() + qs.code.untyped_storage().nbytes() \
        + qs.state2.code.untyped_storage().nbytes() + qs.offset.untyped_storage().nbytes()
    assert stored == nf4_tensor_bytes(4096 * 11008)


def test_targets_in_peft_spelling_are_memlabs_kinds() -> None:
    """What users write in peft's LoraConfig: q_proj, v_proj and all-linear (every Linear of the blocks; a
    non-gated MLP has no gate)."""
    from memlab.predict.memory.finetune import lora_modules
    from memlab.predict.spec.model import preset
    from memlab.predict.spec.setup import LORA_KINDS, Setup

    assert Setup(finetune="lora", lora_targets="q_proj,v_proj").lora_target_kinds == ("q", "v")
    assert Setup(finetune="lora", lora_targets="all-linear").lora_target_kinds == LORA_KINDS
    gpt = preset("gpt2-small")
    kinds = [k for k, _, _ in lora_modules(gpt, LORA_KINDS)]
    assert kinds == (["qkv", "o", "up", "down"] if gpt.impl.fused_qkv else ["q", "k", "v", "o", "up", "down"])
