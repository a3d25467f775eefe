"""``--hf PATH`` on estimate, trace, measure and shard (issue 17, points 5 and 7)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from memlab import cli
from memlab.predict.estimate import estimate
from memlab.predict.hf import from_hf
from memlab.predict.setup import Setup
from memlab.tracing.progress import Progress, TraceTimeout, time_bound

CONFIGS = Path(__file__).resolve().parents[2] / "memlab" / "course" / "configs"
SHIPPED = sorted((CONFIGS / "tiny").glob("*.json")) + sorted((CONFIGS / "full").glob("*.json"))
GPT_NEO = {"model_type": "gpt_neo", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "vocab_size": 128,
           "max_position_embeddings": 64, "attention_types": [[["global", "local"], 1]], "window_size": 8}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_estimate_hf_works_for_every_shipped_config_and_says_what_it_used(
        path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "estimate", "--hf", str(path), "--seq", "64", "--json")
    assert code == 0, err
    d = json.loads(out)
    raw = json.loads(path.read_text())
    model = from_hf(raw)
    assert d["family"] == raw["model_type"] and d["source_of_truth"] == "formula"
    assert d["traits"] == json.loads(json.dumps(model.impl.differs()))
    assert "AutoModelForCausalLM" in d["calling_convention"]
    assert d["per_device"]["peak"] == estimate(model, Setup(seq=64)).peak_bytes


def test_a_family_the_formula_does_not_cover_is_traced_and_says_so(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT_NEO))
    code, out, err = _run(capsys, "estimate", "--hf", str(tmp_path), "--seq", "16", "--batch", "1", "--json")
    assert code == 0, err
    assert "formula does not cover" in err and "gpt_neo" in err and "source of truth: trace" in err
    d = json.loads(out)
    assert d["source_of_truth"] == "trace" and d["family"] == "gpt_neo" and d["traits"] is None
    assert "not supported by from_hf" in d["formula_refused"] and d["peak_bytes"] > 0
    code, _, err = _run(capsys, "estimate", "--hf", str(path), "--no-trace")
    assert code == 2 and err.count("\n") == 1 and "not supported" in err
    # trace's old spelling --hf-config is --hf (tests/cli/test_cli.py traces through it)
    code, _, err = _run(capsys, "trace", "--hf-config", str(tmp_path / "none.json"))
    assert code == 2 and "no config file" in err


def test_a_refused_key_is_named_and_goes_to_the_trace_like_an_unknown_family(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memlab.cli.estimate import _model

    raw = {**json.loads((CONFIGS / "tiny" / "phi.json").read_text()), "qk_layernorm": True}
    (tmp_path / "phi.json").write_text(json.dumps(raw))
    code, _, err = _run(capsys, "estimate", "--hf", str(tmp_path / "phi.json"), "--no-trace")
    assert code == 2 and err.count("\n") == 1 and "qk_layernorm" in err
    args = cli.build_parser().parse_args(["estimate", "--hf", str(tmp_path / "phi.json")])
    model, config, refused = _model(args)  # what estimate then traces (the path the gpt_neo test runs)
    assert model is None and config == raw and "qk_layernorm" in refused


def _cache(root: Path, repo: str, config: dict) -> None:
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    snap = folder / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))


def test_a_model_id_is_read_from_the_local_cache_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    raw = json.loads((CONFIGS / "full" / "llama-2-7b.json").read_text())
    _cache(tmp_path, "someorg/llama-like", raw)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = _run(capsys, "estimate", "--hf", "someorg/llama-like", "--json")
    assert code == 0, err
    assert json.loads(out)["param_count"] == from_hf(raw).param_count()
    code, _, err = _run(capsys, "estimate", "--hf", "someorg/not-there")
    assert code == 2 and err.count("\n") == 1 and "local Hugging Face cache" in err and "never downloads" in err


def test_measure_hf_runs_the_real_model_beside_the_formula(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "measure", "--hf", str(CONFIGS / "tiny" / "llama.json"), "--seq", "16",
                          "--batch", "1", "--device", "cpu", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["family"] == "llama" and d["source_of_truth"] == "measurement"
    assert d["measured"]["params"] == d["predicted"]["params"] > 0
    code, _, err = _run(capsys, "measure", "--hf", str(CONFIGS / "tiny" / "llama.json"), "--optimizer", "sgd")
    assert code == 2 and err.count("\n") == 1


def test_shard_hf_is_a_clear_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "shard", "--hf", str(CONFIGS / "tiny" / "llama.json"))
    assert code == 2 and err.count("\n") == 1 and "reference GPT" in err and "estimate --hf" in err


def test_the_time_bound_stops_with_one_line_saying_where_it_was() -> None:
    progress = Progress(quiet=True)
    progress("forward: block 3/24")
    start = time.monotonic()
    with pytest.raises(TraceTimeout, match=r"0\.2 s \(last: forward: block 3/24\): try less") as err, \
            time_bound(0.2, lambda: progress.last, "try less"):
        while time.monotonic() - start < 5:
            pass
    assert time.monotonic() - start < 2 and "\n" not in str(err.value)
    with time_bound(None, lambda: "", ""):  # no bound: the body runs
        pass


@pytest.mark.parametrize("name", ["gpt2", "llama-2-7b", "llama-2-13b", "mistral-7b"])
def test_a_preset_says_it_is_the_reference_gpt_and_gives_the_published_models_answer(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "estimate", "--preset", name, "--seq", "512", "--json")
    assert code == 0, err
    d = json.loads(out)
    published = from_hf(CONFIGS / "full" / f"{name}.json")
    want = estimate(published, Setup(seq=512))
    assert d["family"] == "reference" and d["published_model"]["hf"] == name
    assert d["published_model"]["peak"] == want.peak_bytes
    assert d["published_model"]["param_count"] == d["param_count"]  # same sizes, another implementation
    code, out2, _ = _run(capsys, "estimate", "--hf", name, "--seq", "512", "--json")
    assert code == 0 and json.loads(out2)["per_device"]["peak"] == want.peak_bytes
    assert json.loads(out2)["published_model"] is None
    code, out3, _ = _run(capsys, "estimate", "--preset", f"ref:{name}", "--seq", "512", "--json")
    assert code == 0 and json.loads(out3)["per_device"] == d["per_device"]
    code, text, _ = _run(capsys, "estimate", "--preset", name, "--seq", "512")
    assert f"reference GPT with {name}'s sizes" in text and f"--hf {name}" in text
