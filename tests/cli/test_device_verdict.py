"""``--gpu`` verdicts on what the device sees (issue 38 part 3): allocated, reserved and device-used peaks, the fit
decided on device-used; every overhead option honoured on every path (formula, per rank, trace) or refused in one
line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlab import cli
from memlab.predict.gpu import device as D

SMALL = ["--batch", "2", "--seq", "32"]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert cli.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _term(d: dict, name: str) -> dict:
    return next(t for t in d["device"]["terms"] if t["name"] == name)


def test_formula_verdict_counts_context_workspaces_and_reserve_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "estimate", "--preset", "tiny-gpt", *SMALL, "--gpu", "a100-80gb-sxm")
    dev = d["device"]
    assert dev["tensors_bytes"] == d["per_device"]["peak"]
    assert dev["allocated_bytes"] == dev["tensors_bytes"] + D.workspace_bytes("a100-80gb-sxm", 2)
    assert dev["reserved_bytes"] > dev["allocated_bytes"] and _term(d, "allocator_reserve")["low"] == 0
    assert dev["device_high_bytes"] == dev["reserved_bytes"] + D.CUDA_CONTEXT_HIGH_BYTES
    assert d["fits"] is dev["fits"] is True


def test_formula_options_replace_their_term_and_are_not_counted_twice(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "estimate", "--preset", "tiny-gpt", *SMALL, "--gpu", "a100-80gb-sxm", "--cuda-context-mib",
              "100", "--workspace-mib", "3", "--fragmentation", "0.5")
    dev = d["device"]
    assert d["overhead_terms"]["cuda_context"] == 100 * 2**20  # the estimate's component, as without --gpu
    assert dev["tensors_bytes"] == d["per_device"]["peak"] - sum(
        d["overhead_terms"][k] for k in ("cuda_context", "workspace", "fragmentation"))
    assert dev["allocated_bytes"] == dev["tensors_bytes"] + 3 * 2**20
    assert _term(d, "allocator_reserve")["high"] == round(0.5 * dev["allocated_bytes"])
    assert dev["device_low_bytes"] == dev["device_high_bytes"] == dev["reserved_bytes"] + 100 * 2**20


def test_per_rank_layout_takes_the_options_in_its_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "--preset", "tiny-gpt", "--seq", "64", "--pp", "2", "--micro-batches", "2"]
    d = _json(capsys, *base, "--gpu", "h100-sxm", "--cuda-context-mib", "300")
    assert _term(d, "cuda_context")["high"] == 300 * 2**20 and d["device"]["tensors_bytes"] == d["per_device"]["peak"]
    assert _term(d, "nccl_buffers")["low"] == 2 * D.NCCL_BUFFSIZE_BYTES
    assert cli.main([*base, "--cuda-context-mib", "300"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gpu" in err[0]


def test_custom_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "estimate", "--preset", "tiny-gpt", *SMALL, "--gpu", "h100-nvl", "--gpu-memory-gib", "0.3")
    assert d["device"]["capacity_bytes"] == round(0.3 * 2**30) and d["fits"] is False
    assert cli.main(["estimate", "--preset", "tiny-gpt", "--gpu-memory-gib", "90"]) == 2
    assert "--gpu NAME" in capsys.readouterr().err


def test_trace_verdict_honours_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "trace", "tiny-gpt", *SMALL, "--gpu", "v100-sxm2-16gb", "--workspace-mib", "10",
              "--fragmentation", "0.25")
    rep, dev = d["allocator_replay"], d["device"]
    rounding = rep["total"]["active_bytes"] - rep["total"]["requested_bytes"]
    assert dev["tensors_bytes"] == d["peak_bytes"]
    assert dev["allocated_bytes"] == d["peak_bytes"] + rounding + 10 * 2**20 and _term(d, "block_rounding")
    assert _term(d, "allocator_reserve")["high"] == round(0.25 * dev["allocated_bytes"])
    assert rep["uncapped_reserve_bytes"] == rep["total"]["reserved_bytes"] - rep["total"]["requested_bytes"]


def test_trace_reserve_is_the_replayed_one_without_fragmentation() -> None:
    import argparse

    from memlab.cli.device_view import peaks
    from memlab.predict.spec.setup import Setup

    ns = argparse.Namespace(gpu="h100-sxm", cuda_context_mib=None, workspace_mib=None, fragmentation=None,
                            gpu_memory_gib=None)
    p = peaks(ns, Setup(), 2**30, 0, (7, 7), "replayed")
    assert p.reserved_low_bytes == p.reserved_bytes == p.allocated_bytes + 7


def test_trace_refuses_the_options_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trace", "tiny-gpt", *SMALL, "--workspace-mib", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--workspace-mib" in err[0] and "--gpu" in err[0]


def test_gpus_knows_the_96_gb_hopper_variants_and_v100_16gb() -> None:
    from memlab.predict.hardware.gpus import gpu

    assert gpu("gh200").memory_gib == 96 and gpu("H100 NVL").memory_gib == 94
    assert gpu("Tesla V100-SXM2-16GB").memory_gib == 16 and gpu("v100-sxm2-32gb").memory_gib == 32


TINY_DIR = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "tiny"


@pytest.mark.parametrize("model", ["tiny-gpt", "llama", *(pytest.param(m, marks=pytest.mark.wide)
                                                          for m in ("qwen2", "gpt2"))])
def test_reference_gpt_and_three_hf_families_report_replayed_peaks_per_phase_and_device_used(
        capsys: pytest.CaptureFixture[str], model: str) -> None:
    """Issue 38's done-when: for the reference GPT and three HF families (tiny configs), ``memlab trace --gpu``
    reports the replayed reserved and active peaks per phase of both steps, each at least the traced bytes, and
    ``memlab estimate --gpu`` its allocated, reserved and device-used peaks, fits decided on device-used."""
    what = [model] if model == "tiny-gpt" else ["--hf", str(TINY_DIR / f"{model}.json")]
    traced = _json(capsys, "trace", *what, *SMALL, "--gpu", "rtx-4090")
    phases = traced["allocator_replay"]["phases"]
    assert [p["label"] for p in phases] == [f"{s} {p}" for s in ("first", "steady")
                                           for p in ("forward", "backward", "optimizer step", "zero_grad")]
    assert all(p["reserved_bytes"] >= p["active_bytes"] >= p["requested_bytes"] > 0 for p in phases)
    assert max(p["requested_bytes"] for p in phases) == traced["peak_bytes"]
    est = _json(capsys, "estimate", *(["--preset", model] if model == "tiny-gpt" else what), *SMALL, "--gpu",
                "rtx-4090")
    dev = est["device"]
    assert dev["device_high_bytes"] > dev["reserved_bytes"] >= dev["allocated_bytes"] > dev["tensors_bytes"] > 0
    assert est["fits"] is dev["fits"] is (dev["device_high_bytes"] <= dev["capacity_bytes"])
