"""Qwen's mixtures of experts, two ``model_type`` values in one module: Qwen3-MoE (``qwen3_moe``) and Qwen2-MoE
(``qwen2_moe``: Qwen1.5-MoE, Qwen2-57B-A14B). Their transformers files share the router and grouped experts
(``Qwen3MoeTopKRouter`` and ``Qwen3MoeExperts`` are Qwen2-MoE's, ``modular_qwen3_moe.py``); Qwen2-MoE adds a gated
shared expert and dense layers between the MoE ones. transformers ``models/qwen3_moe/modeling_qwen3_moe.py``,
``models/qwen2_moe/modeling_qwen2_moe.py``."""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.common import (
    alias_notes,
    decoder,
    experts,
    layer_kinds,
    modeling_file,
    refuse_router_logits,
    window,
)
from memlab.predict.families.family import Family
from memlab.predict.families.keys import (
    AUX_LOSS,
    EPSILON,
    LAYER_TYPES,
    ROPE_NEUTRAL,
    WINDOW,
    listed_account,
)
from memlab.predict.families.llama import ORDER
from memlab.predict.spec.model import TransformerConfig

DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 4,
                  "head_dim": None, "moe_intermediate_size": 768, "vocab_size": 151936,
                  "max_position_embeddings": 32768, "hidden_act": "silu", "num_experts": 128,
                  "num_experts_per_tok": 8, "norm_topk_prob": False, "output_router_logits": False,
                  "decoder_sparse_step": 1, "attention_bias": False, "use_sliding_window": False,
                  "tie_word_embeddings": False},
    "qwen2_moe": {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                  "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                  "vocab_size": 151936, "max_position_embeddings": 32768, "hidden_act": "silu", "num_experts": 60,
                  "num_experts_per_tok": 4, "norm_topk_prob": False, "output_router_logits": False,
                  "decoder_sparse_step": 1, "qkv_bias": True, "use_sliding_window": False,
                  "tie_word_embeddings": False},
}
"""``Qwen3MoeConfig``'s and ``Qwen2MoeConfig``'s defaults of the keys the builders read (Qwen3-MoE's expert count
under its dataclass field's name, ``num_experts``: a ``num_local_experts`` the config gives wins over it,
:func:`memlab.predict.families.common.experts`)."""

QWEN3_ALIASES = {"num_local_experts": "num_experts"}
"""``Qwen3MoeConfig.attribute_map`` maps ``num_experts`` onto ``num_local_experts``, but its dataclass field is
``num_experts``: a given ``num_local_experts`` is the keyword set last, and wins
(:attr:`~memlab.predict.families.family.Family.aliases`)."""
_DENSE = " (dense layers between MoE ones are not modelled)"
_AUX_WEIGHT = ("the auxiliary loss's weight, read only with output_router_logits (refused when true): a Python "
               "float")
_ROUTED = {
    "num_experts_per_tok": "TransformerConfig.top_k (the (token, choice) pairs every MoE tensor is sized by)",
    "norm_topk_prob": "Implementation.moe_topk_renorm (the fp32 top-k values and their sum kept)",
}

KEYS = {
    "qwen3_moe": listed_account(
        "qwen_moe",
        {"head_dim": "TransformerConfig.attn_head_dim (absent: hidden_size / num_attention_heads)",
         "hidden_act": "Implementation.activation", "attention_bias": "Implementation.qkv_bias and o_bias",
         "sliding_window": WINDOW,
         "use_sliding_window": "whether sliding_window applies (Qwen3MoeConfig sets it to None otherwise)",
         "moe_intermediate_size": "TransformerConfig.d_ff (each expert's width)",
         "num_experts": "TransformerConfig.n_experts (3-D expert tensors: Implementation.grouped_experts)",
         **alias_notes(QWEN3_ALIASES, "qwen_moe"),
         **_ROUTED},
        {"rms_norm_eps": EPSILON, **ROPE_NEUTRAL, "router_aux_loss_coef": _AUX_WEIGHT,
         "intermediate_size": "the width of dense MLP layers, which exist only with mlp_only_layers or "
                              "decoder_sparse_step > 1 (refused): no tensor of a modelled step",
         "max_window_layers": "in older config.json files; Qwen3MoeConfig keeps no layer types (any window applies "
                              "to every layer with use_sliding_window)"},
        {"output_router_logits": AUX_LOSS,
         "decoder_sparse_step": ("other than 1 raises ConfigError" + _DENSE, (1,)),
         "mlp_only_layers": ("a non-empty list raises ConfigError" + _DENSE, ([], None))}),
    "qwen2_moe": listed_account(
        "qwen_moe",
        {"hidden_act": "Implementation.activation", "qkv_bias": "Implementation.qkv_bias (o_proj has none)",
         "sliding_window": WINDOW, "layer_types": LAYER_TYPES,
         "use_sliding_window": "whether sliding_window applies (Qwen2MoeConfig sets it to 0 otherwise)",
         "moe_intermediate_size": "TransformerConfig.d_ff (each routed expert's width)",
         "shared_expert_intermediate_size": "Implementation.shared_expert_ff (the gated shared expert's width)",
         "num_experts": "TransformerConfig.n_experts (3-D expert tensors: Implementation.grouped_experts)",
         **_ROUTED,
         "decoder_sparse_step": "Implementation.dense_layers (each layer i with (i + 1) % step != 0 is dense)",
         "mlp_only_layers": "Implementation.dense_layers (these layers' MLP is dense)",
         "intermediate_size": "Implementation.dense_ff (the dense layers' MLP width; no tensor without them)"},
        {"rms_norm_eps": EPSILON, **ROPE_NEUTRAL, "router_aux_loss_coef": _AUX_WEIGHT,
         "max_window_layers": "which layers slide with use_sliding_window, already in layer_types (without them "
                              "memlab assumes some layer slides: the window applies)"},
        {"output_router_logits": AUX_LOSS}),
}


def _qwen3_moe(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Qwen3-MoE: Qwen3's attention (per-head q/k norm) and a sparse MoE block in every layer, experts of width
    ``moe_intermediate_size``; dense layers between them (``mlp_only_layers``, ``decoder_sparse_step`` > 1) and the
    router-logits auxiliary loss are refused."""
    file = modeling_file("qwen3_moe")
    refuse_router_logits(c, family)
    if c["decoder_sparse_step"] != 1 or c.get("mlp_only_layers"):
        raise ConfigError(f"{family}: decoder_sparse_step != 1 or a non-empty mlp_only_layers (dense MLP layers "
                          "between the MoE ones) is not modelled; memlab models an MoE block in every layer")
    n, top_k = experts(c, family)
    bias = bool(c["attention_bias"])
    dense = decoder({**c, "intermediate_size": c["moe_intermediate_size"]}, family, label, cls="Qwen3Moe", file=file,
                    head_dim=c["head_dim"], qkv_bias=bias, o_bias=bias, qk_norm="head", grouped_experts=True,
                    moe_topk_renorm=bool(c["norm_topk_prob"]), moe_weights_fp32=False,
                    sliding_window=window(c, family, bool(c["use_sliding_window"])),
                    sources=(("qk_norm", f"{file} Qwen3MoeAttention.forward: q_norm/k_norm over head_dim"),
                             ("grouped_experts", f"{file} Qwen3MoeSparseMoeBlock, Qwen3MoeTopKRouter, "
                                                 "Qwen3MoeExperts; integrations/moe.py grouped_mm_experts_forward"),
                             ("moe_weights_fp32", f"{file} Qwen3MoeTopKRouter.forward: "
                                                  "router_top_value.to(router_logits.dtype)")))
    return dense.with_(n_experts=n, top_k=top_k)


def _dense_layers(c: dict[str, Any], family: str) -> tuple[int, ...]:
    """The layers whose MLP is dense (Qwen2MoeDecoderLayer: in ``mlp_only_layers``, or ``(i + 1) %
    decoder_sparse_step != 0``), checked: a list of ints (an index past the last layer names none, as in
    transformers), and at least one MoE layer left."""
    n, step, only = c["num_hidden_layers"], c["decoder_sparse_step"], c.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise ConfigError(f"HF {family} config: mlp_only_layers must be a list of layer indices, got {only!r:.60}")
    dense = tuple(i for i in range(n) if i in only or (i + 1) % step)
    if len(dense) == n:
        raise ConfigError(f"{family}: decoder_sparse_step={step} and mlp_only_layers leave no MoE layer of {n}; "
                          "a model without one is a dense Qwen2 (model_type qwen2)")
    return dense


def _qwen2_moe(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Qwen2-MoE: Qwen2's attention (q/k/v bias with ``qkv_bias``, none on o) and in every layer a sparse MoE block
    of grouped experts ``moe_intermediate_size`` wide plus a shared expert
    (:attr:`~memlab.predict.spec.traits.Implementation.shared_expert_ff`) that every token runs through, scaled by
    its sigmoid gate; dense layers between the MoE ones (``mlp_only_layers``, ``decoder_sparse_step`` > 1) are
    :attr:`~memlab.predict.spec.traits.Implementation.dense_layers`, ``intermediate_size`` wide. The router-logits
    auxiliary loss is refused: its top-k indices are packed for backward and freed in forward (the value output
    is dropped), which the saved-tensor recorder cannot yet tell from a kept tensor."""
    file = modeling_file("qwen2_moe")
    refuse_router_logits(c, family)
    n, top_k = experts(c, family)
    dense = _dense_layers(c, family)
    kinds = layer_kinds(c, family) or {"sliding_attention"}  # without layer_types: assume some layer slides
    slide = window(c, family, bool(c["use_sliding_window"]) and "sliding_attention" in kinds)
    model = decoder({**c, "intermediate_size": c["moe_intermediate_size"]}, family, label, cls="Qwen2Moe", file=file,
                    qkv_bias=bool(c["qkv_bias"]), o_bias=False, grouped_experts=True,
                    dense_layers=dense, dense_ff=c["intermediate_size"] if dense else 0,
                    moe_topk_renorm=bool(c["norm_topk_prob"]), moe_weights_fp32=False,
                    shared_expert_ff=c["shared_expert_intermediate_size"], sliding_window=slide,
                    sources=(("qkv_bias", f"{file} Qwen2MoeAttention: q/k/v_proj bias=config.qkv_bias, o_proj "
                                          "bias=False"),
                             ("grouped_experts", f"{file} Qwen2MoeSparseMoeBlock, Qwen2MoeTopKRouter, "
                                                 "Qwen2MoeExperts; integrations/moe.py grouped_mm_experts_forward"),
                             ("moe_weights_fp32", f"{file} Qwen2MoeTopKRouter.forward: "
                                                  "router_top_value.to(router_logits.dtype)"),
                             ("shared_expert_ff", f"{file} Qwen2MoeSparseMoeBlock.forward: "
                                                  "sigmoid(shared_expert_gate(x)) * shared_expert(x)"),
                             ("dense_layers", f"{file} Qwen2MoeDecoderLayer.__init__: Qwen2MoeMLP(intermediate_size) "
                                              "in mlp_only_layers or where (i + 1) % decoder_sparse_step")))
    return model.with_(n_experts=n, top_k=top_k)


def build(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """The TransformerConfig and traits of a ``qwen3_moe`` or ``qwen2_moe`` config."""
    return (_qwen3_moe if family == "qwen3_moe" else _qwen2_moe)(c, family, label)


FAMILY = Family(
    ("qwen3_moe", "qwen2_moe"), DEFAULTS, KEYS, build,
    {  # Qwen3MoeSparseMoeBlock.__init__ assigns the experts before the router (``gate``)
        "qwen3_moe": ("attn.q.", "attn.k.", "attn.v.", "attn.o.", "attn.q_norm", "attn.k_norm", "mlp.experts",
                      "mlp.router", "mlp.", "norm"),
        "qwen2_moe": ORDER,
    },
    aliases={"qwen3_moe": QWEN3_ALIASES},
)
