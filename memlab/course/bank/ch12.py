"""Chapter 12's exercises (fine-tune on your card: LoRA, QLoRA). Questions are the notebook's markdown cells.

The two measured exercises train one step of the tiny model of a family (``memlab/predict/families/configs/tiny``)
with peft on this machine, as the chapter's section 3 does (:func:`memlab.run.hf.run_hf`, LoRA rank 8 on q and v, fp32,
eager attention); the measurements are cached per arguments.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from memlab.course.exercises import Choice, Numeric, When

LORA_RANK = 8
"""The rank of the chapter's tiny LoRA runs (on peft's default targets, q and v)."""


def _lora_setup() -> Any:
    from memlab.predict.spec.setup import Setup

    return Setup(finetune="lora", lora_rank=LORA_RANK)


@cache
def _saved_bytes(family: str, batch: int, seq: int, seed: int, lora: bool) -> int:
    """Measured bytes one training step of the tiny ``family`` saves for backward (peft LoRA on q, v when ``lora``)."""
    from memlab.course.hf_configs import load_config
    from memlab.run.hf import run_hf

    _, m = run_hf(load_config(family, "tiny"), attn_implementation="eager", dtype="fp32", batch=batch, seq=seq,
                  seed=seed, lora=_lora_setup() if lora else None)
    return m.saved_bytes


def _saved_share(family: str, batch: int, seq: int, seed: int) -> float:
    return _saved_bytes(family, batch, seq, seed, True) / _saved_bytes(family, batch, seq, seed, False)


@cache
def _frozen_k_proj_saves(family: str, batch: int, seq: int, seed: int) -> str:
    """What the frozen k_proj of the second block keeps for backward under LoRA on q, v: measured, every saved
    storage with the module that saved it (parameters excluded: they are resident anyway)."""
    from memlab.course.hf_configs import load_config
    from memlab.model.hf import apply_lora, build_hf_model
    from memlab.run.hf import measure_hf

    setup = _lora_setup()
    model = apply_lora(build_hf_model(load_config(family, "tiny"), attn_implementation="eager", seed=seed), setup)
    _, saved = measure_hf(model, batch=batch, seq=seq, attn_implementation="eager", seed=seed, keep_saved=True,
                          lora=setup)
    return "input" if any("layers.1.self_attn.k_proj" in t.scope for t in saved.tensors) else "weight"


_SAVES = {"input": "its input", "weight": "no tensor of its own"}


def _dq_bits() -> float:
    from memlab.predict.memory.finetune import qlora_bits_per_parameter

    return qlora_bits_per_parameter()


def _no_dq_bits() -> float:
    """One fp32 absmax per 64-weight block, without double quantisation."""
    from memlab.predict.memory.finetune import NF4_BLOCK

    return 32 / NF4_BLOCK


def _recipe_max_batch(recompute: str = "full", attention: str = "auto") -> float:
    """The largest micro-batch of chapter 12's QLoRA recipe (Llama-2-7B, r=16 on every linear layer, bf16, seq 2048,
    the library's attention on the card) whose predicted tensor peak fits a 24 GB RTX 4090
    (:func:`memlab.predict.fit.max_batch` with ``ALLOCATED_ONLY``: the device's terms come after)."""
    from memlab.course.hf_configs import load_config
    from memlab.predict.families.reader import from_hf
    from memlab.predict.fit import ALLOCATED_ONLY, max_batch
    from memlab.predict.spec.kernels import resolved
    from memlab.predict.spec.setup import Setup

    cfg = from_hf(load_config("llama-2-7b", "full"))
    setup = Setup(seq=2048, precision="bf16", finetune="qlora", lora_rank=16, lora_targets="all-linear",
                  recompute=recompute, grad_accum_steps=4, attention=attention)
    return float(max_batch(cfg, resolved(cfg, setup, device_type="cuda", gpu="rtx-4090")[0], "rtx-4090",
                           device=ALLOCATED_ONLY).value)


def _sample_tiny() -> dict[str, Any]:
    return {"family": "llama", "batch": 1, "seq": 8, "seed": 0}


EXERCISES = (
    Numeric(
        "12.lora-saved-share", "Fraction of full fine-tuning's saved-for-backward bytes a LoRA step on q, v still "
                               "saves (tiny model, fp32, measured with peft)",
        reference=_saved_share, unit="", rtol=0.05,
        hint="list what each op saves for its input's gradient and what only for its weight's: a frozen base still "
             "needs every activation gradient",
        why=lambda family, batch, seq, seed: (
            f"measured: {_saved_share(family, batch, seq, seed):.3f} of the bytes. A frozen base still saves what "
            "its activations' gradients need (norms, the attention core, the MLP's inner tensors, the loss); only "
            "the inputs kept for weight gradients go, and each adapter adds its input and a rank-wide output."),
        diagnoses={When(lambda v: v < 0.1): "A frozen base still saves what its activations' gradients need: norms, "
                                            "the attention core, the MLP's inner tensors and the loss; only the "
                                            "inputs kept for weight gradients go.",
                   When(lambda v: v > 1): "A fraction of what full fine-tuning saves: LoRA on q, v adds far less "
                                          "than the frozen weights' inputs it stops saving."},
        sample=_sample_tiny,
    ),
    Choice(
        "12.frozen-linear-saves", "What a frozen Linear (k_proj, LoRA on q and v) keeps for backward",
        reference=_frozen_k_proj_saves,
        options={"input": "its input, as in full fine-tuning", "weight": "only its weight (already resident)",
                 "both": "its input and its weight"},
        hint="grad_input = grad_output @ W; grad_W = grad_output^T @ x: which of the two does a frozen W need?",
        why=lambda family, batch, seq, seed: (
            "measured: the frozen k_proj saves "
            f"{_SAVES[_frozen_k_proj_saves(family, batch, seq, seed)]} (its weight is already "
            "resident). The input is kept only for the weight's gradient, which a frozen weight does not have."),
        diagnoses={"input": "The input is kept for the weight's gradient, which a frozen weight does not have.",
                   "both": "The weight is resident anyway; the input is needed only for the weight's gradient."},
        sample=_sample_tiny,
    ),
    Numeric(
        "12.qlora-dq-bits", "Bits per parameter of QLoRA's quantisation constants with double quantisation",
        reference=_dq_bits, unit="", rtol=0.01,
        hint="8 bits per block of 64 weights, plus 32 bits per 256 blocks (and per tensor a few small codes, "
             "negligible at 7B)",
        why=lambda: (f"8/64 + 32/(64 x 256) = {_dq_bits():.4f} bits per parameter (QLoRA Sec. 3), against "
                     f"{_no_dq_bits():.2f} with one fp32 absmax per 64 weights: double quantisation saves "
                     f"{_no_dq_bits() - _dq_bits():.3f} bits per parameter."),
        diagnoses={_no_dq_bits: "That is one fp32 absmax per 64 weights: without double quantisation.",
                   When(lambda v: v > 4): "Only the constants: the 4 bits of each NF4 weight are not part of them."},
    ),
    Numeric(
        "12.recipe-max-batch", "Largest micro-batch of the QLoRA recipe (r=16 all-linear, checkpointing, bf16, seq "
                               "2048, the library's attention) whose tensors fit a 24 GB RTX 4090",
        reference=_recipe_max_batch, unit="", rtol=0.01,  # an integer: 1 % takes only the answer
        hint="under checkpointing each block keeps only its input (b x s x h in bf16); one block is recomputed at a "
             "time; the base is 4-bit and only the fp32 adapters have gradients and Adam moments",
        why=lambda: (f"memlab.predict.fit.max_batch(..., device=ALLOCATED_ONLY): {_recipe_max_batch():.0f} "
                     "sequences of 2048 tokens (live tensors; the CUDA context, workspaces and the allocator's "
                     "reserve come on top: the recipe table's two ends). Without checkpointing "
                     f"{_recipe_max_batch('none'):.0f}; under eager attention "
                     f"{_recipe_max_batch(attention='eager'):.0f}."),
        diagnoses={lambda: _recipe_max_batch("none"): "That is without gradient checkpointing: every block's "
                                                      "activations kept until backward.",
                   lambda: _recipe_max_batch(attention="eager"): "That is under eager attention (the s x s scores "
                                                                 "of the recomputed block); transformers runs SDPA, "
                                                                 "flash on a 4090 in bf16."},
    ),
)
