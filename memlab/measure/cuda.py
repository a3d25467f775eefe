"""The CUDA caching allocator, read as it is: statistics, memory snapshots and a smaller-GPU emulation.

Thin adapters around ``torch.cuda``. Where CUDA is absent (a CPU-only torch build, no visible GPU, or a CPU
device asked for) the readings say so (``available=False`` with the ``reason``); they never pretend with zeros.
The CUDA-only actions (:func:`record_memory_history`, :func:`emulate_smaller_gpu`) raise
:class:`CudaUnavailableError` there instead, so a notebook that calls them on CPU learns why in one line.

Vocabulary (PyTorch docs, "CUDA semantics: memory management", docs.pytorch.org/docs/stable/notes/cuda.html):
*allocated* bytes are held by live tensors; *reserved* bytes are what the caching allocator holds from the driver
(allocated plus its cache); *active* bytes are allocated blocks plus blocks freed but still in use by a stream;
*inactive split* bytes are free pieces of partly used segments, the allocator's fragmentation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from memlab.device import Device, device_string, device_type, resolve_device
from memlab.errors import MemlabError


class CudaUnavailableError(MemlabError):
    """A CUDA-only action was asked for where CUDA cannot be used; the message says why."""


def synchronize(device: torch.device) -> None:
    """Wait until ``device``'s queued kernels have run (CUDA launches are asynchronous); nothing to wait for on a
    CPU, whose ops return when done. Call it before reading a wall clock around GPU work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_unavailable_reason(device: Device = None) -> str | None:
    """Why CUDA cannot be used for ``device`` here, or None when it can.

    ``device`` None means "the current CUDA device"; a CPU device (``"cpu"``, or ``"auto"`` on a machine without
    CUDA) is reported as not CUDA. The device is read by :func:`memlab.device.device_type` (a name it does not know
    raises ``SetupError``).
    """
    if device is not None and device_type(device) != "cuda":
        return f"device {device_string(device)} is not a CUDA device"
    if torch.version.cuda is None:
        return f"this torch build ({torch.__version__}) has no CUDA support"
    if not torch.cuda.is_available():
        return (
            "torch.cuda.is_available() is False: no CUDA GPU is visible to this process "
            "(check the driver and CUDA_VISIBLE_DEVICES)"
        )
    return None


@dataclass(frozen=True)
class CudaMemoryStats:
    """One reading of the CUDA caching allocator for one device (``torch.cuda.memory_stats``).

    All ``*_bytes`` fields are bytes; ``peak_*`` are the highest values since the last :func:`reset_peaks`
    (or process start). ``inactive_split_bytes`` is the fragmentation signal: free bytes stranded inside
    segments that are partly in use. ``num_alloc_retries`` counts the times the allocator had to free its cache
    and retry a cudaMalloc (a sign of memory pressure); ``num_ooms`` the out-of-memory errors it raised.
    When ``available`` is False every number is None and ``reason`` says why.
    """

    available: bool
    reason: str | None = None
    device_index: int | None = None
    allocated_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    active_bytes: int | None = None
    peak_active_bytes: int | None = None
    inactive_split_bytes: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    total_bytes: int | None = None  # device memory as the CUDA runtime reports it (get_device_properties)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a pandas row)."""
        return asdict(self)


_STAT_KEYS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
    "reserved_bytes": "reserved_bytes.all.current",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
    "active_bytes": "active_bytes.all.current",
    "peak_active_bytes": "active_bytes.all.peak",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}
"""Our field -> the key of ``torch.cuda.memory_stats()``."""


def cuda_memory_stats(device: Device = None) -> CudaMemoryStats:
    """Read the caching allocator's statistics for ``device`` (None: the current CUDA device).

    Before the first CUDA allocation torch returns no keys; the allocator then truly holds nothing, so the
    counters read 0 (CUDA is available, it has simply not been used).
    """
    reason = cuda_unavailable_reason(device)
    if reason is not None:
        return CudaMemoryStats(available=False, reason=reason)
    index = resolve_device(device).index
    stats = torch.cuda.memory_stats(index)
    values = {field: int(stats.get(key, 0)) for field, key in _STAT_KEYS.items()}
    total = int(torch.cuda.get_device_properties(index).total_memory)
    return CudaMemoryStats(available=True, device_index=index, total_bytes=total, **values)


def reset_peaks(device: Device = None) -> bool:
    """Reset the allocator's peak statistics for ``device``; False (and nothing done) where CUDA is absent."""
    if cuda_unavailable_reason(device) is not None:
        return False
    torch.cuda.reset_peak_memory_stats(resolve_device(device))
    return True


@contextlib.contextmanager
def record_memory_history(
    path: str | Path,
    *,
    max_entries: int = 100_000,
    stacks: Literal["python", "all"] = "python",
    device: Device = None,
) -> Iterator[Path]:
    """Record every CUDA allocation and free inside the block and save a snapshot for pytorch.org/memory_viz.

    Calls ``torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=..., max_entries=...)``
    on entry; on exit (also when the block raises, e.g. on an out-of-memory error, which is when a snapshot
    helps most) writes ``torch.cuda.memory._dump_snapshot(path)`` (a pickle the viewer at
    https://pytorch.org/memory_viz opens) and turns recording off. ``max_entries`` bounds the ring buffer of
    events (several KB each, per the torch docstring); ``stacks="python"`` records Python frames only, which is
    cheaper than ``"all"`` (Python and C++). Yields the snapshot path.

    On a machine without CUDA this raises :class:`CudaUnavailableError` (there is no allocator history to record);
    guard the call with :func:`cuda_unavailable_reason` in code that must also run on CPU.
    """
    if not isinstance(max_entries, int) or max_entries <= 0:
        raise MemlabError(f"max_entries must be a positive integer (events kept), got {max_entries!r}.")
    if stacks not in ("python", "all"):
        raise MemlabError(f"stacks must be 'python' or 'all', got {stacks!r}.")
    reason = cuda_unavailable_reason(device)
    if reason is not None:
        raise CudaUnavailableError(f"memory snapshots record the CUDA caching allocator, but {reason}.")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    extra = {} if device is None else {"device": resolve_device(device).index}
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks=stacks, max_entries=max_entries, **extra
    )
    try:
        yield out
    finally:
        try:
            torch.cuda.memory._dump_snapshot(str(out))
        finally:
            torch.cuda.memory._record_memory_history(enabled=None, **extra)


@dataclass(frozen=True)
class EmulatedGpu:
    """A per-process cap on the caching allocator that makes a big card behave like a smaller one.

    ``fraction`` = ``capacity_bytes / total_bytes`` was passed to ``torch.cuda.set_per_process_memory_fraction``;
    the allocator then refuses (out-of-memory error) to reserve more than ``fraction * total_bytes``. Use it as a
    context manager, or call :meth:`restore`, to put back ``previous_fraction``.

    What it does not emulate: the small card's own CUDA context and driver reservations (they are not counted
    against the cap, so the emulated card is a little roomier than the real one), its bandwidth and its FLOP/s.
    """

    device_index: int
    capacity_bytes: int
    total_bytes: int
    fraction: float
    previous_fraction: float

    def restore(self) -> None:
        """Put the allocator's fraction back to what it was before (1.0 if torch cannot report it)."""
        torch.cuda.set_per_process_memory_fraction(float(self.previous_fraction), self.device_index)

    def __enter__(self) -> EmulatedGpu:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a pandas row)."""
        return asdict(self)


def emulate_smaller_gpu(capacity_bytes: int, device: Device = None) -> EmulatedGpu:
    """Cap this process's CUDA allocator at ``capacity_bytes`` so an H100/H200 class can feel a 16 GB T4.

    Computes the fraction from the device's total memory (``get_device_properties(i).total_memory``) and calls
    ``torch.cuda.set_per_process_memory_fraction``. Returns an :class:`EmulatedGpu` that restores the previous
    fraction when used as a context manager::

        with emulate_smaller_gpu(16 * 10**9):
            run_step(...)   # raises torch.OutOfMemoryError where a 16 GB card would

    Raises :class:`CudaUnavailableError` without CUDA and :class:`MemlabError` if ``capacity_bytes`` is not a
    positive number of bytes no larger than the device.
    """
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int | float) or capacity_bytes <= 0:
        raise MemlabError(f"capacity_bytes must be a positive number of bytes, got {capacity_bytes!r}.")
    reason = cuda_unavailable_reason(device)
    if reason is not None:
        raise CudaUnavailableError(f"emulating a smaller GPU caps the CUDA allocator, but {reason}.")
    index = resolve_device(device).index
    total = int(torch.cuda.get_device_properties(index).total_memory)
    if capacity_bytes > total:
        raise MemlabError(
            f"cannot emulate a {capacity_bytes / 2**30:.2f} GiB card on device {index}: it has only "
            f"{total / 2**30:.2f} GiB ({total} bytes). Choose a capacity at most the device's total memory."
        )
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    previous = float(getter(index)) if getter is not None else 1.0
    fraction = float(capacity_bytes) / total
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return EmulatedGpu(
        device_index=index, capacity_bytes=int(capacity_bytes), total_bytes=total, fraction=fraction,
        previous_fraction=previous,
    )
