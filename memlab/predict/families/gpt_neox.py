"""GPT-NeoX (``model_type`` gpt_neox; Pythia): a parallel block, a fused ``query_key_value``, partial rotary;
transformers ``models/gpt_neox/modeling_gpt_neox.py``."""

from __future__ import annotations

from typing import Any

from memlab.predict.families.common import hf_activation, optional, src
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPS, PARTIAL, builder_note, key_account
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation
from memlab.predict.spec.validate import check_number

DEFAULTS: dict[str, Any] = {
    "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64, "intermediate_size": 24576,
    "vocab_size": 50432, "max_position_embeddings": 2048, "hidden_act": "gelu", "rotary_pct": 0.25,
    "use_parallel_residual": True, "hidden_dropout": 0.0, "attention_bias": True, "tie_word_embeddings": False,
}
"""``GPTNeoXConfig``'s defaults of the keys the builder reads."""


def _b(what: str) -> str:
    return builder_note("gpt_neox", what)


KEYS = key_account(
    {"hidden_size": _b("d_model"), "num_hidden_layers": _b("n_layers"),
     "num_attention_heads": _b("n_heads"), "intermediate_size": _b("d_ff"),
     "max_position_embeddings": _b("max_seq"), "hidden_act": _b("Implementation.activation"),
     "use_parallel_residual": _b("Implementation.parallel_block"),
     "attention_bias": _b("Implementation.qkv_bias, o_bias"),
     "hidden_dropout": _b("dropout, Implementation.embedding_dropout"),
     "attention_dropout": "memlab/predict/families/reader.py from_hf (Implementation.attention_dropout)",
     "rotary_pct": _b("Implementation.rotary_fraction (the 4.x key)"),
     **{k: _b(v) for k, v in PARTIAL.items()}},
    {"layer_norm_eps": EPS, "classifier_dropout": "the classification head's dropout, not the causal LM",
     "rotary_emb_base": "the 4.x spelling of rope_parameters.rope_theta: values, not shapes"},
    {})


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """GPT-NeoX's TransformerConfig and traits."""
    parallel = bool(c["use_parallel_residual"])
    impl = Implementation(
        family=family, activation=hf_activation(c["hidden_act"], "hidden_act", family), parallel_block=parallel,
        fused_qkv=True, rotary_tables_per_forward=True, rotary_fraction=c["_rotary_fraction"],
        sdpa_output_copy=True, qkv_bias=bool(c["attention_bias"]), o_bias=bool(c["attention_bias"]), softmax_fp32=True,
        embedding_dropout=optional(c, "hidden_dropout", family, check_number, 0.0),
        sources=(("activation", src("gpt_neox", "modeling_gpt_neox.py GPTNeoXMLP (ACT2FN[hidden_act])")),
                 ("parallel_block", src("gpt_neox", "modeling_gpt_neox.py GPTNeoXLayer.forward "
                                                    "(use_parallel_residual)")),
                 ("fused_qkv", src("gpt_neox", "modeling_gpt_neox.py GPTNeoXAttention.query_key_value")),
                 ("softmax_fp32", src("gpt_neox", "modeling_gpt_neox.py eager_attention_forward: "
                                                  "softmax(dtype=float32)")),
                 ("rotary_fraction", src("gpt_neox", "modeling_gpt_neox.py apply_rotary_pos_emb (rotary_pct)")),
                 ("sdpa_output_copy", src("gpt_neox", "modeling_gpt_neox.py apply_rotary_pos_emb: torch.cat "
                                                      "makes q, k contiguous in (b, a, s, d)"))),
    )
    return TransformerConfig(
        name=label, d_model=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
        d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp="gelu",
        positions="rotary", norm="layernorm", bias=True, tied_embeddings=bool(c["tie_word_embeddings"]),
        dropout=float(c["hidden_dropout"]), impl=impl,
    )


FAMILY = Family.single(
    "gpt_neox", defaults=DEFAULTS, keys=KEYS, build=build,
    param_order=("norm", "attn.", "mlp."),  # GPTNeoXLayer: both norms, then attention, then the MLP
    rotary_key="rotary_pct",
)
