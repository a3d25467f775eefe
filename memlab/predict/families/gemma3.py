"""Gemma 3, text (``model_type`` gemma3_text): Gemma 2's sandwich layers
(:func:`memlab.predict.families.gemma2.sandwich`) with a per-head q/k RMSNorm, one rotary table pair per layer kind,
every 6th layer full; no attention soft cap; transformers ``models/gemma3/modeling_gemma3.py``."""

from __future__ import annotations

from typing import Any

from memlab.predict.families.common import modeling_file
from memlab.predict.families.family import Family
from memlab.predict.families.gemma2 import sandwich
from memlab.predict.families.keys import EPSILON, LAYER_TYPES, ROPE_VALUES, WINDOW, listed_account
from memlab.predict.families.llama import ORDER
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "intermediate_size": 9216, "vocab_size": 262208, "max_position_embeddings": 131072,
    "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "tie_word_embeddings": True,
}
"""``Gemma3TextConfig``'s defaults of the keys the builder reads (no soft caps by default)."""

KEYS = listed_account(
    "gemma3",
    {"head_dim": "TransformerConfig.attn_head_dim", "hidden_activation": "Implementation.activation",
     "attention_bias": "Implementation.qkv_bias and o_bias", "sliding_window": WINDOW,
     "layer_types": LAYER_TYPES + "; one (cos, sin) pair per kind: Implementation.rotary_table_pairs",
     "_sliding_window_pattern": "layer_types when a config.json leaves them out (every N-th layer full)",
     "sliding_window_pattern": "the published config.json's spelling of _sliding_window_pattern "
                               "(gemma2._default_kinds)",
     "final_logit_softcapping": "Implementation.final_softcap (tanh of the logits kept; a chunked or fused "
                                "loss raises SetupError)"},
    {"rms_norm_eps": EPSILON, "query_pre_attn_scalar": "the attention's scale: a multiply, nothing saved",
     "rope_local_base_freq": "the sliding layers' rotary base in older config.json files: " + ROPE_VALUES,
     "attn_logit_softcapping": "Gemma3Attention keeps it but never passes it to the attention function "
                               "(modeling_gemma3.py): no cap is applied",
     **{f"rope_parameters.{kind}.{k}": ROPE_VALUES for kind in ("full_attention", "sliding_attention")
        for k in ("rope_theta", "rope_type")}},
    {"use_bidirectional_attention": ("True raises ConfigError (an encoder's mask)", (False, None))})


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Gemma 3's TransformerConfig and traits."""
    return sandwich(c, family, label, cls="Gemma3", file=modeling_file("gemma3"), pattern=6, softcaps=(None, None),
                    gemma3=True)


FAMILY = Family.single("gemma3_text", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
