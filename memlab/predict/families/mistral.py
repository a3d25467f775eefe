"""Mistral (``model_type`` mistral): Llama's layout (:func:`memlab.predict.families.llama.llama_like`) without any
projection bias, and a sliding window; transformers ``models/mistral/modeling_mistral.py``."""

from __future__ import annotations

from typing import Any

from memlab.predict.families.common import mistral_window
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPS, NO_PARTIAL, key_account, sliding
from memlab.predict.families.llama import ORDER, llama_like, llama_like_modelled
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 131072, "hidden_act": "silu",
    "tie_word_embeddings": False, "head_dim": None,
}
"""``MistralConfig``'s defaults of the keys the builder reads."""

KEYS = key_account(
    llama_like_modelled(),
    {"rms_norm_eps": EPS, **{k: "modeling_mistral.py builds every projection with bias=False: the key is not "
                                "read" for k in ("attention_bias", "mlp_bias")}},
    {**NO_PARTIAL, "sliding_window": sliding("mistral")})


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Mistral's TransformerConfig and traits: every projection bias=False, whatever the config says."""
    return llama_like(c, family, label, cls="Mistral", biases=(False, False, False),
                      sliding_window=mistral_window(c, family, c["max_position_embeddings"]))


FAMILY = Family.single("mistral", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
