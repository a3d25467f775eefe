"""Reentrant activation checkpointing (``Setup.checkpoint_reentrant``), as peft's recipe runs it: the library chain
that gives it, its trace against the real step, and what it changes against transformers' non-reentrant default."""

from __future__ import annotations

import warnings

import pytest

from memlab.errors import SetupError
from memlab.predict.spec.setup import Setup

pytest.importorskip("transformers")

import torch

from memlab.course.hf_configs import load_config
from memlab.model.hf import build_hf_model, hf_config
from memlab.tracing.hf import trace_hf

LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}


def _rows(t) -> list:
    return [(r.step, r.phase, r.peak_bytes, r.end_bytes, r.by_category) for r in t.phases]


def _layer_grad_fn(model: torch.nn.Module) -> str:
    """The name of the first decoder layer's output node after one training forward."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layer = next(m for m in model.modules() if isinstance(m, GradientCheckpointingLayer))
    seen: list[str] = []
    handle = layer.register_forward_hook(lambda m, a, out: seen.append(
        (out[0] if isinstance(out, tuple) else out).grad_fn.name()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warning when no use_reentrant reaches it: the point of the test
        model(torch.randint(0, 256, (1, 8)), labels=torch.randint(0, 256, (1, 8))).loss.backward()
    handle.remove()
    return seen[0]


def test_peft_kbit_preparation_alone_leaves_torchs_reentrant_checkpoint() -> None:
    """The facts Setup.checkpoint_reentrant rests on, read from the installed libraries: peft's
    prepare_model_for_kbit_training(model) on a k-bit model hands transformers empty checkpoint kwargs, torch then
    runs its reentrant CheckpointFunction (and warns that use_reentrant was not passed); a later
    gradient_checkpointing_enable() without kwargs (what Trainer(gradient_checkpointing=True) calls) goes back to
    transformers' non-reentrant default; memlab's build with reentrant=True runs the same function."""
    peft = pytest.importorskip("peft")
    model = build_hf_model(hf_config("llama", **LLAMA))
    model.is_loaded_in_4bit = True  # what from_pretrained(quantization_config=4-bit) sets; peft reads only that
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5's deprecated alias, which peft calls
        peft.prepare_model_for_kbit_training(model)
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        model(torch.randint(0, 256, (1, 8)))
    assert _layer_grad_fn(model) == "CheckpointFunctionBackward"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable()  # kwargs None: transformers' {"use_reentrant": False}
    assert _layer_grad_fn(model) != "CheckpointFunctionBackward"
    ours = build_hf_model(hf_config("llama", **LLAMA), gradient_checkpointing=True, reentrant=True)
    assert _layer_grad_fn(ours) == "CheckpointFunctionBackward"
    with pytest.raises(SetupError, match="goes with gradient_checkpointing=True"):
        build_hf_model(hf_config("llama", **LLAMA), reentrant=True)


def test_reentrant_fake_trace_equals_the_real_step_and_holds_one_block_output_more_in_backward() -> None:
    """torch's reentrant checkpoint on fake tensors holds what the real step holds, phase by phase, both steps (the
    checkpoint's function, with the layer's keyword tensors, freed when backward ends: release_reentrant_calls).
    Against transformers' non-reentrant default on this Llama, only the backward peaks differ, by one block output
    (t x h fp32): the reentrant recompute runs the block whole, its last residual add included, and holds its output
    through the block's inner backward (torch/utils/checkpoint.py CheckpointFunction.backward), where the
    non-reentrant one stops once the last tensor backward needs exists."""
    cfg = hf_config("llama", **LLAMA)
    setup = Setup(batch=2, seq=16, recompute="full", attention="eager", checkpoint_reentrant=True)
    fake, real = trace_hf(cfg, setup, device_type="cpu"), trace_hf(cfg, setup, fake=False, device_type="cpu")
    assert _rows(fake) == _rows(real)
    plain = trace_hf(cfg, setup.with_(checkpoint_reentrant=False), device_type="cpu")
    output = setup.tokens * LLAMA["hidden_size"] * 4
    assert [(r.phase, r.peak_bytes - p.peak_bytes, r.end_bytes - p.end_bytes)
            for r, p in zip(fake.phases, plain.phases, strict=True)] == [
        (phase, output if phase == "backward" else 0, 0) for phase in [r.phase for r in plain.phases]]


def test_reentrant_is_refused_where_no_checkpoint_runs_and_by_the_reference_gpt() -> None:
    from memlab.predict.spec.model import preset
    from memlab.tracing.gpt import trace_gpt

    for bad in ({"recompute": "none"}, {"recompute": "op"}, {"recompute": "full", "mode": "inference"}):
        with pytest.raises(SetupError, match="checkpoint_reentrant chooses torch's reentrant checkpoint"):
            Setup(checkpoint_reentrant=True, **bad)
    with pytest.raises(SetupError, match="the reference GPT checkpoints non-reentrant"):
        trace_gpt(preset("tiny-gpt"), Setup(seq=16, recompute="full", checkpoint_reentrant=True))


CASES = [(family, finetune) for family in ("llama", "gpt2", "qwen3", "mistral") for finetune in ("full", "lora")] + [
    ("llama", "qlora"), ("qwen3", "qlora")]


@pytest.mark.wide
@pytest.mark.parametrize(("family", "finetune"), CASES)
@pytest.mark.parametrize("accumulate", [1, 2])
def test_reentrant_changes_only_the_backward_phases(family: str, finetune: str, accumulate: int) -> None:
    """On generated tiny configs, full fine-tuning, LoRA and QLoRA, with and without accumulation: the traces of the
    reentrant and the non-reentrant checkpoint hold the same bytes in every forward, optimizer step and zero_grad,
    and end every backward with the same bytes; the backward peaks are as high or higher, by an amount that depends
    on the family and the moment (0 to one block output and a bias gradient on these; gemma2's four norms a block:
    1.5 block outputs), which is why the formula refuses it (memlab.predict.coverage, 'reentrant checkpointing')."""
    cfg = load_config(family, "tiny")
    setup = Setup(batch=2, seq=32, recompute="full", attention="eager", finetune=finetune,
                  precision="bf16" if finetune == "qlora" else "fp32", grad_accum_steps=accumulate)
    plain = trace_hf(cfg, setup, device_type="cpu").phases
    reentrant = trace_hf(cfg, setup.with_(checkpoint_reentrant=True), device_type="cpu").phases
    for a, b in zip(plain, reentrant, strict=True):
        assert (a.step, a.phase, a.end_bytes) == (b.step, b.phase, b.end_bytes)
        assert b.peak_bytes == a.peak_bytes if "backward" not in a.phase else b.peak_bytes >= a.peak_bytes
