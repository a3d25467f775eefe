"""Gemma (``model_type`` gemma): GeGLU (tanh GELU), RMSNorm computed in fp32 with ``1 + weight``, a 256-wide head_dim,
tied embeddings; transformers ``models/gemma/modeling_gemma.py``."""

from __future__ import annotations

from typing import Any

from memlab.predict.families.common import hf_activation, src
from memlab.predict.families.family import Family
from memlab.predict.families.keys import EPS, NO_PARTIAL, TRACED, builder_note, key_account
from memlab.predict.families.llama import LLAMA_MODELLED, ORDER
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation

DEFAULTS: dict[str, Any] = {
    "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
    "head_dim": 256, "intermediate_size": 24576, "vocab_size": 256000, "max_position_embeddings": 8192,
    "hidden_act": "gelu_pytorch_tanh", "attention_bias": False, "tie_word_embeddings": True,
}
"""``GemmaConfig``'s defaults of the keys the builder reads."""

NOT_HIDDEN_ACTIVATION = ("GemmaConfig (5.x) has no such field and modeling_gemma.py does not read it: GemmaMLP is "
                         "ACT2FN[config.hidden_act] (Gemma 2 and 3 read hidden_activation)" + TRACED)

KEYS = key_account(
    {k: builder_note("gemma", v) for k, v in {**LLAMA_MODELLED, "hidden_act": "Implementation.activation ('gelu' "
                                                                             "read as gelu_pytorch_tanh)",
                                               "attention_bias": "Implementation.qkv_bias, o_bias"}.items()},
    {"rms_norm_eps": EPS, "hidden_activation": NOT_HIDDEN_ACTIVATION},
    {**NO_PARTIAL, "use_bidirectional_attention": ("ConfigError unless false: bidirectional attention "
                                                   "changes the mask", (False, None))})


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Gemma's TransformerConfig and traits. The activation is ``hidden_act``, a legacy ``gelu`` read as
    ``gelu_pytorch_tanh`` (``GemmaConfig.__post_init__``, transformers 5.x ``configuration_gemma.py``)."""
    d, a, head_dim = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    act = "gelu_pytorch_tanh" if c["hidden_act"] == "gelu" else c["hidden_act"]
    impl = Implementation(
        family=family, activation=hf_activation(act, "hidden_act", family), eager_repeat_kv=True,
        softmax_fp32=True, rmsnorm="fp32", rotary_tables_per_forward=True,
        qkv_bias=bool(c["attention_bias"]), o_bias=bool(c["attention_bias"]),
        sources=(("activation", src("gemma", "modeling_gemma.py GemmaMLP: down(act(gate) * up), GELUTanh")),
                 ("eager_repeat_kv", src("gemma", "modeling_gemma.py repeat_kv (eager_attention_forward)")),
                 ("softmax_fp32", src("gemma", "modeling_gemma.py eager_attention_forward: softmax(..., "
                                               "dtype=torch.float32)")),
                 ("rmsnorm", src("gemma", "modeling_gemma.py GemmaRMSNorm.forward: x.float(), "
                                          "output * (1.0 + self.weight.float())")),
                 ("rotary_tables_per_forward", src("gemma", "modeling_gemma.py GemmaRotaryEmbedding.forward"))),
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=a, n_kv_heads=c["num_key_value_heads"],
        d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp="swiglu",
        positions="rotary", norm="rmsnorm", bias=False, tied_embeddings=bool(c["tie_word_embeddings"]),
        attn_head_dim=None if head_dim * a == d else head_dim, impl=impl,
    )


FAMILY = Family.single("gemma", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER)
