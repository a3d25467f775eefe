"""NVML readings: what ``nvidia-smi`` shows, for one device, from Python (``nvidia-ml-py``, imported as pynvml).

NVML sees the whole device, not just PyTorch: ``memory_used_bytes`` includes every process's CUDA context, the
caching allocator's reserve and other programs, so it is larger than ``torch.cuda.memory_allocated`` and larger
than ``memory_reserved``. pynvml is imported inside the functions; a machine without the NVML library or without
an NVIDIA GPU gets a reading with ``available=False`` and the exception's message as ``reason``, never zeros.

NVML device indices are NVML's own (physical order, ignoring ``CUDA_VISIBLE_DEVICES``); use
:func:`nvml_index_for_cuda` to translate a torch CUDA index.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from memlab.errors import MemlabError


@dataclass(frozen=True)
class NvmlReading:
    """One NVML reading of one GPU.

    Fields (None where NVML does not support or permit the query on this device, e.g. utilization under MIG):

    - ``memory_used_bytes`` / ``memory_total_bytes``: device-wide memory, as ``nvidia-smi`` shows it (all
      processes and contexts, not only this one).
    - ``gpu_util_pct``: percent of the last sample period (1/6 s to 1 s, device dependent) during which at least
      one kernel ran. It is not SM occupancy: one tiny kernel running all the time reads 100 %.
    - ``mem_util_pct``: NVML "memory utilization" = percent of the sample period during which the device memory
      was being read or written (the memory controller was busy). It is NOT the fraction of memory capacity in
      use; a full card can read 0 % and a nearly empty one 100 %. (NVML API reference, ``nvmlUtilization_t``.)
    - ``process_used_bytes``: this process's usage from ``nvmlDeviceGetComputeRunningProcesses``, matched by
      ``os.getpid()``; None when NVML does not list it (inside a container NVML reports host PIDs, so the match
      fails) or does not permit the query; ``process_reason`` then says which.
    - ``sm_clock_mhz`` / ``mem_clock_mhz``: current SM and memory clocks, MHz.
    - ``timestamp_s``: ``time.time()`` when read (seconds since the epoch).
    """

    available: bool
    reason: str | None = None
    index: int | None = None
    name: str | None = None
    driver_version: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    process_used_bytes: int | None = None
    process_reason: str | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    timestamp_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a pandas row)."""
        return asdict(self)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class NvmlSession:
    """NVML opened once for many readings of one device: ``nvmlInit`` on enter, ``nvmlShutdown`` on exit.

    ::

        with NvmlSession(0) as nvml:
            if nvml.available:
                reading = nvml.read()

    When NVML cannot start, ``available`` is False, ``reason`` says why and :meth:`read` returns an unavailable
    reading. No state outlives the session except what pynvml itself keeps.
    """

    def __init__(self, index: int = 0) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise MemlabError(f"NVML device index must be an integer >= 0, got {index!r}.")
        self.index = index
        self.available = False
        self.reason: str | None = "NVML session not started (use it as a context manager)"
        self._nvml: Any = None
        self._handle: Any = None
        self._started = False
        self._name: str | None = None
        self._driver: str | None = None

    def __enter__(self) -> NvmlSession:
        try:
            import pynvml
        except ImportError as exc:
            self.reason = f"nvidia-ml-py (pynvml) is not installed: {exc}"
            return self
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... all mean "no NVML here"
            self.reason = f"NVML could not start: {_error_text(exc)}"
            return self
        self._nvml, self._started = pynvml, True
        try:
            count = int(pynvml.nvmlDeviceGetCount())
            if self.index >= count:
                self.reason = f"NVML sees {count} device(s); index {self.index} does not exist"
                return self
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self._name = _text(pynvml.nvmlDeviceGetName(self._handle))
            self._driver = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception as exc:
            self.reason = f"NVML could not open device {self.index}: {_error_text(exc)}"
            return self
        self.available, self.reason = True, None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self._started = False
            with contextlib.suppress(Exception):  # a library going away: nothing useful to report
                self._nvml.nvmlShutdown()
        self.available = False
        self._handle = None

    def _optional(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # NotSupported / NoPermission on this device: the field is None, not 0
            return None

    def read(self, *, include_process: bool = True) -> NvmlReading:
        """Read memory, utilization, clocks and (if ``include_process``) this process's usage."""
        if not self.available:
            return NvmlReading(available=False, reason=self.reason, index=self.index, timestamp_s=time.time())
        nv, h = self._nvml, self._handle
        stamp = time.time()
        mem = self._optional(nv.nvmlDeviceGetMemoryInfo, h)
        util = self._optional(nv.nvmlDeviceGetUtilizationRates, h)
        sm_clock = self._optional(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        mem_clock = self._optional(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        process_used, process_reason = (None, "not queried") if not include_process else self._process_usage()
        return NvmlReading(
            available=True,
            index=self.index,
            name=self._name,
            driver_version=self._driver,
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            gpu_util_pct=None if util is None else float(util.gpu),
            mem_util_pct=None if util is None else float(util.memory),
            process_used_bytes=process_used,
            process_reason=process_reason,
            sm_clock_mhz=None if sm_clock is None else int(sm_clock),
            mem_clock_mhz=None if mem_clock is None else int(mem_clock),
            timestamp_s=stamp,
        )

    def _process_usage(self) -> tuple[int | None, str | None]:
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception as exc:
            return None, f"nvmlDeviceGetComputeRunningProcesses failed: {_error_text(exc)}"
        pid = os.getpid()
        for proc in procs:
            if int(proc.pid) == pid:
                used = getattr(proc, "usedGpuMemory", None)
                if used is None:
                    return None, "NVML lists this process but not its memory (not available on this platform)"
                return int(used), None
        return None, (
            f"pid {pid} is not among the {len(procs)} compute process(es) NVML lists "
            "(inside a container NVML reports host PIDs)"
        )


def nvml_reading(index: int = 0) -> NvmlReading:
    """One full NVML reading of device ``index`` (NVML numbering), with init and shutdown around it."""
    with NvmlSession(index) as session:
        return session.read()


def nvml_index_for_cuda(cuda_index: int) -> int:
    """The NVML index of torch's CUDA device ``cuda_index`` (they differ when CUDA_VISIBLE_DEVICES reorders).

    Uses torch's own mapping when it has one; otherwise returns ``cuda_index`` unchanged.
    """
    try:
        import torch.cuda

        mapper = getattr(torch.cuda, "_get_nvml_device_index", None)
        return int(mapper(cuda_index)) if mapper is not None else cuda_index
    except Exception:  # torch without CUDA, or a CUDA_VISIBLE_DEVICES form torch cannot map: keep the index
        return cuda_index
