"""Chapter 11's exercises (your model: Hugging Face families, their traits, will it fit). Questions are the
notebook's markdown cells."""

from __future__ import annotations

import functools
import json
from typing import Any

from memlab.course.exercises import Choice, Numeric, When

SAME_SIZE_SETUP = {"batch": 2, "seq": 24, "attention": "eager"}
"""Exercise 1's run: batch 2 × 24 tokens, eager attention, fp32 (the Setup default)."""


def _saved(config: Any) -> float:
    from memlab.predict.families.reader import from_hf
    from memlab.predict.memory.activations import activation_bytes
    from memlab.predict.spec.setup import Setup

    return sum(activation_bytes(from_hf(config), Setup(**SAME_SIZE_SETUP), device_type="cpu").values())


def _more_per_token(configs: dict[str, Any]) -> str:
    saved = {family: _saved(cfg) for family, cfg in configs.items()}
    if max(saved.values()) == min(saved.values()):
        return "same"
    return max(saved, key=saved.get)


def _sample_families() -> dict[str, Any]:
    from memlab.course.hf_configs import load_config

    return {"configs": {"gpt2": load_config("gpt2"),
                        "gpt_neox": {**load_config("gpt_neox"), "intermediate_size": 256}}}


def _largest_batch(model: Any, setup: Any, card: str) -> int:
    """The largest batch whose tensor peak fits the card (allocated only: the device's terms come after)."""
    from memlab.predict.fit import ALLOCATED_ONLY, max_batch

    return max_batch(model, setup, card, device=ALLOCATED_ONLY).value


def _by_decimal_gb(model: Any, setup: Any, card: str) -> int:
    """The largest batch whose peak fits the card read as decimal GB: the unit slip chapter 09 warns about."""
    import dataclasses

    from memlab.predict.fit import max_batch
    from memlab.predict.hardware.gpus import gpu

    spec = gpu(card)
    return max_batch(model, setup, dataclasses.replace(spec, memory_bytes=int(spec.memory_gib * 1e9))).value


def _sample_pythia() -> dict[str, Any]:
    from memlab.course.hf_configs import load_config
    from memlab.predict.families.reader import from_hf
    from memlab.predict.spec.setup import Setup

    return {"model": from_hf(load_config("pythia-1.4b", "full"), name="pythia-1.4b"),
            "setup": Setup(batch=1, seq=2048, precision="bf16", attention="flash"), "card": "rtx-4090"}


def _gelu_extra(model: Any) -> float:
    from memlab.predict.memory.activations import trait_effects
    from memlab.predict.spec.setup import Setup

    return trait_effects(model, Setup(batch=1, seq=1, precision="bf16"))["activation"] / model.n_layers


def _sample_gpt2() -> dict[str, Any]:
    from memlab.course.hf_configs import load_config
    from memlab.predict.families.reader import from_hf

    return {"model": from_hf(load_config("gpt2", "full"), name="gpt2")}


def _ckpt_bytes(run: Any, kept: int) -> tuple[float, int]:
    """(the guides' full-recomputation activations, the bytes the step keeps for backward) of a checkpointed run;
    ``kept`` is the chapter's trace of the real code (``traced_truth(run)["activations"]``)."""
    from memlab.studies.calculators import korthikanti_guides

    return korthikanti_guides(run).activations, int(kept)


def _ckpt_sign(run: Any, kept: int) -> str:
    formula, traced = _ckpt_bytes(run, kept)
    return "exact" if formula == traced else ("over" if formula > traced else "under")


def _sample_ckpt_run() -> dict[str, Any]:
    """A checkpointed tiny Llama in mixed bf16, its kept bytes from memlab's formula standing in for the trace (the
    chapter passes the trace's), so checking the exercise needs no trace."""
    from memlab.course.hf_configs import load_config
    from memlab.studies.calculators import Run, memlab_formula

    run = Run(load_config("llama"), 2, 24, "bf16", "sdpa", device_type="cpu", name="llama", precision="mixed-bf16",
              recompute="full")
    return {"run": run, "kept": int(memlab_formula(run).activations)}


COHERE_SAMPLE = {"model_type": "cohere", "hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 3,
                 "num_attention_heads": 6, "num_key_value_heads": 3, "vocab_size": 640,
                 "max_position_embeddings": 128}
"""A small Cohere ``config.json`` (Command-R's family, which ``from_hf`` does not map) for checking exercise
10.unknown-family-states without the chapter; the chapter passes its own."""


def _adam_states(config: dict[str, Any]) -> int:
    """Bytes of fp32 AdamW's states for the model ``config`` builds: two fp32 moments per parameter
    (:func:`memlab.predict.memory.states.adam_moment_bytes`) plus one 4-byte ``step`` per parameter tensor
    (:func:`~memlab.predict.memory.states.step_counter_bytes`), the parameters counted once each (a tied head is
    the embedding's tensor) on the model transformers builds."""
    return _adam_states_of(json.dumps(config, sort_keys=True))


@functools.cache
def _adam_states_of(config_json: str) -> int:
    """:func:`_adam_states` of a config given as JSON text (cached: the reference and its diagnoses build the model
    once)."""
    from memlab.model.hf import build_hf_model
    from memlab.predict.memory.states import adam_moment_bytes, step_counter_bytes

    params = list(build_hf_model(json.loads(config_json)).parameters())  # parameters() yields a tied tensor once
    return adam_moment_bytes(sum(p.numel() for p in params), 4) + step_counter_bytes(len(params), "adamw")


def _untied(config: dict[str, Any]) -> int:
    """The states counted with a separate head (vocab x d_model more parameters): the tied-head slip."""
    return _adam_states(config) + 8 * config["vocab_size"] * config["hidden_size"]


def _sample_unknown() -> dict[str, Any]:
    return {"config": dict(COHERE_SAMPLE)}


EXERCISES = (
    Choice(
        "11.family-per-token", "Which family saves more activation bytes per token at the same sizes",
        reference=_more_per_token,
        options={"gpt2": "GPT-2", "gpt_neox": "GPT-NeoX", "same": "the same: the sizes are equal"},
        hint="count the d_ff-wide tensors each MLP keeps (composed gelu_new vs a fused GELU) and how many norm "
             "inputs a parallel block keeps",
        why=lambda configs: ("bytes saved for backward: " + ", ".join(f"{f} {_saved(c):,.0f}" for f, c in
                                                                      configs.items())
                             + ". Equal sizes, different code: GPT-2's gelu_new is built from element-wise ops, "
                               "each keeping a d_ff-wide tensor, where GPT-NeoX calls one fused GELU."),
        diagnoses={"same": "The sizes are equal, but what a layer keeps depends on how its code is written: "
                           "a composed activation keeps its intermediates."},
        sample=_sample_families,
    ),
    Numeric(
        "11.pythia-4090-batch",
        "Largest micro-batch of Pythia-1.4B (pure bf16, SDPA, 2,048 tokens) whose tensors fit an RTX 4090",
        reference=_largest_batch, unit="", rtol=0.01,
        hint="model states are 8 B/param in pure bf16 with Adam; divide what is left of the card's "
             "gpu('rtx-4090').memory_bytes (memlab's table reads its '24 GB' as 24 GiB) by the peak bytes one more "
             "sequence adds, or call max_batch(config, setup, 'rtx-4090', device=ALLOCATED_ONLY)",
        why=lambda model, setup, card: (
            f"batch {_largest_batch(model, setup, card)} is the largest whose phase-aware tensor peak fits the card's "
            "memory_bytes; what the device adds (context, workspaces, the allocator's reserve) comes below, and the "
            "trace's replay settles it."),
        diagnoses={_by_decimal_gb: "That reads the card as 24 × 10^9 bytes; memlab's table stores 24 GiB "
                                   "(24 × 2^30), as the card reports.",
                   When(lambda v: v != round(v)): "A batch is a whole number of sequences."},
        sample=_sample_pythia,
    ),
    Numeric(
        "11.gelu-new-extra", "Extra bytes per token per layer that composed gelu_new keeps (bf16)",
        reference=_gelu_extra, unit="B", rtol=0.01,
        hint="gelu_new keeps 4 d_ff-wide tensors besides its output where a fused GELU keeps 1; 2 bytes each in "
             "bf16, per token",
        why=lambda model: (f"{_gelu_extra(model):,.0f} B = {_gelu_extra(model) / (2 * model.d_ff):g} extra "
                           f"d_ff-wide tensors × d_ff = {model.d_ff:,} × 2 B: the intermediates of the composed tanh "
                           "approximation, which a fused GELU does not keep."),
        diagnoses={lambda model: 4 * model.d_ff * 2: "That counts all four tensors; a fused GELU keeps one of them "
                                                     "too, so the extra is three.",
                   lambda model: _gelu_extra(model) * model.n_layers: "That is all layers; the question asks per "
                                                                       "layer.",
                   lambda model: _gelu_extra(model) * 2: "That uses 4-byte elements; in pure bf16 each is 2 bytes."},
        sample=_sample_gpt2,
    ),
    Choice(
        "11.ckpt-formula-sign", "Does the guides' full-recomputation formula over- or under-predict a checkpointed "
                                "step's saved bytes",
        reference=_ckpt_sign,
        options={"over": "it over-predicts", "under": "it under-predicts", "exact": "it is exact"},
        hint="2 s b h bytes per layer is one 2-byte tensor per block: each block's input. What else does a "
             "checkpointed step keep for backward that sits outside the blocks? Think of the final norm, the head "
             "and the loss over the whole vocabulary.",
        why=lambda run, kept: ("the formula gives {:,.0f} B, the trace of the real code keeps {:,} B: besides each "
                         "block's input the step keeps the tensors outside the checkpointed blocks (the final norm, "
                         "the logits and the loss's fp32 copies over the vocabulary), which a per-layer formula "
                         "leaves out by definition.").format(*_ckpt_bytes(run, kept)),
        diagnoses={"over": "A per-layer formula counts the blocks only; with checkpointing the blocks keep little, "
                           "so what sits outside them (head, logits, loss) is the larger part.",
                   "exact": "Each block's input is only part of it: the tensors outside the blocks are kept too."},
        sample=_sample_ckpt_run,
    ),
    Numeric(
        "11.unknown-family-states", "fp32 AdamW state bytes of a family the formula does not know, from its "
                                    "config.json",
        reference=_adam_states, unit="B", rtol=0.01,
        hint="AdamW keeps two fp32 moments (exp_avg, exp_avg_sq) per parameter: count the parameters of the model "
             "the config builds (sum(p.numel() for p in build_hf_model(config).parameters())); Cohere ties its head "
             "to the embedding (tie_word_embeddings defaults to True)",
        why=lambda config: (f"{_adam_states(config):,} B: 8 B per parameter (two fp32 moments) plus a 4-byte step "
                            "counter per parameter tensor. No formula of the family is needed: the states follow "
                            "from the parameter count, whatever the code; what needs the code (the trace) is what "
                            "the step keeps for backward."),
        diagnoses={_untied: "That counts a separate head; Cohere ties it to the embedding (one tensor, counted "
                            "once).",
                   lambda config: _adam_states(config) // 2: "That is one moment; AdamW keeps two (exp_avg and "
                                                             "exp_avg_sq).",
                   lambda config: _adam_states(config) * 2: "That is 16 B per parameter: weights, gradients and "
                                                            "states; the question asks for the states alone."},
        sample=_sample_unknown,
    ),
)
