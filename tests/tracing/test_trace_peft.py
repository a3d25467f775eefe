"""memlab.trace on models a library wraps or moves after construction (peft LoRA): it ran into
``RuntimeError: _apply(): Couldn't swap Linear.weight`` (peft moves each adapter to its base layer's device) and then
into MemTracker's gradient hook on frozen parameters; fake must equal real byte for byte."""

from __future__ import annotations

import pytest
import torch

from memlab.model.hf import hf_config
from memlab.tracing.tracer import trace

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

LLAMA = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}


def _model_fn(dtype: torch.dtype = torch.float32):
    cfg = hf_config("llama", **LLAMA)

    def model_fn() -> torch.nn.Module:
        base = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        return peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))

    return model_fn


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, LLAMA["vocab_size"], (2, 16))
    return {"input_ids": ids, "labels": ids.clone()}


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.wide)])
def test_trace_of_a_peft_model_built_in_model_fn_equals_the_real_step(dtype: torch.dtype) -> None:
    fake = trace(_model_fn(dtype), _batch, _optimizer)
    real = trace(_model_fn(dtype), _batch, _optimizer, fake=False)
    assert [(r.step, r.phase, r.peak_bytes, r.by_category) for r in fake.phases] == \
        [(r.step, r.phase, r.peak_bytes, r.by_category) for r in real.phases]
    # Only the adapters have gradients and optimizer states: 2 layers x (q, v) x (A: r x h, B: out x r), fp32
    # (peft keeps adapters in fp32 over a 16-bit base: LoraConfig autocast_adapter_dtype=True).
    h, kv, r = LLAMA["hidden_size"], LLAMA["hidden_size"] // 2, 4
    adapters = 2 * ((r * h + h * r) + (r * h + kv * r))
    comp = fake.components()
    assert comp["grads"] == 4 * adapters
    assert comp["optimizer"] == 2 * 4 * adapters + 4 * 8  # moments and one fp32 step counter per adapter tensor
    assert comp["params"] > 10 * comp["grads"]  # the frozen base is counted as parameters


def test_frozen_parameters_trace_without_a_library() -> None:
    def model_fn() -> torch.nn.Module:
        m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        m[0].requires_grad_(False)
        return m.to(torch.float64)  # a move after construction, on fake parameters

    t = trace(model_fn, lambda: torch.randn(4, 32, dtype=torch.float64),
              lambda m: torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1),
              loss_fn=lambda m, x: m(x).square().mean())
    assert t.components()["grads"] == 8 * (64 * 8 + 8)


def test_tracing_a_peft_model_prints_no_warning_and_leaves_the_warning_format_alone(
        capfd: pytest.CaptureFixture[str]) -> None:
    """peft's wrappers re-enter a module's forward, and torch's ModTracker warns ("The module hierarchy tracking
    maybe be messed up") and replaces ``warnings.formatwarning`` for the whole process; memlab's tracker keeps both
    out of what it prints (memlab.tracing.tracer.quiet_mod_tracker), whatever torch version is installed."""
    import warnings

    from memlab.predict.spec.setup import Setup
    from memlab.tracing.hf import trace_hf

    before = warnings.formatwarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace_hf(hf_config("llama", **LLAMA), Setup(batch=2, seq=16, finetune="lora", lora_rank=4,
                                                    lora_targets="q,v"), device_type="cpu")
    assert [str(w.message) for w in caught if "hierarchy" in str(w.message)] == []
    assert warnings.formatwarning is before
    out, err = capfd.readouterr()
    assert "Warning" not in out + err, out + err
