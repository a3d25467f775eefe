"""Every key of every supported family's config is modelled, neutral or refused (each family module's KEYS)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from memlab.errors import ConfigError, SetupError
from memlab.predict.estimate import estimate
from memlab.predict.families.keys import CONDITIONAL, NESTED, REFUSED_DEFAULTS, flat_keys
from memlab.predict.families.reader import SUPPORTED, from_hf
from memlab.predict.families.registry import ACCOUNTS, account, unaccounted
from memlab.predict.spec.setup import Setup

transformers = pytest.importorskip("transformers")
CONFIGS = Path(__file__).resolve().parents[3] / "memlab" / "predict" / "families" / "configs"
TINY = {p.stem: json.loads(p.read_text()) for p in (CONFIGS / "tiny").glob("*.json")}


def _installed(model_type: str) -> dict[str, Any]:
    return transformers.AutoConfig.for_model(model_type).to_dict()


def test_every_supported_family_has_an_account() -> None:
    assert set(SUPPORTED) <= set(ACCOUNTS)
    with pytest.raises(ConfigError, match="no key account"):
        account("mamba")


@pytest.mark.parametrize("family", sorted(ACCOUNTS))
def test_every_key_of_the_installed_config_class_is_accounted_for(family: str) -> None:
    config = _installed(family)
    assert unaccounted(family, config) == []
    for key, value in config.items():  # a dict-valued key is either read key by key or accounted as a whole
        if isinstance(value, dict) and key in NESTED:
            assert all(f"{key}.{k}" in flat_keys(config) for k in value)
    acc = account(family)
    lists = [set(acc.modelled), set(acc.neutral), set(acc.refused)]
    assert not (lists[0] & lists[1] or lists[0] & lists[2] or lists[1] & lists[2])  # one list per key
    assert all("memlab/" in src for src in acc.modelled.values())
    assert all(why for why in (*acc.neutral.values(), *acc.refused.values()))
    assert set(acc.accepted) == set(acc.refused)
    # The class's own defaults are estimated (no default value is refused), unless they are a layout memlab refuses
    if family in REFUSED_DEFAULTS:
        with pytest.raises(ConfigError):
            from_hf(config)
    else:
        assert from_hf(config).param_count() > 0


@pytest.mark.parametrize("family", sorted(ACCOUNTS))
def test_a_key_in_no_list_is_refused(family: str) -> None:
    with pytest.raises(ConfigError, match="not accounted for") as err:
        from_hf({**TINY[family], "some_new_knob": 3})
    assert "some_new_knob" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"rope_parameters\.brand_new"):
        from_hf({**TINY[family], "rope_parameters": {"rope_type": "default", "brand_new": 1}})


def _other_value(rng: random.Random, accepted: tuple[Any, ...]) -> Any:
    """A value none of ``accepted`` equals, of the kind of the first one."""
    kind = accepted[0] if accepted else {}
    if isinstance(kind, bool):
        return not kind
    if isinstance(kind, int | float):
        return round(rng.uniform(0.01, 0.99), 3)
    if isinstance(kind, str):
        return "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 9)))
    return {"k": rng.randint(1, 9)}


@pytest.mark.parametrize("family", sorted(ACCOUNTS))
def test_a_refused_key_with_another_value_is_refused_naming_it(family: str) -> None:
    rng = random.Random(f"refused-{family}")
    acc = account(family)
    for key in sorted(acc.refused):
        if key in CONDITIONAL:
            continue
        for _ in range(3):
            value = _other_value(rng, acc.accepted[key])
            parent, _, child = key.partition(".")
            cfg = {**TINY[family], parent: {"rope_type": "default", child: value}} if child else \
                {**TINY[family], key: value}
            with pytest.raises(ConfigError) as err:
                from_hf(cfg)
            assert key in str(err.value), (key, value, str(err.value))
        for ok in acc.accepted[key]:  # and every accepted value is estimated
            parent, _, child = key.partition(".")
            cfg = {**TINY[family], parent: {child: ok}} if child else {**TINY[family], key: ok}
            assert from_hf(cfg).param_count() > 0


@pytest.mark.parametrize("family", sorted(ACCOUNTS))
def test_a_neutral_key_changes_nothing_the_formula_gives(family: str) -> None:
    rng = random.Random(f"neutral-{family}")
    base = from_hf(TINY[family])
    for key in sorted(account(family).neutral):
        if key in NESTED or key in ("_name_or_path", "name"):
            continue
        value = rng.choice([rng.randint(0, 7), round(rng.random(), 3), "xyz", True, False])
        parent, _, child = key.partition(".")
        cfg = {**TINY[family], parent: {child: value}} if child else {**TINY[family], key: value}
        assert from_hf(cfg) == base, key


@pytest.mark.parametrize("path", sorted((CONFIGS / "full").glob("*.json")) + sorted((CONFIGS / "tiny").glob("*.json")),
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_config_is_accounted_for(path: Path) -> None:
    raw = json.loads(path.read_text())
    assert unaccounted(raw["model_type"], raw) == []
    assert from_hf(raw).param_count() > 0


def test_the_rotary_dict_wins_over_the_4x_rotary_keys() -> None:
    # transformers 5.x: rope_parameters.setdefault("partial_rotary_factor", rotary_pct): the dict's value wins
    neox = from_hf({**TINY["gpt_neox"], "rotary_pct": 0.25, "rope_parameters": {"partial_rotary_factor": 0.5}})
    assert neox.impl.rotary_fraction == 0.5
    assert from_hf({**TINY["gpt_neox"], "rotary_pct": 0.25}).impl.rotary_fraction == 0.25
    phi = from_hf({**TINY["phi"], "rope_scaling": {"rope_type": "linear", "factor": 2.0,
                                                   "partial_rotary_factor": 1.0}})
    assert phi.impl.rotary_fraction == 1.0
    with pytest.raises(ConfigError, match="partial_rotary_factor"):
        from_hf({**TINY["llama"], "rope_parameters": {"partial_rotary_factor": 0.5}})


def test_a_sliding_window_not_longer_than_seq_is_refused_for_sdpa_and_inference() -> None:
    mistral = from_hf({**TINY["mistral"], "sliding_window": 32})
    assert mistral.impl.sliding_window == 32
    assert from_hf(TINY["mistral"]).impl.sliding_window is None  # null: no window
    assert from_hf({**TINY["mistral"], "sliding_window": 256}).impl.sliding_window is None  # >= max_seq
    plain = from_hf(TINY["mistral"])
    for attention in ("eager", "flash"):  # a window longer than seq: the causal mask, the estimate holds
        assert estimate(mistral, Setup(batch=1, seq=31, attention=attention)).peak_bytes == \
            estimate(plain, Setup(batch=1, seq=31, attention=attention)).peak_bytes
    # eager adds the windowed mask to the full scores: the same tensors at any seq (measured, tests/run/test_hf.py)
    assert estimate(mistral, Setup(batch=1, seq=64, attention="eager")).peak_bytes == \
        estimate(plain, Setup(batch=1, seq=64, attention="eager")).peak_bytes
    # transformers passes SDPA an explicit mask once kv_length >= the window (masking_utils._ignore_causal_mask_sdpa)
    for setup in (Setup(batch=1, seq=32, attention="flash"), Setup(batch=1, seq=32, mode="inference")):
        with pytest.raises(SetupError, match="sliding_window=32"):
            estimate(mistral, setup)
    assert mistral.modelled_seq(4096) == 31 and plain.modelled_seq(100) == 100
    with pytest.raises(ConfigError, match="layer_types"):
        from_hf({**TINY["qwen2"], "layer_types": ["sliding_attention", "full_attention"]})


def test_mistral_reads_no_bias_keys() -> None:
    # modeling_mistral.py builds every projection with bias=False
    assert from_hf({**TINY["mistral"], "mlp_bias": True, "attention_bias": True}) == from_hf(TINY["mistral"])
