"""GPT-2 (``model_type`` gpt2): learned positions, a fused ``c_attn`` (Conv1D), the composed ``gelu_new``; transformers
``models/gpt2/modeling_gpt2.py``."""

from __future__ import annotations

from typing import Any

from memlab.predict.families.common import GPT_ALIASES, alias_notes, hf_activation, optional, src
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPS, TRACED, builder_note, key_account
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation
from memlab.predict.spec.validate import check_number

DEFAULTS: dict[str, Any] = {
    "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "vocab_size": 50257, "n_positions": 1024,
    "activation_function": "gelu_new", "resid_pdrop": 0.1, "attn_pdrop": 0.1, "embd_pdrop": 0.1,
    "tie_word_embeddings": True, "scale_attn_weights": True,
}
"""``GPT2Config``'s defaults of the keys the builder reads."""


def _b(what: str) -> str:
    return builder_note("gpt2", what)


KEYS = key_account(
    {"n_embd": _b("d_model"), "n_layer": _b("n_layers"), "n_head": _b("n_heads"),
     "n_inner": _b("d_ff"), "n_positions": _b("max_seq, the learned table"),
     "activation_function": _b("Implementation.activation"),
     "resid_pdrop": _b("dropout"), "attn_pdrop": "memlab/predict/families/reader.py from_hf "
                                                 "(Implementation.attention_dropout)",
     "embd_pdrop": _b("Implementation.embedding_dropout"), **alias_notes(GPT_ALIASES, "gpt2")},
    {"layer_norm_epsilon": EPS,
     **{k: "the sequence-summary head of GPT2DoubleHeadsModel, not the causal LM" + TRACED for k in (
         "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
         "summary_first_dropout")}},
    {"reorder_and_upcast_attn": ("ConfigError unless false: the fp32 baddbmm path keeps other tensors "
                                 "(traced +327,680 B on tiny gpt2), not modelled", (False,)),
     "scale_attn_weights": ("ConfigError unless true: the estimate follows the scaled eager attention",
                            (True,)),
     "scale_attn_by_inverse_layer_idx": ("ConfigError unless false: an extra op on the scores, not modelled",
                                         (False,))},
    rope=False)


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """GPT-2's TransformerConfig and traits."""
    d = c["n_embd"]
    impl = Implementation(
        family=family, activation=hf_activation(c["activation_function"], "activation_function", family),
        fused_qkv=True, q_view_of_fused_qkv=True, checkpoint_keeps_mask=True, autocast_mask_promotes_scores=True,
        embedding_dropout=optional(c, "embd_pdrop", family, check_number, 0.0),
        sources=(("activation", src("gpt2", "modeling_gpt2.py GPT2MLP (ACT2FN[activation_function]); "
                                            "activations.py NewGELUActivation")),
                 ("fused_qkv", src("gpt2", "modeling_gpt2.py GPT2Attention.c_attn (Conv1D)")),
                 ("q_view_of_fused_qkv", src("gpt2", "modeling_gpt2.py GPT2Attention.forward: "
                                                     "c_attn(hidden_states).split(split_size, dim=2)")),
                 ("embedding_dropout", src("gpt2", "modeling_gpt2.py GPT2Model.drop (embd_pdrop)")),
                 ("autocast_mask_promotes_scores", src("gpt2", "modeling_gpt2.py eager_attention_forward: "
                                                               "attn_weights + causal_mask (fp32)")),
                 ("checkpoint_keeps_mask", src("gpt2", "modeling_gpt2.py GPT2Block called with the causal mask "
                                                       "as a positional argument"))),
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["n_layer"], n_heads=c["n_head"], d_ff=c["n_inner"] or 4 * d,
        vocab_size=c["vocab_size"], max_seq=c["n_positions"], mlp="gelu", positions="learned", norm="layernorm",
        bias=True, tied_embeddings=bool(c["tie_word_embeddings"]), dropout=float(c["resid_pdrop"]), impl=impl,
    )


FAMILY = Family.single(
    "gpt2", defaults=DEFAULTS, keys=KEYS, build=build,
    # GPT2Block: ln_1, attn (c_attn, c_proj), ln_2, mlp: memlab's own order
    param_order=("norm1", "attn.", "norm2", "mlp."),
    attention_dropout_key="attn_pdrop", aliases={"gpt2": GPT_ALIASES},
)
