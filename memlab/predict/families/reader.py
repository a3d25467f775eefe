"""Hugging Face configs to memlab: :func:`from_hf` maps a ``transformers`` config to a TransformerConfig and traits.

A Hugging Face model is described by its ``config.json``; the code that runs it is the family's modelling file in
``transformers`` ``[hf-transformers]``. :func:`from_hf` reads the sizes from the config and sets the
:class:`~memlab.predict.spec.traits.Implementation` traits that the family's modelling code implies (composed
``gelu_new``, a parallel block, ``repeat_kv``, fp32 softmax and RMSNorm upcasts, ...), each with the file and
function that causes it, so :mod:`memlab.predict.memory.activations` counts what that code really saves.

Accepted input: a ``transformers`` config object (anything with ``to_dict()``, or attributes with a
``model_type``), a plain dict, or the path of a ``config.json`` (read by :func:`read_config_json`, the one safe
reader :mod:`memlab.model.hf` shares). Nothing is downloaded and neither torch nor transformers is imported here.
Keys the config leaves out take the family's ``transformers`` defaults (:data:`DEFAULTS`); the keys it gives are
checked against the kind of their default (sizes are positive ints, flags are JSON booleans, dropouts are numbers
in [0, 1]), so ``"false"`` is no False and ``0`` heads no default. ``vocab_size`` is the embedding's row count as
the config gives it, i.e. already padded (Pythia: 50,304 rows for a 50,277-token tokenizer).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from memlab.errors import ConfigError, SetupError
from memlab.predict.families.builders import BUILDERS, FAMILY_DEFAULTS, HF_ACTIVATIONS, hf_activation
from memlab.predict.families.keys import check as check_keys
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation
from memlab.predict.spec.validate import check_bool, check_int, check_number, check_str
from memlab.predict.spec.versions import warn_if_unverified

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

DEFAULTS.update(FAMILY_DEFAULTS)  # Qwen3, Phi-3, Starcoder2, OLMo 2, StableLM, Gemma 2, 3 (predict.families.builders)

SUPPORTED = tuple(DEFAULTS)
"""The ``model_type`` values :func:`from_hf` maps."""

_ACT = HF_ACTIVATIONS  # HF activation name -> memlab Implementation.activation (memlab.predict.families.builders)


MAX_CONFIG_BYTES = 4 * 2**20
"""The largest ``config.json`` :func:`read_config_json` reads, bytes (4 MiB; a real one is a few KiB, a
multimodal one with its sub-configs under 100 KiB)."""

MAX_CONFIG_DEPTH = 32
"""The deepest nesting of objects and lists :func:`read_config_json` accepts (real configs nest 3 or 4 deep:
``text_config.rope_scaling.*``)."""


def read_config_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in a Hugging Face ``config.json`` (or in ``path/config.json`` for a folder), read safely.

    Only a regular file is opened (a FIFO would block, ``/dev/zero`` never ends), at most :data:`MAX_CONFIG_BYTES`
    of it, as strict UTF-8 JSON (no comments, no NaN or Infinity) that is an object nesting at most
    :data:`MAX_CONFIG_DEPTH` deep. Anything else raises :class:`~memlab.errors.ConfigError` saying what the file
    is. Used by :func:`from_hf` and by :func:`memlab.model.hf.hf_config`."""
    path = Path(path)
    try:
        if path.is_dir():
            path = path / "config.json"
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"no config file at {path}: give the path of a Hugging Face config.json, a dict or a "
                          "transformers config") from None
    except (OSError, ValueError) as exc:  # permissions, a name too long, a NUL byte
        raise ConfigError(f"cannot read the config {str(path)[:200]!r}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    _check_regular(path, info.st_mode)
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path} is {info.st_size:,} bytes, over the {MAX_CONFIG_BYTES:,} a config.json may have "
                          "(real ones are a few KiB): is it a weights file?")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # never blocks, even if swapped for a FIFO
        with os.fdopen(fd, "rb") as f:
            _check_regular(path, os.fstat(f.fileno()).st_mode)
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path} is over the {MAX_CONFIG_BYTES:,} bytes a config.json may have")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}): a config.json is UTF-8 JSON") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}; JSON has "
                          "no comments or trailing commas)") from None
    except RecursionError:
        raise ConfigError(f"{path} nests deeper than Python's JSON reader goes: not a config.json") from None
    except ValueError as exc:  # a number with more digits than Python converts
        raise ConfigError(f"{path} is not a config.json memlab reads: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{path} holds a JSON {_json_kind(obj)}, not a Hugging Face config object {{...}}")
    if _depth(obj) > MAX_CONFIG_DEPTH:
        raise ConfigError(f"{path} nests objects or lists over {MAX_CONFIG_DEPTH} deep: not a Hugging Face config")
    return obj


def _check_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a file")
        raise ConfigError(f"{path} is {kind}, not a regular file: give the path of a config.json file")


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


def _json_kind(obj: object) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(obj), "number")


def _depth(obj: object) -> int:
    """How deep lists and objects nest in ``obj`` (iteratively: a deep value never recurses)."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level <= MAX_CONFIG_DEPTH:
                todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _as_dict(config: object) -> dict[str, Any]:
    if isinstance(config, str | os.PathLike):
        return read_config_json(config)
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        out = to_dict()
        if not isinstance(out, Mapping):
            raise ConfigError(f"{type(config).__name__}.to_dict() returned {type(out).__name__}, not a dict")
        return dict(out)
    attrs = getattr(config, "__dict__", None)
    if isinstance(attrs, dict) and "model_type" in attrs:
        return {k: v for k, v in attrs.items() if not k.startswith("__")}
    raise ConfigError(f"from_hf needs a config.json path, a dict or a transformers config (with model_type), got "
                      f"{type(config).__name__}")


def _checked(c: dict[str, Any], family: str) -> dict[str, Any]:
    """``c`` with every key of the family's :data:`DEFAULTS` checked against the kind of its default: an int
    default is a positive size, None an optional positive size, a bool a JSON boolean, a str a name, a float a
    fraction in [0, 1] (rotary fractions in (0, 1])."""
    for key, default in DEFAULTS[family].items():
        value, where = c[key], f"HF {family} config"
        if default is None:
            if value is not None:
                check_int(key, value, owner=where, err=ConfigError)
        elif isinstance(default, bool):
            check_bool(key, value, owner=where, err=ConfigError)
        elif isinstance(default, int):
            check_int(key, value, owner=where, err=ConfigError)
        elif isinstance(default, float):
            rotary = key in ("rotary_pct", "partial_rotary_factor")
            check_number(key, value, lo=0.0, hi=1.0, lo_open=rotary, owner=where, err=ConfigError)
        else:
            check_str(key, value, owner=where, err=ConfigError)
    return c


def _optional(c: dict[str, Any], key: str, family: str, check: Any, default: Any) -> Any:
    """``c[key]`` checked by ``check`` (a :mod:`memlab.predict.spec.validate` checker; numbers in [0, 1]), or
    ``default`` when the config leaves it out or gives null: for keys some families have and :data:`DEFAULTS`
    does not list."""
    value = c.get(key)
    if value is None:
        return default
    bounds = {"lo": 0.0, "hi": 1.0} if check is check_number else {}
    return check(key, value, **bounds, owner=f"HF {family} config", err=ConfigError)


def _src(family: str, text: str) -> str:
    return f"{_T}/{family}/{text}"


_activation = hf_activation


def from_hf(config: object, *, name: str | None = None) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face causal LM config, with its family's implementation traits.

    Supported ``model_type``: :data:`SUPPORTED` (gpt2, opt, gpt_neox, phi, llama, mistral, qwen2, gemma and the
    families of :mod:`memlab.predict.families.builders`). Anything else raises a :class:`~memlab.errors.ConfigError`
    naming these. Under a transformers, torch or peft release other than :data:`memlab.predict.spec.versions.VERIFIED`
    it warns
    in one line (:class:`~memlab.predict.spec.versions.UnverifiedVersionWarning`): the trace of the installed code
    (:func:`memlab.tracing.hf.trace_hf`) is then the exact answer. Parameter counts equal the HF model's
    ``sum(p.numel() for p in model.parameters())`` (tied embeddings once). ``dropout`` is the family's residual
    dropout; attention and embedding dropout, where the family has them, are the traits ``attention_dropout`` and
    ``embedding_dropout`` (OPT's ``activation_dropout`` is not modelled). Source: ``[hf-transformers]``.
    """
    raw = _as_dict(config)
    kind = raw.get("model_type", "")
    family = kind.lower() if isinstance(kind, str) else ""
    if family not in DEFAULTS:
        shown = repr(kind)[:60] if kind else "(missing)"
        raise ConfigError(f"HF model_type {shown} is not supported by from_hf; supported: "
                          f"{', '.join(SUPPORTED)}; trace it instead (memlab trace --hf PATH: transformers' own "
                          "code on fake tensors), or build a TransformerConfig by hand")
    check_keys(family, raw)  # every key modelled, neutral, or refused (memlab.predict.families.keys)
    warn_if_unverified()  # one line when transformers, torch or peft is not the release the terms were verified on
    c = _checked({**DEFAULTS[family], **{k: v for k, v in raw.items() if v is not None or k not in DEFAULTS[family]}},
                 family)
    c["_rotary_fraction"] = _rotary_fraction(raw, {"gpt_neox": "rotary_pct", "phi": "partial_rotary_factor"}
                                             .get(family), c, family)
    given = next((v for v in (raw.get("_name_or_path"), raw.get("name")) if isinstance(v, str) and v), family)
    label = name or given
    build = {"gpt2": _gpt2, "opt": _opt, "gpt_neox": _neox, "phi": _phi, "gemma": _gemma, **BUILDERS}.get(
        family, _llama_like)
    tc = build(c, family, label)
    attn_p = _optional(c, "attn_pdrop" if family in ("gpt2", "gptj") else "attention_dropout", family, check_number,
                       0.0)
    embd_key = {"gpt2": "embd_pdrop", "phi": "embd_pdrop", "gpt_neox": "hidden_dropout"}.get(family, "")
    embd_p = _optional(c, embd_key, family, check_number, 0.0) if family not in BUILDERS else tc.impl.embedding_dropout
    loss_src = ("loss_labels_padded", "transformers/loss/loss_utils.py ForCausalLMLoss")
    im = tc.impl
    # Traits equal to what the reference GPT would do anyway go back to their defaults, so impl.differs() lists
    # only real differences (Llama's SiLU is the reference swiglu's; a bias equal to config.bias is no trait).
    same = {"activation": "default"} if im.activation == Implementation().act(tc.mlp) else {}
    same.update({k: None for k in ("qkv_bias", "o_bias", "mlp_bias") if getattr(im, k) == tc.bias})
    impl = replace(im, loss_labels_padded=True, sources=(*im.sources, loss_src), embedding_dropout=embd_p,
                   attention_dropout=None if attn_p == tc.dropout else attn_p, **same)
    if family in ("mistral", "qwen2"):  # the new families' builders set their window (hf_families._window)
        impl = replace(impl, sliding_window=_sliding_window(raw, family, tc.max_seq))
    return tc.with_(impl=impl)


def _rope(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The rotary dict transformers 5.x uses: ``rope_scaling`` (4.x) when given, else ``rope_parameters``
    (``configuration_gpt_neox.py``: ``rope_scaling or rope_parameters``)."""
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise ConfigError(f"rope_parameters must be an object {{...}}, got {_json_kind(rope)}")
    return rope


def _rotary_fraction(raw: Mapping[str, Any], legacy: str | None, c: Mapping[str, Any], family: str) -> float:
    """The share of head_dim that rotates: the rotary dict's ``partial_rotary_factor`` wins over the 4.x top-level
    key (``rope_parameters.setdefault("partial_rotary_factor", rotary_pct)`` in the 5.x config classes)."""
    value = _rope(raw).get("partial_rotary_factor")
    if value is None:
        return float(c[legacy]) if legacy else 1.0
    return float(check_number("rope_parameters.partial_rotary_factor", value, lo=0.0, hi=1.0, lo_open=True,
                              owner=f"HF {family} config", err=ConfigError))


def _sliding_window(raw: Mapping[str, Any], family: str, max_seq: int) -> int | None:
    """The attention window a Mistral or Qwen2 config sets (None: none, or one at least ``max_seq`` long); Qwen2's
    sliding layers (``use_sliding_window``, ``layer_types``) are refused (memlab.predict.families.keys)."""
    if family == "qwen2":
        types = raw.get("layer_types")
        if types is not None and (not isinstance(types, list) or any(t != "full_attention" for t in types)):
            raise ConfigError("qwen2 config layer_types with other entries than full_attention (sliding-window "
                              "layers) are not modelled")
        return None  # without use_sliding_window (refused when true) every layer is full attention
    if family != "mistral":
        return None
    window = raw.get("sliding_window", 4096)  # MistralConfig's default
    if window is None:
        return None
    check_int("sliding_window", window, owner="HF mistral config", err=ConfigError)
    return window if window < max_seq else None


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
        fused_qkv=True, rotary_tables_per_forward=True, rotary_fraction=c["_rotary_fraction"],
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
        shared_norm=True, rotary_tables_per_forward=True, rotary_fraction=c["_rotary_fraction"],
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
    head_dim = _optional(c, "head_dim", family, check_int, None) or d // a
    if family == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
    elif family == "mistral":  # modeling_mistral.py: every projection bias=False, whatever the config says
        qkv_bias = o_bias = mlp_bias = False
    else:
        qkv_bias = o_bias = _optional(c, "attention_bias", family, check_bool, False)
        mlp_bias = _optional(c, "mlp_bias", family, check_bool, False)
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
    ``flash_attention_2`` is flash. ``device_type`` is ``"cpu"`` or ``"cuda"`` (the kernels memlab models),
    ``dtype`` the model's (fp32, bf16 or fp16); anything else raises :class:`~memlab.errors.SetupError`."""
    if device_type not in ("cpu", "cuda") or not isinstance(device_type, str):
        raise SetupError(f"device_type must be 'cpu' or 'cuda' (the SDPA kernels memlab models), got "
                         f"{device_type!r:.60}")
    if dtype not in ("fp32", "bf16", "fp16") or not isinstance(dtype, str):
        raise SetupError(f"dtype must be fp32, bf16 or fp16 (an HF model's dtype), got {dtype!r:.60}")
    check_number("attention_dropout", attention_dropout, lo=0.0, hi=1.0, err=SetupError)
    if attn_implementation == "eager":
        return "eager"
    if attn_implementation in ("flash_attention_2", "flash_attention_3"):
        return "flash"
    if attn_implementation == "sdpa":
        if device_type == "cpu":
            return "math" if attention_dropout > 0 else "flash"
        return "flash" if dtype != "fp32" else "efficient"
    raise ConfigError(f"attn_implementation must be eager, sdpa or flash_attention_2, got "
                      f"{attn_implementation!r:.60}")
