"""Hugging Face configs to memlab: :func:`from_hf` maps a ``transformers`` config to a TransformerConfig and traits.

A Hugging Face model is described by its ``config.json``; the code that runs it is the family's modelling file in
``transformers`` ``[hf-transformers]``. :func:`from_hf` reads the sizes from the config and sets the
:class:`~memlab.predict.traits.Implementation` traits that the family's modelling code implies (composed
``gelu_new``, a parallel block, ``repeat_kv``, fp32 softmax and RMSNorm upcasts, ...), each with the file and
function that causes it, so :mod:`memlab.predict.activations` counts what that code really saves.

Accepted input: a ``transformers`` config object (anything with ``to_dict()`` or attributes), a plain dict, or the
path of a ``config.json``. Nothing is downloaded and neither torch nor transformers is imported here. Keys the
config leaves out take the family's ``transformers`` defaults (:data:`DEFAULTS`). ``vocab_size`` is the embedding's
row count as the config gives it, i.e. already padded (Pythia: 50,304 rows for a 50,277-token tokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from memlab.errors import ConfigError
from memlab.predict.models import TransformerConfig
from memlab.predict.traits import Implementation

_T = "transformers/models"
_LLAMA_LIKE = {
    "eager_repeat_kv": "modeling_{f}.py repeat_kv (eager_attention_forward)",
    "softmax_fp32": "modeling_{f}.py eager_attention_forward: softmax(..., dtype=torch.float32).to(query.dtype)",
    "rmsnorm": "modeling_{f}.py {F}RMSNorm.forward: hidden_states.to(torch.float32)",
    "rotary_tables_per_forward": "modeling_{f}.py {F}RotaryEmbedding.forward, apply_rotary_pos_emb",
}

DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "vocab_size": 50257, "n_positions": 1024,
             "activation_function": "gelu_new", "resid_pdrop": 0.1, "attn_pdrop": 0.1, "embd_pdrop": 0.1,
             "tie_word_embeddings": True,
             "scale_attn_weights": True},
    "opt": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "ffn_dim": 3072,
            "vocab_size": 50272, "max_position_embeddings": 2048, "activation_function": "relu", "dropout": 0.1,
            "enable_bias": True, "do_layer_norm_before": True, "word_embed_proj_dim": None,
            "tie_word_embeddings": True},
    "gpt_neox": {"hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64, "intermediate_size": 24576,
                 "vocab_size": 50432, "max_position_embeddings": 2048, "hidden_act": "gelu", "rotary_pct": 0.25,
                 "use_parallel_residual": True, "hidden_dropout": 0.0, "attention_bias": True,
                 "tie_word_embeddings": False},
    "phi": {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": None,
            "intermediate_size": 8192, "vocab_size": 51200, "max_position_embeddings": 2048, "hidden_act": "gelu_new",
            "partial_rotary_factor": 0.5, "resid_pdrop": 0.0, "qk_layernorm": False, "tie_word_embeddings": False},
    "llama": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
              "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 2048, "hidden_act": "silu",
              "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "head_dim": None},
    "mistral": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 131072,
                "hidden_act": "silu", "tie_word_embeddings": False, "head_dim": None},
    "qwen2": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "intermediate_size": 22016, "vocab_size": 151936, "max_position_embeddings": 32768,
              "hidden_act": "silu", "tie_word_embeddings": False},
    "gemma": {"hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
              "head_dim": 256, "intermediate_size": 24576, "vocab_size": 256000, "max_position_embeddings": 8192,
              "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "tie_word_embeddings": True},
}
"""The ``transformers`` defaults of the keys :func:`from_hf` reads, per ``model_type`` (each family's
``configuration_*.py``)."""

SUPPORTED = tuple(DEFAULTS)
"""The ``model_type`` values :func:`from_hf` maps."""

_ACT = {"gelu_new": "gelu_new", "gelu_fast": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu",
        "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def _as_dict(config: object) -> dict[str, Any]:
    if isinstance(config, str | Path):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"no HF config at {path}: pass a config.json path, a dict or a transformers config")
        return json.loads(path.read_text())
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return {k: v for k, v in vars(config).items() if not k.startswith("__")}


def _src(family: str, text: str) -> str:
    return f"{_T}/{family}/{text}"


def _activation(name: str, field: str, family: str) -> str:
    if name not in _ACT:
        raise ConfigError(f"{family}: {field}={name!r} is not modelled; known activations: {', '.join(sorted(_ACT))}")
    return _ACT[name]


def from_hf(config: object, *, name: str | None = None) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face causal LM config, with its family's implementation traits.

    Supported ``model_type``: gpt2, opt, gpt_neox, phi, llama, mistral, qwen2, gemma. Anything else raises a
    :class:`~memlab.errors.ConfigError` naming these. Parameter counts equal the HF model's
    ``sum(p.numel() for p in model.parameters())`` (tied embeddings once). ``dropout`` is the family's residual
    dropout; attention and embedding dropout, where the family has them, are the traits ``attention_dropout`` and
    ``embedding_dropout`` (OPT's ``activation_dropout`` is not modelled). Source: ``[hf-transformers]``.
    """
    raw = _as_dict(config)
    family = str(raw.get("model_type", "")).lower()
    if family not in DEFAULTS:
        raise ConfigError(f"HF model_type {family or '(missing)'!r} is not supported by from_hf; supported: "
                          f"{', '.join(SUPPORTED)} (or build a TransformerConfig by hand)")
    c = {**DEFAULTS[family], **{k: v for k, v in raw.items() if v is not None or k not in DEFAULTS[family]}}
    label = name or str(raw.get("_name_or_path") or raw.get("name") or family) or family
    build = {"gpt2": _gpt2, "opt": _opt, "gpt_neox": _neox, "phi": _phi, "gemma": _gemma}.get(family, _llama_like)
    tc = build(c, family, label)
    attn_p = float(c.get("attn_pdrop" if family == "gpt2" else "attention_dropout") or 0.0)
    embd_key = {"gpt2": "embd_pdrop", "phi": "embd_pdrop", "gpt_neox": "hidden_dropout"}.get(family, "")
    embd_p = float(c.get(embd_key, 0.0) or 0.0)
    loss_src = ("loss_labels_padded", "transformers/loss/loss_utils.py ForCausalLMLoss")
    im = tc.impl
    # Traits equal to what the reference GPT would do anyway go back to their defaults, so impl.differs() lists
    # only real differences (Llama's SiLU is the reference swiglu's; a bias equal to config.bias is no trait).
    same = {"activation": "default"} if im.activation == Implementation().act(tc.mlp) else {}
    same.update({k: None for k in ("qkv_bias", "o_bias", "mlp_bias") if getattr(im, k) == tc.bias})
    impl = replace(im, loss_labels_padded=True, sources=(*im.sources, loss_src), embedding_dropout=embd_p,
                   attention_dropout=None if attn_p == tc.dropout else attn_p, **same)
    return tc.with_(impl=impl)


def _gpt2(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    d = c["n_embd"]
    impl = Implementation(
        family=family, activation=_activation(c["activation_function"], "activation_function", family),
        fused_qkv=True, q_view_of_fused_qkv=True, checkpoint_keeps_mask=True, autocast_mask_promotes_scores=True,
        sources=(("activation", _src("gpt2", "modeling_gpt2.py GPT2MLP (ACT2FN[activation_function]); "
                                             "activations.py NewGELUActivation")),
                 ("fused_qkv", _src("gpt2", "modeling_gpt2.py GPT2Attention.c_attn (Conv1D)")),
                 ("q_view_of_fused_qkv", _src("gpt2", "modeling_gpt2.py GPT2Attention.forward: "
                                                      "c_attn(hidden_states).split(split_size, dim=2)")),
                 ("embedding_dropout", _src("gpt2", "modeling_gpt2.py GPT2Model.drop (embd_pdrop)")),
                 ("autocast_mask_promotes_scores", _src("gpt2", "modeling_gpt2.py eager_attention_forward: "
                                                                "attn_weights + causal_mask (fp32)")),
                 ("checkpoint_keeps_mask", _src("gpt2", "modeling_gpt2.py GPT2Block called with the causal mask "
                                                        "as a positional argument"))),
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["n_layer"], n_heads=c["n_head"], d_ff=c["n_inner"] or 4 * d,
        vocab_size=c["vocab_size"], max_seq=c["n_positions"], mlp="gelu", positions="learned", norm="layernorm",
        bias=True, tied_embeddings=bool(c["tie_word_embeddings"]), dropout=float(c["resid_pdrop"]), impl=impl,
    )


def _opt(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    d = c["hidden_size"]
    if not c["do_layer_norm_before"] or (c["word_embed_proj_dim"] or d) != d:
        raise ConfigError("opt: only pre-norm OPT with word_embed_proj_dim == hidden_size is modelled (not opt-350m's "
                          "post-norm with project_in/project_out)")
    impl = Implementation(
        family=family, activation=_activation(c["activation_function"], "activation_function", family),
        position_offset=2, position_ids_per_token=True, softmax_fp32=True,
        sources=(("activation", _src("opt", "modeling_opt.py OPTDecoderLayer.fc1 -> ACT2FN['relu']")),
                 ("softmax_fp32", _src("opt", "modeling_opt.py eager_attention_forward: softmax(dtype=float32)")),
                 ("position_offset", _src("opt", "modeling_opt.py OPTLearnedPositionalEmbedding (offset 2)")),
                 ("position_ids_per_token", _src("opt", "modeling_opt.py OPTDecoder.forward: position_ids from "
                                                        "torch.cumsum(attention_mask)"))),
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"], d_ff=c["ffn_dim"],
        vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp="gelu", positions="learned",
        norm="layernorm", bias=bool(c["enable_bias"]), tied_embeddings=bool(c["tie_word_embeddings"]),
        dropout=float(c["dropout"]), impl=impl,
    )


def _neox(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    parallel = bool(c["use_parallel_residual"])
    impl = Implementation(
        family=family, activation=_activation(c["hidden_act"], "hidden_act", family), parallel_block=parallel,
        fused_qkv=True, rotary_tables_per_forward=True, rotary_fraction=float(c["rotary_pct"]),
        sdpa_output_copy=True, qkv_bias=bool(c["attention_bias"]), o_bias=bool(c["attention_bias"]), softmax_fp32=True,
        sources=(("activation", _src("gpt_neox", "modeling_gpt_neox.py GPTNeoXMLP (ACT2FN[hidden_act])")),
                 ("parallel_block", _src("gpt_neox", "modeling_gpt_neox.py GPTNeoXLayer.forward "
                                                     "(use_parallel_residual)")),
                 ("fused_qkv", _src("gpt_neox", "modeling_gpt_neox.py GPTNeoXAttention.query_key_value")),
                 ("softmax_fp32", _src("gpt_neox", "modeling_gpt_neox.py eager_attention_forward: "
                                                   "softmax(dtype=float32)")),
                 ("rotary_fraction", _src("gpt_neox", "modeling_gpt_neox.py apply_rotary_pos_emb (rotary_pct)")),
                 ("sdpa_output_copy", _src("gpt_neox", "modeling_gpt_neox.py apply_rotary_pos_emb: torch.cat "
                                                       "makes q, k contiguous in (b, a, s, d)"))),
    )
    return TransformerConfig(
        name=label, d_model=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
        d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp="gelu",
        positions="rotary", norm="layernorm", bias=True, tied_embeddings=bool(c["tie_word_embeddings"]),
        dropout=float(c["hidden_dropout"]), impl=impl,
    )


def _phi(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    if c["qk_layernorm"]:
        raise ConfigError("phi: qk_layernorm=True is not modelled; use a config with qk_layernorm false")
    impl = Implementation(
        family=family, activation=_activation(c["hidden_act"], "hidden_act", family), parallel_block=True,
        shared_norm=True, rotary_tables_per_forward=True, rotary_fraction=float(c["partial_rotary_factor"]),
        sdpa_output_copy=True, head_bias=True, softmax_fp32=True,
        sources=(("activation", _src("phi", "modeling_phi.py PhiMLP (ACT2FN['gelu_new'])")),
                 ("parallel_block", _src("phi", "modeling_phi.py PhiDecoderLayer.forward: attn + mlp + residual")),
                 ("shared_norm", _src("phi", "modeling_phi.py PhiDecoderLayer.input_layernorm (the only norm)")),
                 ("rotary_fraction", _src("phi", "modeling_phi.py PhiAttention (partial_rotary_factor)")),
                 ("sdpa_output_copy", _src("phi", "modeling_phi.py PhiAttention.forward: torch.cat of the rotated "
                                                  "and pass-through halves")),
                 ("head_bias", _src("phi", "modeling_phi.py PhiForCausalLM.lm_head (bias=True)")),
                 ("softmax_fp32", _src("phi", "modeling_phi.py eager_attention_forward: softmax(dtype=float32)"))),
    )
    return TransformerConfig(
        name=label, d_model=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
        n_kv_heads=c["num_key_value_heads"], d_ff=c["intermediate_size"], vocab_size=c["vocab_size"],
        max_seq=c["max_position_embeddings"], mlp="gelu", positions="rotary", norm="layernorm", bias=True,
        tied_embeddings=bool(c["tie_word_embeddings"]), dropout=float(c["resid_pdrop"]), impl=impl,
    )


def _llama_like(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    cls = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[family]
    d, a = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or d // a
    if family == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
    else:
        qkv_bias = o_bias = bool(c.get("attention_bias", False))
        mlp_bias = bool(c.get("mlp_bias", False))
    sources = tuple((k, _src(family, v.format(f=family, F=cls))) for k, v in _LLAMA_LIKE.items())
    if family == "qwen2":
        sources += (("qkv_bias", _src(family, "modeling_qwen2.py Qwen2Attention: q/k/v_proj bias=True, o_proj "
                                              "bias=False")),)
    impl = Implementation(
        family=family, activation=_activation(c["hidden_act"], "hidden_act", family), eager_repeat_kv=True,
        softmax_fp32=True, rmsnorm="fp32-input", rotary_tables_per_forward=True, qkv_bias=qkv_bias, o_bias=o_bias,
        mlp_bias=mlp_bias, sources=sources,
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=a, n_kv_heads=c["num_key_value_heads"],
        d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp="swiglu",
        positions="rotary", norm="rmsnorm", bias=False, tied_embeddings=bool(c["tie_word_embeddings"]),
        attn_head_dim=None if head_dim * a == d else head_dim, impl=impl,
    )


def _gemma(c: dict[str, Any], family: str, label: str) -> TransformerConfig:
    d, a, head_dim = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    act = c.get("hidden_activation") or c.get("hidden_act") or "gelu_pytorch_tanh"
    impl = Implementation(
        family=family, activation=_activation(act, "hidden_activation", family), eager_repeat_kv=True,
        softmax_fp32=True, rmsnorm="fp32", rotary_tables_per_forward=True,
        qkv_bias=bool(c["attention_bias"]), o_bias=bool(c["attention_bias"]),
        sources=(("activation", _src("gemma", "modeling_gemma.py GemmaMLP: down(act(gate) * up), GELUTanh")),
                 ("eager_repeat_kv", _src("gemma", "modeling_gemma.py repeat_kv (eager_attention_forward)")),
                 ("softmax_fp32", _src("gemma", "modeling_gemma.py eager_attention_forward: softmax(..., "
                                                "dtype=torch.float32)")),
                 ("rmsnorm", _src("gemma", "modeling_gemma.py GemmaRMSNorm.forward: x.float(), "
                                           "output * (1.0 + self.weight.float())")),
                 ("rotary_tables_per_forward", _src("gemma", "modeling_gemma.py GemmaRotaryEmbedding.forward"))),
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=a, n_kv_heads=c["num_key_value_heads"],
        d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp="swiglu",
        positions="rotary", norm="rmsnorm", bias=False, tied_embeddings=bool(c["tie_word_embeddings"]),
        attn_head_dim=None if head_dim * a == d else head_dim, impl=impl,
    )


def hf_attention(attn_implementation: str, device_type: str = "cpu", dtype: str = "fp32",
                 attention_dropout: float = 0.0) -> str:
    """The memlab ``Setup.attention`` an HF ``attn_implementation`` runs as: ``eager`` is eager; ``sdpa`` picks
    PyTorch's fused kernel (on CPU the flash kernel, or the math backend when attention dropout is on, which the
    CPU flash kernel does not support; on CUDA flash for 16-bit and memory-efficient for fp32);
    ``flash_attention_2`` is flash."""
    if attn_implementation == "eager":
        return "eager"
    if attn_implementation in ("flash_attention_2", "flash_attention_3"):
        return "flash"
    if attn_implementation == "sdpa":
        if device_type == "cpu":
            return "math" if attention_dropout > 0 else "flash"
        return "flash" if dtype != "fp32" else "efficient"
    raise ConfigError(f"attn_implementation must be eager, sdpa or flash_attention_2, got {attn_implementation!r}")
