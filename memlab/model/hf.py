"""Hugging Face causal LMs built from configs, never downloaded: :func:`hf_config` and :func:`build_hf_model`.

:func:`hf_config` is the one way memlab turns what a user holds (a ``config.json`` path or its folder, a dict with its
``model_type``, a ``PretrainedConfig``, or a model type name with dimensions) into a ``transformers`` config;
:func:`build_hf_model` is ``AutoModelForCausalLM.from_config`` in a dtype and attention implementation. The trace
(:mod:`memlab.tracing.hf`) and the measured runs (:mod:`memlab.run.hf`) both build through here.
:func:`memlab.predict.hf.from_hf` is the torch-free reader the estimator uses.

``transformers`` is imported when a function runs, so importing this module is cheap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from memlab.errors import SetupError, unknown_name

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""Dtypes a Hugging Face model is built in here (memlab name -> torch dtype)."""


def import_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - a course dependency
        raise SetupError(f"tracing a Hugging Face model needs transformers: pip install transformers ({exc})") from None
    return transformers


def hf_config(source: Any, **dims: Any) -> Any:
    """A ``transformers`` config from what a user holds: a config object (returned as is, or copied with ``dims``), a
    dict with its ``model_type`` (a parsed ``config.json``), a ``config.json`` path (or its folder), or a model type
    name (``gpt2``, ``llama``, ``mistral``, ``qwen2``, ...); ``dims`` override or add keys. Nothing is downloaded.
    Keys starting with ``_`` (memlab's notes, transformers' bookkeeping), ``architectures`` and
    ``transformers_version`` are dropped; a bad path, bad JSON or unknown type raises :class:`SetupError`."""
    tf = import_transformers()
    if hasattr(source, "to_dict") and hasattr(source, "model_type"):
        return source.__class__.from_dict({**source.to_dict(), **dims}) if dims else source
    if isinstance(source, dict):
        return _from_dict(tf, dict(source), dims, "an HF config dict")
    path = Path(str(source))
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise SetupError(f"no config file at {path}: give the path of a Hugging Face config.json")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise SetupError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise SetupError(f"{path} holds a JSON {type(data).__name__}, not a Hugging Face config object")
        return _from_dict(tf, data, dims, str(path))
    try:
        return tf.AutoConfig.for_model(str(source), **dims)
    except ValueError:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        raise unknown_name("Hugging Face model type", str(source), list(CONFIG_MAPPING.keys())) from None


def _from_dict(tf: Any, data: dict[str, Any], dims: dict[str, Any], where: str) -> Any:
    kind = data.pop("model_type", None)
    if not kind:
        raise SetupError(f"{where} has no 'model_type' (gpt2, llama, ...): is it a Hugging Face config.json?")
    keys = {k: v for k, v in {**data, **dims}.items()
            if not k.startswith("_") and k not in ("architectures", "transformers_version")}
    return tf.AutoConfig.for_model(kind, **keys)


def build_hf_model(config: Any, *, attn_implementation: str = "eager", dtype: str = "fp32",
                   device: str | torch.device = "cpu", seed: int = 0,
                   gradient_checkpointing: bool = False) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_config`` in ``dtype`` with ``attn_implementation`` (eager or sdpa), in train mode;
    ``gradient_checkpointing`` calls the model's ``gradient_checkpointing_enable()`` (memlab's recompute "full")."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise SetupError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    from transformers.utils import logging

    torch.manual_seed(seed)
    level = logging.get_verbosity()
    logging.set_verbosity_error()  # config validation warnings about tiny vocabularies, once per build
    try:
        cfg = hf_config(config)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation, dtype=DTYPES[dtype])
    finally:
        logging.set_verbosity(level)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model.to(device).train()
