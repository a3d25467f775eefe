"""Starcoder2 (``model_type`` starcoder2): Llama's attention with biases everywhere (``use_bias``), a GELU MLP,
LayerNorm, embedding and residual dropout; transformers ``models/starcoder2/modeling_starcoder2.py``."""

from __future__ import annotations

from typing import Any

from memlab.predict.families.common import decoder, modeling_file, window
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPSILON, ROPE_NEUTRAL, WINDOW, listed_account
from memlab.predict.families.llama import ORDER
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 3072, "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2,
    "intermediate_size": 12288, "vocab_size": 49152, "max_position_embeddings": 4096,
    "hidden_act": "gelu_pytorch_tanh", "residual_dropout": 0.0, "embedding_dropout": 0.0, "use_bias": True,
    "tie_word_embeddings": True,
}
"""``Starcoder2Config``'s defaults of the keys the builder reads."""

KEYS = listed_account(
    "starcoder2",
    {"hidden_act": "Implementation.activation",
     "use_bias": "Implementation.qkv_bias, o_bias, mlp_bias (every linear; the LayerNorms always have a bias)",
     "residual_dropout": "TransformerConfig.dropout", "embedding_dropout": "Implementation.embedding_dropout",
     "sliding_window": WINDOW},
    {"norm_epsilon": EPSILON, **ROPE_NEUTRAL})

FILE = modeling_file("starcoder2")


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Starcoder2's TransformerConfig and traits. ``use_bias`` sets the linears' biases only: the LayerNorms are
    ``nn.LayerNorm(hidden_size, eps=...)``, with a bias whatever ``use_bias`` says."""
    bias = bool(c["use_bias"])
    return decoder(c, family, label, cls="Starcoder2", file=FILE, mlp="gelu", norm="layernorm", bias=True,
                   qkv_bias=bias, o_bias=bias, mlp_bias=bias, dropout=float(c["residual_dropout"]),
                   embedding_dropout=float(c["embedding_dropout"]), sliding_window=window(c, family),
                   sources=(("activation", f"{FILE} Starcoder2MLP: c_proj(act(c_fc(x))), dropout"),
                            ("embedding_dropout", f"{FILE} Starcoder2Model: embedding_dropout")))


FAMILY = Family.single("starcoder2", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
