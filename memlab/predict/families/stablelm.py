"""StableLM (``model_type`` stablelm; StableLM 2): Llama's attention with LayerNorm, a partial rotary, optional q/k/v
bias and parallel block; per-head q/k LayerNorm refused; transformers ``models/stablelm/modeling_stablelm.py``."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import decoder, modeling_file, rope_value
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPSILON, ROPE_NEUTRAL, listed_account
from memlab.predict.families.llama import ORDER
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "intermediate_size": 6912, "vocab_size": 50304, "max_position_embeddings": 4096, "hidden_act": "silu",
    "use_qkv_bias": False, "qk_layernorm": False, "use_parallel_residual": False, "hidden_dropout": 0.0,
    "tie_word_embeddings": False,
}
"""``StableLmConfig``'s defaults of the keys the builder reads."""

KEYS = listed_account(
    "stablelm",
    {"hidden_act": "Implementation.activation", "use_qkv_bias": "Implementation.qkv_bias",
     "use_parallel_residual": "Implementation.parallel_block and shared_norm",
     "rope_parameters.partial_rotary_factor": "Implementation.rotary_fraction",
     "partial_rotary_factor": "Implementation.rotary_fraction (the top-level spelling of older config.json "
                              "files; common.rope_value)"},
    {"layer_norm_eps": EPSILON, **ROPE_NEUTRAL},
    {"qk_layernorm": ("True raises ConfigError (StableLmLayerNormPerHead is not modelled)", (False,)),
     "hidden_dropout": ("above 0 raises ConfigError (a dropout on the MLP output only is not modelled)", (0, 0.0))})

FILE = modeling_file("stablelm")


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """StableLM's TransformerConfig and traits."""
    if c["qk_layernorm"]:
        raise ConfigError("stablelm: qk_layernorm=True (a LayerNorm per head, StableLmLayerNormPerHead) is not "
                          "modelled; use a config with qk_layernorm false")
    if c["hidden_dropout"] > 0:
        raise ConfigError("stablelm: hidden_dropout > 0 (dropout on the MLP output only) is not modelled; set 0.0")
    parallel = bool(c["use_parallel_residual"])
    bias = bool(c["use_qkv_bias"])
    return decoder(c, family, label, cls="StableLm", file=FILE, norm="layernorm", bias=True, qkv_bias=bias,
                   o_bias=False, mlp_bias=False, rotary_fraction=rope_value(c, "partial_rotary_factor", 0.25),
                   sdpa_output_copy=True, parallel_block=parallel, shared_norm=parallel,
                   sources=(("rotary_fraction", f"{FILE} StableLmAttention: rotary_ndims (partial_rotary_factor)"),
                            ("sdpa_output_copy", f"{FILE} StableLmAttention.forward: torch.cat((query_rot, "
                                                 "query_pass))"),
                            ("parallel_block", f"{FILE} StableLmDecoderLayer.forward (use_parallel_residual: "
                                               "input_layernorm feeds both)")))


FAMILY = Family.single("stablelm", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
