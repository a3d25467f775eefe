"""What the monitors' "utilisation" numbers count, measured beside the work actually done.

CPU twins (run anywhere):

- :func:`cpu_busy_vs_work`: ``psutil``'s process CPU % for a Python busy loop (no floating-point work), a
  memory-bound copy and a matmul, each with the FLOP/s it achieved. CPU % is time-occupancy, like GPU-Util.
- :func:`rss_vs_live_bytes`: process RSS against live tensor bytes as small tensors are freed; glibc keeps the
  freed pages until ``malloc_trim`` (the CPU analogue of the CUDA allocator's reserved vs allocated, and of
  ``empty_cache``).

On CUDA (each returns a frame with ``status="skipped"`` and the reason elsewhere):

- :func:`gpu_util_demo`: NVML GPU-Util sampled while one tiny kernel spins (``torch.cuda._sleep``), while many
  tiny kernels run back to back, during a big matmul and during a copy, each with its measured MFU and
  bandwidth; NVML's "memory utilisation" beside the measured bandwidth.
- :func:`nvml_memory_ledger`: NVML "used" = other processes + CUDA context + allocator reserved, stage by stage
  (allocate, free, ``empty_cache``), with the residual.

``python scripts/record_utilisation.py --out DIR`` runs all of them and writes ``utilisation_NAME.csv`` with its
``utilisation_NAME.json`` (:func:`memlab.course.provenance.write_recorded`) for ``data/recorded/``.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from memlab.device import resolve_device
from memlab.measure.cuda import cuda_unavailable_reason
from memlab.predict.spec.validate import check_number

_pos = functools.partial(check_number, lo=0.0, lo_open=True)
"""A finite number > 0, or the :class:`~memlab.errors.MemlabError` naming it
(:func:`memlab.predict.spec.validate.check_number`)."""


def _busy_python(deadline: float) -> float:
    """Spin in pure Python until ``deadline``: integer adds, no floating-point tensor work. Returns 0 FLOPs."""
    x = 0
    while time.perf_counter() < deadline:
        for _ in range(1000):
            x += 1
    return 0.0


def _calls(op: Callable[[], Any], deadline: float) -> int:
    """Call ``op`` until ``deadline``; the number of calls."""
    done = 0
    while time.perf_counter() < deadline:
        op()
        done += 1
    return done


def cpu_busy_vs_work(duration_s: float = 0.5, matmul_n: int = 512, copy_bytes: int = 64 * 2**20,
                     peak_flops_per_s: float | None = None, threads: int | None = 1) -> pd.DataFrame:
    """Process CPU % (psutil) and achieved FLOP/s of three loops, each run for ``duration_s`` seconds.

    ``busy loop``: pure Python, 0 FLOPs. ``copy``: ``a.copy_(b)`` on ``copy_bytes`` arrays, 0 FLOPs, memory-bound
    (``bytes_per_s`` counts its read and its write: useful work a FLOP count misses).
    ``matmul``: ``matmul_n``³ fp32, 2n³ FLOPs per call. ``cpu_pct`` is psutil's process figure (100 = one core
    fully busy; a multi-threaded matmul reads up to 100 x threads); ``cpu_pct_of_machine`` divides by the
    logical cores. ``fraction_of_peak`` divides FLOP/s by ``peak_flops_per_s`` when given (the fp32 peak of
    :func:`memlab.measure.machine.detect`). ``threads``: torch threads during the loops (default 1, so every loop
    can occupy exactly one core, as the Python loop does; None keeps torch's setting).
    """
    import psutil

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(_pos("threads", threads)))
    try:
        return _busy_rows(duration_s, matmul_n, copy_bytes, peak_flops_per_s, psutil)
    finally:
        torch.set_num_threads(previous)


def _busy_rows(duration_s: float, matmul_n: int, copy_bytes: int, peak_flops_per_s: float | None,
               psutil: Any) -> pd.DataFrame:
    duration = _pos("duration_s", duration_s)
    n = int(_pos("matmul_n", matmul_n))
    elements = int(_pos("copy_bytes", copy_bytes)) // 4
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    src, dst = torch.ones(elements), torch.empty(elements)
    # per loop: a function of the deadline returning the calls made, and each call's FLOPs and bytes moved
    # (the copy reads and writes every element; the matmul reads a and b and writes c once per call)
    loops: dict[str, tuple[Callable[[float], float], float, float]] = {
        "busy loop (Python)": (lambda end: _busy_python(end) or 1, 0.0, 0.0),
        "copy (memory-bound)": (lambda end: _calls(lambda: dst.copy_(src), end), 0.0, 2.0 * 4 * elements),
        "matmul (fp32)": (lambda end: _calls(lambda: torch.mm(a, b, out=c), end), 2.0 * n**3, 3.0 * 4 * n * n),
    }
    proc = psutil.Process()
    cores = psutil.cpu_count() or 1
    rows = []
    for name, (run, flops_per_call, bytes_per_call) in loops.items():
        run(time.perf_counter() + 0.05)  # warm up
        proc.cpu_percent(None)
        start = time.perf_counter()
        calls = run(start + duration)
        wall = time.perf_counter() - start
        pct = proc.cpu_percent(None)
        flops = flops_per_call * calls
        rate = flops / wall
        rows.append({"loop": name, "cpu_pct": pct, "cpu_pct_of_machine": pct / cores, "wall_s": wall,
                     "flops": flops, "flops_per_s": rate, "bytes_per_s": bytes_per_call * calls / wall,
                     "fraction_of_peak": rate / peak_flops_per_s if peak_flops_per_s else None,
                     "torch_threads": torch.get_num_threads(), "logical_cores": cores})
    return pd.DataFrame(rows)


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _malloc_trim() -> bool:
    """Ask glibc to return free heap pages to the OS; False where there is no glibc (macOS, musl, Windows)."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def rss_vs_live_bytes(total_bytes: int = 64 * 2**20, tensor_bytes: int = 64 * 2**10, keep_every: int = 64
                      ) -> pd.DataFrame:
    """RSS against live tensor bytes: allocate ``total_bytes`` in ``tensor_bytes`` tensors, free all but every
    ``keep_every``-th, then ``malloc_trim(0)``. One row per stage: ``live_tensor_bytes`` (exact: the tensors
    this function holds), ``rss_bytes`` and ``rss_delta_bytes`` (above the start).

    Tensors below glibc's mmap threshold (128 KiB by default) come from the heap; the few survivors pin the
    pages between them, so RSS stays up after the free. That gap is the CPU's "reserved but not allocated".
    """
    total, size = int(_pos("total_bytes", total_bytes)), int(_pos("tensor_bytes", tensor_bytes))
    every = int(_pos("keep_every", keep_every))
    gc.collect()
    _malloc_trim()
    base = _rss()
    rows = []

    def record(stage: str, live: list[torch.Tensor]) -> None:
        rss = _rss()
        rows.append({"stage": stage, "live_tensor_bytes": sum(t.nbytes for t in live), "rss_bytes": rss,
                     "rss_delta_bytes": rss - base})

    record("start", [])
    tensors = [torch.ones(size // 4) for _ in range(total // size)]
    record("allocated", tensors)
    tensors = tensors[::every]
    gc.collect()
    record(f"freed (all but every {every}th)", tensors)
    trimmed = _malloc_trim()
    record("after malloc_trim(0)" if trimmed else "malloc_trim unavailable", tensors)
    del tensors
    return pd.DataFrame(rows)


class _Sampler:
    """NVML readings every ``interval_s`` in a background thread."""

    def __init__(self, index: int, interval_s: float = 0.02) -> None:
        self.index, self.interval_s = index, interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()

    def __enter__(self) -> _Sampler:
        from memlab.measure.nvml import NvmlSession

        self._session = NvmlSession(self.index).__enter__()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._session.read(include_process=False).to_dict())
            time.sleep(self.interval_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._session.__exit__()


def _skipped(reason: str) -> pd.DataFrame:
    return pd.DataFrame([{"status": "skipped", "reason": reason}])


def gpu_util_demo(device: str | torch.device = "cuda", duration_s: float = 2.0, matmul_n: int = 8192,
                  dtype: str = "bf16") -> pd.DataFrame:
    """NVML GPU-Util and memory-util next to measured FLOP/s, MFU and bandwidth, for four workloads (CUDA).

    ``one spinning kernel``: ``torch.cuda._sleep`` (one thread block busy-waits on one SM): 0 FLOPs.
    ``tiny kernels``: ``x.add_(1)`` on a 1-element tensor, back to back (launch-bound, ~0 FLOP/s).
    ``big matmul``: ``matmul_n``³ in ``dtype``. ``copy``: 1 GiB device-to-device copies (bandwidth-bound).
    GPU-Util is "percent of the sample period a kernel ran" (NVML), so the first two read near 100 % too.
    """
    why = cuda_unavailable_reason(device)
    if why:
        return _skipped(why)
    from memlab.device import torch_dtype
    from memlab.measure.machine import detect
    from memlab.measure.nvml import nvml_index_for_cuda

    dev = resolve_device(device)
    info = detect(device=str(dev))
    peak = info.peak_flops.get(dtype)
    bw = info.accelerator.bandwidth_bytes_per_s if info.accelerator else None
    t = torch_dtype(dtype)
    a, b = torch.randn(matmul_n, matmul_n, device=dev, dtype=t), torch.randn(matmul_n, matmul_n, device=dev, dtype=t)
    c = torch.empty_like(a)
    one = torch.zeros(1, device=dev)
    src = torch.empty(2**28, device=dev)  # 1 GiB fp32
    dst = torch.empty_like(src)
    cycles = int(1e6)  # ~0.5 ms at ~2 GHz
    work: dict[str, tuple[Callable[[], None], float, float]] = {  # op, FLOPs, bytes per call
        "one spinning kernel (torch.cuda._sleep)": (lambda: torch.cuda._sleep(cycles), 0.0, 0.0),
        "tiny kernels (1-element add)": (lambda: one.add_(1), 1.0, 8.0),
        f"big matmul ({dtype} {matmul_n}^3)": (lambda: torch.mm(a, b, out=c), 2.0 * matmul_n**3,
                                              3.0 * a.nbytes),
        "copy (1 GiB)": (lambda: dst.copy_(src), 0.0, 2.0 * src.nbytes),
    }
    rows = []
    for name, (op, flops, nbytes) in work.items():
        op()
        torch.cuda.synchronize(dev)
        with _Sampler(nvml_index_for_cuda(dev.index)) as sampler:
            start = time.perf_counter()
            calls = 0
            while time.perf_counter() - start < duration_s:
                for _ in range(10):
                    op()
                calls += 10
                torch.cuda.synchronize(dev)
            wall = time.perf_counter() - start
        s = pd.DataFrame(sampler.samples)
        s = s.dropna(subset=["gpu_util_pct"]) if "gpu_util_pct" in s else s.iloc[0:0]
        s = s.iloc[len(s) // 5:]  # drop the first fifth: NVML averages over its last sample period
        rate = flops * calls / wall
        rows.append({"workload": name, "status": "ok", "reason": None, "calls": calls, "wall_s": wall,
                     "nvml_gpu_util_pct": s["gpu_util_pct"].mean() if len(s) else None,
                     "nvml_mem_util_pct": s["mem_util_pct"].mean() if len(s) else None,
                     "flops_per_s": rate, "mfu": rate / peak if peak else None,
                     "bytes_per_s": nbytes * calls / wall,
                     "fraction_of_peak_bandwidth": nbytes * calls / wall / bw if bw else None,
                     "sm_clock_mhz": s["sm_clock_mhz"].median() if len(s) else None,
                     "samples": len(s), "device_name": info.name})
    return pd.DataFrame(rows)


def nvml_memory_ledger(device: str | torch.device = "cuda", alloc_bytes: int = 4 * 2**30) -> pd.DataFrame:
    """NVML "used" taken apart, stage by stage: ``other`` (used before this process touched CUDA, as read at
    the first stage), ``context`` (the CUDA context and libraries: the rise at init minus reserved), torch's
    ``reserved`` and ``allocated``, and ``residual`` = used - other - context - reserved (ideally a few MiB).

    Stages: ``before CUDA init`` (only meaningful when this is the process's first CUDA call), ``context``,
    ``allocated`` (``alloc_bytes`` in 64 MiB tensors), ``freed half`` (the allocator keeps the blocks),
    ``empty_cache`` (returned to the driver). CUDA only. In a process that already used CUDA the first reading
    cannot separate other processes from this one's context: ``other`` is then 0 and ``context`` holds both
    (``fresh_process`` says which); ``scripts/record_utilisation.py`` calls this first, in a fresh process.
    """
    why = cuda_unavailable_reason(device)
    if why:
        return _skipped(why)
    from memlab.measure.nvml import nvml_index_for_cuda, nvml_reading

    fresh = not torch.cuda.is_initialized()
    dev = resolve_device(device)  # creates no CUDA context, so the first stage can read the GPU before one exists
    index = nvml_index_for_cuda(dev.index)
    rows: list[dict[str, Any]] = []

    def record(stage: str) -> None:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize(dev)
        n = nvml_reading(index)
        live = torch.cuda.is_initialized()
        rows.append({"stage": stage, "nvml_used_bytes": n.memory_used_bytes,
                     "nvml_process_bytes": n.process_used_bytes,
                     "reserved_bytes": torch.cuda.memory_reserved(dev) if live else 0,
                     "allocated_bytes": torch.cuda.memory_allocated(dev) if live else 0})

    if not fresh:
        gc.collect()
        torch.cuda.empty_cache()  # start from the allocator's smallest reserve
    record("before CUDA init" if fresh else "before (CUDA already initialised)")
    torch.empty(1, device=dev)
    record("context")
    chunk = 64 * 2**20
    tensors = [torch.empty(chunk, dtype=torch.uint8, device=dev) for _ in range(max(1, alloc_bytes // chunk))]
    record("allocated")
    del tensors[::2]
    record("freed half")
    del tensors
    torch.cuda.empty_cache()
    record("empty_cache")
    t = pd.DataFrame(rows)
    other = t["nvml_used_bytes"].iloc[0] if fresh else 0
    t["other_bytes"] = other
    t["context_bytes"] = t["nvml_used_bytes"].iloc[1] - other - t["reserved_bytes"].iloc[1]
    t["residual_bytes"] = t["nvml_used_bytes"] - t["other_bytes"] - t["context_bytes"] - t["reserved_bytes"]
    t.loc[0, ["context_bytes", "residual_bytes"]] = None
    t["status"], t["fresh_process"] = "ok", fresh
    return t


def monitor_snapshot(index: int = 0) -> pd.DataFrame:
    """Seed 004's monitoring script, run once and corrected [seed-004]: GPU memory (pynvml) and system memory
    (psutil), total / used / free.

    The seed divides bytes by ``1024**3`` and prints "GB": that is GiB (2^30 B). Each row keeps the exact
    ``bytes``, the seed's printed figure (``seed_label``), and the figure correctly labelled in GiB and in GB
    (10^9 B). A machine without NVML gets one GPU row saying why instead of numbers.
    """
    import psutil

    from memlab.measure.nvml import nvml_reading

    rows: list[dict[str, Any]] = []
    gpu = nvml_reading(index)
    if gpu.available and gpu.memory_total_bytes is not None:
        used = gpu.memory_used_bytes or 0
        rows += [{"source": "GPU (pynvml)", "field": k, "bytes": v}
                 for k, v in (("total", gpu.memory_total_bytes), ("used", used),
                              ("free", gpu.memory_total_bytes - used))]
    else:
        rows.append({"source": "GPU (pynvml)", "field": "unavailable", "bytes": None, "reason": gpu.reason})
    vm = psutil.virtual_memory()
    rows += [{"source": "SYS (psutil)", "field": k, "bytes": int(v)} for k, v in (("total", vm.total),
                                                                                   ("used", vm.used))]
    t = pd.DataFrame(rows)
    t["seed_label"] = [None if b is None or b != b else f"{b / 1024**3:.1f}GB" for b in t["bytes"]]
    t["GiB"] = t["bytes"] / 2**30
    t["GB"] = t["bytes"] / 1e9
    return t

