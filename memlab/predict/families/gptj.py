"""GPT-J (``model_type`` gptj): a parallel block under one LayerNorm, rotary on ``rotary_dim`` of each head with
tables repeated per use, q and k upcast to fp32 in eager attention, a biased LM head; transformers
``models/gptj/modeling_gptj.py``."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import GPT_ALIASES, alias_notes, hf_activation, modeling_file
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPSILON, listed_account
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation

DEFAULTS: dict[str, Any] = {
    "n_embd": 4096, "n_layer": 28, "n_head": 16, "n_inner": None, "vocab_size": 50400, "n_positions": 2048,
    "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    "tie_word_embeddings": False,
}
"""``GPTJConfig``'s defaults of the keys the builder reads."""

KEYS = listed_account(
    "gptj",
    {"n_embd": "TransformerConfig.d_model", "n_layer": "TransformerConfig.n_layers",
     "n_head": "TransformerConfig.n_heads", "n_inner": "TransformerConfig.d_ff (null: 4 n_embd)",
     "n_positions": "TransformerConfig.max_seq (rotary: a sinusoid buffer, no parameter)",
     "rotary_dim": "Implementation.rotary_fraction (rotary_dim / head_dim)",
     "activation_function": "Implementation.activation", "resid_pdrop": "TransformerConfig.dropout",
     "embd_pdrop": "Implementation.embedding_dropout", "attn_pdrop": "Implementation.attention_dropout",
     **alias_notes(GPT_ALIASES, "gptj")},
    {"layer_norm_epsilon": EPSILON,
     **{k: "not a GPTJConfig field and modeling_gptj.py does not read it (n_inner, n_head and attn_pdrop are "
           "GPT-J's)" for k in ("intermediate_size", "num_key_value_heads", "attention_dropout")}})

FILE = modeling_file("gptj")


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """GPT-J's TransformerConfig and traits."""
    d, a = c["n_embd"], c["n_head"]
    if d % a:
        raise ConfigError(f"gptj: n_head={a} must divide n_embd={d}")
    rot = c.get("rotary_dim")
    hd = d // a
    if rot is not None and (isinstance(rot, bool) or not isinstance(rot, int) or not 0 < rot <= hd or rot % 2):
        raise ConfigError(f"gptj: rotary_dim must be an even int in (0, head_dim={hd}] or null, got {rot!r:.40}")
    impl = Implementation(
        family=family, activation=hf_activation(c["activation_function"], "activation_function", family),
        parallel_block=True, shared_norm=True, rotary_tables_per_use=True, eager_qk_fp32=True,
        rotary_fraction=(rot or hd) / hd, qkv_bias=False,
        o_bias=False, mlp_bias=True, head_bias=True, embedding_dropout=float(c["embd_pdrop"]),
        sources=(("activation", f"{FILE} GPTJMLP: fc_out(act(fc_in(x))), ACT2FN[activation_function]"),
                 ("parallel_block", f"{FILE} GPTJBlock.forward: attn + mlp + residual from ln_1 alone"),
                 ("rotary_tables_per_use", f"{FILE} apply_rotary_pos_emb: repeat_interleave(sin/cos) per call"),
                 ("eager_qk_fp32", f"{FILE} eager_attention_forward: query.to(float32), key.to(float32)"),
                 ("rotary_fraction", f"{FILE} GPTJAttention.forward: rotary_dim of head_dim, torch.cat"),
                 ("head_bias", f"{FILE} GPTJForCausalLM.lm_head = nn.Linear(n_embd, vocab_size) (bias)"),
                 ("embedding_dropout", f"{FILE} GPTJModel.drop (embd_pdrop)")),
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["n_layer"], n_heads=a, d_ff=c["n_inner"] or 4 * d,
        vocab_size=c["vocab_size"], max_seq=c["n_positions"], mlp="gelu", positions="rotary", norm="layernorm",
        bias=True, tied_embeddings=bool(c["tie_word_embeddings"]), dropout=float(c["resid_pdrop"]), impl=impl,
    )


FAMILY = Family.single(
    "gptj", defaults=DEFAULTS, keys=KEYS, build=build,
    # GPTJBlock: ln_1, attn (k_proj, v_proj, q_proj, out_proj), mlp
    param_order=("norm", "attn.k.", "attn.v.", "attn.q.", "attn.o.", "mlp."),
    attention_dropout_key="attn_pdrop", aliases={"gptj": GPT_ALIASES},
)
