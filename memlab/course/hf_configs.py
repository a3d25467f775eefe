"""The Hugging Face ``config.json`` files chapter 10 ships, and the learner's own.

``memlab/course/configs/tiny/`` holds a scaled-down config of every family
:func:`memlab.predict.families.reader.from_hf` maps
(written for memlab from each family's layout: d_model 64, 2 layers, vocab 512; tests/studies/test_hf_draws.py checks
that none is missing) that builds and trains on a CPU in milliseconds; ``full/`` the published
architectures (each file names its source in ``_memlab_source``), for predictions at full size. Nothing here is
downloaded: these are configs, not weights; a model is built from one with ``AutoModelForCausalLM.from_config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memlab.errors import ConfigError, unknown_name
from memlab.predict.families.reader import from_hf, read_config_json
from memlab.predict.spec.model import TransformerConfig

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
SIZES = ("tiny", "full")


def config_names(size: str = "tiny") -> list[str]:
    """Names of the shipped configs of one size (``tiny`` or ``full``)."""
    if size not in SIZES:
        raise ConfigError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    return sorted(p.stem for p in (CONFIG_DIR / size).glob("*.json"))


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


def published(name: str) -> TransformerConfig:
    """The published model ``name`` as its published code runs it: :func:`memlab.predict.families.reader.from_hf` of
    the full config memlab ships under that name (``llama-2-7b``, ``gpt2``, ...; :func:`config_names` ``("full")``),
    named
    ``name``. This is what ``memlab estimate --preset NAME`` and ``--hf NAME`` give for such a name;
    :func:`memlab.predict.spec.model.preset` is the reference GPT with the same sizes (``--preset ref:NAME``), whose
    activations differ where the published code differs (its traits: ``published(name).impl.differs()``)."""
    if name not in config_names("full"):
        raise unknown_name("published config", str(name), config_names("full"))
    return from_hf(read_config_json(CONFIG_DIR / "full" / f"{name}.json"), name=name)
