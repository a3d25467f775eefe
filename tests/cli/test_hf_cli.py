"""``--hf PATH`` on estimate, trace, measure and shard (issue 17, points 5 and 7)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from memlab import cli
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.spec.model import preset_names
from memlab.predict.spec.setup import Setup
from memlab.tracing.progress import Progress, TraceTimeout, time_bound

CONFIGS = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs"
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
    assert d["per_device"]["peak"] == estimate(model, Setup(seq=64, attention="auto")).peak_bytes  # the library default


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


@pytest.mark.parametrize("heads", [3, 6])
def test_a_config_the_models_own_code_cannot_run_is_one_line_naming_where(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], heads: int) -> None:
    """Helium's head_dim defaults to 128 whatever hidden_size is, and its o_proj is hidden_size wide on both sides,
    so a small hidden_size with that default cannot run in transformers' own code: the trace fallback says so in one
    line naming the file, not a traceback, and a real forward of the same config fails as the line says."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "helium", "hidden_size": 16 * heads, "num_attention_heads": heads,
                                "num_key_value_heads": heads, "head_dim": 16, "num_hidden_layers": 1,
                                "intermediate_size": 64, "vocab_size": 128}))
    code, _, _ = _run(capsys, "estimate", "--hf", str(path), "--seq", "8")
    assert code == 0  # a consistent helium config traces
    cfg = json.loads(path.read_text())
    del cfg["head_dim"]
    path.write_text(json.dumps(cfg))
    code, _, err = _run(capsys, "estimate", "--hf", str(path), "--seq", "8")
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err
    assert last.startswith("memlab: error: transformers' helium code cannot run this config (RuntimeError at "
                           "transformers/models/helium/modeling_helium.py:"), last
    assert not [line for line in err.splitlines() if line.startswith("E") and "fake_tensor" in line], err
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    real = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    with pytest.raises(RuntimeError):
        real(torch.zeros(1, 8, dtype=torch.long))


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


PUBLISHED_PRESETS = sorted(set(preset_names()) & {p.stem for p in (CONFIGS / "full").glob("*.json")})
"""Every shipped full config that has a preset of the same name (issue 17 point 6: one model, one answer)."""


def test_the_published_presets_are_found() -> None:
    assert {"gpt2", "llama-2-7b", "llama-2-13b", "mistral-7b"} <= set(PUBLISHED_PRESETS)
    assert "tiny-gpt" not in PUBLISHED_PRESETS and "gpt-3-175b" not in PUBLISHED_PRESETS
    import memlab
    from memlab.cli.args import _preset_model as preset_model
    from memlab.cli.hf_source import published_presets

    assert sorted(published_presets()) == PUBLISHED_PRESETS
    for name in PUBLISHED_PRESETS:  # the Python API's published model is the CLI's; preset() stays the reference GPT
        model = memlab.published(name)
        assert model == preset_model(name) and model.impl.family != "reference" and model.name == name
        assert model == memlab.resolve(name) == memlab.resolve(f"hf:{name}")
        assert memlab.preset(name).impl.family == "reference" and preset_model(f"ref:{name}") == memlab.preset(name)
        assert memlab.resolve(f"ref:{name}") == memlab.preset(name)
    with pytest.raises(memlab.UnknownNameError, match="llama-2-7b"):
        memlab.published("llama-2-7x")


def _setups(name: str) -> list[list[str]]:
    """Generated setups (seeded by the name): batch, seq, precision, recompute and mode vary."""
    import random

    rng = random.Random(name)
    out = [["--seq", "512"]]
    for _ in range(2):
        out.append(["--batch", str(rng.randint(1, 8)), "--seq", str(rng.choice((64, 256, 1000, 1024))),
                    "--precision", rng.choice(("fp32", "bf16", "mixed-bf16")),
                    "--recompute", rng.choice(("none", "full", "selective")),
                    "--optimizer", rng.choice(("adamw", "sgd"))])
    out.append(["--mode", "inference", "--batch", str(rng.randint(1, 4)), "--seq", str(rng.choice((128, 1024)))])
    return out


@pytest.mark.parametrize("name", PUBLISHED_PRESETS)
def test_a_preset_named_after_a_published_model_is_that_model(name: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    published = from_hf(CONFIGS / "full" / f"{name}.json")
    differ = []
    for flags in _setups(name):
        code, out, err = _run(capsys, "estimate", "--preset", name, *flags, "--json")
        assert code == 0, err
        d = json.loads(out)
        code, out2, err = _run(capsys, "estimate", "--hf", name, *flags, "--json")
        assert code == 0, err
        assert d == json.loads(out2)  # one model, one answer: every number and every label
        assert d["family"] == published.impl.family != "reference" and d["published_model"] is None
        assert d["model_label"] == f"{name} (published config, family {published.impl.family})"
        assert d["param_count"] == published.param_count()
        text = [_run(capsys, "estimate", flag, name, *flags)[1] for flag in ("--preset", "--hf")]
        assert text[0] == text[1] and f"model: {name} (published config" in text[0]
        code, out3, _ = _run(capsys, "estimate", "--preset", f"ref:{name}", *flags, "--json")
        ref = json.loads(out3)
        assert code == 0 and ref["family"] == "reference"
        assert ref["model_label"] == f"reference GPT with {name}'s sizes (ref:{name})"
        assert ref["published_model"]["peak"] == d["per_device"]["peak"]  # the published answer beside it
        assert ref["param_count"] == d["param_count"]  # same sizes, another implementation
        differ.append(ref["per_device"]["peak"] != d["per_device"]["peak"])
    code, text, _ = _run(capsys, "estimate", "--preset", f"ref:{name}", "--seq", "512")
    assert f"reference GPT with {name}'s sizes (ref:{name})" in text and f"--hf {name}" in text
    if name == "llama-2-13b":  # the example: the two differ, so the flip is visible
        assert any(differ)


def test_other_presets_stay_the_reference_gpt_and_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("tiny-gpt", "gpt-3-175b", "llama-2-70b"):
        code, out, err = _run(capsys, "estimate", "--preset", name, "--seq", "128", "--json")
        d = json.loads(out)
        assert code == 0 and d["family"] == "reference", err
        assert d["model_label"] == f"{name} (reference GPT; memlab ships no published config of that name)"


def test_trace_measure_and_shard_follow_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    from memlab.cli import build_parser
    from memlab.cli.trace import _target

    kind, target = _target(build_parser().parse_args(["trace", "--preset", "gpt2"]))
    assert kind == "hf" and Path(target) == CONFIGS / "full" / "gpt2.json"
    kind, target = _target(build_parser().parse_args(["trace", "ref:gpt2"]))
    assert kind == "gpt" and target.impl.family == "reference"
    code, _, err = _run(capsys, "trace", "--preset", "llama-2-7b", "--max-seq", "8192")
    assert code == 2 and "--preset ref:llama-2-7b" in err and err.count("\n") == 1
    code, _, err = _run(capsys, "measure", "--preset", "gpt2", "--optimizer", "sgd")
    assert code == 2 and "--preset ref:gpt2" in err and err.count("\n") == 1
    code, _, err = _run(capsys, "shard", "--preset", "llama-2-7b")
    assert code == 2 and "--preset ref:llama-2-7b" in err and err.count("\n") == 1
    for name, label in (("gpt2", "gpt2 (published config, family gpt2)"),
                        ("ref:gpt2", "reference GPT with gpt2's sizes (ref:gpt2)")):
        code, out, err = _run(capsys, "mfu", "--preset", name, "--seq", "1024", "--tokens-per-second", "1e4",
                              "--gpu", "h100-sxm", "--json")
        assert code == 0 and json.loads(out)["model_label"] == label, err


def test_trace_and_measure_json_name_family_traits_call_and_source(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """trace --hf (a generated config of a family the formula maps) and measure --hf (one it does not): --json says
    which family, traits, calling convention and source of truth were used (estimate's are tested above)."""
    import random

    rng = random.Random(17)
    heads = rng.choice((2, 4))
    native = {"model_type": "qwen2", "hidden_size": 16 * heads, "intermediate_size": rng.randrange(40, 120, 4),
              "num_hidden_layers": rng.choice((1, 2)), "num_attention_heads": heads, "num_key_value_heads": 1,
              "vocab_size": rng.randrange(128, 512), "max_position_embeddings": 64}
    (tmp_path / "native.json").write_text(json.dumps(native))
    (tmp_path / "unknown.json").write_text(json.dumps({**native, "model_type": "cohere"}))
    for command, name, source in (("trace", "native", "trace"), ("measure", "unknown", "measurement")):
        code, out, err = _run(capsys, command, "--hf", str(tmp_path / f"{name}.json"), "--seq", "16", "--batch", "1",
                              *(["--device", "cpu"] if command == "measure" else []), "--json")
        assert code == 0, err
        d = json.loads(out)
        assert d["source_of_truth"] == source and "AutoModelForCausalLM" in d["calling_convention"], command
        if name == "native":
            assert d["family"] == "qwen2" and d["traits"] == json.loads(json.dumps(from_hf(native).impl.differs()))
            assert "formula_refused" not in d
        else:
            assert d["family"] == "cohere" and d["traits"] is None and "cohere" in d["formula_refused"]


def test_a_setup_the_formula_does_not_model_is_traced_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    """Frozen layers under 8-bit AdamW are a valid setup the formula refuses (a row of memlab.predict.coverage): on a
    Hugging Face config memlab estimate answers from the trace of transformers' code, the formula's reason said
    first; --no-trace keeps the one-line refusal."""
    argv = ["estimate", "--hf", str(CONFIGS / "tiny" / "llama.json"), "--finetune", "frozen", "--frozen-layers", "1",
            "--optimizer", "adam-8bit", "--seq", "32", "--precision", "bf16"]
    assert cli.main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["source_of_truth"] == "trace" and "finetune='frozen' is modelled with" in out["formula_refused"]
    assert out["peak_bytes"] > 0 and "the formula does not model this setup" in captured.err
    assert cli.main([*argv, "--no-trace"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "finetune='frozen' is modelled with" in err[0]


def test_the_trace_of_a_published_name_reads_its_shipped_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--hf llama-2-7b`` names memlab's shipped config: when the trace answers, it traces that config, not the
    Hugging Face model type the name resembles (it once failed with 'unknown Hugging Face model type')."""
    import argparse

    import memlab.tracing.hf as tracing_hf
    from memlab.cli.traced import trace_config
    from memlab.predict.spec.setup import Setup

    seen = {}
    monkeypatch.setattr(tracing_hf, "trace_hf", lambda cfg, setup, **kw: seen.setdefault("cfg", cfg))
    trace_config(argparse.Namespace(timeout=1.0), "llama-2-7b", Setup())
    assert seen["cfg"].model_type == "llama" and seen["cfg"].hidden_size == 4096 and seen["cfg"].num_hidden_layers == 32


def test_reentrant_checkpointing_is_answered_by_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    """--reentrant (torch's reentrant checkpoint, as peft's prepare_model_for_kbit_training alone leaves it): the
    formula refuses it, memlab estimate --hf answers from the trace of transformers' code running it; --no-trace
    keeps the one-line refusal; the reference GPT refuses it in one line."""
    argv = ["estimate", "--hf", str(CONFIGS / "tiny" / "llama.json"), "--seq", "16", "--recompute", "full",
            "--reentrant", "--attention", "eager"]
    assert cli.main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source_of_truth"] == "trace" and "checkpoint_reentrant" in out["formula_refused"]
    assert out["setup"]["checkpoint_reentrant"] is True and out["peak_bytes"] > 0
    assert cli.main([*argv, "--no-trace"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trace it (memlab estimate --hf answers from the trace" in err[0]
    code, _, err = _run(capsys, "estimate", "--preset", "tiny-gpt", "--recompute", "full", "--reentrant")
    assert code == 2 and err.count("\n") == 1 and "the reference GPT checkpoints non-reentrant" in err
