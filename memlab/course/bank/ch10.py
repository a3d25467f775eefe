"""Chapter 10's exercises (inference: KV cache, paging, mixtures of experts). Questions are the notebook's markdown
cells."""

from __future__ import annotations

import math
from typing import Any

from memlab.course.exercises import Numeric, When
from memlab.units import GiB


def _preset(name: str) -> Any:
    from memlab.predict.spec.model import preset

    return preset(name)


def _kv(model: str, batch: int, tokens: int, dtype: str) -> float:
    from memlab.predict.memory.inference import kv_cache_bytes

    return kv_cache_bytes(_preset(model), batch, tokens, dtype)


def _head_dim(model: str) -> int:
    cfg = _preset(model)
    return round(_kv(model, 1, 1, "fp32") / (2 * cfg.n_layers * cfg.n_kv_heads * 4))


def _resident_bytes(model: str) -> float:
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.setup import Setup

    return estimate(_preset(model), Setup(mode="inference", batch=1, seq=1)).params_bytes


def _card_bytes(card: str) -> int:
    from memlab.predict.hardware.gpus import gpu

    return gpu(card).memory_bytes


def _cards_needed(model: str, card: str) -> int:
    return math.ceil(_resident_bytes(model) / _card_bytes(card))


def _reserved(tokens: int, policy: str) -> float:
    """Tokens one request reserves under ``policy`` (section 5's max_len of 2048)."""
    import numpy as np

    from memlab.predict.paging import reserved_tokens

    return float(reserved_tokens(np.array([tokens]), policy, max_len=2048)[0])


def _empty_share(tokens: int, policy: str) -> float:
    """Percent of one request's contiguous KV reservation that holds no token, under ``policy``."""
    return 100 * (_reserved(tokens, policy) - tokens) / _reserved(tokens, policy)


def _sequences(model: str, card: str, tokens: int) -> int:
    from memlab.predict.paging import max_sequences

    return max_sequences(_preset(model), _card_bytes(card), tokens)


EXERCISES = (
    Numeric(
        "10.tiny-kv", "KV cache bytes of tiny-llama, 4 sequences × 256 tokens, fp32",
        reference=lambda: _kv("tiny-llama", 4, 256, "fp32"), unit="B", rtol=0.01,
        hint="2 (K and V) × layers × sequences × tokens × KV heads × head_dim × 4 bytes; the KV heads, not the "
             "query heads",
        why=lambda: (f"2 × {_preset('tiny-llama').n_layers} layers × 4 × 256 tokens × "
                     f"{_preset('tiny-llama').n_kv_heads} KV heads × {_head_dim('tiny-llama')} dims × 4 B: GQA "
                     "stores only the KV heads."),
        diagnoses={lambda: _kv("tiny-llama", 4, 256, "fp32") / 2: "That is half: either only K (or only V), while "
                                                                  "the cache keeps both, or a 2-byte cache, while "
                                                                  "this one is fp32 (4 bytes).",
                   lambda: _kv("tiny-llama", 4, 256, "fp32") * _preset("tiny-llama").n_heads
                   / _preset("tiny-llama").n_kv_heads:
                   "That uses the query heads; grouped-query attention caches only the KV heads."},
    ),
    Numeric(
        "10.mixtral-cards", "Fewest cards of the given kind that hold Mixtral-8x7B's bf16 weights (weights only)",
        reference=_cards_needed, unit="", rtol=0.001,
        hint="every expert is resident: 2 bytes × param_count() (not active_param_count()), divided by the card's "
             "memory_bytes, rounded up",
        why=lambda model, card: (f"{_resident_bytes(model) / GiB:.1f} GiB of weights (all experts) over "
                                 f"{_card_bytes(card) / GiB:.0f} GiB per card, rounded up; the top-2 experts a token "
                                 "uses are not what must be resident."),
        diagnoses={lambda model, card: math.ceil(2 * _preset(model).active_param_count() / _card_bytes(card)):
                   "That holds only the active (top-2) experts; every expert must be resident, since a batch routes "
                   "tokens to all of them.",
                   When(lambda v: v != round(v)): "A whole number of cards: round up."},
        sample=lambda: {"model": "mixtral-8x7b", "card": "l4"},
    ),
    Numeric(
        "10.pow2-empty", "Share (%) of one request's power-of-two KV reservation that holds no token",
        reference=_empty_share, unit="%", rtol=0.01,
        hint="the pow2 policy reserves the request's length rounded up to a power of two: the empty share is "
             "(reserved − tokens) / reserved",
        why=lambda tokens, policy: (f"{tokens:,} tokens reserve {_reserved(tokens, policy):,.0f}; "
                                    f"{_empty_share(tokens, policy):.1f} % of that holds nothing until the request "
                                    "grows, memory no other request can use."),
        diagnoses={lambda tokens, policy: 100 * (_reserved(tokens, policy) - tokens) / tokens:
                   "That divides by the request's length; the share of the reservation divides by what is reserved.",
                   When(lambda v: v < 0): "The reservation rounds *up*: it is at least the request's length.",
                   When(lambda v: 0 < v < 1): "That looks like a fraction: the question asks for a percentage."},
        sample=lambda: {"tokens": 1100, "policy": "pow2"},
    ),
    Numeric(
        "10.llama3-h200-8k", "Sequences of the given length a serving engine holds for Llama-3-8B (bf16) on one card",
        reference=_sequences, unit="", rtol=0.02,
        hint="(card memory_bytes − bf16 weights) / KV bytes of one sequence (kv_cache_bytes(model, 1, tokens, "
             "'bf16')), rounded down",
        why=lambda model, card, tokens: (
            f"({_card_bytes(card) / GiB:.0f} GiB − {_resident_bytes(model) / GiB:.1f} GiB of weights) / "
            f"{_kv(model, 1, tokens, 'bf16') / GiB:.2f} GiB per {tokens:,}-token sequence: weights + KV decide "
            "(max_sequences)."),
        diagnoses={lambda model, card, tokens: _card_bytes(card) // _kv(model, 1, tokens, "bf16"):
                   "That forgets the weights: they take their share of the card first.",
                   lambda model, card, tokens: (_card_bytes(card) - _resident_bytes(model))
                   // (_kv(model, 1, tokens, "bf16") * _preset(model).n_heads / _preset(model).n_kv_heads):
                   "That sizes the cache with the query heads; Llama-3 caches only its KV heads (GQA).",
                   When(lambda v: v != round(v)): "A whole number of sequences: round down."},
        sample=lambda: {"model": "llama-3-8b", "card": "h200-sxm", "tokens": 8192},
    ),
)
