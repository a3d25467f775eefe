"""The utilisation twins on CPU, the step-time loops, cache sizing, and the CUDA demos (skipped without a GPU)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memlab.errors import MemlabError, SetupError
from memlab.labs import monitors as utilisation
from memlab.labs import step_time
from memlab.measure import roofline
from memlab.measure.cpu import cpu_cache_bytes
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

ROOT = Path(__file__).resolve().parents[2]


def test_cache_bytes_reads_sysfs_levels(tmp_path) -> None:
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                                             (3, "Unified", "32768K")]):
        d = tmp_path / "cpu0" / "cache" / f"index{i}"  # no shared_cpu_list: each CPU's caches its own
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert cpu_cache_bytes(tmp_path) == {"L1d": 48 * 1024, "L2": 2 * 2**20, "L3": 32 * 2**20,
                                         "last_level": 32 * 2**20, "last_level_total": 32 * 2**20}
    assert cpu_cache_bytes(tmp_path / "absent") == {}


def test_bandwidth_arrays_are_beyond_the_last_level_cache() -> None:
    size = roofline.beyond_cache_bytes("cpu")
    llc = cpu_cache_bytes().get("last_level")
    assert size >= (4 * llc if llc else roofline.DRAM_FALLBACK_BYTES)
    with pytest.raises(MemlabError, match="factor"):
        roofline.beyond_cache_bytes("cpu", factor=1)


def test_cpu_percent_does_not_see_flops() -> None:
    t = utilisation.cpu_busy_vs_work(duration_s=0.15, matmul_n=128, copy_bytes=2**20, peak_flops_per_s=1e12)
    assert list(t["flops"] > 0) == [False, False, True]
    assert (t["cpu_pct"] > 0).all()
    assert t.loc[2, "fraction_of_peak"] > 0 and t["torch_threads"].eq(1).all()
    assert t.loc[0, "bytes_per_s"] == 0 and t.loc[1, "bytes_per_s"] > 0  # the copy moves bytes, with no FLOPs
    # the matmul's bytes are its three n x n fp32 matrices per call, so bytes/s = FLOP/s x 12 n² / 2n³
    assert t.loc[2, "bytes_per_s"] == pytest.approx(t.loc[2, "flops_per_s"] * 12 * 128**2 / (2 * 128**3))


def test_rss_keeps_freed_small_tensors_until_trimmed() -> None:
    # In a fresh process, as a chapter's kernel is: after a thousand tests this process's heap already holds freed,
    # resident pages that a new allocation reuses without growing RSS.
    code = ("import json; from memlab.labs import monitors as utilisation; "
            "t = utilisation.rss_vs_live_bytes(total_bytes=16 * 2**20, tensor_bytes=64 * 2**10, keep_every=64); "
            "print(json.dumps({'live': t['live_tensor_bytes'].tolist(), 'rss': t['rss_delta_bytes'].tolist()}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    t = json.loads(out.stdout.strip().splitlines()[-1])
    assert t["live"][:3] == [0, 16 * 2**20, 16 * 2**20 // 64]
    assert t["rss"][1] >= 0.8 * 16 * 2**20


def test_monitor_snapshot_labels_gib_as_the_seed_did_and_corrects_it() -> None:
    t = utilisation.monitor_snapshot()
    sys_total = t[(t["source"] == "SYS (psutil)") & (t["field"] == "total")].iloc[0]
    assert sys_total["seed_label"] == f"{sys_total['bytes'] / 2**30:.1f}GB"
    assert sys_total["GB"] == pytest.approx(sys_total["GiB"] * 2**30 / 1e9)


def test_training_loop_splits_the_step_and_excludes_logging_from_mfu_time() -> None:
    r = step_time.training_loop(preset("tiny-gpt"), Setup(batch=2, seq=16), "cpu", steps=2, log_every=1,
                                checkpoint_every=1)
    assert set(r.phase_s) == set(step_time.PHASES)
    assert r.phase_s["checkpoint"] > 0
    assert r.model_step_s == pytest.approx(r.step_s - r.phase_s["host"] - r.phase_s["checkpoint"])
    assert r.mfu is not None and r.mfu_model_time >= r.mfu
    row = r.to_row()
    assert row["checkpoint_every"] == 1 and "data_s" in row


def test_slow_loader_shows_up_as_data_wait() -> None:
    r = step_time.training_loop(preset("tiny-gpt"), Setup(batch=2, seq=16), "cpu", steps=2, delay_s=0.01)
    assert r.phase_s["data"] >= 0.02
    with pytest.raises(SetupError, match="delay_s"):
        step_time.SlowTokens(10, 4, 2, delay_s=-1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_cuda_demos_skip_with_the_reason_on_cpu() -> None:
    for frame in (utilisation.gpu_util_demo("cpu"), utilisation.nvml_memory_ledger("cpu")):
        assert frame.loc[0, "status"] == "skipped" and "CUDA" in frame.loc[0, "reason"]


def test_entry_point_writes_tables_with_provenance(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("record_utilisation", ROOT / "scripts" / "record_utilisation.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--out", str(tmp_path), "--duration", "0.2"]) == 0
    for name in ("gpu_util", "nvml_ledger", "cpu_busy", "rss", "monitor"):
        assert (tmp_path / f"utilisation_{name}.csv").exists()
        assert "provenance" in (tmp_path / f"utilisation_{name}.json").read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: this machine's torch sees none")
def test_gpu_util_reads_high_for_a_spinning_kernel_with_no_flops() -> None:
    t = utilisation.gpu_util_demo("cuda", duration_s=1.0, matmul_n=4096)
    spin = t.iloc[0]
    assert spin["flops_per_s"] == 0 and spin["nvml_gpu_util_pct"] > 80
    assert t.iloc[2]["mfu"] is None or t.iloc[2]["mfu"] > 0.2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: this machine's torch sees none")
def test_nvml_ledger_closes_and_empty_cache_returns_reserved() -> None:
    t = utilisation.nvml_memory_ledger("cuda", alloc_bytes=2**30).set_index("stage")
    assert t.loc["freed half", "reserved_bytes"] == t.loc["allocated", "reserved_bytes"]
    assert t.loc["empty_cache", "reserved_bytes"] < t.loc["allocated", "reserved_bytes"]
    assert t["residual_bytes"].dropna().abs().max() < 256 * 2**20
