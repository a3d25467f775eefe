"""Config keys memlab's tests did not choose: every key of every family's config, flipped alone and drawn jointly,
the parameter count memlab reads from it against the real model's (issue 36, "States").

A family's keys are those of its ``transformers`` config class (``AutoConfig.for_model(model_type).to_dict()``,
the key account's own source, :mod:`memlab.predict.families.keys`), of its tiny config, and both spellings of each
``attribute_map`` alias (``hidden_size`` and ``n_embd``). :func:`flipped_booleans` sets each boolean key away from
its value one at a time; :func:`draw_keys` changes two to six keys at once, each to a value of its kind
(:func:`drawn_value`: sizes from small sets, fractions, activation names, layer kinds, a rotary dict with a partial
factor), so keys meet others that are not at their defaults. Each config ends in one verdict
(:func:`count_verdict`):

- ``exact``: :func:`memlab.predict.families.reader.from_hf` accepts it, and its ``param_count()`` and the
  estimate's parameter, gradient and AdamW bytes (:func:`memlab.predict.estimate.estimate`, fp32, one token:
  the states do not depend on the call) equal the real model's: ``AutoModelForCausalLM.from_config`` on the meta
  device (no memory), ``sum(p.numel() for p in model.parameters())`` (a tied weight once), 4, 4 and 8 bytes a
  parameter;
- ``refused``: from_hf raised a one-line :class:`~memlab.errors.MemlabError`;
- ``unbuildable``: memlab accepts it but transformers does not build it (not memlab's count to judge);
- ``off``: accepted, built, and a count differs: the silent miss this exists to find.

``benchmarks/config_key_counts.py`` runs a large sample; ``tests/studies/test_key_draws.py`` every boolean key and
a seeded joint sample. Nothing here is fitted: both sides are counted.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memlab.errors import MemlabError

VERDICTS = ("exact", "refused", "unbuildable", "off")
"""Every verdict a config can end in (module docstring)."""

SKIPPED = frozenset({"model_type", "transformers_version", "_name_or_path", "architectures", "id2label", "label2id",
                     "auto_map", "quantization_config", "torchscript", "dtype", "torch_dtype"})
"""Keys a draw leaves alone: the family's name, labels, serialisation, and keys whose refusal is tested elsewhere
(``tests/predict/families/test_config_keys.py``)."""

ACTIVATIONS = ("gelu", "relu", "silu", "gelu_new", "gelu_pytorch_tanh", "tanh", "swish")
"""Activation names a drawn ``*act*`` key takes (transformers ``activations.py ACT2FN`` keys)."""
WIDTHS = (32, 64, 96, 128)
HEADS = (1, 2, 4, 8)
LAYERS = (1, 2, 3)
HEAD_DIMS = (8, 16, 32)
FRACTIONS = (0.0, 0.1, 0.5)
INTS = (0, 1, 2, 4, 16, 64, 128)
FLOATS = (0.0, 0.5, 1.0, 2.0, 30.0)
OPTIONAL = (None, 0, 1, 2, 3, 16, 64, 128, 0.5)
WINDOWS = (None, 8, 16, 300)
"""The values drawn per kind of key: small sizes, so every model is built in milliseconds on the meta device."""


@dataclass(frozen=True)
class KeyVerdict:
    """One config's outcome: ``verdict`` (module docstring), memlab's and the real model's parameter counts where
    both exist, the keys changed and ``reason`` (the refusal, the build error, or what differs)."""

    family: str
    changed: Mapping[str, Any]
    verdict: str
    predicted: int | None = None
    real: int | None = None
    reason: str = ""

    def label(self) -> str:
        """A short description for tables: the family and what was changed."""
        return f"{self.family} {dict(self.changed)!r:.160}"


def family_keys(model_type: str, base: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(every key of ``model_type``'s config class and of ``base`` with its value there, the class's
    ``attribute_map``); ``base``'s values win."""
    from memlab.model.hf import import_transformers, quiet_transformers

    with quiet_transformers():
        cls = import_transformers().AutoConfig.for_model(model_type)
    return {**cls.to_dict(), **base}, dict(cls.attribute_map)


def flipped_booleans(model_type: str, base: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(key, ``base`` with that boolean key set away from its value) for every boolean key of the family
    (:func:`family_keys`), sorted."""
    values, _ = family_keys(model_type, base)
    return [(k, {**base, k: not v}) for k, v in sorted(values.items()) if isinstance(v, bool) and k not in SKIPPED]


def drawn_value(rng: random.Random, key: str, value: Any, layers: int) -> Any:
    """A value for ``key`` (now ``value``) of its kind: a boolean flipped, a size from a small set, a fraction,
    an activation name, a list of ``layers`` layer kinds, a rotary dict with a partial factor."""
    k = key.lower()
    if isinstance(value, bool):
        return not value
    if "act" in k and "dropout" not in k and (value is None or isinstance(value, str)):
        return rng.choice(ACTIVATIONS)
    if isinstance(value, list) and (not value or isinstance(value[0], str)):
        return [rng.choice(("full_attention", "sliding_attention")) for _ in range(layers)]
    if k in ("rope_parameters", "rope_scaling"):
        return {**(value or {"rope_type": "default", "rope_theta": 10000.0}),
                "partial_rotary_factor": rng.choice((0.25, 0.5, 1.0))}
    return _drawn_number(rng, k, value)


def _drawn_number(rng: random.Random, k: str, value: Any) -> Any:
    """A number (or a name) for the lower-cased key ``k`` by what it names, else by the kind of ``value``."""
    named = ((("dropout", "pdrop", "eps", "init", "range", "std"), FRACTIONS), (("hidden_size", "n_embd"), WIDTHS),
             (("heads", "n_head"), HEADS), (("layers", "n_layer"), LAYERS), (("head_dim",), HEAD_DIMS),
             (("window",), WINDOWS))
    for words, choices in named:
        if any(w in k for w in words):
            return rng.choice(choices)
    if isinstance(value, float):
        return rng.choice(FLOATS)
    if isinstance(value, int):
        return rng.choice(INTS)
    if value is None:
        return rng.choice(OPTIONAL)
    if isinstance(value, str):
        return rng.choice((value, "default", "linear", "mean", "abc"))
    return value


def draw_keys(rng: random.Random, model_type: str, base: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """One joint draw: ``base`` with two to six of the family's keys (and ``attribute_map`` spellings) changed at
    once (:func:`drawn_value`); returns (the config, the keys changed)."""
    values, aliases = family_keys(model_type, base)
    keys = sorted({*(k for k in values if k not in SKIPPED and not k.startswith("_")), *aliases, *aliases.values()})
    cfg = dict(base)
    changed = rng.sample(keys, rng.randint(2, 6))
    for key in changed:
        now = values.get(key, values.get(aliases.get(key, "")))
        cfg[key] = drawn_value(rng, key, now, int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 2))
    return cfg, changed


def real_param_count(config: Mapping[str, Any]) -> int:
    """The real model's parameter count: ``AutoModelForCausalLM.from_config`` on the meta device, each parameter
    once (a tied weight is one parameter)."""
    import torch

    from memlab.model.hf import hf_config, import_transformers, quiet_transformers

    cfg = hf_config(dict(config))
    with torch.device("meta"), quiet_transformers():
        model = import_transformers().AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def count_verdict(config: Mapping[str, Any], changed: Mapping[str, Any] | None = None) -> KeyVerdict:
    """``config``'s verdict (module docstring); ``changed`` (the keys drawn, for the label) defaults to none."""
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf
    from memlab.predict.spec.setup import Setup

    family, shown = str(config.get("model_type")), dict(changed or {})
    try:
        tc = from_hf(dict(config))
        states = estimate(tc, Setup(batch=1, seq=1))
    except MemlabError as exc:
        return KeyVerdict(family, shown, "refused", reason=str(exc))
    try:
        real = real_param_count(config)
    except Exception as exc:  # transformers (or torch) rejects the drawn config: reported, not judged
        return KeyVerdict(family, shown, "unbuildable", tc.param_count(), reason=f"{type(exc).__name__}: {exc}"[:200])
    n = tc.param_count()
    pairs = {"param_count": (n, real), "params B": (states.params_bytes, 4 * real),
             "grads B": (states.grads_bytes, 4 * real), "AdamW state B": (states.optimizer_bytes, 8 * real)}
    wrong = {k: (p, r) for k, (p, r) in pairs.items() if p != r}
    if wrong:
        why = ", ".join(f"{k} {p:,} vs {r:,} ({(p - r) / r:+.3%})" for k, (p, r) in wrong.items())
        return KeyVerdict(family, shown, "off", n, real, why)
    return KeyVerdict(family, shown, "exact", n, real)


def key_draws(bases: Mapping[str, Mapping[str, Any]], draws: int, *, seed: int = 0) -> list[KeyVerdict]:
    """``draws`` joint draws (:func:`draw_keys`) of each base config (a dict with ``model_type``), each judged
    (:func:`count_verdict`); seeded by ``seed`` and the family."""
    out = []
    for name, base in sorted(bases.items()):
        family = str(base["model_type"])
        clean = {k: v for k, v in base.items() if not k.startswith("_")}
        rng = random.Random(f"keys {seed} {name}")
        for _ in range(draws):
            cfg, changed = draw_keys(rng, family, clean)
            out.append(count_verdict(cfg, {k: cfg[k] for k in changed}))
    return out


def verdict_counts(verdicts: list[KeyVerdict]) -> dict[str, int]:
    """How many configs ended in each verdict (:data:`VERDICTS`, zeros included)."""
    return {v: sum(x.verdict == v for x in verdicts) for v in VERDICTS}
