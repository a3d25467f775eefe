"""Llama (``model_type`` llama), and the Llama-shaped builder Mistral and Qwen2 share (:func:`llama_like`: their
transformers files are copied from ``modeling_llama.py``): ``repeat_kv``, fp32 softmax and RMSNorm upcasts, rotary
tables per forward; transformers ``models/llama/modeling_llama.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memlab.predict.families.common import hf_activation, optional, src
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPS, NO_PARTIAL, NOT_READ, TRACED, builder_note, key_account
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation
from memlab.predict.spec.validate import check_bool, check_int

DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
    "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 2048, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "head_dim": None,
}
"""``LlamaConfig``'s defaults of the keys the builder reads."""

LLAMA_MODELLED = {
    "hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads", "intermediate_size": "d_ff", "max_position_embeddings": "max_seq",
    "hidden_act": "Implementation.activation", "head_dim": "attn_head_dim",
    "attention_dropout": "Implementation.attention_dropout",
}
"""The keys a Llama-shaped config's builder reads, with what they set."""


def llama_like_modelled(extra: Mapping[str, str] = ()) -> dict[str, str]:
    """The modelled keys of a family built by :func:`llama_like` (plus ``extra``)."""
    return {k: builder_note("llama", f"llama_like: {v}") for k, v in {**LLAMA_MODELLED, **dict(extra)}.items()}


KEYS = key_account(
    llama_like_modelled({"attention_bias": "Implementation.qkv_bias, o_bias", "mlp_bias": "Implementation.mlp_bias"}),
    {"rms_norm_eps": EPS, "pretraining_tp": NOT_READ + " (5.x dropped the sliced-matmul path)" + TRACED},
    NO_PARTIAL)

_SOURCES = {
    "eager_repeat_kv": "modeling_{f}.py repeat_kv (eager_attention_forward)",
    "softmax_fp32": "modeling_{f}.py eager_attention_forward: softmax(..., dtype=torch.float32).to(query.dtype)",
    "rmsnorm": "modeling_{f}.py {F}RMSNorm.forward: hidden_states.to(torch.float32)",
    "rotary_tables_per_forward": "modeling_{f}.py {F}RotaryEmbedding.forward, apply_rotary_pos_emb",
}

ORDER = ("attn.q.", "attn.k.", "attn.v.", "attn.qkv.", "attn.o.", "attn.q_norm", "attn.k_norm", "mlp.", "norm")
"""``LlamaDecoderLayer.__init__``: ``self_attn`` (q, k, v, o, then Qwen3's / OLMo 2's q_norm, k_norm), ``mlp``, the
norms (input, post-attention; Gemma 2/3's pre- and post-feedforward): the order of every Llama-shaped family."""


def llama_like(c: dict[str, Any], family: str, label: str, *, cls: str, biases: tuple[bool, bool, bool] | None = None,
               sources: tuple[tuple[str, str], ...] = (), **traits: Any) -> TransformerConfig:
    """A family written as ``modeling_llama.py`` is: ``cls`` its class prefix (``Mistral``), ``biases`` its fixed
    (qkv, o, mlp) biases (None: read from ``attention_bias`` and ``mlp_bias``), ``sources`` its own traits'."""
    d, a = c["hidden_size"], c["num_attention_heads"]
    head_dim = optional(c, "head_dim", family, check_int, None) or d // a
    if biases is None:
        qkv_bias = o_bias = optional(c, "attention_bias", family, check_bool, False)
        biases = (qkv_bias, o_bias, optional(c, "mlp_bias", family, check_bool, False))
    qkv_bias, o_bias, mlp_bias = biases
    base = tuple((k, src(family, v.format(f=family, F=cls))) for k, v in _SOURCES.items())
    impl = Implementation(
        family=family, activation=hf_activation(c["hidden_act"], "hidden_act", family), eager_repeat_kv=True,
        softmax_fp32=True, rmsnorm="fp32-input", rotary_tables_per_forward=True, qkv_bias=qkv_bias, o_bias=o_bias,
        mlp_bias=mlp_bias, sources=base + sources, **traits,
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=a, n_kv_heads=c["num_key_value_heads"],
        d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp="swiglu",
        positions="rotary", norm="rmsnorm", bias=False, tied_embeddings=bool(c["tie_word_embeddings"]),
        attn_head_dim=None if head_dim * a == d else head_dim, impl=impl,
    )


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Llama's TransformerConfig and traits."""
    return llama_like(c, family, label, cls="Llama")


FAMILY = Family.single("llama", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
