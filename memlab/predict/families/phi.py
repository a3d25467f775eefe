"""Phi (``model_type`` phi; Phi-1, 1.5, 2): a parallel block under one shared LayerNorm, partial rotary, a biased LM
head; transformers ``models/phi/modeling_phi.py``."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import hf_activation, optional, src
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPS, PARTIAL, builder_note, key_account
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation
from memlab.predict.spec.validate import check_number

DEFAULTS: dict[str, Any] = {
    "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": None,
    "intermediate_size": 8192, "vocab_size": 51200, "max_position_embeddings": 2048, "hidden_act": "gelu_new",
    "partial_rotary_factor": 0.5, "resid_pdrop": 0.0, "qk_layernorm": False, "tie_word_embeddings": False,
}
"""``PhiConfig``'s defaults of the keys the builder reads."""


def _b(what: str) -> str:
    return builder_note("phi", what)


KEYS = key_account(
    {"hidden_size": _b("d_model"), "num_hidden_layers": _b("n_layers"),
     "num_attention_heads": _b("n_heads"), "num_key_value_heads": _b("n_kv_heads"),
     "intermediate_size": _b("d_ff"), "max_position_embeddings": _b("max_seq"),
     "hidden_act": _b("Implementation.activation"), "resid_pdrop": _b("dropout"),
     "embd_pdrop": _b("Implementation.embedding_dropout"),
     "attention_dropout": "memlab/predict/families/reader.py from_hf (Implementation.attention_dropout)",
     "partial_rotary_factor": _b("Implementation.rotary_fraction (the 4.x key)"),
     **{k: _b(v) for k, v in PARTIAL.items()}},
    {"layer_norm_eps": EPS},
    {"qk_layernorm": ("ConfigError unless false: the q/k layer norms are not modelled (phi.build)", (False,))})


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Phi's TransformerConfig and traits (``qk_layernorm`` refused)."""
    if c["qk_layernorm"]:
        raise ConfigError("phi: qk_layernorm=True is not modelled; use a config with qk_layernorm false")
    impl = Implementation(
        family=family, activation=hf_activation(c["hidden_act"], "hidden_act", family), parallel_block=True,
        shared_norm=True, eager_repeat_kv=True, rotary_tables_per_forward=True, rotary_fraction=c["_rotary_fraction"],
        sdpa_output_copy=True, head_bias=True, softmax_fp32=True,
        embedding_dropout=optional(c, "embd_pdrop", family, check_number, 0.0),
        sources=(("activation", src("phi", "modeling_phi.py PhiMLP (ACT2FN['gelu_new'])")),
                 ("parallel_block", src("phi", "modeling_phi.py PhiDecoderLayer.forward: attn + mlp + residual")),
                 ("shared_norm", src("phi", "modeling_phi.py PhiDecoderLayer.input_layernorm (the only norm)")),
                 ("eager_repeat_kv", src("phi", "modeling_phi.py repeat_kv (eager_attention_forward)")),
                 ("rotary_fraction", src("phi", "modeling_phi.py PhiAttention (partial_rotary_factor)")),
                 ("sdpa_output_copy", src("phi", "modeling_phi.py PhiAttention.forward: torch.cat of the rotated "
                                                 "and pass-through halves")),
                 ("head_bias", src("phi", "modeling_phi.py PhiForCausalLM.lm_head (bias=True)")),
                 ("softmax_fp32", src("phi", "modeling_phi.py eager_attention_forward: softmax(dtype=float32)"))),
    )
    return TransformerConfig(
        name=label, d_model=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
        n_kv_heads=c["num_key_value_heads"], d_ff=c["intermediate_size"], vocab_size=c["vocab_size"],
        max_seq=c["max_position_embeddings"], mlp="gelu", positions="rotary", norm="layernorm", bias=True,
        tied_embeddings=bool(c["tie_word_embeddings"]), dropout=float(c["resid_pdrop"]), impl=impl,
    )


FAMILY = Family.single(
    "phi", defaults=DEFAULTS, keys=KEYS, build=build,
    # PhiDecoderLayer: self_attn (q, k, v, dense), mlp (fc1, fc2), input_layernorm
    param_order=("attn.q.", "attn.k.", "attn.v.", "attn.o.", "mlp.", "norm"),
    rotary_key="partial_rotary_factor",
)
