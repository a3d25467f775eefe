"""Mixtral (``model_type`` mixtral): Mistral's attention and a sparse MoE block of grouped experts in place of the
MLP; its jitter noise and router-logits auxiliary loss are refused, not approximated; transformers
``models/mixtral/modeling_mixtral.py``."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import alias_notes, decoder, experts, modeling_file, refuse_router_logits, window
from memlab.predict.families.family import Family
from memlab.predict.families.keys import AUX_LOSS, EPSILON, ROPE_NEUTRAL, WINDOW, listed_account
from memlab.predict.families.llama import ORDER
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": None, "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 131072,
    "hidden_act": "silu", "num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": False,
    "router_jitter_noise": 0.0, "tie_word_embeddings": False,
}
"""``MixtralConfig``'s defaults of the keys the builder reads."""

ALIASES = {"num_experts": "num_local_experts"}
"""``MixtralConfig.attribute_map`` (:attr:`~memlab.predict.families.family.Family.aliases`)."""

KEYS = listed_account(
    "mixtral",
    {"head_dim": "TransformerConfig.attn_head_dim (null: hidden_size / num_attention_heads)",
     "hidden_act": "Implementation.activation", "sliding_window": WINDOW,
     "num_local_experts": "TransformerConfig.n_experts (3-D expert tensors: Implementation.grouped_experts)",
     "num_experts_per_tok": "TransformerConfig.top_k (the (token, choice) pairs every MoE tensor is sized by)",
     **alias_notes(ALIASES, "mixtral")},
    {"rms_norm_eps": EPSILON, **ROPE_NEUTRAL,
     "router_aux_loss_coef": "the auxiliary loss's weight, read only with output_router_logits (refused when "
                             "true): a Python float"},
    {"output_router_logits": AUX_LOSS,
     "router_jitter_noise": ("above 0 raises ConfigError (the training-time noise on the MoE input is not "
                             "modelled)", (0, 0.0))})

FILE = modeling_file("mixtral")


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Mixtral's TransformerConfig and traits (:attr:`~memlab.predict.spec.traits.Implementation.grouped_experts`)."""
    refuse_router_logits(c, family)
    if c["router_jitter_noise"] != 0:
        raise ConfigError("mixtral: router_jitter_noise > 0 (a noise tensor multiplied into the MoE input in "
                          "training) is not modelled; set 0.0")
    n, top_k = experts(c, family)
    dense = decoder(c, family, label, cls="Mixtral", file=FILE, head_dim=c["head_dim"], grouped_experts=True,
                    sliding_window=window(c, family),
                    sources=(("grouped_experts", f"{FILE} MixtralSparseMoeBlock, MixtralTopKRouter (fp32 softmax, "
                                                 "top-k), MixtralExperts 3-D gate_up_proj/down_proj; "
                                                 "transformers/integrations/moe.py grouped_mm_experts_forward"),))
    return dense.with_(n_experts=n, top_k=top_k)


FAMILY = Family.single("mixtral", defaults=DEFAULTS, keys=KEYS, build=build, param_order=ORDER,
                       aliases={"mixtral": ALIASES})
