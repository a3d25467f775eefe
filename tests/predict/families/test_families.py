"""One module per family, one way to name a model: every registered family has its shipped tiny and full configs,
and :func:`memlab.predict.families.resolve` reads each spelling (``ref:``, ``hf:``, a bare published name, a path,
a folder, a model id in a fake Hugging Face cache) or refuses it in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memlab
from memlab import cli
from memlab.errors import ConfigError, UnknownNameError
from memlab.predict.families import locate, resolve, resolve_with_raw
from memlab.predict.families.family import Family
from memlab.predict.families.reader import from_hf
from memlab.predict.families.registry import FAMILIES, MODULES, SUPPORTED
from memlab.predict.families.resolver import CONFIGS, config_names, shipped
from memlab.predict.spec.model import preset

FULL = {name: json.loads((CONFIGS / "full" / f"{name}.json").read_text()) for name in config_names("full")}


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_family_module_exports_one_record_with_its_tiny_and_full_configs(module: object) -> None:
    family = module.FAMILY  # type: ignore[attr-defined]
    assert isinstance(family, Family)
    for model_type in family.model_types:
        assert FAMILIES[model_type] is family
        assert set(family.defaults[model_type]) and family.keys[model_type].modelled and family.param_order[model_type]
        tiny = CONFIGS / "tiny" / f"{model_type}.json"
        assert tiny.is_file(), f"{model_type}: ship configs/tiny/{model_type}.json"
        assert from_hf(tiny).impl.family == model_type
        assert [n for n, raw in FULL.items() if raw["model_type"] == model_type], \
            f"{model_type}: ship a published configs/full/NAME.json"


def test_the_registry_is_the_shipped_configs() -> None:
    assert set(SUPPORTED) == set(config_names("tiny")) == {raw["model_type"] for raw in FULL.values()}
    assert len(SUPPORTED) == len(set(SUPPORTED))


@pytest.mark.parametrize("name", sorted(FULL))
def test_each_spelling_of_a_published_name_is_the_same_model(name: str, tmp_path: Path) -> None:
    path = CONFIGS / "full" / f"{name}.json"
    expected = from_hf(FULL[name], name=name)
    assert resolve(name) == resolve(f"hf:{name}") == resolve(str(path)) == memlab.resolve(name) == expected
    model, raw = resolve_with_raw(name)
    assert model == expected and raw == FULL[name]
    (tmp_path / "config.json").write_text(path.read_text())
    assert resolve(tmp_path) == from_hf(FULL[name])  # a folder holding a config.json: labelled by the config


def test_ref_is_the_reference_gpt() -> None:
    assert resolve("ref:llama-2-7b") == preset("llama-2-7b") == memlab.preset("llama-2-7b")
    assert resolve_with_raw("ref:tiny-gpt") == (preset("tiny-gpt"), None)
    assert resolve("ref:llama-2-7b").impl.family == "reference" != resolve("llama-2-7b").impl.family
    with pytest.raises(UnknownNameError, match="llama-2-7b"):
        resolve("ref:llama-2-7x")
    with pytest.raises(ConfigError, match="reference GPT"):
        locate("ref:llama-2-7b")


def test_a_bad_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as err:
        resolve("llama-2-7x")
    text = str(err.value)
    assert "llama-2-7b" in text and "mistral-7b" in text and "ref:NAME" in text and "\n" not in text
    with pytest.raises(UnknownNameError, match="say ref:tiny-gpt"):  # a reference preset has no published config
        resolve("tiny-gpt")
    with pytest.raises(UnknownNameError, match="published config 'nope'"):
        resolve("hf:nope")
    with pytest.raises(ConfigError, match="no config file"):
        resolve("missing/config.json")


def _cache(root: Path, repo: str, config: dict, *, ref: bool = True) -> None:
    folder = root / f"models--{repo.replace('/', '--')}"
    snap = folder / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    if ref:
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text("abc123")


def test_a_model_id_is_read_from_a_fake_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _cache(tmp_path, "someorg/llama-like", FULL["llama-2-7b"])
    _cache(tmp_path, "other/no-ref", FULL["gpt2"], ref=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert resolve("someorg/llama-like") == from_hf(FULL["llama-2-7b"])
    assert resolve("other/no-ref").param_count() == from_hf(FULL["gpt2"]).param_count()
    with pytest.raises(ConfigError, match="never downloads") as err:
        resolve("someorg/not-there")
    assert str(tmp_path) in str(err.value)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    _cache(tmp_path / "home" / "hub", "someorg/at-home", FULL["mistral-7b"])
    assert resolve("someorg/at-home") == from_hf(FULL["mistral-7b"])


def test_shipped_names_only_name_shipped_files() -> None:
    assert shipped("llama-2-7b") == CONFIGS / "full" / "llama-2-7b.json" and shipped("nope") is None


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_model_spellings_answer_as_the_old_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    flags = ["--seq", "256", "--json"]
    same = [(["--model", "llama-2-7b"], ["--hf", "llama-2-7b"]), (["--model", "hf:gpt2"], ["--hf", "gpt2"]),
            (["--model", "ref:llama-2-7b"], ["--preset", "ref:llama-2-7b"]),
            (["--model", str(CONFIGS / "full" / "phi-2.json")], ["--hf", str(CONFIGS / "full" / "phi-2.json")])]
    for new, old in same:
        a, b = _run(capsys, "estimate", *new, *flags), _run(capsys, "estimate", *old, *flags)
        assert a[0] == b[0] == 0 and json.loads(a[1]) == json.loads(b[1]), (new, a[2])
    mfu = ["--tokens-per-second", "1000", "--seq", "512", "--gpu", "h100-sxm", "--json"]
    code, out, err = _run(capsys, "mfu", "--model", "llama-2-7b", *mfu)
    code_old, out_old, _ = _run(capsys, "mfu", "--preset", "llama-2-7b", *mfu)
    assert code == code_old == 0 and json.loads(out) == json.loads(out_old), err


@pytest.mark.parametrize(("argv", "expected"), [
    (["--model", "llama-2-7x"], "llama-2-7b"),
    (["--model", "ref:nope"], "unknown preset"),
    (["--model", "tiny-gpt"], "ref:tiny-gpt"),
    (["--model", "llama-2-7b", "--preset", "gpt2"], "would be ignored"),
    (["--preset", "gpt2", "--model", "ref:gpt2"], "give the model once"),
    (["--hf", "gpt2", "--model", "gpt2"], "give the model once"),
    (["--model", "gpt2", "--hf", "llama-2-7b"], "give the model once"),
])
def test_bad_model_specs_are_one_line(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "estimate", *argv)
    assert code == 2 and err.count("\n") == 1 and expected in err and "Traceback" not in err, err
