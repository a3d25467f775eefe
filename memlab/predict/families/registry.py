"""The families by ``model_type``: :data:`FAMILIES`, built from each family module's ``FAMILY`` record, and what is
looked up in it (the defaults, the key accounts and their checks).

:data:`MODULES` lists the family modules; adding one there is the one registration a new family needs (the
``families/__init__.py`` guide). Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import memlab.predict.families.falcon as falcon
import memlab.predict.families.gemma as gemma
import memlab.predict.families.gemma2 as gemma2
import memlab.predict.families.gemma3 as gemma3
import memlab.predict.families.gpt2 as gpt2
import memlab.predict.families.gpt_neox as gpt_neox
import memlab.predict.families.gptj as gptj
import memlab.predict.families.llama as llama
import memlab.predict.families.mistral as mistral
import memlab.predict.families.mixtral as mixtral
import memlab.predict.families.olmo2 as olmo2
import memlab.predict.families.opt as opt
import memlab.predict.families.phi as phi
import memlab.predict.families.phi3 as phi3
import memlab.predict.families.qwen2 as qwen2
import memlab.predict.families.qwen3 as qwen3
import memlab.predict.families.qwen_moe as qwen_moe
import memlab.predict.families.stablelm as stablelm
import memlab.predict.families.starcoder2 as starcoder2
from memlab.errors import ConfigError
from memlab.predict.families.family import Family
from memlab.predict.families.keys import CONDITIONAL, KeyAccount, flat_keys, same_value

MODULES = (gpt2, opt, gpt_neox, phi, llama, mistral, qwen2, gemma, qwen3, phi3, starcoder2, olmo2, stablelm,
           gemma2, gemma3, gptj, falcon, mixtral, qwen_moe)
"""Every family module, each exporting ``FAMILY`` (:class:`~memlab.predict.families.family.Family`)."""

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
