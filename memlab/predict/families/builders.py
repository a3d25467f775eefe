"""The newer Hugging Face families :func:`memlab.predict.families.reader.from_hf` maps: Qwen3, Phi-3, Starcoder2, OLMo
2, StableLM, Gemma 2 and Gemma 3 (text), GPT-J, Falcon, Mixtral, Qwen3-MoE and Qwen2-MoE (mixtures of experts), each
with the
:class:`~memlab.predict.spec.traits.Implementation` traits its modelling code implies (file and function named in
``sources``, transformers 5.x ``[hf-transformers]``).

:data:`FAMILY_DEFAULTS` holds each family's ``transformers`` defaults of the keys the builders read (checked by kind in
:func:`memlab.predict.families.reader.from_hf`); :data:`BUILDERS` the builder per ``model_type``. What a family can be
configured to do and memlab does not model (StableLM's per-head qk LayerNorm, a partial rotary Phi-3, Gemma's
bidirectional
attention, ...) raises :class:`~memlab.errors.ConfigError` in one line; a sliding window is the trait
``sliding_window``, and a ``seq`` longer than it is refused where the setup is known
(:meth:`~memlab.predict.spec.traits.Implementation.check_window`). This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memlab.errors import ConfigError
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation
from memlab.predict.spec.validate import check_number

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "head_dim": 128, "intermediate_size": 22016, "vocab_size": 151936, "max_position_embeddings": 32768,
              "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
              "use_sliding_window": False},
    "phi3": {"hidden_size": 3072, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
             "intermediate_size": 8192, "vocab_size": 32064, "max_position_embeddings": 4096, "hidden_act": "silu",
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "tie_word_embeddings": False},
    "starcoder2": {"hidden_size": 3072, "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2,
                   "intermediate_size": 12288, "vocab_size": 49152, "max_position_embeddings": 4096,
                   "hidden_act": "gelu_pytorch_tanh", "residual_dropout": 0.0, "embedding_dropout": 0.0,
                   "use_bias": True, "tie_word_embeddings": True},
    "olmo2": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "intermediate_size": 11008, "vocab_size": 50304, "max_position_embeddings": 2048, "hidden_act": "silu",
              "attention_bias": False, "tie_word_embeddings": False},
    "stablelm": {"hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                 "intermediate_size": 6912, "vocab_size": 50304, "max_position_embeddings": 4096, "hidden_act": "silu",
                 "use_qkv_bias": False, "qk_layernorm": False, "use_parallel_residual": False,
                 "hidden_dropout": 0.0, "tie_word_embeddings": False},
    "gemma2": {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 256, "intermediate_size": 9216, "vocab_size": 256000, "max_position_embeddings": 8192,
               "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "tie_word_embeddings": True},
    "gemma3_text": {"hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                    "head_dim": 256, "intermediate_size": 9216, "vocab_size": 262208,
                    "max_position_embeddings": 131072, "hidden_activation": "gelu_pytorch_tanh",
                    "attention_bias": False, "tie_word_embeddings": True},
}
"""The ``transformers`` defaults (each family's ``configuration_*.py``, transformers 5.x) of the keys the builders
below read and :func:`memlab.predict.families.reader.from_hf` checks by kind."""

FAMILY_DEFAULTS["gptj"] = {"n_embd": 4096, "n_layer": 28, "n_head": 16, "n_inner": None, "vocab_size": 50400,
                           "n_positions": 2048, "activation_function": "gelu_new", "resid_pdrop": 0.0,
                           "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": False}

FAMILY_DEFAULTS["falcon"] = {"hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
                             "num_kv_heads": 71, "vocab_size": 65024, "max_position_embeddings": 2048,
                             "ffn_hidden_size": None, "activation": "gelu", "hidden_dropout": 0.0,
                             "attention_dropout": 0.0, "new_decoder_architecture": False, "multi_query": True,
                             "parallel_attn": True, "bias": False, "alibi": False, "num_ln_in_parallel_attn": None,
                             "tie_word_embeddings": True}

FAMILY_DEFAULTS["mixtral"] = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                              "num_key_value_heads": 8, "head_dim": None, "intermediate_size": 14336,
                              "vocab_size": 32000, "max_position_embeddings": 131072, "hidden_act": "silu",
                              "num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": False,
                              "router_jitter_noise": 0.0, "tie_word_embeddings": False}

FAMILY_DEFAULTS["qwen3_moe"] = {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32,
                                "num_key_value_heads": 4, "head_dim": None,
                                "moe_intermediate_size": 768, "vocab_size": 151936, "max_position_embeddings": 32768,
                                "hidden_act": "silu", "num_local_experts": 128, "num_experts_per_tok": 8,
                                "norm_topk_prob": False, "output_router_logits": False, "decoder_sparse_step": 1,
                                "attention_bias": False, "use_sliding_window": False, "tie_word_embeddings": False}

FAMILY_DEFAULTS["qwen2_moe"] = {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
                                "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408,
                                "shared_expert_intermediate_size": 5632, "vocab_size": 151936,
                                "max_position_embeddings": 32768, "hidden_act": "silu", "num_experts": 60,
                                "num_experts_per_tok": 4, "norm_topk_prob": False, "output_router_logits": False,
                                "decoder_sparse_step": 1, "qkv_bias": True, "use_sliding_window": False,
                                "tie_word_embeddings": False}

SOFTCAP_DEFAULTS = {"gemma2": (50.0, 30.0), "gemma3_text": (None, None)}
"""(attn_logit_softcapping, final_logit_softcapping) defaults: positive numbers or None (not fractions, so not in
:data:`FAMILY_DEFAULTS`)."""

HF_ACTIVATIONS = {"gelu_new": "gelu_new", "gelu_fast": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu",
                  "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
"""HF activation names (``ACT2FN`` keys, transformers activations.py) -> memlab ``Implementation.activation``."""


def hf_activation(name: object, field: str, family: str) -> str:
    """The memlab activation of an HF activation name, or a one-line ConfigError naming the known ones."""
    if not isinstance(name, str) or name not in HF_ACTIVATIONS:
        raise ConfigError(f"{family}: {field}={name!r} is not modelled; known activations: "
                          f"{', '.join(sorted(HF_ACTIVATIONS))}")
    return HF_ACTIVATIONS[name]


_T = "transformers/models"
_RMS = {"fp32-input": "{F}RMSNorm.forward: hidden_states.to(torch.float32), weight * x.to(input_dtype)",
        "fp32-product": "{F}RMSNorm.forward: (weight * x_fp32).to(input_dtype)",
        "fp32": "{F}RMSNorm.forward: x.float(), output * (1.0 + self.weight.float())"}
_CLS = {"qwen3": "Qwen3", "phi3": "Phi3", "starcoder2": "Starcoder2", "olmo2": "Olmo2", "stablelm": "StableLm",
        "gemma2": "Gemma2", "gemma3_text": "Gemma3", "mixtral": "Mixtral",
        "qwen3_moe": "Qwen3Moe", "qwen2_moe": "Qwen2Moe"}


def _file(family: str) -> str:
    folder = "gemma3" if family == "gemma3_text" else family
    return f"{_T}/{folder}/modeling_{folder}.py"


def _rope_value(c: dict[str, Any], key: str, default: float) -> float:
    """A rope setting given at the top level (older config.json files) or in ``rope_parameters`` /
    ``rope_scaling`` (transformers 5 moves it there)."""
    for where in (c, c.get("rope_parameters"), c.get("rope_scaling")):
        if isinstance(where, dict) and where.get(key) is not None:
            return float(check_number(key, where[key], lo=0.0, hi=1.0, lo_open=True, owner="HF config",
                                      err=ConfigError))
    return default


def _positive_or_none(c: dict[str, Any], key: str, default: float | None, family: str) -> float | None:
    value = c.get(key, default)
    if value is None:
        return None
    return float(check_number(key, value, lo=0.0, lo_open=True, hi=1e9, owner=f"HF {family} config",
                              err=ConfigError))


def _window(c: dict[str, Any], family: str, used: bool = True) -> int | None:
    """The sliding window a family's layers use (None when none does), checked as a positive int."""
    value = c.get("sliding_window")
    if not used or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"HF {family} config: sliding_window must be a positive int or null, got {value!r:.60}")
    return value


def _layer_kinds(c: dict[str, Any], family: str) -> set[str]:
    kinds = c.get("layer_types")
    if kinds is None:
        return set()
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ConfigError(f"HF {family} config: layer_types must be a list of names, got {kinds!r:.80}")
    unknown = set(kinds) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ConfigError(f"HF {family} config: layer_types {sorted(unknown)} are not modelled (only full_attention "
                          "and sliding_attention)")
    return set(kinds)


def _default_kinds(c: dict[str, Any], family: str) -> set[str]:
    """The layer types transformers derives when a config.json leaves ``layer_types`` out: Gemma 2 alternates
    sliding and full layers; Gemma 3 makes every ``sliding_window_pattern``-th layer full (default 6)
    [configuration_gemma2.py, configuration_gemma3.py Gemma3TextConfig.__post_init__]."""
    pattern = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6 if family == "gemma3_text" else 2))
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ConfigError(f"HF {family} config: sliding_window_pattern must be a positive int, got {pattern!r:.60}")
    return {"sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(c["num_hidden_layers"])}


def _decoder(c: dict[str, Any], family: str, label: str, *, act_key: str = "hidden_act", mlp: str = "swiglu",
             norm: str = "rmsnorm", rmsnorm: str = "fp32-input", bias: bool = False,
             qkv_bias: bool = False, o_bias: bool = False, mlp_bias: bool = False, dropout: float = 0.0,
             head_dim: int | None = None, sources: tuple[tuple[str, str], ...] = (),
             **traits: Any) -> TransformerConfig:
    """A decoder-only family written like Llama (separate or fused projections, ``repeat_kv``, fp32 softmax,
    rotary tables per forward) with the given differences."""
    d, a = c["hidden_size"], c["num_attention_heads"]
    hd = head_dim or d // a
    src = _file(family)
    base = (("eager_repeat_kv", f"{src} repeat_kv (eager_attention_forward)"),
            ("softmax_fp32", f"{src} eager_attention_forward: softmax(..., dtype=torch.float32).to(query.dtype)"),
            ("rotary_tables_per_forward", f"{src} {_CLS[family]}RotaryEmbedding.forward, apply_rotary_pos_emb"))
    if norm == "rmsnorm":
        base += (("rmsnorm", f"{src} " + _RMS[rmsnorm].format(F=_CLS[family])),)
    impl = Implementation(
        family=family, activation=hf_activation(c[act_key], act_key, family), eager_repeat_kv=True, softmax_fp32=True,
        rmsnorm=rmsnorm if norm == "rmsnorm" else "reference", rotary_tables_per_forward=True,
        qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias, sources=base + sources, **traits,
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=a, n_kv_heads=c["num_key_value_heads"],
        d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp=mlp,
        positions="rotary", norm=norm, bias=bias, tied_embeddings=bool(c["tie_word_embeddings"]), dropout=dropout,
        attn_head_dim=None if hd * a == d else hd, impl=impl,
    )


def _qwen3(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    kinds = _layer_kinds(c, family) or {"sliding_attention"}  # without layer_types: assume some layer slides
    window = _window(c, family, bool(c["use_sliding_window"]) and "sliding_attention" in kinds)
    bias = bool(c["attention_bias"])
    return _decoder(c, family, label, head_dim=c["head_dim"], qkv_bias=bias, o_bias=bias, qk_norm="head",
                    sliding_window=window,
                    sources=(("qk_norm", f"{_file(family)} Qwen3Attention.forward: q_norm/k_norm (RMSNorm over "
                                         "head_dim) before apply_rotary_pos_emb"),))


def _phi3(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    if _rope_value(c, "partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError("phi3: partial_rotary_factor < 1 (Phi-4-mini) is not modelled; memlab models Phi-3's "
                          "full rotary")
    return _decoder(c, family, label, dropout=float(c["resid_pdrop"]), fused_qkv=True, fused_gate_up=True,
                    sdpa_output_copy=True,
                    sliding_window=_window(c, family),  # embd_pdrop: in the config, unused by modeling_phi3.py
                    sources=(("fused_qkv", f"{_file(family)} Phi3Attention.qkv_proj (q, k, v are slices of one "
                                           "output); Phi3MLP.gate_up_proj then chunk(2)"),
                             ("sdpa_output_copy", f"{_file(family)} Phi3Attention.forward: q sliced from the "
                                                  "fused qkv output is not dense, so the rotation's output and "
                                                  "SDPA's are contiguous in (b, a, s, d)")))


def _starcoder2(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    bias = bool(c["use_bias"])
    return _decoder(c, family, label, mlp="gelu", norm="layernorm", bias=bias, qkv_bias=bias, o_bias=bias,
                    mlp_bias=bias, dropout=float(c["residual_dropout"]),
                    embedding_dropout=float(c["embedding_dropout"]), sliding_window=_window(c, family),
                    sources=(("activation", f"{_file(family)} Starcoder2MLP: c_proj(act(c_fc(x))), dropout"),
                             ("embedding_dropout", f"{_file(family)} Starcoder2Model: embedding_dropout")))


def _olmo2(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    bias = bool(c["attention_bias"])
    return _decoder(c, family, label, rmsnorm="fp32-product", qkv_bias=bias, o_bias=bias, qk_norm="full",
                    norm_placement="post", rotary_tables_fp32=True,
                    sources=(("qk_norm", f"{_file(family)} Olmo2Attention.forward: q_norm(q_proj(x)), "
                                         "k_norm(k_proj(x)) over the whole projection"),
                             ("norm_placement", f"{_file(family)} Olmo2DecoderLayer.forward: "
                                                "residual + post_attention_layernorm(attn(x)), "
                                                "post_feedforward_layernorm(mlp(h))"),
                             ("rotary_tables_fp32", f"{_file(family)} Olmo2RotaryEmbedding.forward returns fp32 "
                                                    "cos, sin; apply_rotary_pos_emb casts q, k back")))


def _stablelm(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    if c["qk_layernorm"]:
        raise ConfigError("stablelm: qk_layernorm=True (a LayerNorm per head, StableLmLayerNormPerHead) is not "
                          "modelled; use a config with qk_layernorm false")
    if c["hidden_dropout"] > 0:
        raise ConfigError("stablelm: hidden_dropout > 0 (dropout on the MLP output only) is not modelled; set 0.0")
    parallel = bool(c["use_parallel_residual"])
    bias = bool(c["use_qkv_bias"])
    src = _file(family)
    return _decoder(c, family, label, norm="layernorm", bias=True, qkv_bias=bias, o_bias=False, mlp_bias=False,
                    rotary_fraction=_rope_value(c, "partial_rotary_factor", 0.25), sdpa_output_copy=True,
                    parallel_block=parallel, shared_norm=parallel,
                    sources=(("rotary_fraction", f"{src} StableLmAttention: rotary_ndims (partial_rotary_factor)"),
                             ("sdpa_output_copy", f"{src} StableLmAttention.forward: torch.cat((query_rot, "
                                                  "query_pass))"),
                             ("parallel_block", f"{src} StableLmDecoderLayer.forward (use_parallel_residual: "
                                                "input_layernorm feeds both)")))


def _gemma2(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    if c.get("use_bidirectional_attention"):
        raise ConfigError(f"{family}: use_bidirectional_attention=True (an encoder) is not modelled")
    gemma3 = family == "gemma3_text"
    kinds = _layer_kinds(c, family) or _default_kinds(c, family)
    final_cap = _positive_or_none(c, "final_logit_softcapping", SOFTCAP_DEFAULTS[family][1], family)
    # Gemma3Attention keeps attn_logit_softcapping but never passes it to the attention function: not read
    attn_cap = None if gemma3 else _positive_or_none(c, "attn_logit_softcapping", SOFTCAP_DEFAULTS[family][0], family)
    bias = bool(c["attention_bias"])
    src = _file(family)
    traits: dict[str, Any] = {"qk_norm": "head", "rotary_table_pairs": max(1, len(kinds))} if gemma3 else {}
    sources = ((("qk_norm", f"{src} Gemma3Attention.forward: q_norm/k_norm (Gemma3RMSNorm over head_dim)"),
                ("rotary_table_pairs", f"{src} Gemma3TextModel.forward: one rotary_emb call per set(layer_types)"))
               if gemma3 else ())
    if attn_cap is not None:
        sources += (("attn_softcap", f"{src} eager_attention_forward: tanh(attn_weights / softcap) * softcap"),)
    if final_cap is not None:
        sources += (("final_softcap", f"{src} {_CLS[family]}ForCausalLM.forward: tanh(logits / cap) * cap"),)
    return _decoder(c, family, label, act_key="hidden_activation", rmsnorm="fp32", head_dim=c["head_dim"],
                    qkv_bias=bias, o_bias=bias, norm_placement="sandwich", attn_softcap=attn_cap is not None,
                    final_softcap=final_cap is not None,
                    sliding_window=_window(c, family, "sliding_attention" in kinds),
                    sources=(("norm_placement", f"{src} {_CLS[family]}DecoderLayer.forward: input, "
                                                "post_attention, pre_feedforward and post_feedforward norms"),
                             *sources), **traits)


def _gptj(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    d, a = c["n_embd"], c["n_head"]
    if d % a:
        raise ConfigError(f"gptj: n_head={a} must divide n_embd={d}")
    rot = c.get("rotary_dim")
    hd = d // a
    if rot is not None and (isinstance(rot, bool) or not isinstance(rot, int) or not 0 < rot <= hd or rot % 2):
        raise ConfigError(f"gptj: rotary_dim must be an even int in (0, head_dim={hd}] or null, got {rot!r:.40}")
    src = _file(family)
    impl = Implementation(
        family=family, activation=hf_activation(c["activation_function"], "activation_function", family),
        parallel_block=True, shared_norm=True, rotary_tables_per_use=True, eager_qk_fp32=True,
        rotary_fraction=(rot or hd) / hd, qkv_bias=False,
        o_bias=False, mlp_bias=True, head_bias=True, embedding_dropout=float(c["embd_pdrop"]),
        sources=(("activation", f"{src} GPTJMLP: fc_out(act(fc_in(x))), ACT2FN[activation_function]"),
                 ("parallel_block", f"{src} GPTJBlock.forward: attn + mlp + residual from ln_1 alone"),
                 ("rotary_tables_per_use", f"{src} apply_rotary_pos_emb: repeat_interleave(sin/cos) per call"),
                 ("eager_qk_fp32", f"{src} eager_attention_forward: query.to(float32), key.to(float32)"),
                 ("rotary_fraction", f"{src} GPTJAttention.forward: rotary_dim of head_dim, torch.cat"),
                 ("head_bias", f"{src} GPTJForCausalLM.lm_head = nn.Linear(n_embd, vocab_size) (bias)"),
                 ("embedding_dropout", f"{src} GPTJModel.drop (embd_pdrop)")),
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["n_layer"], n_heads=a, d_ff=c["n_inner"] or 4 * d,
        vocab_size=c["vocab_size"], max_seq=c["n_positions"], mlp="gelu", positions="rotary", norm="layernorm",
        bias=True, tied_embeddings=bool(c["tie_word_embeddings"]), dropout=float(c["resid_pdrop"]), impl=impl,
    )


def _falcon(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    src = _file(family)
    if c["alibi"]:
        raise ConfigError("falcon: alibi=True (ALiBi positions, Falcon-RW) is not modelled; memlab models rotary "
                          "Falcon")
    if c["hidden_dropout"] > 0 or c["attention_dropout"] > 0:
        raise ConfigError("falcon: hidden_dropout or attention_dropout > 0 is not modelled (Falcon drops the sum of "
                          "attention and MLP once, dropout_add); set both to 0.0")
    new, parallel = bool(c["new_decoder_architecture"]), bool(c["parallel_attn"])
    if not parallel:
        raise ConfigError("falcon: parallel_attn=False is not modelled; memlab models Falcon's parallel block")
    d, a = c["hidden_size"], c["num_attention_heads"]
    if d % a:
        raise ConfigError(f"falcon: num_attention_heads={a} must divide hidden_size={d}")
    # Falcon-7B's multi_query without the new architecture is one K/V head: since transformers 5.25 it is split
    # from the fused output and repeated like any grouped-query K/V (modeling_falcon.py FalconAttention.forward)
    kv = c["num_kv_heads"] if new else (1 if c["multi_query"] else a)
    lns = c["num_ln_in_parallel_attn"] or (2 if new else 1)
    if lns not in (1, 2):
        raise ConfigError(f"falcon: num_ln_in_parallel_attn must be 1 or 2, got {lns!r:.40}")
    bias = bool(c["bias"])
    impl = Implementation(
        family=family, activation=hf_activation(c["activation"], "activation", family), parallel_block=True,
        shared_norm=not (new and lns == 2), fused_qkv=True, kv_broadcast=True, sdpa_keeps_mask=True,
        eager_repeat_kv=True, softmax_fp32=True,
        rotary_tables_per_forward=True, qkv_bias=bias, o_bias=bias, mlp_bias=bias,
        sources=(("activation", f"{src} FalconMLP: dense_4h_to_h(act(dense_h_to_4h(x)))"),
                 ("parallel_block", f"{src} FalconDecoderLayer.forward: mlp_output += attention_output "
                                    "(ln_attn and ln_mlp, or one input_layernorm)"),
                 ("fused_qkv", f"{src} FalconAttention.query_key_value"),
                 ("kv_broadcast", f"{src} FalconAttention.forward: K, V views of the fused output; a mask always "
                                  "(allow_is_causal_skip=False), so sdpa_attention.py repeat_kv (no enable_gqa)"),
                 ("eager_repeat_kv", f"{src} eager_attention_forward: repeat_kv (transformers 5.25)"),
                 ("softmax_fp32", f"{src} eager_attention_forward: softmax(..., dtype=torch.float32).to(query.dtype)"),
                 ("sdpa_keeps_mask", f"{src} FalconAttention.forward: scaled_dot_product_attention(..., "
                                     "attn_mask=attention_mask)"),
                 ("rotary_tables_per_forward", f"{src} FalconRotaryEmbedding.forward, apply_rotary_pos_emb")),
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=a, n_kv_heads=kv,
        d_ff=c["ffn_hidden_size"] or 4 * d, vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"],
        mlp="gelu", positions="rotary", norm="layernorm", bias=True, tied_embeddings=bool(c["tie_word_embeddings"]),
        impl=impl,
    )


def _experts(c: dict[str, Any], family: str) -> tuple[int, int]:
    """(routed experts, top_k) of an MoE config (``num_experts`` is the published config.json's spelling of
    ``num_local_experts``, the config class's attribute_map), checked: 2 or more experts, 1 <= top_k <= experts."""
    key = "num_experts" if "num_experts" in c else "num_local_experts"
    experts, top_k = c[key], c["num_experts_per_tok"]
    for name, value in ((key, experts), ("num_experts_per_tok", top_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{family}: {name} must be a positive int, got {value!r:.40}")
    if experts < 2 or top_k > experts:
        raise ConfigError(f"{family}: num_experts_per_tok={top_k} of {key}={experts} is not a mixture of experts "
                          "memlab models (it needs 2 or more experts and top_k <= experts)")
    return experts, top_k


def _qwen3_moe(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Qwen3-MoE: Qwen3's attention (per-head q/k norm) and a sparse MoE block in every layer, experts of width
    ``moe_intermediate_size``; dense layers between them (``mlp_only_layers``, ``decoder_sparse_step`` > 1) and the
    router-logits auxiliary loss are refused."""
    src = _file(family)
    if c["output_router_logits"]:
        raise ConfigError(f"{family}: output_router_logits=True (the load-balancing auxiliary loss over every "
                          "layer's router logits) is not modelled; set it false")
    if c["decoder_sparse_step"] != 1 or c.get("mlp_only_layers"):
        raise ConfigError(f"{family}: decoder_sparse_step != 1 or a non-empty mlp_only_layers (dense MLP layers "
                          "between the MoE ones) is not modelled; memlab models an MoE block in every layer")
    experts, top_k = _experts(c, family)
    bias = bool(c["attention_bias"])
    dense = _decoder({**c, "intermediate_size": c["moe_intermediate_size"]}, family, label, head_dim=c["head_dim"],
                     qkv_bias=bias, o_bias=bias, qk_norm="head", grouped_experts=True,
                     moe_topk_renorm=bool(c["norm_topk_prob"]), moe_weights_fp32=False,
                     sliding_window=_window(c, family, bool(c["use_sliding_window"])),
                     sources=(("qk_norm", f"{src} Qwen3MoeAttention.forward: q_norm/k_norm over head_dim"),
                              ("grouped_experts", f"{src} Qwen3MoeSparseMoeBlock, Qwen3MoeTopKRouter, "
                                                  "Qwen3MoeExperts; integrations/moe.py grouped_mm_experts_forward"),
                              ("moe_weights_fp32", f"{src} Qwen3MoeTopKRouter.forward: "
                                                   "router_top_value.to(router_logits.dtype)")))
    return dense.with_(n_experts=experts, top_k=top_k)


def _qwen2_moe(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (q/k/v bias with ``qkv_bias``, none on o) and in
    every layer a sparse MoE block of grouped experts ``moe_intermediate_size`` wide plus a shared expert
    (:attr:`~memlab.predict.spec.traits.Implementation.shared_expert_ff`) that every token runs through, scaled by its
    sigmoid gate; dense layers between the MoE ones (``mlp_only_layers``, ``decoder_sparse_step`` > 1) are
    :attr:`~memlab.predict.spec.traits.Implementation.dense_layers`, ``intermediate_size`` wide. The router-logits
    auxiliary loss is refused: its top-k indices are packed for backward and freed in forward (the value output
    is dropped), which the saved-tensor recorder cannot yet tell from a kept tensor."""
    src = _file(family)
    if c["output_router_logits"]:
        raise ConfigError(f"{family}: output_router_logits=True (the load-balancing auxiliary loss over every "
                          "layer's router logits) is not modelled; set it false")
    experts, top_k = _experts(c, family)
    dense = _dense_layers(c, family)
    kinds = _layer_kinds(c, family) or {"sliding_attention"}  # without layer_types: assume some layer slides
    window = _window(c, family, bool(c["use_sliding_window"]) and "sliding_attention" in kinds)
    model = _decoder({**c, "intermediate_size": c["moe_intermediate_size"]}, family, label,
                     qkv_bias=bool(c["qkv_bias"]), o_bias=False, grouped_experts=True,
                     dense_layers=dense, dense_ff=c["intermediate_size"] if dense else 0,
                     moe_topk_renorm=bool(c["norm_topk_prob"]), moe_weights_fp32=False,
                     shared_expert_ff=c["shared_expert_intermediate_size"], sliding_window=window,
                     sources=(("qkv_bias", f"{src} Qwen2MoeAttention: q/k/v_proj bias=config.qkv_bias, o_proj "
                                           "bias=False"),
                              ("grouped_experts", f"{src} Qwen2MoeSparseMoeBlock, Qwen2MoeTopKRouter, "
                                                  "Qwen2MoeExperts; integrations/moe.py grouped_mm_experts_forward"),
                              ("moe_weights_fp32", f"{src} Qwen2MoeTopKRouter.forward: "
                                                   "router_top_value.to(router_logits.dtype)"),
                              ("shared_expert_ff", f"{src} Qwen2MoeSparseMoeBlock.forward: "
                                                   "sigmoid(shared_expert_gate(x)) * shared_expert(x)"),
                              ("dense_layers", f"{src} Qwen2MoeDecoderLayer.__init__: Qwen2MoeMLP(intermediate_size) "
                                               "in mlp_only_layers or where (i + 1) % decoder_sparse_step")))
    return model.with_(n_experts=experts, top_k=top_k)


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


def _mixtral(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    """Mixtral: Mistral's attention and a sparse MoE block (:attr:`Implementation.grouped_experts`) in place of the
    MLP; its jitter noise and router-logits auxiliary loss are refused, not approximated."""
    src = _file(family)
    if c["output_router_logits"]:
        raise ConfigError("mixtral: output_router_logits=True (the load-balancing auxiliary loss over every layer's "
                          "router logits) is not modelled; set it false")
    if c["router_jitter_noise"] != 0:
        raise ConfigError("mixtral: router_jitter_noise > 0 (a noise tensor multiplied into the MoE input in "
                          "training) is not modelled; set 0.0")
    experts, top_k = _experts(c, family)
    dense = _decoder(c, family, label, head_dim=c["head_dim"], grouped_experts=True,
                     sliding_window=_window(c, family),
                     sources=(("grouped_experts", f"{src} MixtralSparseMoeBlock, MixtralTopKRouter (fp32 softmax, "
                                                  "top-k), MixtralExperts 3-D gate_up_proj/down_proj; "
                                                  "transformers/integrations/moe.py grouped_mm_experts_forward"),))
    return dense.with_(n_experts=experts, top_k=top_k)


BUILDERS: dict[str, Callable[[dict[str, Any], str, str], TransformerConfig]] = {
    "qwen3": _qwen3, "phi3": _phi3, "starcoder2": _starcoder2, "olmo2": _olmo2, "stablelm": _stablelm,
    "gemma2": _gemma2, "gemma3_text": _gemma2, "gptj": _gptj,
    "falcon": _falcon, "mixtral": _mixtral, "qwen3_moe": _qwen3_moe, "qwen2_moe": _qwen2_moe,
}
"""The builder of each family in :data:`FAMILY_DEFAULTS`."""
