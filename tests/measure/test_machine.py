"""memlab.measure.machine: detect()/describe() (GPU rows from the table, a CPU's peak measured and cached, unknown
GPUs given no borrowed peak)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from memlab.errors import MemlabError
from memlab.measure import machine as device_mod
from memlab.predict.hardware import gpus as hw_

CUDA = torch.cuda.is_available()
GIB, MIB = 2**30, 2**20


def _as_cpu_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_detect_on_a_cpu_measures_caches_and_marks_the_peak(tmp_path, monkeypatch):
    _as_cpu_machine(monkeypatch)
    info = device_mod.detect(cache_dir=tmp_path)
    assert info.kind == "cpu"
    assert info.peak_flops["fp32"] > 0
    assert info.peak_source.startswith("measured: ") and "fp32" in info.peak_source
    assert info.peak_reason is None
    assert info.accelerator is not None and info.accelerator.measured
    assert info.accelerator.key not in hw_.GPUS  # never a GPU table row for a CPU
    assert info.peak_flops["fp8"] is None and info.peak_flops["tf32"] is None
    assert (tmp_path / device_mod.CPU_CACHE_FILE).exists()
    assert json.dumps(info.to_dict())

    def must_not_run(*args, **kwargs):
        raise AssertionError("the second call must read the cache, not benchmark again")

    monkeypatch.setattr(device_mod, "_measure_cpu_peaks", must_not_run)
    again = device_mod.detect(cache_dir=tmp_path)
    assert again.peak_flops == info.peak_flops
    assert again.peak_source == info.peak_source


def test_detect_without_measuring_reports_unknown_with_reason(tmp_path, monkeypatch):
    _as_cpu_machine(monkeypatch)
    monkeypatch.setattr(device_mod, "_measure_cpu_peaks", lambda *a: pytest.fail("must not benchmark"))
    info = device_mod.detect(measure_cpu_peak=False, cache_dir=tmp_path)
    assert info.kind == "cpu" and info.accelerator is None
    assert all(v is None for v in info.peak_flops.values())
    assert info.peak_source == "unknown" and "not measured" in info.peak_reason


def test_detect_ignores_a_corrupt_cache(tmp_path, monkeypatch):
    _as_cpu_machine(monkeypatch)
    (tmp_path / device_mod.CPU_CACHE_FILE).write_text("{not json")
    monkeypatch.setattr(device_mod, "_measure_cpu_peaks", lambda torch, threads: ({"fp32": 1e11, "bf16": None}, "fake"))
    info = device_mod.detect(cache_dir=tmp_path)
    assert info.peak_flops["fp32"] == 1e11
    assert json.loads((tmp_path / device_mod.CPU_CACHE_FILE).read_text())["entries"]


def _fake_cuda(monkeypatch, name, total, sms=132):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)
    props = SimpleNamespace(total_memory=total, multi_processor_count=sms)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)


def test_detect_gives_an_unknown_gpu_no_borrowed_peak(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA Future GPU 2000", 100 * GIB)
    info = device_mod.detect()
    assert info.kind == "cuda" and info.accelerator is None
    assert all(v is None for v in info.peak_flops.values())
    assert info.peak_source == "unknown"
    assert "not in memlab's table" in info.peak_reason and "NVIDIA Future GPU 2000" in info.peak_reason


def test_detect_resolves_a_known_gpu_to_its_table_row(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA H100 80GB HBM3", 81559 * MIB)
    info = device_mod.detect()
    assert info.accelerator is hw_.GPUS["h100-sxm"]
    assert info.peak_flops["bf16"] == hw_.GPUS["h100-sxm"].peak("bf16")
    assert info.peak_source.startswith("table: NVIDIA H100")


def test_detect_device_argument_picks_the_cpu_and_refuses_missing_devices(tmp_path, monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA H100 80GB HBM3", 81559 * MIB)
    monkeypatch.setattr(device_mod, "_measure_cpu_peaks", lambda torch, threads: ({"fp32": 1e11}, "fake"))
    assert device_mod.detect(cache_dir=tmp_path, device="cpu").kind == "cpu"  # a GPU box can still describe its CPU
    with pytest.raises(MemlabError, match="CUDA device 3 does not exist"):
        device_mod.detect(device="cuda:3")
    with pytest.raises(MemlabError, match="device must be"):
        device_mod.detect(device="tpu")


def test_describe_is_a_flat_provenance_dict(tmp_path, monkeypatch):
    _as_cpu_machine(monkeypatch)
    monkeypatch.setattr(device_mod, "_measure_cpu_peaks", lambda torch, threads: ({"fp32": 1e11}, "fake"))
    d = device_mod.describe("cpu", cache_dir=tmp_path)
    assert d["device_kind"] == "cpu" and d["peak_fp32_flops"] == 1e11 and d["peak_bf16_flops"] is None
    assert d["peak_source"].startswith("measured: fake") and d["accelerator"] == "cpu"
    assert json.dumps(d)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_detect_on_a_real_gpu_reports_cuda():
    info = device_mod.detect()
    assert info.kind == "cuda" and info.name and info.total_memory_bytes > 0
    assert (info.accelerator is None) == (info.peak_reason is not None)

