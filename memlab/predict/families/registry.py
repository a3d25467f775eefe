"""The families by ``model_type``: :data:`FAMILIES`, built from each family module's ``FAMILY`` record, and what is
looked up in it (the defaults, the key accounts and their checks).

:data:`MODULES` are the family modules, found in this package (each exports ``FAMILY``): writing one is the one
registration a new family needs (the ``families/__init__.py`` guide). Pure: no torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.family import Family
from memlab.predict.families.keys import CONDITIONAL, KeyAccount, flat_keys, same_value

SHARED = ("family", "common", "keys", "registry", "order", "reader", "resolver")
"""The package's shared modules (the family modules build on them; none is a family)."""


def _family_modules() -> tuple[ModuleType, ...]:
    """Every other module of this package, each exporting ``FAMILY``, by module name: writing the module is its
    registration."""
    found = []
    package = __name__.rpartition(".")[0]
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if info.ispkg or info.name in SHARED:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        if not isinstance(getattr(module, "FAMILY", None), Family):
            raise ConfigError(f"{module.__name__} is in memlab.predict.families but exports no FAMILY record: a family "
                              "module exports one (the package's guide), a shared module is listed in SHARED")
        found.append(module)
    return tuple(found)


MODULES = _family_modules()
"""Every family module, each exporting ``FAMILY`` (:class:`~memlab.predict.families.family.Family`), by name:
found, not listed, so a new family's module is its one registration."""

FAMILIES: dict[str, Family] = {t: m.FAMILY for m in MODULES for t in m.FAMILY.model_types}
"""model_type -> its family's record."""

SUPPORTED = tuple(FAMILIES)
"""The ``model_type`` values :func:`memlab.predict.families.reader.from_hf` maps."""

DEFAULTS: dict[str, Mapping[str, Any]] = {t: f.defaults[t] for t, f in FAMILIES.items()}
"""model_type -> the ``transformers`` defaults of the keys its builder reads."""

ACCOUNTS: dict[str, KeyAccount] = {t: f.keys[t] for t, f in FAMILIES.items()}
"""model_type -> its :class:`~memlab.predict.families.keys.KeyAccount`."""


def account(model_type: str) -> KeyAccount:
    """The :class:`KeyAccount` of ``model_type``; a :class:`ConfigError` for a family without one."""
    try:
        return ACCOUNTS[model_type]
    except (KeyError, TypeError):
        raise ConfigError(f"model_type {model_type!r:.60} has no key account in memlab.predict.families: its "
                          "config keys are not checked, so the formula refuses it") from None


def unaccounted(model_type: str, config: Mapping[str, Any]) -> list[str]:
    """The keys of ``config`` (nested ones dotted) in none of ``model_type``'s three lists, sorted."""
    acc = account(model_type)
    return sorted(k for k in flat_keys(config) if acc.kind(k) is None)


def refused_values(model_type: str, config: Mapping[str, Any]) -> list[str]:
    """The refused keys of ``config`` whose values are not accepted (null counts as not given), sorted; the
    conditional ones (:data:`~memlab.predict.families.keys.CONDITIONAL`) are left to the family's builder."""
    acc = account(model_type)
    bad = []
    for key, value in flat_keys(config).items():
        if acc.kind(key) != "refused" or key in CONDITIONAL or value is None:
            continue
        if not any(same_value(value, ok) for ok in acc.entry(key, "accepted") or ()):
            bad.append(key)
    return sorted(bad)


def check(model_type: str, config: Mapping[str, Any]) -> None:
    """Raise a one-line :class:`ConfigError` when ``config`` has a key in no list, or a refused key with a value
    the estimate does not cover (the first such key, with what memlab does about it)."""
    missing = unaccounted(model_type, config)
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise ConfigError(f"{model_type} config key(s) {shown} are not accounted for in memlab.predict.families "
                          f"(the {model_type} module's KEYS; not known to change memory or not): the estimate "
                          "refuses rather than ignore them; remove them or trace the model (memlab trace --hf)")
    bad = refused_values(model_type, config)
    if bad:
        key = bad[0]
        value = flat_keys(config)[key]
        raise ConfigError(f"{model_type} config {key}={value!r:.60} is not modelled: "
                          f"{account(model_type).entry(key, 'refused')}")
