"""Phi-3 (``model_type`` phi3): Llama's layout with a fused ``qkv_proj`` and ``gate_up_proj``; a partial rotary
(Phi-4-mini) is refused; transformers ``models/phi3/modeling_phi3.py``."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import decoder, modeling_file, rope_value, window
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPSILON, ROPE_NEUTRAL, ROPE_VALUES, WINDOW, listed_account
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 3072, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "intermediate_size": 8192, "vocab_size": 32064, "max_position_embeddings": 4096, "hidden_act": "silu",
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "tie_word_embeddings": False,
}
"""``Phi3Config``'s defaults of the keys the builder reads."""

KEYS = listed_account(
    "phi3",
    {"hidden_act": "Implementation.activation", "resid_pdrop": "TransformerConfig.dropout",
     "sliding_window": WINDOW},
    {"embd_pdrop": "in Phi3Config, never used by modeling_phi3.py (no embedding dropout is applied)",
     "rms_norm_eps": EPSILON, **ROPE_NEUTRAL, "original_max_position_embeddings": ROPE_VALUES},
    {"rope_parameters.partial_rotary_factor": ("below 1 (Phi-4-mini) raises ConfigError", (1, 1.0, None))})

FILE = modeling_file("phi3")


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Phi-3's TransformerConfig and traits."""
    if rope_value(c, "partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError("phi3: partial_rotary_factor < 1 (Phi-4-mini) is not modelled; memlab models Phi-3's "
                          "full rotary")
    return decoder(c, family, label, cls="Phi3", file=FILE, dropout=float(c["resid_pdrop"]), fused_qkv=True,
                   fused_gate_up=True, sdpa_output_copy=True,
                   sliding_window=window(c, family),  # embd_pdrop: in the config, unused by modeling_phi3.py
                   sources=(("fused_qkv", f"{FILE} Phi3Attention.qkv_proj (q, k, v are slices of one "
                                          "output); Phi3MLP.gate_up_proj then chunk(2)"),
                            ("sdpa_output_copy", f"{FILE} Phi3Attention.forward: q sliced from the "
                                                 "fused qkv output is not dense, so the rotation's output and "
                                                 "SDPA's are contiguous in (b, a, s, d)")))


FAMILY = Family.single(
    "phi3", defaults=DEFAULTS, keys=KEYS, build=build,
    param_order=("attn.o.", "attn.qkv.", "mlp.", "norm"),  # Phi3Attention.__init__: o_proj before qkv_proj
)
