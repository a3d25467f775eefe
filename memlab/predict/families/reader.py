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
from memlab.predict.families.common import optional
from memlab.predict.families.family import alias_given
from memlab.predict.families.registry import DEFAULTS, FAMILIES, SUPPORTED
from memlab.predict.families.registry import check as check_keys
from memlab.predict.spec.kernels import sdpa_kernel
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation
from memlab.predict.spec.validate import check_bool, check_int, check_number, check_str
from memlab.predict.spec.versions import warn_if_unverified

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


def from_hf(config: object, *, name: str | None = None) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face causal LM config, with its family's implementation traits.

    Supported ``model_type``: :data:`SUPPORTED` (one module each in :mod:`memlab.predict.families`). Anything else
    raises a :class:`~memlab.errors.ConfigError` naming these. Under a transformers, torch or peft release other
    than :data:`memlab.predict.spec.versions.VERIFIED` it warns in one line
    (:class:`~memlab.predict.spec.versions.UnverifiedVersionWarning`): the trace of the installed code
    (:func:`memlab.tracing.hf.trace_hf`) is then the exact answer. Parameter counts equal the HF model's
    ``sum(p.numel() for p in model.parameters())`` (tied embeddings once). ``dropout`` is the family's residual
    dropout; attention and embedding dropout, where the family has them, are the traits ``attention_dropout`` and
    ``embedding_dropout`` (OPT's ``activation_dropout`` is not modelled). Source: ``[hf-transformers]``.
    """
    raw = _as_dict(config)
    kind = raw.get("model_type", "")
    family = kind.lower() if isinstance(kind, str) else ""
    if family not in FAMILIES:
        shown = repr(kind)[:60] if kind else "(missing)"
        raise ConfigError(f"HF model_type {shown} is not supported by from_hf; supported: "
                          f"{', '.join(SUPPORTED)}; trace it instead (memlab trace --hf PATH: transformers' own "
                          "code on fake tensors), or build a TransformerConfig by hand")
    fam = FAMILIES[family]
    check_keys(family, raw)  # every key modelled, neutral, or refused (the family module's KEYS)
    raw = alias_given(raw, fam.aliases.get(family, {}))  # hidden_size -> n_embd (GPT-2): the spelling that wins
    warn_if_unverified()  # one line when transformers, torch or peft is not the release the terms were verified on
    c = _checked({**DEFAULTS[family], **{k: v for k, v in raw.items() if v is not None or k not in DEFAULTS[family]}},
                 family)
    c["_rotary_fraction"] = _rotary_fraction(raw, fam.rotary_key, c, family)
    given = next((v for v in (raw.get("_name_or_path"), raw.get("name")) if isinstance(v, str) and v), family)
    tc = fam.build(c, family, name or given)
    attn_p = optional(c, fam.attention_dropout_key, family, check_number, 0.0)
    loss_src = ("loss_labels_padded", "transformers/loss/loss_utils.py ForCausalLMLoss")
    im = tc.impl
    # Traits equal to what the reference GPT would do anyway go back to their defaults, so impl.differs() lists
    # only real differences (Llama's SiLU is the reference swiglu's; a bias equal to config.bias is no trait).
    same = {"activation": "default"} if im.activation == Implementation().act(tc.mlp) else {}
    same.update({k: None for k in ("qkv_bias", "o_bias", "mlp_bias") if getattr(im, k) == tc.bias})
    impl = replace(im, loss_labels_padded=True, sources=(*im.sources, loss_src),
                   attention_dropout=None if attn_p == tc.dropout else attn_p, **same)
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


def hf_attention(attn_implementation: str, device_type: str = "cuda", dtype: str = "fp32",
                 attention_dropout: float = 0.0, head_dim: int = 128) -> str:
    """The memlab ``Setup.attention`` an HF ``attn_implementation`` runs as: ``eager`` is eager; ``sdpa`` is the
    kernel torch dispatches for a call without a mask (:mod:`memlab.predict.spec.kernels`: on CPU flash, or math
    with attention dropout; on an sm90 CUDA card flash in 16 bits and memory-efficient in fp32);
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
        return sdpa_kernel(device_type=device_type, dtype=dtype, head_dim=head_dim, mask=False,
                           dropout=attention_dropout)[0]
    raise ConfigError(f"attn_implementation must be eager, sdpa or flash_attention_2, got "
                      f"{attn_implementation!r:.60}")
