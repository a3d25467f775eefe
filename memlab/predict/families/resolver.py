"""One way to name a model: :func:`resolve` turns a model spec into a TransformerConfig, the same in Python and on
the command line (``memlab estimate --model SPEC``). Nothing is downloaded and no torch is imported.

The spellings, tried in this order:

- ``ref:NAME``: the reference GPT with NAME's sizes (:func:`memlab.predict.spec.model.preset`, what
  ``memlab.preset(NAME)`` is in Python);
- ``hf:NAME``: the published config memlab ships under NAME (``configs/full/NAME.json``: ``hf:llama-2-7b``);
- a path to a ``config.json``, or to a folder holding one;
- a bare NAME of a shipped published config (``llama-2-7b``: the same as ``hf:llama-2-7b``);
- a Hugging Face model id ``org/name`` whose ``config.json`` is in the local Hugging Face hub cache
  (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``: ``models--org--name/snapshots/``;
  memlab never downloads).

Anything else is one :class:`~memlab.errors.ConfigError` (an unknown name lists the known ones). :func:`locate`
gives the ``config.json`` path a spec names (the CLI's ``--hf``), :func:`resolve_with_raw` the config dict beside
the model (for building the real Hugging Face model from it). The shipped configs live in :data:`CONFIGS`:
``tiny/`` holds a scaled-down config of every family (named by ``model_type``), ``full/`` the published
architectures (each names its source in ``_memlab_source``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from memlab.errors import ConfigError, UnknownNameError, unknown_name
from memlab.predict.families.reader import from_hf, read_config_json
from memlab.predict.spec.model import TransformerConfig, preset, preset_names

CONFIGS = Path(__file__).resolve().parent / "configs"
"""The shipped configs: ``tiny/MODEL_TYPE.json`` and ``full/NAME.json``."""

SIZES = ("tiny", "full")

_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def config_names(size: str = "full") -> list[str]:
    """Names of the shipped configs of one size (``tiny``: one per ``model_type``; ``full``: published models)."""
    if size not in SIZES:
        raise ConfigError(f"size must be one of {', '.join(SIZES)}, got {size!r:.60}")
    return sorted(p.stem for p in (CONFIGS / size).glob("*.json"))


def shipped(name: str) -> Path | None:
    """The published config memlab ships under ``name`` (``configs/full/NAME.json``), or None."""
    return CONFIGS / "full" / f"{name}.json" if isinstance(name, str) and name in config_names("full") else None


def shipped_name(path: str | os.PathLike[str]) -> str | None:
    """The name memlab ships the config at ``path`` under (``.../configs/full/llama-2-7b.json``: ``llama-2-7b``),
    or None for any other file."""
    stem = Path(path).stem
    found = shipped(stem)
    try:
        return stem if found is not None and Path(path).resolve() == found.resolve() else None
    except (OSError, ValueError):
        return None


def hub_cache() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub finds it: ``$HF_HUB_CACHE`` (or the older
    ``$HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` or
    ``~/.cache/huggingface/hub``."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached_config(model_id: str) -> Path | None:
    """The ``config.json`` of ``model_id`` (``org/name``) in :func:`hub_cache`: the snapshot ``refs/main`` names,
    else the newest snapshot holding one; None when there is none. Reads the file system only."""
    folder = hub_cache() / f"models--{model_id.replace('/', '--')}"
    try:
        ref = folder / "refs" / "main"
        if ref.is_file():
            path = folder / "snapshots" / ref.read_text().strip() / "config.json"
            if path.is_file():
                return path
        found = [p for p in (folder / "snapshots").glob("*/config.json") if p.is_file()]
        return max(found, key=lambda p: p.stat().st_mtime) if found else None
    except (OSError, ValueError):
        return None


def _unknown(name: str) -> UnknownNameError:
    """The error for a bare name that is neither shipped nor a file: the known names, and ``ref:`` for a preset."""
    err = unknown_name("model", name, config_names("full"))
    hint = (f" {name!r} is a reference GPT preset: say ref:{name}." if name in preset_names() else
            " Or give ref:NAME (the reference GPT, presets: " + ", ".join(preset_names()) + "), the path of a "
            "config.json or its folder, or a Hugging Face model id org/name in the local cache.")
    return UnknownNameError(f"{err}{hint}")


def locate(spec: str | os.PathLike[str]) -> str:
    """The path of the ``config.json`` a spec names (module docstring; not ``ref:``). A path that does not exist
    comes back as given when it looks like one (``.json``, a folder separator): :func:`read_config_json` then
    says what is wrong with it."""
    text = os.fspath(spec)
    if not isinstance(text, str) or not text:
        raise ConfigError(f"a model spec is a non-empty name or path, got {text!r:.60}")
    if text.startswith("ref:"):
        raise ConfigError(f"{text!r:.80} names the reference GPT, not a Hugging Face config: give hf:NAME, a "
                          "config.json path or a model id (the reference GPT is --preset ref:NAME / --model ref:NAME)")
    if text.startswith("hf:"):
        name = text.removeprefix("hf:")
        found = shipped(name)
        if found is None:
            raise unknown_name("published config", name, config_names("full"))
        return str(found)
    path = Path(text)
    try:
        exists = path.exists()
    except (OSError, ValueError):  # a name the OS refuses: read_config_json says so
        return text
    if exists:
        return text
    if shipped(text) is not None:
        return str(shipped(text))
    if path.suffix == ".json" or (os.sep in text and not _MODEL_ID.match(text)):
        return text  # read_config_json says there is no such file
    if not _MODEL_ID.match(text):
        raise _unknown(text)
    found = cached_config(text)
    if found is None:
        raise ConfigError(f"no config file at {text!r}, and no config.json for model id {text!r} in the local "
                          f"Hugging Face cache ({hub_cache()}); memlab never downloads: download it once "
                          "(huggingface-cli download ... config.json) or give the path of a config.json")
    return str(found)


def resolve_with_raw(spec: str | os.PathLike[str]) -> tuple[TransformerConfig, dict[str, Any] | None]:
    """(model, its config dict) of a spec (module docstring); the dict is None for ``ref:NAME``. A shipped
    published config is named after its name; any other takes :func:`~memlab.predict.families.reader.from_hf`'s
    label (``_name_or_path``)."""
    text = os.fspath(spec)
    if isinstance(text, str) and text.startswith("ref:"):
        return preset(text.removeprefix("ref:")), None
    path = locate(text)
    raw = read_config_json(path)
    return from_hf(raw, name=shipped_name(path)), raw


def resolve(spec: str | os.PathLike[str]) -> TransformerConfig:
    """The TransformerConfig a model spec names: ``ref:NAME``, ``hf:NAME``, a path, a shipped name or a cached
    model id (module docstring)."""
    return resolve_with_raw(spec)[0]


def published(name: str) -> TransformerConfig:
    """The published model ``name`` as its published code runs it: ``resolve("hf:" + name)`` (``llama-2-7b``,
    ``gpt2``, ...: :func:`config_names`). :func:`memlab.predict.spec.model.preset` is the reference GPT with the
    same sizes (``ref:NAME``), whose activations differ where the published code differs (its traits:
    ``published(name).impl.differs()``)."""
    return resolve(f"hf:{name}")
