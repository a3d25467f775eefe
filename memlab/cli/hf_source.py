"""``--hf PATH``: a Hugging Face config for ``estimate``, ``trace``, ``measure`` and ``shard``, read offline.

PATH is a ``config.json``, a folder holding one, the name of a published config memlab ships
(``memlab/course/configs/full``: ``--hf llama-2-7b``), or a model id (``org/name``) whose ``config.json`` is in the
local Hugging Face cache (``HF_HUB_CACHE``, else huggingface_hub's default; looked up with
``huggingface_hub.try_to_load_from_cache``, which never touches the network). Anything else is one clear error:
memlab never downloads. :func:`model_info` is what ``--json`` says about the model: its family, the traits its
modelling code implies, how the step calls it, and which source of truth gave the numbers (the formula, or the trace
of the real modelling code).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from memlab.errors import ConfigError

_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
HF_CALL = ("transformers AutoModelForCausalLM.from_config(config) in the setup's dtype; loss = model(input_ids=ids, "
           "labels=ids).loss (transformers shifts the labels inside: loss_utils.py ForCausalLMLoss)")
"""How memlab's step calls a Hugging Face model (memlab.model.loss, memlab.tracing.hf, memlab.run.hf)."""
REFERENCE_CALL = "memlab.model.gpt.GPT (the reference GPT) through memlab.model.step.train_step"
"""How memlab's step calls the reference GPT (presets with the ref: prefix, explicit dimensions)."""


def resolve(text: str) -> str:
    """The path of the ``config.json`` that ``text`` names (module docstring); :class:`ConfigError` otherwise."""
    path = Path(text)
    try:
        exists = path.exists()
    except (OSError, ValueError):  # a name the OS refuses: read_config_json says so
        return text
    if not exists and shipped(text) is not None:
        return str(shipped(text))
    if exists or path.suffix == ".json" or not _MODEL_ID.match(text):
        return text  # read_config_json reads it, or says what is wrong with it
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        raise ConfigError(f"no config file at {text!r}; reading a model id from the Hugging Face cache needs "
                          "huggingface_hub (pip install 'memlab[course]')") from None

    cache = os.environ.get("HF_HUB_CACHE") or None
    try:
        found = try_to_load_from_cache(text, "config.json", cache_dir=cache)
    except (ValueError, OSError):  # huggingface_hub's HFValidationError is a ValueError: an id it refuses
        found = None
    if isinstance(found, str):
        return found
    where = cache or constants.HF_HUB_CACHE
    raise ConfigError(f"no config file at {text!r}, and no config.json for model id {text!r} in the local Hugging "
                      f"Face cache ({where}); memlab never downloads: download it once (huggingface-cli download "
                      "... config.json) or give the path of a config.json")


def shipped(name: str) -> Path | None:
    """The published config memlab ships under ``name`` (``memlab/course/configs/full/NAME.json``: gpt2,
    llama-2-7b, llama-2-13b, mistral-7b, ...), or None."""
    from memlab.course.hf_configs import CONFIG_DIR, config_names

    return CONFIG_DIR / "full" / f"{name}.json" if name in config_names("full") else None


def published_presets() -> tuple[str, ...]:
    """The preset names memlab ships a published config of (``--preset NAME`` is then that published model)."""
    from memlab.course.hf_configs import config_names
    from memlab.predict.spec.model import preset_names

    return tuple(n for n in preset_names() if n in config_names("full"))


def shipped_name(path: str | os.PathLike[str]) -> str | None:
    """The name memlab ships the config at ``path`` under (``.../configs/full/llama-2-7b.json``: ``llama-2-7b``),
    or None for any other file."""
    stem = Path(path).stem
    found = shipped(stem)
    try:
        return stem if found is not None and Path(path).resolve() == found.resolve() else None
    except (OSError, ValueError):
        return None


def published(path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
    """(model, config dict) of a Hugging Face config: :func:`memlab.predict.families.reader.from_hf` of it, named after
    the shipped config when it is one, so ``--preset llama-2-7b`` and ``--hf llama-2-7b`` build the same object."""
    from memlab.predict.families.reader import from_hf, read_config_json

    raw = read_config_json(path)
    return from_hf(raw, name=shipped_name(path)), raw


def preset_model(text: str) -> Any:
    """The model ``--preset TEXT`` names: a preset with a published config memlab ships (gpt2, llama-2-7b,
    llama-2-13b, mistral-7b) is that model as its published code runs it (:func:`published` of the shipped
    config, the object ``--hf NAME`` gives); ``ref:NAME`` is the reference GPT with NAME's sizes; any other preset
    (tiny-gpt, gpt-3-175b, ...) is the reference GPT (memlab ships no config of that name)."""
    from memlab.predict.spec.model import preset

    if text.startswith("ref:"):
        return preset(text.removeprefix("ref:"))
    from memlab.course.hf_configs import published as published_model

    cfg = preset(text)  # unknown names: one line with the closest ones
    return published_model(cfg.name) if shipped(cfg.name) is not None else cfg


def is_published(model: Any) -> bool:
    """Whether ``model`` is a Hugging Face family's config (from :func:`memlab.predict.families.reader.from_hf`), not
    the reference GPT."""
    impl = getattr(model, "impl", None)
    return impl is not None and impl.family != "reference"


def model_label(model: Any) -> str:
    """Which model the numbers are of, in words, for every output: ``NAME (published config, family F)``,
    ``reference GPT with NAME's sizes (ref:NAME)``, ``NAME (reference GPT; memlab ships no published config of that
    name)``, or the reference GPT with explicit dimensions."""
    from memlab.predict.spec.model import PRESETS

    name = getattr(model, "name", None)
    if not isinstance(name, str):
        return "a bare parameter count (model states only)"
    if is_published(model):
        where = "published config" if shipped(name) is not None else "Hugging Face config"
        return f"{name} ({where}, family {model.impl.family})"
    if shipped(name) is not None:
        return f"reference GPT with {name}'s sizes (ref:{name})"
    if name in PRESETS:
        return f"{name} (reference GPT; memlab ships no published config of that name)"
    return f"reference GPT with explicit dimensions ({name})"


def published_twin(model: Any, setup: Any, overheads: Any) -> dict[str, Any] | None:
    """For a preset named after a published model whose config memlab ships: that model as its published code
    runs it (:func:`memlab.predict.families.reader.from_hf` of the shipped config) under the same setup, as ``{"hf":
    name, "peak": bytes, "activations": bytes, "param_count": n}``; None for any other model."""
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf

    name = getattr(model, "name", None)
    impl = getattr(model, "impl", None)
    path = shipped(name) if isinstance(name, str) and impl is not None and impl.family == "reference" else None
    if path is None:
        return None
    bd = estimate(from_hf(path), setup, overheads=overheads)
    return {"hf": name, "peak": bd.peak_bytes, "activations": bd.activations_bytes, "param_count": bd.param_count}


def hf_path(text: str) -> str:
    """An argument type: :func:`resolve` with its error as the one-line argparse error."""
    try:
        return resolve(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def model_info(model: Any, *, source: str, config: dict[str, Any] | None = None,
               refused: str | None = None) -> dict[str, Any]:
    """What ``--json`` says about the model: ``family``, ``traits`` (``impl.differs()``; None when the formula
    does not cover the model), ``calling_convention``, ``source_of_truth`` (``formula`` or ``trace``) and, when the
    formula refused the config, ``formula_refused`` (its one-line reason); ``model_label`` is :func:`model_label`."""
    impl = getattr(model, "impl", None)
    hf = config is not None or (impl is not None and impl.family != "reference")
    family = (config or {}).get("model_type") or (impl.family if impl is not None else None)
    out = {"family": family if hf else "reference", "traits": impl.differs() if impl is not None else None,
           "calling_convention": HF_CALL if hf else REFERENCE_CALL, "source_of_truth": source,
           "model_label": model_label(model) if model is not None else f"{family} (Hugging Face config)"}
    if refused is not None:
        out["formula_refused"] = refused
    return out
