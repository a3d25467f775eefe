"""Qwen3 (``model_type`` qwen3): Llama's layout with a per-head RMSNorm on q and k before the rotation, and an
optional sliding window; transformers ``models/qwen3/modeling_qwen3.py``."""

from __future__ import annotations

from typing import Any

from memlab.predict.families.common import decoder, layer_kinds, modeling_file, window
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPSILON, LAYER_TYPES, ROPE_NEUTRAL, WINDOW, listed_account
from memlab.predict.families.llama import ORDER
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "head_dim": 128, "intermediate_size": 22016, "vocab_size": 151936, "max_position_embeddings": 32768,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False, "use_sliding_window": False,
}
"""``Qwen3Config``'s defaults of the keys the builder reads."""

KEYS = listed_account(
    "qwen3",
    {"head_dim": "TransformerConfig.attn_head_dim", "hidden_act": "Implementation.activation",
     "attention_bias": "Implementation.qkv_bias and o_bias", "sliding_window": WINDOW,
     "use_sliding_window": "whether sliding_window applies (Qwen3Config sets it to None otherwise)",
     "layer_types": LAYER_TYPES},
    {"rms_norm_eps": EPSILON, **ROPE_NEUTRAL,
     "max_window_layers": "which layers slide, already in layer_types (any sliding layer: the window applies)"})

FILE = modeling_file("qwen3")


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Qwen3's TransformerConfig and traits."""
    kinds = layer_kinds(c, family) or {"sliding_attention"}  # without layer_types: assume some layer slides
    slide = window(c, family, bool(c["use_sliding_window"]) and "sliding_attention" in kinds)
    bias = bool(c["attention_bias"])
    return decoder(c, family, label, cls="Qwen3", file=FILE, head_dim=c["head_dim"], qkv_bias=bias, o_bias=bias,
                   qk_norm="head", sliding_window=slide,
                   sources=(("qk_norm", f"{FILE} Qwen3Attention.forward: q_norm/k_norm (RMSNorm over "
                                        "head_dim) before apply_rotary_pos_emb"),))


FAMILY = Family.single("qwen3", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
