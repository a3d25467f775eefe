"""The Hugging Face ``config.json`` files chapter 11 reads, and the learner's own.

The configs are shipped beside the families that read them (:data:`memlab.predict.families.resolver.CONFIGS`):
``tiny/`` holds a scaled-down config of every family :func:`memlab.predict.families.reader.from_hf` maps (written
for memlab from each family's layout: d_model 64, 2 layers, vocab 512; tests/predict/test_families.py checks that
none is missing) that builds and trains on a CPU in milliseconds; ``full/`` the published architectures (each file
names its source in ``_memlab_source``), for predictions at full size. Nothing here is downloaded: these are
configs, not weights; a model is built from one with ``AutoModelForCausalLM.from_config``. A published model by
name is :func:`memlab.predict.families.resolve` (``memlab.resolve("llama-2-7b")``, ``memlab.published``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memlab.errors import ConfigError, unknown_name
from memlab.predict.families import resolver
from memlab.predict.families.reader import read_config_json

CONFIG_DIR = resolver.CONFIGS
SIZES = resolver.SIZES


def config_names(size: str = "tiny") -> list[str]:
    """Names of the shipped configs of one size (``tiny`` or ``full``)."""
    return resolver.config_names(size)


def _read(name_or_path: str | Path, size: str) -> dict[str, Any]:
    path = Path(name_or_path)
    if path.suffix != ".json":
        if str(name_or_path) not in config_names(size):
            raise unknown_name(f"{size} config", str(name_or_path), config_names(size))
        path = CONFIG_DIR / size / f"{name_or_path}.json"
    if not path.exists():
        raise ConfigError(f"no config.json at {path}: give a shipped name ({', '.join(config_names(size))}) or a path")
    return read_config_json(path)  # a learner's file: regular, size-capped, strict UTF-8 JSON object


def load_config(name_or_path: str | Path, size: str = "tiny") -> dict[str, Any]:
    """A shipped config by name (or any ``config.json`` path) as a dict, without memlab's ``_memlab_*`` notes."""
    return {k: v for k, v in _read(name_or_path, size).items() if not k.startswith("_memlab")}


def config_source(name_or_path: str | Path, size: str = "full") -> str:
    """Where a shipped config's sizes come from (its ``_memlab_source`` or ``_memlab_note``)."""
    raw = _read(name_or_path, size)
    return str(raw.get("_memlab_source") or raw.get("_memlab_note") or "the learner's own config.json")
