"""memlab.course.hf_configs: the shipped tiny and full-size HF configs load, name their source, and map with
from_hf; unknown names get the closest shipped ones."""

from __future__ import annotations

import json

import pytest

from memlab.course.hf_configs import config_names, config_source, load_config
from memlab.errors import ConfigError, UnknownNameError
from memlab.predict.families.reader import SUPPORTED, from_hf


def test_tiny_configs_cover_every_supported_family() -> None:
    assert set(config_names("tiny")) == set(SUPPORTED)
    for name in config_names("tiny"):
        cfg = from_hf(load_config(name))
        assert cfg.d_model == 64 and cfg.n_layers == 2 and cfg.dropout == 0.0


def test_full_configs_name_their_source_and_are_full_size() -> None:
    for name in config_names("full"):
        assert "config.json" in config_source(name)
        assert from_hf(load_config(name, "full")).param_count() > 1e8
    assert not any(k.startswith("_memlab") for k in load_config("gpt2", "full"))


def test_own_config_path_and_unknown_names(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(load_config("llama")))
    assert load_config(path) == load_config("llama")
    assert config_source(path) == "the learner's own config.json"
    with pytest.raises(UnknownNameError):
        load_config("lama")
    with pytest.raises(ConfigError):
        config_names("huge")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON list"):
        load_config(tmp_path / "list.json")
