"""Falcon (``model_type`` falcon): a parallel block (one LayerNorm, or two on the new decoder architecture), a fused
``query_key_value`` whose K/V heads are broadcast, rotary positions; ALiBi and the non-parallel block are refused;
transformers ``models/falcon/modeling_falcon.py``."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import hf_activation, modeling_file
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPSILON, ROPE_NEUTRAL, listed_account
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation

DEFAULTS: dict[str, Any] = {
    "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71, "num_kv_heads": 71,
    "vocab_size": 65024, "max_position_embeddings": 2048, "ffn_hidden_size": None, "activation": "gelu",
    "hidden_dropout": 0.0, "attention_dropout": 0.0, "new_decoder_architecture": False, "multi_query": True,
    "parallel_attn": True, "bias": False, "alibi": False, "num_ln_in_parallel_attn": None,
    "tie_word_embeddings": True,
}
"""``FalconConfig``'s defaults of the keys the builder reads."""

KEYS = listed_account(
    "falcon",
    {"num_kv_heads": "TransformerConfig.n_kv_heads (new decoder architecture; else 1 with multi_query)",
     "multi_query": "TransformerConfig.n_kv_heads = 1 without new_decoder_architecture (Falcon-7B)",
     "ffn_hidden_size": "TransformerConfig.d_ff (null: 4 hidden_size)",
     "activation": "Implementation.activation",
     "bias": "Implementation.qkv_bias, o_bias, mlp_bias (the LayerNorms always have one)",
     "new_decoder_architecture": "TransformerConfig.n_kv_heads (num_kv_heads) and two norms by default",
     "num_ln_in_parallel_attn": "Implementation.shared_norm (1) or two norms on one input (2)"},
    {"layer_norm_epsilon": EPSILON, **ROPE_NEUTRAL,
     "intermediate_size": "not a FalconConfig field and modeling_falcon.py does not read it (ffn_hidden_size is "
                          "Falcon's)",
     "num_key_value_heads": "FalconConfig.__post_init__ derives it from num_kv_heads and multi_query (a given "
                            "value is kept as an attribute); modeling_falcon.py reads num_kv_heads, not it"},
    {"alibi": ("True raises ConfigError (ALiBi positions are not modelled)", (False,)),
     "parallel_attn": ("False raises ConfigError (only the parallel block is modelled)", (True,)),
     "hidden_dropout": ("above 0 raises ConfigError (Falcon drops attention + MLP once, dropout_add)", (0, 0.0)),
     "attention_dropout": ("above 0 raises ConfigError (Falcon uses it as a residual dropout)", (0, 0.0))})

FILE = modeling_file("falcon")
_SOURCES = (
    ("activation", f"{FILE} FalconMLP: dense_4h_to_h(act(dense_h_to_4h(x)))"),
    ("parallel_block", f"{FILE} FalconDecoderLayer.forward: mlp_output += attention_output "
                       "(ln_attn and ln_mlp, or one input_layernorm)"),
    ("fused_qkv", f"{FILE} FalconAttention.query_key_value"),
    ("kv_broadcast", f"{FILE} FalconAttention.forward: K, V views of the fused output; a mask always "
                     "(allow_is_causal_skip=False), so sdpa_attention.py repeat_kv (no enable_gqa)"),
    ("eager_repeat_kv", f"{FILE} eager_attention_forward: repeat_kv (transformers 5.25)"),
    ("softmax_fp32", f"{FILE} eager_attention_forward: softmax(..., dtype=torch.float32).to(query.dtype)"),
    ("sdpa_keeps_mask", f"{FILE} FalconAttention.forward: scaled_dot_product_attention(..., "
                        "attn_mask=attention_mask)"),
    ("rotary_tables_per_forward", f"{FILE} FalconRotaryEmbedding.forward, apply_rotary_pos_emb"),
)


def _refuse(c: dict[str, Any]) -> None:
    """What memlab does not model of Falcon: ALiBi, dropout (a residual one), the sequential block."""
    if c["alibi"]:
        raise ConfigError("falcon: alibi=True (ALiBi positions, Falcon-RW) is not modelled; memlab models rotary "
                          "Falcon")
    if c["hidden_dropout"] > 0 or c["attention_dropout"] > 0:
        raise ConfigError("falcon: hidden_dropout or attention_dropout > 0 is not modelled (Falcon drops the sum of "
                          "attention and MLP once, dropout_add); set both to 0.0")
    if not c["parallel_attn"]:
        raise ConfigError("falcon: parallel_attn=False is not modelled; memlab models Falcon's parallel block")


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Falcon's TransformerConfig and traits."""
    _refuse(c)
    new = bool(c["new_decoder_architecture"])
    d, a = c["hidden_size"], c["num_attention_heads"]
    if d % a:
        raise ConfigError(f"falcon: num_attention_heads={a} must divide hidden_size={d}")
    # Falcon-7B's multi_query without the new architecture is one K/V head: since transformers 5.25 it is split
    # from the fused output and repeated like any grouped-query K/V (modeling_falcon.py FalconAttention.forward)
    kv = c["num_kv_heads"] if new else (1 if c["multi_query"] else a)
    lns = c["num_ln_in_parallel_attn"] or (2 if new else 1)
    if lns not in (1, 2):
        raise ConfigError(f"falcon: num_ln_in_parallel_attn must be 1 or 2, got {lns!r:.40}")
    if lns == 2 and not new:  # FalconDecoderLayer builds ln_attn, ln_mlp; its forward calls input_layernorm
        raise ConfigError("falcon: num_ln_in_parallel_attn=2 without new_decoder_architecture builds ln_attn and "
                          "ln_mlp but transformers' forward calls input_layernorm (AttributeError, modeling_falcon.py "
                          "FalconDecoderLayer); set num_ln_in_parallel_attn to 1 or null, or new_decoder_architecture "
                          "true")
    bias = bool(c["bias"])
    impl = Implementation(
        family=family, activation=hf_activation(c["activation"], "activation", family), parallel_block=True,
        shared_norm=not (new and lns == 2), fused_qkv=True, kv_broadcast=True, sdpa_keeps_mask=True,
        eager_repeat_kv=True, softmax_fp32=True,
        rotary_tables_per_forward=True, qkv_bias=bias, o_bias=bias, mlp_bias=bias, sources=_SOURCES,
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=a, n_kv_heads=kv,
        d_ff=c["ffn_hidden_size"] or 4 * d, vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"],
        mlp="gelu", positions="rotary", norm="layernorm", bias=True, tied_embeddings=bool(c["tie_word_embeddings"]),
        impl=impl,
    )


FAMILY = Family.single(
    "falcon", defaults=DEFAULTS, keys=KEYS, build=build,
    # FalconDecoderLayer: self_attention, mlp, then its norms (ln_attn/ln_mlp or input_layernorm)
    param_order=("attn.", "mlp.", "norm"),
)
