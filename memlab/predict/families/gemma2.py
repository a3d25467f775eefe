"""Gemma 2 (``model_type`` gemma2): Gemma's layout with four norms per layer ("sandwich"), alternating sliding and
full layers, and soft-capped attention scores and logits; transformers ``models/gemma2/modeling_gemma2.py``. Its
builder (:func:`sandwich`) is Gemma 3's too (:mod:`memlab.predict.families.gemma3`: ``modular_gemma3.py`` derives
from Gemma 2)."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import decoder, layer_kinds, modeling_file, positive_or_none, window
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPSILON, LAYER_TYPES, ROPE_NEUTRAL, WINDOW, listed_account
from memlab.predict.families.llama import ORDER
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "intermediate_size": 9216, "vocab_size": 256000, "max_position_embeddings": 8192,
    "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "tie_word_embeddings": True,
}
"""``Gemma2Config``'s defaults of the keys the builder reads (the soft caps: :data:`SOFTCAPS`)."""

SOFTCAPS = (50.0, 30.0)
"""(attn_logit_softcapping, final_logit_softcapping) defaults: positive numbers or None (not fractions, so not in
:data:`DEFAULTS`)."""

KEYS = listed_account(
    "gemma2",
    {"head_dim": "TransformerConfig.attn_head_dim", "hidden_activation": "Implementation.activation",
     "attention_bias": "Implementation.qkv_bias and o_bias", "sliding_window": WINDOW,
     "layer_types": LAYER_TYPES,
     "attn_logit_softcapping": "Implementation.attn_softcap (eager: tanh output kept; math/efficient SDPA "
                               "raise SetupError)",
     "final_logit_softcapping": "Implementation.final_softcap (tanh of the logits kept; a chunked or fused "
                                "loss raises SetupError)"},
    {"rms_norm_eps": EPSILON, **ROPE_NEUTRAL,
     "query_pre_attn_scalar": "the attention's scale: a multiply by a Python float, nothing saved"},
    {"use_bidirectional_attention": ("True raises ConfigError (an encoder's mask)", (False, None))})


def _default_kinds(c: dict[str, Any], family: str, pattern: int) -> set[str]:
    """The layer types transformers derives when a config.json leaves ``layer_types`` out: Gemma 2 alternates
    sliding and full layers (``pattern`` 2); Gemma 3 makes every ``sliding_window_pattern``-th layer full (default 6)
    [configuration_gemma2.py, configuration_gemma3.py Gemma3TextConfig.__post_init__]."""
    pattern = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", pattern))
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ConfigError(f"HF {family} config: sliding_window_pattern must be a positive int, got {pattern!r:.60}")
    return {"sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(c["num_hidden_layers"])}


def sandwich(c: dict[str, Any], family: str, label: str, *, cls: str, file: str, pattern: int,
             softcaps: tuple[float | None, float | None], gemma3: bool = False) -> TransformerConfig:
    """A Gemma 2 or Gemma 3 (``gemma3``) text model: ``cls`` its class prefix, ``file`` its modelling file,
    ``pattern`` the default sliding pattern, ``softcaps`` the default (attention, final) soft caps."""
    if c.get("use_bidirectional_attention"):
        raise ConfigError(f"{family}: use_bidirectional_attention=True (an encoder) is not modelled")
    kinds = layer_kinds(c, family) or _default_kinds(c, family, pattern)
    final_cap = positive_or_none(c, "final_logit_softcapping", softcaps[1], family)
    # Gemma3Attention keeps attn_logit_softcapping but never passes it to the attention function: not read
    attn_cap = None if gemma3 else positive_or_none(c, "attn_logit_softcapping", softcaps[0], family)
    bias = bool(c["attention_bias"])
    traits: dict[str, Any] = {"qk_norm": "head", "rotary_table_pairs": max(1, len(kinds))} if gemma3 else {}
    sdpa = {} if gemma3 else {"supports_sdpa": False}  # Gemma2PreTrainedModel._supports_sdpa = False
    sources = ((("qk_norm", f"{file} Gemma3Attention.forward: q_norm/k_norm (Gemma3RMSNorm over head_dim)"),
                ("rotary_table_pairs", f"{file} Gemma3TextModel.forward: one rotary_emb call per set(layer_types)"))
               if gemma3 else ())
    if not gemma3:
        sources += (("supports_sdpa", f"{file} Gemma2PreTrainedModel: _supports_sdpa = False (softcapping)"),)
    if attn_cap is not None:
        sources += (("attn_softcap", f"{file} eager_attention_forward: tanh(attn_weights / softcap) * softcap"),)
    if final_cap is not None:
        sources += (("final_softcap", f"{file} {cls}ForCausalLM.forward: tanh(logits / cap) * cap"),)
    return decoder(c, family, label, cls=cls, file=file, act_key="hidden_activation", rmsnorm="fp32",
                   head_dim=c["head_dim"], qkv_bias=bias, o_bias=bias, norm_placement="sandwich",
                   attn_softcap=attn_cap is not None, final_softcap=final_cap is not None, **sdpa,
                   sliding_window=window(c, family, "sliding_attention" in kinds),
                   sources=(("norm_placement", f"{file} {cls}DecoderLayer.forward: input, "
                                               "post_attention, pre_feedforward and post_feedforward norms"),
                            *sources), **traits)


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Gemma 2's TransformerConfig and traits."""
    return sandwich(c, family, label, cls="Gemma2", file=modeling_file("gemma2"), pattern=2, softcaps=SOFTCAPS)


FAMILY = Family.single("gemma2", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
