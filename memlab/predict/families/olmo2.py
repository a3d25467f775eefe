"""OLMo 2 (``model_type`` olmo2): Llama's layout with the norms after attention and MLP, an RMSNorm over the whole
q and k projections, fp32 rotary tables; transformers ``models/olmo2/modeling_olmo2.py``."""

from __future__ import annotations

from typing import Any

from memlab.predict.families.common import decoder, modeling_file
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPSILON, ROPE_NEUTRAL, listed_account
from memlab.predict.families.llama import ORDER
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "intermediate_size": 11008, "vocab_size": 50304, "max_position_embeddings": 2048, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False,
}
"""``Olmo2Config``'s defaults of the keys the builder reads."""

KEYS = listed_account(
    "olmo2",
    {"hidden_act": "Implementation.activation", "attention_bias": "Implementation.qkv_bias and o_bias"},
    {"rms_norm_eps": EPSILON, **ROPE_NEUTRAL})

FILE = modeling_file("olmo2")


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """OLMo 2's TransformerConfig and traits."""
    bias = bool(c["attention_bias"])
    return decoder(c, family, label, cls="Olmo2", file=FILE, rmsnorm="fp32-product", qkv_bias=bias, o_bias=bias,
                   qk_norm="full", norm_placement="post", rotary_tables_fp32=True,
                   sources=(("qk_norm", f"{FILE} Olmo2Attention.forward: q_norm(q_proj(x)), "
                                        "k_norm(k_proj(x)) over the whole projection"),
                            ("norm_placement", f"{FILE} Olmo2DecoderLayer.forward: "
                                               "residual + post_attention_layernorm(attn(x)), "
                                               "post_feedforward_layernorm(mlp(h))"),
                            ("rotary_tables_fp32", f"{FILE} Olmo2RotaryEmbedding.forward returns fp32 "
                                                   "cos, sin; apply_rotary_pos_emb casts q, k back")))


FAMILY = Family.single("olmo2", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
