"""measure: the meters, what is really there.

- ``accounting``: model states by storage, saved-for-backward bytes by category; ``by_op``: saved tensors per
  autograd op.
- ``live_bytes``: live tensor bytes op by op and the peak inside each phase (the CPU's twin of the allocator).
- ``cuda``: the caching allocator's statistics, snapshots, a smaller-GPU emulation; ``snapshot``: snapshots read
  offline, fragmentation.
- ``nvml``: what nvidia-smi shows; ``host``: RSS and RAM; ``timeline``: a sampled memory timeline.
- ``oom`` and ``oom_examples``: out-of-memory messages as data.
- ``comm``: the collectives and sends a rank issues, with their bytes.
- ``roofline``: matmul FLOP/s and memory-bandwidth microbenchmarks; ``machine``: this machine (``detect``, the CPU
  peak benchmark); ``cpu``: the CPU's model name and caches; ``timing``: the one timer (``time_fn``).

The adapters here read what is really there. Where a source is absent (no CUDA, no NVML) a reading says so
(``available=False`` and a ``reason``); it never reports zeros in its place.

The names below are re-exported lazily (PEP 562), so importing one submodule (e.g. ``accounting``) does not
import the others (pandas, the sampler thread, NVML).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "cuda": (
        "CudaMemoryStats", "CudaUnavailableError", "EmulatedGpu", "cuda_memory_stats", "cuda_unavailable_reason",
        "emulate_smaller_gpu", "record_memory_history", "reset_peaks",
    ),
    "host": ("HostReading", "host_reading"),
    "live_bytes": ("LiveBytes", "PhasePeaks"),
    "nvml": ("NvmlReading", "NvmlSession", "nvml_reading"),
    "oom": ("OomInfo", "catch_oom", "clean_allocator", "is_oom_error", "parse_oom_message", "run_catching_oom"),
    "timeline": ("TimelineSampler",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'memlab.measure' has no attribute {name!r}")
    return getattr(importlib.import_module(f"memlab.measure.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
