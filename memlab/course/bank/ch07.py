"""Chapter 07's exercises (FlashAttention and what attention keeps). Questions are the notebook's markdown cells."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memlab.course.exercises import Numeric, When

SEED_004_SCORES_BYTES = 2048 * 2048 * 2
"""Seed article 004's attention-matrix figure: 2048² entries × 2 bytes [seed-004]."""


def _llama() -> Any:
    from memlab.predict.spec.model import preset

    return preset("llama-2-7b")


def _scores(batch: int, seq: int) -> float:
    """Eager attention-score bytes memlab's estimate counts for Llama-2-7B (mixed-bf16) at ``batch`` × ``seq``."""
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.setup import Setup

    setup = Setup(batch=batch, seq=seq, precision="mixed-bf16", attention="eager")
    return estimate(_llama(), setup).activation_detail["attention scores"]


def _eager_max_seq(setup: Any, card: str) -> int:
    """The longest sequence whose tensor peak fits the card (allocated only: the device's terms come after)."""
    from memlab.predict.fit import ALLOCATED_ONLY, max_seq

    return max_seq(_llama(), setup, card, limit=1 << 17, device=ALLOCATED_ONLY).value


def _capacity_gib(card: str) -> float:
    from memlab.predict.hardware.gpus import gpu

    return gpu(card).memory_bytes / 2**30


def _sample_attention() -> dict[str, Any]:
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.model import preset
    from memlab.predict.spec.setup import Setup

    layer = preset("tiny-gpt").with_(n_layers=1, max_seq=8192)

    def predicted(attention: str, s: int) -> dict[str, float]:
        b = estimate(layer, Setup(batch=1, seq=s, precision="fp32", attention=attention), device_type="cpu")
        return {k: v for k, v in b.activation_detail.items() if k.startswith("attention")}

    return {"attention": predicted, "scores": lambda s: predicted("eager", s)["attention scores"]}


def _attention_growth(attention: Callable[[str, int], dict[str, float]]) -> float:
    return sum(attention("eager", 8192).values()) / sum(attention("eager", 1024).values())


EXERCISES = (
    Numeric(
        "07.eager-growth", "Eager attention-score bytes at 1024 tokens / at 512",
        reference=lambda scores: scores(1024) / scores(512), unit="", rtol=0.02,
        hint="the probabilities are b × a × s × s numbers: what does doubling s do to s²?",
        why=lambda scores: (f"{scores(1024):,.0f} B / {scores(512):,.0f} B: the score matrix is s × s per head, so "
                            "doubling s quadruples it."),
        diagnoses={2: "That is linear growth: q, k, v and the output grow with s, but the probabilities are s × s.",
                   When(lambda v: v > 4.5): "Doubling s multiplies s² by 2², no more."},
        sample=_sample_attention,
    ),
    Numeric(
        "07.seed-undercount-b4", "Eager attention-score bytes of Llama-2-7B at batch 4, 4096 tokens / (2048² × 2 B)",
        reference=lambda: _scores(4, 4096) / SEED_004_SCORES_BYTES, unit="x", rtol=0.01,
        hint="the seed's figure is one 2048 × 2048 matrix: eager attention keeps one per head, per layer and per "
             "sequence of the batch, and the matrix grows with s²",
        why=lambda: (f"{_llama().n_heads} heads × {_llama().n_layers} layers × batch 4 × (4096 / 2048)² = "
                     f"{_scores(4, 4096) / SEED_004_SCORES_BYTES:,.0f}: the seed counted one head of one layer of "
                     "one sequence."),
        diagnoses={lambda: _scores(1, 2048) / SEED_004_SCORES_BYTES:
                   "That is the factor at batch 1 and 2048 tokens (the table above); this batch and length differ.",
                   lambda: _scores(4, 2048) / SEED_004_SCORES_BYTES:
                   "That leaves out a factor of 4: either the growth with s² (4096 tokens is twice 2048) or the "
                   "batch (one matrix per sequence, 4 of them)."},
    ),
    Numeric(
        "07.eager-max-seq",
        "Longest sequence whose tensors the estimator's fit search (max_seq, ALLOCATED_ONLY) admits, eager attention",
        reference=_eager_max_seq, unit="", rtol=0.1,
        hint="model states are 16 B/param / 8 ranks; activations grow with s (linear terms) and s² (the "
             "probabilities): the card holds what is left after the states",
        why=lambda setup, card: (
            f"max_seq(..., device=ALLOCATED_ONLY) answers {_eager_max_seq(setup, card):,} tokens against the "
            f"{_capacity_gib(card):.0f} GiB of "
            f"memlab's {card} row. It is "
            "the estimator's answer: the trace below runs the real step there, and FSDP2's gathered parameters and "
            "buffers, which the estimate counts only with Overheads(gathered_layers=...), can put it over the card."),
        diagnoses={lambda: 4096: "4096 is Llama-2's trained context, not what fits: memory, not the model, sets the "
                                 "limit here.",
                   When(lambda v: v > 20_000): "Too long for eager attention: the b × a × s² probabilities of every "
                                               "layer grow fast."},
        sample=lambda: {"setup": __import__("memlab.predict.spec.setup", fromlist=["Setup"]).Setup(
            batch=1, precision="mixed-bf16", attention="eager", zero_stage=3, world_size=8), "card": "h100-sxm"},
    ),
    Numeric(
        "07.attention-growth", "Growth of everything eager attention keeps (all attention categories), 1024 → 8192",
        reference=_attention_growth, unit="x", rtol=0.02,
        hint="the s² probabilities grow 64-fold, q, k, v and the output 8-fold: weigh each by its share at 1024 "
             "tokens (predicted_attention('eager', 1024))",
        why=lambda attention: (
            f"{sum(attention('eager', 8192).values()):,.0f} B / {sum(attention('eager', 1024).values()):,.0f} B: "
            "between 8 and 64, closer to 64 the more the s² scores dominate."),
        diagnoses={64: "Only the probabilities grow with s²; q, k, v and the output grow with s.",
                   8: "The probabilities grow with s², 64-fold over 8× the sequence."},
        sample=_sample_attention,
    ),
)
