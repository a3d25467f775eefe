"""``memlab measure`` and ``memlab ledger``: prediction beside measurement from the command line; bad input gets
one line on stderr and exit status 2 (the CLI's contract). In-process through ``memlab.cli.main``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memlab import cli
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

TINY = preset("tiny-gpt")


@pytest.fixture(autouse=True)
def _hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The CPU peak benchmark caches into tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_measure_prints_the_ledger(capsys) -> None:
    code, out, err = run(capsys, "measure", "--preset", "tiny-gpt", "--batch", "2", "--seq", "32", "--device", "cpu")
    assert code == 0 and err == ""
    assert out.startswith("memlab measure: tiny-gpt on cpu (cpu), status ok")
    # columns: predicted, traced (memlab trace of the same step), measured, relative error
    components = [re.sub(r"(\s+[-+\d,.]+( %)?){4}$", "", line.strip()) for line in out.splitlines()[2:13]]
    assert components == ["params", "grads", "optimizer", "activations", "activations: token ids",
                          "activations: norms", "activations: attention", "activations: attention scores",
                          "activations: mlp", "activations: head & loss", "modelled total"]
    params_line = next(line for line in out.splitlines() if line.strip().startswith("params "))
    assert f"{4 * TINY.param_count():,}" in params_line and "+0.000 %" in params_line
    assert "tokens/s" in out and "MFU" in out


def test_measure_json_parses_and_errors_are_zero(capsys) -> None:
    code, out, _ = run(capsys, "measure", "--preset", "tiny-gpt", "--batch", "2", "--seq", "16", "--device", "cpu",
                       "--precision", "amp-bf16", "--recompute", "selective", "--attention", "flash", "--steps", "1",
                       "--json")
    assert code == 0
    d = json.loads(out)
    m, rows = d["measurement"], d["ledger"]
    assert m["status"] == "ok"
    expected = Setup(batch=2, seq=16, precision="amp-bf16", recompute="selective", attention="flash").to_dict()
    assert {k: m["setup"][k] for k in ("batch", "seq", "precision", "recompute", "attention", "optimizer")} == \
        {k: expected[k] for k in ("batch", "seq", "precision", "recompute", "attention", "optimizer")}
    by = {r["component"]: r for r in rows}
    assert by["params"]["measured"] == 4 * TINY.param_count()
    components = [r for r in rows if not r["component"].startswith(("phase: ", "peak"))]
    assert all(r["rel_error"] == 0 for r in components)
    assert all(abs(r["rel_error"]) < 0.05 for r in rows)  # the phases and the peak inside the step
    assert by["peak (inside the step)"]["traced"] == by["peak (inside the step)"]["measured"]
    assert "activations: autocast weight copies" in by


def test_measure_inference_prints_kv_cache_and_decode_speed(capsys) -> None:
    code, out, _ = run(capsys, "measure", "--preset", "tiny-llama", "--mode", "inference", "--weights", "bf16",
                       "--seq", "16", "--device", "cpu", "--steps", "2")
    assert code == 0
    cfg = preset("tiny-llama")
    kv_line = next(line for line in out.splitlines() if line.strip().startswith("kv_cache"))
    assert f"{2 * cfg.n_layers * 16 * cfg.kv_dim * 2:,}" in kv_line
    assert "prefill" in out and "ms/token" in out and "grads" not in out


def test_measure_a_custom_model_from_dimensions(capsys) -> None:
    code, out, _ = run(capsys, "measure", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--vocab", "64",
                       "--max-seq", "32", "--seq", "8", "--device", "cpu", "--steps", "1", "--json")
    assert code == 0
    by = {r["component"]: r for r in json.loads(out)["ledger"]}
    assert by["params"]["measured"] == by["params"]["predicted"] > 0


@pytest.mark.parametrize(("argv", "words"), [
    (["measure", "--params", "5", "--device", "cpu"], "--preset"),
    (["measure", "--preset", "tiny-gpt", "--attention", "efficient", "--device", "cpu"], "eager, math, flash"),
    (["measure", "--preset", "tiny-gpt", "--seq", "999", "--device", "cpu"], "max_seq=256"),
    (["measure", "--preset", "tiny-gpt", "--batch", "0", "--device", "cpu"], "positive integer"),
    (["measure", "--preset", "tiny-gpt", "--mode", "inference", "--weights", "int8", "--device", "cpu"], "int8"),
    (["measure", "--preset", "tiny-gtp", "--device", "cpu"], "tiny-gpt"),
    (["measure", "--preset", "tiny-gpt", "--precision", "fp64", "--device", "cpu"], "precision"),
])
def test_measure_bad_input_is_one_line_and_status_2(capsys, argv: list[str], words: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("memlab") and words in err
    assert "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a CUDA GPU")
def test_measure_on_cuda_without_a_gpu_says_so(capsys) -> None:
    code, _, err = run(capsys, "measure", "--preset", "tiny-gpt", "--device", "cuda")
    assert code == 2 and "no CUDA GPU" in err and err.count("\n") == 1


def test_the_installed_command_prints_no_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "memlab", "measure", "--preset", "tiny-gpt", "--attention",
                           "efficient", "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("memlab: error: attention 'efficient'") and proc.stderr.count("\n") == 1


@pytest.fixture
def small_grid(monkeypatch: pytest.MonkeyPatch):
    """``memlab ledger`` over three points instead of the 48 of ci_grid (the full grid runs in test_ledger)."""
    import memlab.compare.ledger

    grid = [(TINY, Setup(batch=1, seq=8)), (TINY, Setup(batch=1, seq=8, attention="flash", recompute="full")),
            (preset("tiny-llama"), Setup(batch=2, seq=8, precision="amp-bf16"))]
    monkeypatch.setattr(memlab.compare.ledger, "ci_grid", lambda: grid)
    return grid


def test_ledger_json_and_table(capsys, tmp_path: Path, small_grid) -> None:
    out_file = tmp_path / "ledger.jsonl"
    code, out, _ = run(capsys, "ledger", "--device", "cpu", "--out", str(out_file), "--json")
    assert code == 0
    d = json.loads(out)
    assert d["configs"] == 3 and d["failed"] == 0
    assert {r["component"] for r in d["summary"]} >= {"params", "grads", "optimizer", "activations"}
    comps = [r for r in d["summary"] if not r["component"].startswith(("phase: ", "peak"))]
    assert comps and all(r["max_abs_rel_error"] == 0 for r in comps)
    assert all(r["max_abs_rel_error"] < 0.05 for r in d["summary"])  # phases and the peak: the phase model
    assert len(out_file.read_text().splitlines()) == 3
    code, out, _ = run(capsys, "ledger", "--device", "cpu", "--out", str(out_file))
    assert code == 0 and f"3 configs on cpu, 0 failed; sweep file {out_file}" in out
    assert "max_abs_rel_error" in out and "0.0000 %" in out
    assert len(out_file.read_text().splitlines()) == 3  # resumed: nothing re-measured


def test_ledger_fresh_starts_over_and_failures_give_status_1(capsys, tmp_path: Path, small_grid) -> None:
    out_file = tmp_path / "ledger.jsonl"
    out_file.write_text('{"key": "stale", "config": {}, "time": 0, "measurement": {}}\n')
    small_grid.append((TINY, Setup(batch=1, seq=8, attention="efficient")))  # fails on CPU: recorded, not raised
    code, out, _ = run(capsys, "ledger", "--device", "cpu", "--out", str(out_file), "--fresh", "--json")
    assert code == 1
    d = json.loads(out)
    assert d["configs"] == 4 and d["failed"] == 1
    assert "stale" not in out_file.read_text()
