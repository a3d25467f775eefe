"""Qwen2 (``model_type`` qwen2): Llama's layout (:func:`memlab.predict.families.llama.llama_like`) with q/k/v biases;
its sliding-window layers are refused; transformers ``models/qwen2/modeling_qwen2.py``."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import src
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPS, NO_PARTIAL, key_account, sliding
from memlab.predict.families.llama import ORDER, llama_like, llama_like_modelled
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "intermediate_size": 22016, "vocab_size": 151936, "max_position_embeddings": 32768, "hidden_act": "silu",
    "tie_word_embeddings": False,
}
"""``Qwen2Config``'s defaults of the keys the builder reads."""

KEYS = key_account(
    llama_like_modelled(),
    {"rms_norm_eps": EPS},
    {**NO_PARTIAL, "sliding_window": sliding("qwen2"),
     "use_sliding_window": ("ConfigError unless false: sliding-window layers are not modelled", (False,)),
     "max_window_layers": ("accepted while use_sliding_window is false (then every layer is full attention; "
                           "from_hf checks layer_types); use_sliding_window true is refused", ()),
     "layer_types": ("ConfigError unless every entry is full_attention: sliding-window layers are not "
                     "modelled", ())})


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Qwen2's TransformerConfig and traits: q/k/v bias, none on o or the MLP; every layer full attention (without
    ``use_sliding_window``, refused when true, or a sliding entry in ``layer_types``)."""
    types = c.get("layer_types")
    model = llama_like(c, family, label, cls="Qwen2", biases=(True, False, False),
                       sources=(("qkv_bias", src(family, "modeling_qwen2.py Qwen2Attention: q/k/v_proj bias=True, "
                                                         "o_proj bias=False")),))
    if types is not None and (not isinstance(types, list) or any(t != "full_attention" for t in types)):
        raise ConfigError("qwen2 config layer_types with other entries than full_attention (sliding-window "
                          "layers) are not modelled")
    return model


FAMILY = Family.single("qwen2", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
