"""Key accounting for the families of :mod:`memlab.predict.families.builders`: every key of each family's
``transformers.AutoConfig.for_model(model_type).to_dict()`` (nested dicts as ``parent.child``), as modelled (where
memlab reads it: the trait or size it sets), neutral (why it cannot change memory or time as memlab counts them), or
refused (what :func:`memlab.predict.families.reader.from_hf` does with a value memlab does not model: a one-line
ConfigError, or the named setup refusal). Plain dicts, for the key-accounting table (``memlab.predict.families.keys``,
built
elsewhere) to take in.
This module imports nothing.
"""

from __future__ import annotations

from typing import Any

_BOOKKEEPING = "transformers bookkeeping (outputs, labels, names, serialisation): no tensor of the step"
_TOKEN = "a special token id: selects a row, sizes nothing"
_INIT = "initialisation scale: values of the weights, not their sizes"
_EPS = "a norm's epsilon: a value in the arithmetic, no tensor"
_ROPE = ("how cos and sin are computed (under no_grad, each forward): their values, not which tensors are saved "
         "or their sizes [modeling_rope_utils.py]")

_COMMON: dict[str, dict[str, str]] = {
    "modelled": {
        "hidden_size": "TransformerConfig.d_model",
        "num_hidden_layers": "TransformerConfig.n_layers",
        "num_attention_heads": "TransformerConfig.n_heads",
        "num_key_value_heads": "TransformerConfig.n_kv_heads",
        "intermediate_size": "TransformerConfig.d_ff",
        "vocab_size": "TransformerConfig.vocab_size (the embedding's rows as given)",
        "max_position_embeddings": "TransformerConfig.max_seq (rotary: not a table, no refusal)",
        "tie_word_embeddings": "TransformerConfig.tied_embeddings",
        "attention_dropout": "Implementation.attention_dropout (the probabilities' dropout mask; CPU SDPA: math)",
    },
    "neutral": {
        **{k: _BOOKKEEPING for k in ("_name_or_path", "architectures", "chunk_size_feed_forward", "dtype",
                                     "id2label", "is_encoder_decoder", "label2id", "model_type",
                                     "output_attentions", "output_hidden_states", "problem_type", "return_dict",
                                     "transformers_version")},
        **{k: _TOKEN for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
        "initializer_range": _INIT,
        "use_cache": "the KV cache of generation; a training step with labels builds none",
    },
    "refused": {},
}


def _family(modelled: dict[str, str], neutral: dict[str, str],
            refused: dict[str, tuple[str, tuple[Any, ...]]] | None = None) -> dict[str, dict[str, Any]]:
    refused = dict(refused or {})
    common = {k: v for k, v in _COMMON["modelled"].items() if k not in refused and k not in neutral}
    return {"modelled": {**common, **modelled}, "neutral": {**_COMMON["neutral"], **neutral}, "refused": refused}


_AUX_LOSS = ("True raises ConfigError (the load-balancing auxiliary loss is not modelled)", (False,))
_DENSE_LAYERS = " (dense layers between MoE ones are not modelled)"
_WINDOW = ("Implementation.sliding_window: a seq of the window or longer raises SetupError (check_window); "
           "shorter, the mask is the causal one")
_LAYER_TYPES = ("which layers slide: a sliding one sets Implementation.sliding_window; a kind other than "
                "full_attention or sliding_attention raises ConfigError")

NEW_FAMILY_KEYS: dict[str, dict[str, dict[str, Any]]] = {
    "qwen3": _family(
        {"head_dim": "TransformerConfig.attn_head_dim", "hidden_act": "Implementation.activation",
         "attention_bias": "Implementation.qkv_bias and o_bias", "sliding_window": _WINDOW,
         "use_sliding_window": "whether sliding_window applies (Qwen3Config sets it to None otherwise)",
         "layer_types": _LAYER_TYPES},
        {"rms_norm_eps": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE,
         "max_window_layers": "which layers slide, already in layer_types (any sliding layer: the window applies)"}),
    "phi3": _family(
        {"hidden_act": "Implementation.activation", "resid_pdrop": "TransformerConfig.dropout",
         "sliding_window": _WINDOW},
        {"embd_pdrop": "in Phi3Config, never used by modeling_phi3.py (no embedding dropout is applied)",
         "rms_norm_eps": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE,
         "original_max_position_embeddings": _ROPE},
        {"rope_parameters.partial_rotary_factor": ("below 1 (Phi-4-mini) raises ConfigError", (1, 1.0, None))}),
    "starcoder2": _family(
        {"hidden_act": "Implementation.activation", "use_bias": "TransformerConfig.bias (every linear and norm)",
         "residual_dropout": "TransformerConfig.dropout", "embedding_dropout": "Implementation.embedding_dropout",
         "sliding_window": _WINDOW},
        {"norm_epsilon": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE}),
    "olmo2": _family(
        {"hidden_act": "Implementation.activation", "attention_bias": "Implementation.qkv_bias and o_bias"},
        {"rms_norm_eps": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE}),
    "stablelm": _family(
        {"hidden_act": "Implementation.activation", "use_qkv_bias": "Implementation.qkv_bias",
         "use_parallel_residual": "Implementation.parallel_block and shared_norm",
         "rope_parameters.partial_rotary_factor": "Implementation.rotary_fraction",
         "partial_rotary_factor": "Implementation.rotary_fraction (the top-level spelling of older config.json "
                                  "files; hf_families._rope_value)"},
        {"layer_norm_eps": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE},
        {"qk_layernorm": ("True raises ConfigError (StableLmLayerNormPerHead is not modelled)", (False,)),
         "hidden_dropout": ("above 0 raises ConfigError (a dropout on the MLP output only is not modelled)",
                            (0, 0.0))}),
    "gemma2": _family(
        {"head_dim": "TransformerConfig.attn_head_dim", "hidden_activation": "Implementation.activation",
         "attention_bias": "Implementation.qkv_bias and o_bias", "sliding_window": _WINDOW,
         "layer_types": _LAYER_TYPES,
         "attn_logit_softcapping": "Implementation.attn_softcap (eager: tanh output kept; math/efficient SDPA "
                                   "raise SetupError)",
         "final_logit_softcapping": "Implementation.final_softcap (tanh of the logits kept; a chunked or fused "
                                    "loss raises SetupError)"},
        {"rms_norm_eps": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE,
         "query_pre_attn_scalar": "the attention's scale: a multiply by a Python float, nothing saved"},
        {"use_bidirectional_attention": ("True raises ConfigError (an encoder's mask)", (False, None))}),
    "gemma3_text": _family(
        {"head_dim": "TransformerConfig.attn_head_dim", "hidden_activation": "Implementation.activation",
         "attention_bias": "Implementation.qkv_bias and o_bias", "sliding_window": _WINDOW,
         "layer_types": _LAYER_TYPES + "; one (cos, sin) pair per kind: Implementation.rotary_table_pairs",
         "_sliding_window_pattern": "layer_types when a config.json leaves them out (every N-th layer full)",
         "sliding_window_pattern": "the published config.json's spelling of _sliding_window_pattern "
                                   "(hf_families._default_kinds)",
         "final_logit_softcapping": "Implementation.final_softcap (tanh of the logits kept; a chunked or fused "
                                    "loss raises SetupError)"},
        {"rms_norm_eps": _EPS, "query_pre_attn_scalar": "the attention's scale: a multiply, nothing saved",
         "rope_local_base_freq": "the sliding layers' rotary base in older config.json files: " + _ROPE,
         "attn_logit_softcapping": "Gemma3Attention keeps it but never passes it to the attention function "
                                   "(modeling_gemma3.py): no cap is applied",
         **{f"rope_parameters.{kind}.{k}": _ROPE for kind in ("full_attention", "sliding_attention")
            for k in ("rope_theta", "rope_type")}},
        {"use_bidirectional_attention": ("True raises ConfigError (an encoder's mask)", (False, None))}),
    "gptj": _family(
        {"n_embd": "TransformerConfig.d_model", "n_layer": "TransformerConfig.n_layers",
         "n_head": "TransformerConfig.n_heads", "n_inner": "TransformerConfig.d_ff (null: 4 n_embd)",
         "n_positions": "TransformerConfig.max_seq (rotary: a sinusoid buffer, no parameter)",
         "rotary_dim": "Implementation.rotary_fraction (rotary_dim / head_dim)",
         "activation_function": "Implementation.activation", "resid_pdrop": "TransformerConfig.dropout",
         "embd_pdrop": "Implementation.embedding_dropout", "attn_pdrop": "Implementation.attention_dropout"},
        {"layer_norm_epsilon": _EPS}),
    "falcon": _family(
        {"num_kv_heads": "TransformerConfig.n_kv_heads (new decoder architecture; else 1 with multi_query)",
         "multi_query": "TransformerConfig.n_kv_heads = 1 without new_decoder_architecture (Falcon-7B)",
         "ffn_hidden_size": "TransformerConfig.d_ff (null: 4 hidden_size)",
         "activation": "Implementation.activation",
         "bias": "Implementation.qkv_bias, o_bias, mlp_bias (the LayerNorms always have one)",
         "new_decoder_architecture": "TransformerConfig.n_kv_heads (num_kv_heads) and two norms by default",
         "num_ln_in_parallel_attn": "Implementation.shared_norm (1) or two norms on one input (2)"},
        {"layer_norm_epsilon": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE},
        {"alibi": ("True raises ConfigError (ALiBi positions are not modelled)", (False,)),
         "parallel_attn": ("False raises ConfigError (only the parallel block is modelled)", (True,)),
         "hidden_dropout": ("above 0 raises ConfigError (Falcon drops attention + MLP once, dropout_add)", (0, 0.0)),
         "attention_dropout": ("above 0 raises ConfigError (Falcon uses it as a residual dropout)", (0, 0.0))}),
    "mixtral": _family(
        {"head_dim": "TransformerConfig.attn_head_dim (null: hidden_size / num_attention_heads)",
         "hidden_act": "Implementation.activation", "sliding_window": _WINDOW,
         "num_local_experts": "TransformerConfig.n_experts (3-D expert tensors: Implementation.grouped_experts)",
         "num_experts_per_tok": "TransformerConfig.top_k (the (token, choice) pairs every MoE tensor is sized by)"},
        {"rms_norm_eps": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE,
         "router_aux_loss_coef": "the auxiliary loss's weight, read only with output_router_logits (refused when "
                                 "true): a Python float"},
        {"output_router_logits": _AUX_LOSS,
         "router_jitter_noise": ("above 0 raises ConfigError (the training-time noise on the MoE input is not "
                                 "modelled)", (0, 0.0))}),
    "qwen3_moe": _family(
        {"head_dim": "TransformerConfig.attn_head_dim (absent: hidden_size / num_attention_heads)",
         "hidden_act": "Implementation.activation", "attention_bias": "Implementation.qkv_bias and o_bias",
         "sliding_window": _WINDOW,
         "use_sliding_window": "whether sliding_window applies (Qwen3MoeConfig sets it to None otherwise)",
         "moe_intermediate_size": "TransformerConfig.d_ff (each expert's width)",
         "num_local_experts": "TransformerConfig.n_experts (3-D expert tensors: Implementation.grouped_experts)",
         "num_experts": "TransformerConfig.n_experts (the published config.json's spelling of num_local_experts)",
         "num_experts_per_tok": "TransformerConfig.top_k (the (token, choice) pairs every MoE tensor is sized by)",
         "norm_topk_prob": "Implementation.moe_topk_renorm (the fp32 top-k values and their sum kept)"},
        {"rms_norm_eps": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE,
         "router_aux_loss_coef": "the auxiliary loss's weight, read only with output_router_logits (refused when "
                                 "true): a Python float",
         "intermediate_size": "the width of dense MLP layers, which exist only with mlp_only_layers or "
                              "decoder_sparse_step > 1 (refused): no tensor of a modelled step",
         "max_window_layers": "in older config.json files; Qwen3MoeConfig keeps no layer types (any window applies "
                              "to every layer with use_sliding_window)"},
        {"output_router_logits": _AUX_LOSS,
         "decoder_sparse_step": ("other than 1 raises ConfigError" + _DENSE_LAYERS, (1,)),
         "mlp_only_layers": ("a non-empty list raises ConfigError" + _DENSE_LAYERS, ([], None))}),
    "qwen2_moe": _family(
        {"hidden_act": "Implementation.activation", "qkv_bias": "Implementation.qkv_bias (o_proj has none)",
         "sliding_window": _WINDOW, "layer_types": _LAYER_TYPES,
         "use_sliding_window": "whether sliding_window applies (Qwen2MoeConfig sets it to 0 otherwise)",
         "moe_intermediate_size": "TransformerConfig.d_ff (each routed expert's width)",
         "shared_expert_intermediate_size": "Implementation.shared_expert_ff (the gated shared expert's width)",
         "num_experts": "TransformerConfig.n_experts (3-D expert tensors: Implementation.grouped_experts)",
         "num_experts_per_tok": "TransformerConfig.top_k (the (token, choice) pairs every MoE tensor is sized by)",
         "norm_topk_prob": "Implementation.moe_topk_renorm (the fp32 top-k values and their sum kept)",
         "decoder_sparse_step": "Implementation.dense_layers (each layer i with (i + 1) % step != 0 is dense)",
         "mlp_only_layers": "Implementation.dense_layers (these layers' MLP is dense)",
         "intermediate_size": "Implementation.dense_ff (the dense layers' MLP width; no tensor without them)"},
        {"rms_norm_eps": _EPS, "rope_parameters.rope_theta": _ROPE, "rope_parameters.rope_type": _ROPE,
         "router_aux_loss_coef": "the auxiliary loss's weight, read only with output_router_logits (refused when "
                                 "true): a Python float",
         "max_window_layers": "which layers slide with use_sliding_window, already in layer_types (without them "
                              "memlab assumes some layer slides: the window applies)"},
        {"output_router_logits": _AUX_LOSS}),
}
"""model_type -> {"modelled": {key: where memlab reads it}, "neutral": {key: why it changes nothing memlab counts},
"refused": {key: (what memlab does with a value it does not model, the values under which the estimate stays
exact)}}: the family's builder in :mod:`memlab.predict.families.builders` refuses any other value, with the
same reason."""
