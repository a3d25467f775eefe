"""Issue 23, part 3: memlab.predict.families.reader (from_hf, read_config_json, hf_attention) answers every bad config
with one ConfigError (or SetupError for a device type) naming what is wrong: never a TypeError, JSONDecodeError,
UnicodeDecodeError, RecursionError or MemoryError, and never a silent wrong answer ("false" read as True, a zero
size read as "use the default"). A hypothesis fuzz over the keys of every supported family holds it to that."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memlab.errors import ConfigError, MemlabError, SetupError
from memlab.predict.families.reader import (
    DEFAULTS,
    MAX_CONFIG_BYTES,
    SUPPORTED,
    from_hf,
    hf_attention,
    read_config_json,
)
from memlab.predict.spec.model import TransformerConfig

from .test_hf import TINY


@pytest.mark.parametrize("config", [None, 7, 3.5, True, [1, 2], ("gpt2",), b'{"model_type": "gpt2"}', object(),
                                    {1, 2}])
def test_a_non_config_is_a_config_error(config: object) -> None:
    with pytest.raises(ConfigError, match="from_hf needs"):
        from_hf(config)


def test_a_to_dict_that_returns_no_dict_is_refused() -> None:
    class Odd:
        def to_dict(self) -> list:
            return []

    with pytest.raises(ConfigError, match="to_dict"):
        from_hf(Odd())


def test_an_attribute_object_with_a_model_type_still_reads() -> None:
    class Attrs:
        def __init__(self) -> None:
            self.__dict__.update(TINY["llama"])

    assert from_hf(Attrs()).d_model == TINY["llama"]["hidden_size"]


BAD_FILES: dict[str, bytes] = {
    "empty": b"",
    "invalid": b"{model_type: gpt2}",
    "comments": b'{"model_type": "gpt2" // the family\n}',
    "trailing comma": b'{"model_type": "gpt2",}',
    "list": b"[1, 2]",
    "null": b"null",
    "string": b'"gpt2"',
    "number": b"12",
    "not utf-8": b'{"model_type": "\xff\xfe"}',
    "deep list": b"[" * 100_000 + b"]" * 100_000,
    "deep value": b'{"model_type": "gpt2", "x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}",
    "nested 40 deep": b'{"model_type": "gpt2", "x": ' + b"[" * 40 + b"]" * 40 + b"}",
    "nan": b'{"model_type": "gpt2", "resid_pdrop": NaN}',
    "a long number": b'{"model_type": "gpt2", "n_embd": 1' + b"0" * 5_000 + b"}",
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_config_file_is_one_config_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(BAD_FILES[name])
    with pytest.raises(ConfigError) as err:
        from_hf(path)
    assert str(path) in str(err.value) and len(str(err.value)) < 400


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero", "/dev/full"])
def test_a_device_is_refused_before_it_is_read(device: str) -> None:
    if not Path(device).exists():
        pytest.skip(f"no {device}")
    with pytest.raises(ConfigError, match="not a regular file"):
        from_hf(device)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="a FIFO, not a regular file"):
        read_config_json(fifo)


def test_a_huge_file_is_refused_by_its_size(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    with path.open("wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(ConfigError, match="bytes"):
        read_config_json(path)


def test_a_folder_without_config_and_a_bom_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config file"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(TINY["gpt2"]).encode())
    assert from_hf(tmp_path).d_model == TINY["gpt2"]["n_embd"]


@pytest.mark.parametrize(("family", "key", "value", "hint"), [
    ("llama", "hidden_size", "64", "whole number"),
    ("llama", "num_attention_heads", 0, ">= 1"),
    ("gpt2", "n_head", 0, ">= 1"),
    ("gpt2", "n_head", 5, "must divide"),
    ("llama", "head_dim", 0, ">= 1"),
    ("gemma", "head_dim", 0, ">= 1"),
    ("qwen2", "head_dim", "16", "whole number"),
    ("gpt2", "n_inner", 0, ">= 1"),
    ("opt", "word_embed_proj_dim", 0, ">= 1"),
    ("gpt2", "tie_word_embeddings", "false", "True or False"),
    ("llama", "tie_word_embeddings", 0, "True or False"),
    ("llama", "attention_bias", "no", "True or False"),
    ("llama", "mlp_bias", 1, "True or False"),
    ("gpt2", "resid_pdrop", "0.1", "number"),
    ("gpt2", "attn_pdrop", 2.0, "[0, 1]"),
    ("llama", "attention_dropout", "x", "number"),
    ("gpt_neox", "rotary_pct", 0, "positive"),
    ("gpt2", "activation_function", ["gelu"], "string"),
    ("gemma", "hidden_act", 3, "string"),
    ("llama", "vocab_size", 2.5, "whole number"),
    ("llama", "num_hidden_layers", True, "a bool"),
])
def test_a_bad_value_is_refused_naming_its_key(family: str, key: str, value: object, hint: str) -> None:
    with pytest.raises(ConfigError, match=key) as err:
        from_hf({**TINY[family], key: value})
    assert hint in str(err.value)


def test_model_type_of_the_wrong_kind() -> None:
    for kind in (None, 3, ["gpt2"], {"a": 1}, ""):
        with pytest.raises(ConfigError, match="not supported"):
            from_hf({**TINY["gpt2"], "model_type": kind})


@pytest.mark.parametrize(("args", "hint"), [
    (("sdpa", "tpu"), "device_type"), (("sdpa", None), "device_type"), (("sdpa", "cuda:7"), "device_type"),
    (("sdpa", 7), "device_type"), (("eager", "tpu"), "device_type"), (("sdpa", "cpu", "fp64"), "dtype"),
    (("sdpa", "cpu", "fp32", "0.1"), "attention_dropout"), (("sdpa", "cpu", "fp32", math.nan), "attention_dropout"),
])
def test_hf_attention_refuses_unknown_devices_and_dtypes(args: tuple, hint: str) -> None:
    with pytest.raises(SetupError, match=hint):
        hf_attention(*args)
    with pytest.raises(ConfigError, match="attn_implementation"):
        hf_attention(["sdpa"])  # type: ignore[arg-type]


# -- fuzz: random JSON-ish values for a supported family's keys ---------------------------------------------------
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from([0, 1, 2, 3, 4, 8, 64, 128, 256])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
    | st.sampled_from(["gelu", "gelu_new", "silu", "relu", "gelu_pytorch_tanh", "64", "true", "false"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_EXTRA_KEYS = ("head_dim", "attention_bias", "mlp_bias", "attention_dropout", "hidden_act", "name", "_name_or_path",
               "model_type")


@st.composite
def _configs(draw: st.DrawFn) -> dict:
    family = draw(st.sampled_from(SUPPORTED))
    keys = sorted({*DEFAULTS[family], *_EXTRA_KEYS})
    changed = draw(st.dictionaries(st.sampled_from(keys), _JSON, max_size=4))
    dropped = draw(st.lists(st.sampled_from(keys), max_size=2))
    cfg = {**TINY[family], **changed}
    for key in dropped:
        cfg.pop(key, None)
    return cfg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_configs())
def test_fuzzed_configs_give_a_config_or_a_config_error(cfg: dict) -> None:
    try:
        out = from_hf(cfg)
    except ConfigError:
        return
    except MemlabError as exc:  # pragma: no cover - reported with the config that caused it
        pytest.fail(f"{type(exc).__name__} (not ConfigError) for {cfg!r}: {exc}")
    assert isinstance(out, TransformerConfig)
    assert out.param_count() > 0
