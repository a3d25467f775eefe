"""Tests for the ``memlab`` command (bad input: one stderr line, exit 2): in-process via main(), one subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from memlab import cli
from memlab.course.hf_configs import CONFIG_DIR
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.fit import serving_table
from memlab.predict.hardware.gpus import gpu
from memlab.predict.spec.model import preset
from memlab.predict.spec.precision import PRECISION_POLICIES
from memlab.predict.spec.setup import Setup

DONE_WHEN = ["estimate", "--preset", "llama-2-7b", "--gpu", "h100-sxm", "--precision", "mixed-bf16", "--zero", "3",
             "--world-size", "8", "--batch", "1", "--seq", "4096"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_done_when_command_prints_breakdown_and_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *DONE_WHEN)
    assert code == 0 and err == ""
    for word in ("params", "grads", "optimizer", "activations", "kv_cache", "overhead", "total", "GiB", "GB"):
        assert word in out
    assert "verdict: FITS" in out or "verdict: DOES NOT FIT" in out
    published = from_hf(CONFIG_DIR / "full" / "llama-2-7b.json")  # the preset is the published model
    bd = estimate(published, Setup(precision="mixed-bf16", zero_stage=3, world_size=8, seq=4096, attention="auto"))
    assert f"{bd.total_bytes:,}" in out and "model: llama-2-7b (published config, family llama)" in out


def test_estimate_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *DONE_WHEN, "--json")
    assert code == 0
    d = json.loads(out)
    assert isinstance(d["param_count"], int) and d["param_count"] == preset("llama-2-7b").param_count()
    per = d["per_device"]
    assert set(per) == {"params", "grads", "optimizer", "activations", "kv_cache", "overhead", "total", "peak"}
    assert all(isinstance(v, int) for v in per.values())
    assert per["total"] == sum(v for k, v in per.items() if k not in ("total", "peak"))
    assert per["overhead"] == sum(d["overhead_terms"].values())
    dev = d["device"]  # the verdict is on device-used (nvidia-smi): its high end against the card
    assert d["fits"] is (dev["device_high_bytes"] <= gpu("h100-sxm").memory_bytes)
    assert dev["tensors_bytes"] == per["peak"]
    assert per["peak"] == max(r["peak_bytes"] for r in d["phases"])
    assert {r["step"] for r in d["phases"]} == {"first", "steady"} and d["peak_phase"]
    assert isinstance(d["assumptions"], list) and d["assumptions"]
    assert sum(d["activation_detail"].values()) == pytest.approx(per["activations"], abs=1)


def test_estimate_json_without_gpu_has_null_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--params", "7.5e9", "--precision", "mixed-bf16", "--zero", "1",
                       "--world-size", "64", "--json")
    d = json.loads(out)
    assert code == 0 and d["fits"] is None
    assert round(d["per_device"]["total"] / 1e9, 1) == 31.4  # ZeRO Figure 1, P_os
    assert d["per_device"]["activations"] == 0


def test_estimate_explicit_dimensions_and_inference(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--d-model", "4096", "--n-layers", "32", "--n-heads", "32",
                       "--n-kv-heads", "8", "--d-ff", "14336", "--vocab", "128256", "--mlp", "swiglu", "--untied",
                       "--positions", "rotary", "--norm", "rmsnorm", "--no-bias", "--max-seq", "8192",
                       "--mode", "inference", "--seq", "8192", "--attention", "flash", "--json")
    d = json.loads(out)
    assert code == 0 and d["param_count"] == preset("llama-3-8b").param_count()
    ref = estimate(preset("llama-3-8b"), Setup(mode="inference", seq=8192, attention="flash"))
    assert d["per_device"]["kv_cache"] == ref.kv_cache_bytes > 0


def test_serving_flag_prints_the_largest_batch_per_context(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("estimate", "--preset", "ref:llama-3-8b", "--mode", "inference", "--attention", "flash",
            "--gpu", "rtx-4090", "--serving", "1024,8192")
    code, out, _ = run(capsys, *argv, "--json")
    d = json.loads(out)
    setup = Setup(mode="inference", attention="flash")
    assert code == 0 and d["serving"] == serving_table(preset("llama-3-8b"), setup, "rtx-4090", [1024, 8192])
    assert d["setup"]["logits_to_keep"] == 1 and d["setup"]["kv_cache"] == "dynamic"  # generate()'s defaults
    code, human, _ = run(capsys, *argv)
    assert code == 0 and "serving on rtx-4090" in human and f"{d['serving'][1]['max_batch']:>9,}" in human
    code, _, err = run(capsys, "estimate", "--preset", "llama-3-8b", "--gpu", "rtx-4090", "--serving", "1024")
    assert code == 2 and "--mode inference" in err


def test_overhead_flags_become_named_terms(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--preset", "tiny-gpt", "--cuda-context-mib", "300", "--fragmentation",
                       "5e-2", "--json")
    d = json.loads(out)
    assert code == 0 and d["overhead_terms"]["cuda_context"] == 300 * 2**20
    assert d["overhead_terms"]["fragmentation"] > 0


def test_fsdp_flag_maps_to_zero_stage(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "--preset", "gpt2", "--world-size", "4", "--json"]
    _, fsdp, _ = run(capsys, *base, "--fsdp", "shard-grad-op")
    _, zero, _ = run(capsys, *base, "--zero", "2")
    assert json.loads(fsdp)["per_device"] == json.loads(zero)["per_device"]


@pytest.mark.parametrize("precision", list(PRECISION_POLICIES))
def test_every_precision_policy_is_accepted(capsys: pytest.CaptureFixture[str], precision: str) -> None:
    code, _, err = run(capsys, "estimate", "--preset", "tiny-gpt", "--precision", precision, "--json")
    assert code == 0, err


@pytest.mark.parametrize(("argv", "needle"), [
    (["estimate", "--preset", "llama-2-7x"], "llama-2-7b"),  # closest names listed
    (["estimate", "--preset", "gpt2", "--batch", "-4"], "--batch"),
    (["estimate", "--preset", "gpt2", "--batch", "many"], "--batch"),
    (["estimate", "--preset", "gpt2", "--gpu", "h100-sxmm"], "h100-sxm"),
    (["estimate", "--preset", "gpt2", "--d-model", "64"], "exactly one model"),
    (["estimate", "--preset", "gpt2", "--d-ff", "64"], "--d-ff"),
    (["estimate", "--d-model", "64", "--n-layers", "2"], "--n-heads"),
    (["estimate"], "exactly one model"),
    (["estimate", "--preset", "gpt2", "--zero", "2", "--fsdp", "full-shard"], "--fsdp"),
    (["estimate", "--preset", "gpt2", "--precision", "fp9"], "--precision"),
    (["estimate", "--preset", "gpt2", "--seq", "4096"], "max_seq"),
    (["estimate", "--params", "7B", "--optimizer", "adafactor"], "adafactor"),
    (["estimate", "--params", "-3"], "--params"),
    (["estimate", "--preset", "gpt2", "--sp"], "tensor parallelism"),
    (["estimate", "--d-model", "100", "--n-layers", "2", "--n-heads", "3"], "n_heads"),
    (["mfu", "--preset", "gpt2", "--gpu", "h100-sxm", "--tokens-per-second", "1e5", "--step-time", "1"],
     "exactly one of"),
    (["mfu", "--preset", "gpt2", "--gpu", "h100-sxm", "--step-time", "1"], "--batch"),
    (["mfu", "--preset", "gpt2", "--tokens-per-second", "1e5"], "--gpu"),
    (["mfu", "--preset", "gpt2", "--gpu", "h100-sxm", "--tokens-per-second", "1e5"], "--seq"),
    (["mfu", "--params", "7B", "--gpu", "nope-9000", "--tokens-per-second", "1e5"], "GPU"),
    (["frobnicate"], "frobnicate"),
    ([], "give a command"),
    (["estimate", "--preset", "gpt2", "--cuda-context-mib", "nan"], "--cuda-context-mib"),
    (["estimate", "--preset", "gpt2", "--fragmentation", "1.5"], "--fragmentation"),
    (["estimate", "--preset", "gpt2", "--gathered-layers", "-1"], "--gathered-layers"),
])
def test_bad_input_is_one_stderr_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                 needle: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memlab: error: ")
    assert needle in lines[0] and "Traceback" not in err and out == ""


def test_mfu_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "mfu", "--preset", "gpt2", "--gpu", "h100-sxm", "--step-time", "0.5", "--batch", "8",
                         "--seq", "1024", "--num-gpus", "2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert {"mfu", "hfu", "peak_flops", "flops_per_token"} <= set(d)
    assert 0 < d["mfu"] < 1 and d["flops_per_token"] > 6 * preset("gpt2").param_count() * 0.9
    code, human, _ = run(capsys, "mfu", "--preset", "gpt2", "--gpu", "h100-sxm", "--tokens-per-second", "1e5",
                         "--seq", "1024")
    assert code == 0 and "MFU" in human and "%" in human


def test_mfu_bare_count_and_unknown_peak(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mfu", "--params", "1e9", "--gpu", "a100-80gb-sxm", "--tokens-per-second", "26000",
                       "--json")
    d = json.loads(out)
    assert code == 0 and d["flops_per_token"] == 6e9
    assert d["mfu"] == pytest.approx(26000 * 6e9 / gpu("a100-80gb-sxm").peak("bf16"))
    code, out, _ = run(capsys, "mfu", "--params", "1e9", "--gpu", "a100-80gb-sxm", "--dtype", "fp8",
                       "--tokens-per-second", "26000", "--json")
    d = json.loads(out)
    assert code == 0 and d["mfu"] is None and d["reason"]


def test_gpus_lists_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "gpus", "--json")
    rows = json.loads(out)
    assert code == 0 and {r["key"] for r in rows} >= {"h100-sxm", "a100-80gb-sxm", "t4"}
    code, human, _ = run(capsys, "gpus")
    assert code == 0 and "h100-sxm" in human and "GiB" in human and "GB" in human
    assert all(r["name"] in human for r in rows), "no card's name is cut"


def test_report_passes_its_arguments_through(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("memlab.course.report")
    fake.main = lambda argv, prog: seen.append([prog, *argv]) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "memlab.course.report", fake)
    monkeypatch.setattr("memlab.course.report", fake, raising=False)
    assert cli.main(["report", "--scale", "ci", "--help"]) == 0
    assert seen == [["memlab report", "--scale", "ci", "--help"]]


def test_report_unavailable_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import memlab.course

    monkeypatch.setitem(sys.modules, "memlab.course.report", None)  # makes the import fail
    monkeypatch.delattr(memlab.course, "report", raising=False)
    code, _, err = run(capsys, "report")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "memlab.course.report" in err


def test_installed_entry_point_runs_in_a_subprocess() -> None:
    """``python -m memlab`` (the same main as the ``memlab`` script): a good and a bad invocation."""
    ok = subprocess.run([sys.executable, "-m", "memlab", "estimate", "--preset", "tiny-gpt", "--gpu", "t4", "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["fits"] is True
    bad = subprocess.run([sys.executable, "-m", "memlab", "estimate", "--preset", "nope"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_trace_command_prints_phases_and_peak(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "trace", "tiny-gpt", "--seq", "32", "--batch", "2")
    assert code == 0 and "<- peak" in out and "steady  backward" in out and "top 8 modules" in out
    code, out, _ = run(capsys, "trace", "--preset", "tiny-gpt", "--seq", "32", "--json")
    d = json.loads(out)
    assert code == 0 and d["peak_bytes"] == max(r["peak_bytes"] for r in d["phases"]) and d["estimate"]["peak"]
    code, _, err = run(capsys, "trace", "no-such-model")
    assert code == 2 and err.count("\n") == 1 and "unknown preset" in err


def test_trace_command_builds_a_hugging_face_config(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    pytest.importorskip("transformers")
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, _ = run(capsys, "trace", "--hf-config", str(path), "--seq", "32", "--batch", "2", "--json")
    d = json.loads(out)
    assert code == 0 and d["model"].startswith("hf:") and d["peak_bytes"] > 0
    assert any("unpacked batch forced" in n for n in d["notes"])


def test_trace_gpu_replays_the_caching_allocator(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``memlab trace --gpu``: the traced allocations replayed through the allocator model, labelled as a model,
    allocated == the trace's bytes, active and reserved above; ``--alloc-conf`` (or the environment's) is honoured,
    a bad one or one without ``--gpu`` is one line before any trace."""
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    code, out, _ = run(capsys, "trace", "tiny-gpt", "--seq", "32", "--batch", "2", "--gpu", "t4", "--json")
    d = json.loads(out)["allocator_replay"]
    assert code == 0 and d["alloc_conf"] == "expandable_segments:True" and "not a GPU measurement" in d["source"]
    assert d["total"]["requested_bytes"] == json.loads(out)["peak_bytes"]
    assert d["total"]["reserved_bytes"] >= d["total"]["active_bytes"] >= d["total"]["requested_bytes"]
    code, out, _ = run(capsys, "trace", "tiny-gpt", "--seq", "32", "--gpu", "t4", "--alloc-conf",
                       "max_split_size_mb:64")
    assert code == 0 and "caching allocator, modelled" in out and "max_split_size_mb:64" in out
    for argv in (["--gpu", "t4", "--alloc-conf", "max_split_size_mb:2"], ["--alloc-conf", "expandable_segments:True"]):
        code, _, err = run(capsys, "trace", "tiny-gpt", "--seq", "32", *argv)
        assert code == 2 and err.count("\n") == 1
