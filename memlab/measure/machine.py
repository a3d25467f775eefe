"""This machine: ``detect()`` (the device this process would use and its peak), caches, the CPU peak benchmark.

A GPU's peak comes from the sourced table (:mod:`memlab.predict.hardware.gpus`); a CPU's is measured once with the
roofline's matmul benchmark (:func:`memlab.measure.roofline.matmul_flops_per_s`) and cached on disk
(``~/.cache/memlab``), because no table knows a CPU's achievable FLOP/s. The CPU's name and cache sizes come from
:mod:`memlab.measure.cpu`. torch is imported lazily, so this module imports without it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from memlab.device import Device, resolve_device
from memlab.measure.cpu import cpu_identity
from memlab.predict.hardware.gpus import PEAK_DTYPES, Accelerator, DeviceInfo, resolve


def _driver_version() -> str | None:
    """NVIDIA driver version from NVML, or None when NVML (or a driver) is absent."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing, no driver, no permission: "unavailable", never a guess
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def _host_memory_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None


def _measure_cpu_peaks(torch: Any, threads: int) -> tuple[dict[str, float | None], str]:
    """Measured fp32 (and bf16 when it runs) matmul FLOP/s on this CPU, and the benchmark's description.

    Timed by :func:`memlab.measure.roofline.matmul_flops_per_s` (the roofline's matmul benchmark) on square
    n x n x n shapes after one warm-up; the peak is ``2 n^3 / min_s``, the best repeat. fp32: best of 5 1024^3
    matmuls. bf16: the size is picked from a 256^3 probe so one matmul takes at most ~50 ms (CPUs without bf16
    units emulate it slowly); best of 3. Total well under 1 s. The benchmark's random operands are drawn inside
    ``torch.random.fork_rng``, so detecting the machine leaves the caller's random stream where it was.
    """
    from memlab.measure.roofline import matmul_flops_per_s

    def best_s(dtype: str, n: int, reps: int) -> float | None:
        row = matmul_flops_per_s([(n, n, n)], [dtype], device="cpu", repeats=reps, warmup=1).iloc[0]
        return float(row["min_s"]) if row["status"] == "ok" else None

    n32, reps32 = 1024, 5
    with torch.random.fork_rng(devices=[]):
        fp32_s = best_s("fp32", n32, reps32)
        probe = best_s("bf16", 256, 2)
        n16 = 256 if probe is None else 1024 if probe * 64 < 0.05 else 512 if probe * 8 < 0.05 else 256
        bf16_s = None if probe is None else best_s("bf16", n16, 3)
    if fp32_s is None:
        raise RuntimeError("an fp32 matmul does not run on this CPU: no peak to measure")
    peaks: dict[str, float | None] = {"fp32": 2 * n32**3 / fp32_s}
    peaks["bf16"] = None if bf16_s is None else 2 * n16**3 / bf16_s
    desc = f"best of {reps32} torch.mm {n32}x{n32}x{n32} fp32"
    desc += ", bf16 matmul unsupported" if bf16_s is None else f", best of 3 {n16}x{n16}x{n16} bf16"
    desc += f" on {threads} thread(s), FLOP/s = 2*n^3 / best time"
    return peaks, desc


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memlab"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) and isinstance(data.get("entries"), dict) else {"entries": {}}
    except (OSError, ValueError):
        return {"entries": {}}


def _write_cache(path: Path, data: dict[str, Any]) -> None:
    """Atomic write; an unwritable cache only costs a re-measurement next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass


CPU_CACHE_FILE = "cpu_peak.json"


MAX_CPU_PEAK_FLOPS = 1e15
"""The most a cached CPU matmul peak may claim: 1 PFLOP/s, several times the bf16 AMX peak of a two-socket server
(about 2 x 56 cores x 2 GHz x 1024 FLOP/cycle = 230 TFLOP/s). A larger cached value is corrupt and is re-measured."""


def _valid_entry(entry: object) -> bool:
    """A cache entry with a benchmark description and plausible peaks (positive, at most
    :data:`MAX_CPU_PEAK_FLOPS`, or None) for known dtypes only."""
    if not isinstance(entry, dict) or not isinstance(entry.get("benchmark"), str):
        return False
    peaks = entry.get("peak_flops")
    if not isinstance(peaks, dict) or not peaks or set(peaks) - set(PEAK_DTYPES):
        return False
    return all(v is None or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                             and 0 < v <= MAX_CPU_PEAK_FLOPS) for v in peaks.values())


def _detect_cpu(torch: Any, measure: bool, cache_dir: Path | None, common: dict[str, Any]) -> DeviceInfo:
    model, vendor = cpu_identity()
    threads = int(torch.get_num_threads())
    cache_key = f"{model} | torch {torch.__version__} | {threads} threads"
    path = (cache_dir if cache_dir is not None else _default_cache_dir()) / CPU_CACHE_FILE
    cache = _read_cache(path)
    entry = cache["entries"].get(cache_key)
    if not _valid_entry(entry):
        entry = None
        if measure:
            peaks, desc = _measure_cpu_peaks(torch, threads)
            entry = {"peak_flops": peaks, "benchmark": desc, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            cache["entries"][cache_key] = entry
            _write_cache(path, cache)
    memory = _host_memory_bytes()
    if entry is None:
        return DeviceInfo("cpu", model, None, memory, {}, "unknown",
                          "CPU peak not measured (measure_cpu_peak=False and no cached measurement)", **common)
    source = f"measured: {entry['benchmark']} ({model})"
    row = None
    if memory:
        row = Accelerator("cpu", model, vendor, memory, None, entry["peak_flops"], "CPU", source,
                          "host CPU: peak measured by memlab.measure.machine.detect(), not a datasheet figure; "
                          "bandwidth not measured", measured=True)
    return DeviceInfo("cpu", model, row, memory, entry["peak_flops"], source, None, **common)


def detect(measure_cpu_peak: bool = True, cache_dir: Path | None = None, *, device: Device = None) -> DeviceInfo:
    """Describe the device this process would use: the current CUDA device when available, else the CPU.

    GPU: name and total memory go through :func:`resolve`; a GPU missing from the table gets no peak, with the
    reason. CPU: the fp32 (and bf16) matmul peak is measured by a sub-second benchmark and cached as JSON in
    ``cache_dir`` (default ``$XDG_CACHE_HOME/memlab`` or ``~/.cache/memlab``), keyed by CPU model, torch version
    and thread count; later calls read the cache. ``measure_cpu_peak=False`` uses a cached value if present and
    never benchmarks. ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``; None or ``"auto"`` = the default above)
    picks another device, read by :func:`memlab.device.resolve_device` (a device that is not here raises its
    ``SetupError``). The function keeps no state between calls besides that file.
    """
    import torch

    hip = getattr(torch.version, "hip", None)
    common: dict[str, Any] = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or (f"hip {hip}" if hip else None),
        "driver_version": _driver_version(),
        "cpu_count": os.cpu_count(),
    }
    dev = resolve_device(device)
    if dev.type == "cpu":
        return _detect_cpu(torch, measure_cpu_peak, cache_dir, common)
    index = dev.index
    props = torch.cuda.get_device_properties(index)
    name = torch.cuda.get_device_name(index)
    total = int(props.total_memory)
    row = resolve(name, total, multiprocessor_count=getattr(props, "multi_processor_count", None))
    if row is None:
        reason = (f"GPU {name!r} is not in memlab's table; MFU is reported as unknown rather than borrowing "
                  "another GPU's peak")
        return DeviceInfo("cuda", name, None, total, {}, "unknown", reason, **common)
    return DeviceInfo("cuda", name, row, total, row.peak_flops, row.peak_source, None, **common)


def describe(device: Device = None, *, measure_cpu_peak: bool = True, cache_dir: Path | None = None
             ) -> dict[str, Any]:
    """Flat provenance of a device for reports: ``device``, ``device_kind``, ``peak_source``, ``peak_reason``,
    versions and the dense bf16/fp32 peaks (FLOP/s, None when unknown). Built from :func:`detect`."""
    info = detect(measure_cpu_peak, cache_dir, device=device)
    return {
        "device": info.name, "device_kind": info.kind,
        "accelerator": info.accelerator.key if info.accelerator else None,
        "peak_source": info.peak_source, "peak_reason": info.peak_reason,
        "peak_fp32_flops": info.peak_flops["fp32"], "peak_bf16_flops": info.peak_flops["bf16"],
        "total_memory_bytes": info.total_memory_bytes, "torch_version": info.torch_version,
        "cuda_version": info.cuda_version, "driver_version": info.driver_version, "cpu_count": info.cpu_count,
    }
