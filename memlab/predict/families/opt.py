"""OPT (``model_type`` opt): learned positions offset by 2, ReLU, pre-norm only; transformers
``models/opt/modeling_opt.py``."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import hf_activation, src
from memlab.predict.families.family import Family
from memlab.predict.families.keys import NOT_READ, TRACED, builder_note, key_account
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation

DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "ffn_dim": 3072,
    "vocab_size": 50272, "max_position_embeddings": 2048, "activation_function": "relu", "dropout": 0.1,
    "enable_bias": True, "do_layer_norm_before": True, "word_embed_proj_dim": None, "tie_word_embeddings": True,
}
"""``OPTConfig``'s defaults of the keys the builder reads."""


def _b(what: str) -> str:
    return builder_note("opt", what)


KEYS = key_account(
    {"hidden_size": _b("d_model"), "num_hidden_layers": _b("n_layers"),
     "num_attention_heads": _b("n_heads"), "ffn_dim": _b("d_ff"),
     "max_position_embeddings": _b("max_seq, the learned table"),
     "activation_function": _b("Implementation.activation"), "dropout": _b("dropout"),
     "enable_bias": _b("Implementation.qkv_bias, o_bias, mlp_bias: the linears' biases; the LayerNorms keep "
                       "theirs"),
     "attention_dropout": "memlab/predict/families/reader.py from_hf (Implementation.attention_dropout)"},
    {"init_std": "initial values, not sizes" + TRACED,
     "activation_dropout": NOT_READ + " (modeling_opt.py has no activation dropout)" + TRACED},
    {"do_layer_norm_before": ("ConfigError unless true: post-norm OPT (opt-350m) is not modelled (opt.build)",
                              (True,)),
     "word_embed_proj_dim": ("ConfigError unless null or hidden_size: project_in/project_out are not "
                             "modelled (opt.build)", (None,)),
     "_remove_final_layer_norm": ("ConfigError unless false: no final norm is not modelled", (False,)),
     "layer_norm_elementwise_affine": ("ConfigError unless true: norms without weights change the parameter "
                                       "count (traced -3,880 B on tiny opt)", (True,)),
     "layerdrop": ("ConfigError unless 0: dropping whole layers at random is not modelled", (0, 0.0))},
    rope=False)


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """OPT's TransformerConfig and traits (pre-norm, ``word_embed_proj_dim`` == ``hidden_size`` only).
    ``enable_bias`` sets the linears' biases only: ``OPTDecoderLayer`` builds ``nn.LayerNorm(embed_dim,
    elementwise_affine=...)``, which has a bias whatever ``enable_bias`` says (``TransformerConfig.bias`` stays
    True for the norms)."""
    d = c["hidden_size"]
    linear_bias = bool(c["enable_bias"])
    if not c["do_layer_norm_before"] or (c["word_embed_proj_dim"] or d) != d:
        raise ConfigError("opt: only pre-norm OPT with word_embed_proj_dim == hidden_size is modelled (not opt-350m's "
                          "post-norm with project_in/project_out)")
    impl = Implementation(
        family=family, activation=hf_activation(c["activation_function"], "activation_function", family),
        position_offset=2, position_ids_per_token=True, softmax_fp32=True,
        qkv_bias=linear_bias, o_bias=linear_bias, mlp_bias=linear_bias,
        sources=(("qkv_bias", src("opt", "modeling_opt.py OPTAttention/OPTDecoderLayer: q/k/v/out_proj, fc1, fc2 "
                                         "bias=config.enable_bias; the LayerNorms always have a bias")),
                 ("activation", src("opt", "modeling_opt.py OPTDecoderLayer.fc1 -> ACT2FN['relu']")),
                 ("softmax_fp32", src("opt", "modeling_opt.py eager_attention_forward: softmax(dtype=float32)")),
                 ("position_offset", src("opt", "modeling_opt.py OPTLearnedPositionalEmbedding (offset 2)")),
                 ("position_ids_per_token", src("opt", "modeling_opt.py OPTDecoder.forward: position_ids from "
                                                       "torch.cumsum(attention_mask)"))),
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"], d_ff=c["ffn_dim"],
        vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp="gelu", positions="learned",
        norm="layernorm", bias=True, tied_embeddings=bool(c["tie_word_embeddings"]),
        dropout=float(c["dropout"]), impl=impl,
    )


FAMILY = Family.single(
    "opt", defaults=DEFAULTS, keys=KEYS, build=build,
    # OPTDecoderLayer: self_attn (k, v, q, out), self_attn_layer_norm, fc1, fc2, final_layer_norm
    param_order=("attn.k.", "attn.v.", "attn.q.", "attn.o.", "norm1", "mlp.up", "mlp.down", "norm2"),
    # OPTDecoder.__init__: embed_tokens, embed_positions, final_layer_norm, then layers
    top_order=("tok_emb.", "pos_emb.", "norm_f.", "blocks.", "head."),
)
