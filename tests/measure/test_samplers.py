"""CUDA, NVML, host and timeline samplers: real readings where the source exists, 'unavailable' where it does not."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import types
from types import SimpleNamespace

import pytest
import torch

from memlab.errors import MemlabError
from memlab.measure.cuda import (
    CudaUnavailableError,
    cuda_memory_stats,
    cuda_unavailable_reason,
    emulate_smaller_gpu,
    record_memory_history,
    reset_peaks,
)
from memlab.measure.host import host_reading
from memlab.measure.nvml import NvmlSession, nvml_index_for_cuda, nvml_reading
from memlab.measure.timeline import TimelineSampler

MiB = 2**20
CUDA = torch.cuda.is_available()
cpu_only = pytest.mark.skipif(CUDA, reason="checks the no-CUDA behaviour; this machine has CUDA")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: this machine's torch sees none")
CUDA_COLUMNS = {"cuda_allocated_bytes", "cuda_reserved_bytes", "nvml_used_bytes", "gpu_util_pct", "mem_util_pct"}


# --- CUDA allocator -------------------------------------------------------------------------------------------


@cpu_only
def test_cuda_stats_unavailable_on_cpu_with_a_reason_not_zeros() -> None:
    stats = cuda_memory_stats()
    assert stats.available is False
    assert stats.reason and ("CUDA" in stats.reason or "cuda" in stats.reason)
    numbers = {k: v for k, v in stats.to_dict().items() if k not in ("available", "reason")}
    assert all(v is None for v in numbers.values())


def test_cuda_stats_for_a_cpu_device_are_unavailable_even_with_cuda() -> None:
    stats = cuda_memory_stats("cpu")
    assert not stats.available
    assert stats.reason == "device cpu is not a CUDA device"


def test_unknown_device_name_is_a_clear_error() -> None:
    with pytest.raises(MemlabError, match="device must be 'auto', 'cpu', 'cuda'"):
        cuda_memory_stats("gpu-please")


@cpu_only
def test_cuda_only_actions_explain_why_they_cannot_run(tmp_path) -> None:
    assert reset_peaks() is False
    assert cuda_unavailable_reason() is not None
    with pytest.raises(CudaUnavailableError, match="memory snapshots"), record_memory_history(tmp_path / "s.pickle"):
        pass
    assert not (tmp_path / "s.pickle").exists()
    with pytest.raises(CudaUnavailableError, match="smaller GPU"):
        emulate_smaller_gpu(16 * 10**9)


def test_bad_arguments_are_rejected_before_touching_cuda(tmp_path) -> None:
    with pytest.raises(MemlabError, match="max_entries"), record_memory_history(tmp_path / "s.pickle", max_entries=0):
        pass
    with pytest.raises(MemlabError, match="stacks"), record_memory_history(tmp_path / "s.pickle", stacks="cpp"):
        pass
    for bad in (0, -5, "16GB", True):
        with pytest.raises(MemlabError, match="capacity_bytes"):
            emulate_smaller_gpu(bad)


# --- NVML -------------------------------------------------------------------------------------------------------


class _FakeNvmlError(Exception):
    pass


def _fake_pynvml(*, init_error: str | None = None, util_supported: bool = True, pids: tuple[int, ...] = ()):
    """A stand-in for the pynvml module (test double of the library's API, not of a GPU result)."""
    calls = {"init": 0, "shutdown": 0}

    def init() -> None:
        calls["init"] += 1
        if init_error:
            raise _FakeNvmlError(init_error)

    def util(_h):
        if not util_supported:
            raise _FakeNvmlError("Not Supported")
        return SimpleNamespace(gpu=87, memory=41)

    mod = types.ModuleType("pynvml")
    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda i: f"handle{i}"
    mod.nvmlDeviceGetName = lambda h: b"Fake GPU 80GB"
    mod.nvmlSystemGetDriverVersion = lambda: "999.01"
    mod.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=3 * 2**30, total=80 * 2**30, free=77 * 2**30)
    mod.nvmlDeviceGetUtilizationRates = util
    mod.NVML_CLOCK_SM, mod.NVML_CLOCK_MEM = 1, 2
    mod.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1980, 2: 2619}[kind]
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        SimpleNamespace(pid=p, usedGpuMemory=512 * MiB * (i + 1)) for i, p in enumerate(pids)
    ]
    return mod, calls


def test_nvml_missing_library_is_unavailable_with_the_exception_message(monkeypatch) -> None:
    fake, calls = _fake_pynvml(init_error="NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reading = nvml_reading()
    assert reading.available is False
    assert "NVML Shared Library Not Found" in reading.reason
    assert reading.memory_used_bytes is None and reading.gpu_util_pct is None
    assert calls["shutdown"] == 0  # never started, so nothing to shut down


def test_nvml_reading_maps_the_library_fields(monkeypatch) -> None:
    fake, calls = _fake_pynvml(pids=(1, os.getpid()))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    r = nvml_reading(0)
    assert r.available and r.reason is None
    assert (r.name, r.driver_version) == ("Fake GPU 80GB", "999.01")
    assert (r.memory_used_bytes, r.memory_total_bytes) == (3 * 2**30, 80 * 2**30)
    assert (r.gpu_util_pct, r.mem_util_pct) == (87.0, 41.0)
    assert (r.sm_clock_mhz, r.mem_clock_mhz) == (1980, 2619)
    assert r.process_used_bytes == 1024 * MiB  # the second process listed is this one
    assert calls == {"init": 1, "shutdown": 1}


def test_nvml_unsupported_query_is_none_and_unmatched_pid_is_explained(monkeypatch) -> None:
    fake, _ = _fake_pynvml(util_supported=False, pids=(1, 2))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    r = nvml_reading(0)
    assert r.available and r.gpu_util_pct is None and r.mem_util_pct is None
    assert r.process_used_bytes is None and str(os.getpid()) in r.process_reason


def test_nvml_index_beyond_the_devices_is_unavailable(monkeypatch) -> None:
    fake, calls = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    r = nvml_reading(3)
    assert not r.available and "index 3 does not exist" in r.reason
    assert calls["shutdown"] == 1
    with pytest.raises(MemlabError, match="index"):
        NvmlSession(-1)


@cpu_only
def test_nvml_on_this_cpu_machine_is_unavailable_not_zero() -> None:
    r = nvml_reading()
    assert r.available is False and r.reason
    assert r.memory_used_bytes is None and r.memory_total_bytes is None


# --- host -------------------------------------------------------------------------------------------------------


def test_host_reading_is_positive_and_consistent() -> None:
    r = host_reading()
    assert r.available
    assert r.rss_bytes > 0 and r.peak_rss_bytes > 0
    assert r.system_total_bytes >= r.system_available_bytes > 0
    assert r.rss_bytes < r.system_total_bytes


def test_host_rss_sees_a_touched_64_mib_tensor() -> None:
    before = host_reading().rss_bytes
    held = torch.ones(16 * MiB, dtype=torch.float32)  # 64 MiB, every page written
    after = host_reading().rss_bytes
    assert held.numel() == 16 * MiB
    assert after - before >= 32 * MiB


# --- timeline ---------------------------------------------------------------------------------------------------


def test_timeline_on_cpu_has_phases_and_rss_only() -> None:
    with TimelineSampler(interval_s=0.002, device="cpu") as tl:
        tl.mark("forward")
        x = torch.ones(4 * MiB)
        tl.mark("backward")
        y = x * 2
        tl.mark("optimizer")
        del x, y
    df = tl.frame()
    assert list(df.columns) == ["t_s", "phase", "rss_bytes"]
    assert not CUDA_COLUMNS & set(df.columns)
    assert {"start", "forward", "backward", "optimizer"} <= set(df["phase"])
    assert (df["rss_bytes"] > 0).all()
    assert df["t_s"].is_monotonic_increasing
    assert set(tl.unavailable) == {"cuda", "nvml"} and all(tl.unavailable.values())
    markers = tl.markers()
    assert list(markers["phase"]) == ["forward", "backward", "optimizer"]
    assert markers["t_s"].is_monotonic_increasing
    for t, phase in zip(markers["t_s"], markers["phase"], strict=True):  # a sample at each mark
        at_mark = df[df["t_s"] >= t].iloc[0]
        assert at_mark["phase"] == phase
    assert list(tl.peaks_by_phase().index) == ["start", "forward", "backward", "optimizer"]


@cpu_only
def test_timeline_default_device_on_a_cpu_machine_has_no_cuda_columns() -> None:
    with TimelineSampler(interval_s=0.005) as tl:
        tl.mark("work")
    assert set(tl.frame().columns) == {"t_s", "phase", "rss_bytes"}
    assert "CUDA" in tl.unavailable["cuda"] or "cuda" in tl.unavailable["cuda"]


def test_timeline_thread_stops_when_the_body_raises() -> None:
    with pytest.raises(ZeroDivisionError), TimelineSampler(interval_s=0.001, device="cpu") as tl:
        tl.mark("forward")
        1 / 0  # noqa: B018
    assert tl._thread is not None and not tl._thread.is_alive()
    assert not any(t.name == "memlab-timeline" and t.is_alive() for t in threading.enumerate())
    assert "forward" in set(tl.frame()["phase"])


def test_timeline_misuse_is_a_clear_error() -> None:
    for bad in (0, -1, "fast", 120):
        with pytest.raises(MemlabError, match="interval_s"):
            TimelineSampler(interval_s=bad)
    tl = TimelineSampler(device="cpu")
    with pytest.raises(MemlabError, match="inside"):
        tl.mark("forward")
    with tl, pytest.raises(MemlabError, match="phase"):
        tl.mark("")
    with pytest.raises(MemlabError, match="runs once"), tl:
        pass


# --- GPU ----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_cuda_stats_follow_an_allocation() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert reset_peaks()
    before = cuda_memory_stats()
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    during = cuda_memory_stats()
    assert during.available and during.device_index == torch.cuda.current_device()
    assert during.allocated_bytes - before.allocated_bytes >= 256 * MiB
    assert during.peak_allocated_bytes >= during.allocated_bytes
    assert during.reserved_bytes >= during.allocated_bytes
    assert during.total_bytes == torch.cuda.get_device_properties(during.device_index).total_memory
    del x
    after = cuda_memory_stats()
    assert after.allocated_bytes == before.allocated_bytes
    assert after.peak_allocated_bytes >= before.allocated_bytes + 256 * MiB  # the peak remembers


@pytest.mark.gpu
@needs_cuda
def test_memory_snapshot_is_written_for_memory_viz(tmp_path) -> None:
    path = tmp_path / "snap" / "step.pickle"
    with record_memory_history(path, max_entries=10_000) as out:
        x = torch.randn(1024, 1024, device="cuda")
        y = x @ x
        del x, y
    assert out == path and path.stat().st_size > 0
    with path.open("rb") as f:
        snapshot = pickle.load(f)
    assert "segments" in snapshot and "device_traces" in snapshot
    events = [e for trace in snapshot["device_traces"] for e in trace]
    assert any(e.get("action") == "alloc" and e.get("size", 0) >= 4 * MiB for e in events)


@pytest.mark.gpu
@needs_cuda
def test_timeline_on_cuda_sees_the_allocation_in_its_phase() -> None:
    with TimelineSampler(interval_s=0.005, device="cuda") as tl:
        tl.mark("alloc")
        x = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        tl.mark("free")
        del x
    df = tl.frame()
    assert {"cuda_allocated_bytes", "cuda_reserved_bytes", "rss_bytes"} <= set(df.columns)
    peaks = tl.peaks_by_phase()
    assert peaks.loc["free", "cuda_allocated_bytes"] - peaks.loc["start", "cuda_allocated_bytes"] >= 512 * MiB
    if "nvml" not in tl.unavailable:
        assert (df["nvml_used_bytes"] >= df["cuda_reserved_bytes"]).all()


@pytest.mark.gpu
@needs_cuda
def test_nvml_reads_the_cuda_device() -> None:
    r = nvml_reading(nvml_index_for_cuda(torch.cuda.current_device()))
    if not r.available:
        pytest.skip(f"NVML is not usable on this CUDA machine: {r.reason}")
    assert r.name and r.driver_version
    assert 0 < r.memory_used_bytes <= r.memory_total_bytes
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert abs(r.memory_total_bytes - props.total_memory) <= 0.05 * r.memory_total_bytes
