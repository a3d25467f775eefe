"""QLoRA on cards without bf16 (a T4): bnb_4bit_compute_dtype=float16 under fp16 autocast with a GradScaler and
fp32 adapters, memlab's precision='amp-fp16'. The formula against a measured CPU step (bitsandbytes' CPU kernels,
the real GradScaler), the fake trace against the real one phase by phase, and the kernel torch runs on sm75."""

from __future__ import annotations

import random

import pytest

from memlab.errors import SetupError
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.families.resolver import resolve
from memlab.predict.memory.finetune import adapter_elements, qlora_base_bytes
from memlab.predict.spec.kernels import library_attention
from memlab.predict.spec.setup import Setup

from .test_finetune import FAMILIES as SHARED_FAMILIES  # the same tiny configs

FAMILIES = {name: keys for name, keys in SHARED_FAMILIES.items() if name != "gpt2"}  # nn.Linear families only
KINDS = ("q", "k", "v", "o", "gate", "up", "down")


def _draw(rng: random.Random, finetune: str) -> tuple[str, Setup]:
    family = rng.choice(sorted(FAMILIES))  # nn.Linear families (qwen2: biased q, k, v, cast to fp16 by Linear4bit)
    targets = ",".join(k for k in KINDS if rng.random() < 0.5) or "v"
    return family, Setup(finetune=finetune, precision="amp-fp16", lora_rank=rng.choice([2, 4]), lora_targets=targets,
                         lora_dropout=rng.choice([0.0, 0.1]))


@pytest.mark.parametrize(("seed", "finetune"), [(0, "qlora"), (1, "qlora"), (2, "qlora"), (3, "lora")])
def test_amp_fp16_adapters_estimate_equals_a_measured_step_with_a_grad_scaler(seed: int, finetune: str) -> None:
    """An fp32 model (NF4 block Linears computing in fp16 for qlora) under fp16 autocast, the loss scaled by
    torch.amp.GradScaler: saved activations and model states equal the formula's, byte for byte."""
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from memlab.run.hf import predict_hf, run_hf

    rng = random.Random(300 + seed)
    family, setup = _draw(rng, finetune)
    tc, m = run_hf({"model_type": family, **FAMILIES[family]}, attn_implementation=rng.choice(["eager", "sdpa"]),
                   dtype="fp32", autocast=True, autocast_dtype="fp16", batch=2, seq=16, lora=setup,
                   gradient_checkpointing=rng.random() < 0.3)
    assert predict_hf(tc, m) == {"activations": m.saved_bytes, "params": m.params_bytes, "grads": m.grads_bytes,
                                 "optimizer": m.optimizer_bytes}, (family, setup)
    if finetune == "qlora":  # fp32 embeddings, norms and head; the NF4 block matrices; the fp32 adapters
        base, _ = qlora_base_bytes(tc, 4)
        assert m.params_bytes == base + 4 * adapter_elements(tc, setup.lora_r, setup.lora_target_kinds)


def test_qlora_amp_fp16_traces_on_fake_tensors_as_on_real_ones_and_its_states_are_the_formula_s() -> None:
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from memlab.model.hf import hf_config
    from memlab.tracing.hf import trace_hf

    rng = random.Random(400)
    family, setup = _draw(rng, "qlora")
    setup = setup.with_(batch=rng.choice([1, 2]), seq=rng.choice([8, 16]), attention=rng.choice(["eager", "flash"]),
                        recompute=rng.choice(["none", "full"]))
    real = trace_hf(hf_config(family, **FAMILIES[family]), setup, fake=False, device_type="cpu")
    fake = trace_hf(hf_config(family, **FAMILIES[family]), setup, device_type="cpu")
    assert [(r.step, r.phase, r.peak_bytes, r.by_category) for r in fake.phases] == \
        [(r.step, r.phase, r.peak_bytes, r.by_category) for r in real.phases], (family, setup)
    traced = fake.components()
    predicted = estimate(from_hf({"model_type": family, **FAMILIES[family]}), setup, device_type="cpu").components()
    assert {k: traced[k] for k in ("params", "grads", "optimizer")} == \
        {k: predicted[k] for k in ("params", "grads", "optimizer")}


def test_qlora_precisions_are_bf16_and_amp_fp16_else_one_line_naming_both() -> None:
    llama = from_hf({"model_type": "llama", **FAMILIES["llama"]})
    for precision in ("fp32", "amp-bf16", "mixed-fp16"):
        with pytest.raises(SetupError, match="precision='amp-fp16'") as info:
            estimate(llama, Setup(seq=16, finetune="qlora", precision=precision))
        assert "\n" not in str(info.value)
    assert estimate(llama, Setup(seq=16, finetune="qlora", precision="amp-fp16")).peak_bytes > 0


def test_sdpa_on_a_t4_runs_the_memory_efficient_kernel_in_fp16_and_math_in_bf16() -> None:
    """torch's CUDA dispatch on sm75: flash needs sm80+, memory-efficient runs fp16 from sm50 (bf16 only from
    sm80), so a Llama 2 7B (head dim 128) QLoRA step on a T4 runs memory-efficient attention under amp-fp16."""
    llama = resolve("llama-2-7b")
    fp16 = library_attention(llama, Setup(finetune="qlora", precision="amp-fp16"), device_type="cuda", gpu="t4")
    assert fp16.kernel == "efficient" and "sm75" in fp16.reason, fp16
    bf16 = library_attention(llama, Setup(finetune="qlora", precision="bf16"), device_type="cuda", gpu="t4")
    assert bf16.kernel == "math" and "bf16 below sm80" in bf16.reason, bf16
    a100 = library_attention(llama, Setup(finetune="qlora", precision="amp-fp16"), device_type="cuda",
                             gpu="a100-80gb-sxm")
    assert a100.kernel == "flash"
