"""Out-of-memory errors as data: parse the message, record it, and leave the allocator clean for the next config.

PyTorch's messages changed shape over the years; :func:`parse_oom_message` reads all the shapes below into one
:class:`OomInfo` (a field is None where that shape does not state it; a message it cannot read at all gives an
``OomInfo`` with only ``raw``, never an exception):

- ``cuda-cached`` (torch <= 1.3): "Tried to allocate X (GPU 0; T total capacity; A already allocated; F free;
  C cached)". ``cached`` was ``amount_cached - amount_allocated``, i.e. reserved but unallocated
  (c10/cuda/CUDACachingAllocator.cpp of that era).
- ``cuda-reserved`` (torch 1.4 - 2.0): "... A already allocated; F free; [L allowed;] R reserved in total by
  PyTorch)", where R is the allocator's whole reserve and "allowed" appears under
  ``set_per_process_memory_fraction``.
- ``cuda-sentences`` (torch 2.1 on; 2.1 spelled it "total capacty"): "Tried to allocate X. GPU 0 has a total
  capacity of T of which F is free. [Including non-PyTorch memory, this process has P memory in use. | Process N has P
  memory in use. ...] [L allowed;] Of the allocated memory A is allocated by PyTorch, [with P allocated in private
  pools (e.g., CUDA Graphs),] and U is reserved by PyTorch but unallocated." Torch names "this process" only when
  the PID NVML reports equals its own; inside a container the PIDs differ and every process, this one included,
  appears as "Process N".
- ``mps``: "MPS backend out of memory (MPS allocated: A, other allocations: O, max allowed: L). Tried to
  allocate X on private pool."
- ``other``: another backend's "out of memory" (XPU, ...); only the request is read, if stated.
- ``cpu-allocator``: "DefaultCPUAllocator: not enough memory: you tried to allocate N bytes" (Windows) or
  "DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error code 12" (Linux).

The version ranges are inferred from dated public reports (GitHub issues quoted in tests/test_oom.py), not from
release notes. Sizes are printed by c10's ``format_size`` with two decimals ("0 bytes", "20.00 KiB",
"512.00 MiB", "2.00 GiB"), so a parsed value is exact only to half a unit of its last digit (±0.005 GiB, about
±5.4 MB, for GiB values).
"""

from __future__ import annotations

import contextlib
import gc
import re
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch

from memlab.device import Device
from memlab.measure.cuda import CudaMemoryStats, cuda_memory_stats, cuda_unavailable_reason, reset_peaks

T = TypeVar("T")

UNIT_BYTES: dict[str, int] = {
    "bytes": 1, "byte": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "kb": 2**10, "mb": 2**20, "gb": 2**30, "tb": 2**40,
}
"""Bytes per unit as torch's messages write them. All are binary: c10's format_size prints KiB/MiB/GiB, and the
MPS allocator's older "KB/MB/GB" used the same 1024 divisors (it printed "Tried to allocate 1024.00 MB",
which only a 2**20 divisor with a 2**30 threshold produces; Comfy-Org/ComfyUI#7372)."""

_SIZE = r"(\d+(?:\.\d+)?)\s*(bytes?|[KMGT]i?B|B)"


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * UNIT_BYTES[unit.lower()])


@dataclass(frozen=True)
class OomInfo:
    """The fields of one out-of-memory message, in bytes (None where this message's shape does not state them).

    - ``tried_to_allocate_bytes``: the request that failed.
    - ``total_capacity_bytes``: the device's memory (CUDA); ``free_bytes``: free on the device per the driver.
    - ``allowed_bytes``: the cap set by ``set_per_process_memory_fraction`` (``cuda-reserved`` shape) or the MPS
      high-watermark limit ("max allowed").
    - ``process_in_use_bytes``: "this process has P memory in use", including non-PyTorch memory (context).
    - ``other_processes``: ``(pid, bytes)`` for each "Process N has P memory in use" (may include this process
      when torch could not match its PID, e.g. in a container).
    - ``allocated_by_pytorch_bytes``: held by live tensors ("already allocated" / "is allocated by PyTorch").
    - ``private_pool_bytes``: of those, allocated in private pools (CUDA Graphs, ``torch.cuda.MemPool``): "with P
      allocated in private pools (e.g., CUDA Graphs)", which torch prints only when P is not zero.
    - ``reserved_by_pytorch_bytes``: the allocator's whole reserve ("reserved in total by PyTorch").
    - ``reserved_unallocated_bytes``: reserved but not allocated ("reserved by PyTorch but unallocated", or the
      oldest shape's "cached"): the allocator cache and fragmentation.
    - ``device_type``: "cuda", "mps", "cpu", or None; ``device_index``: the GPU number; ``message_format``: which shape
      matched (see the module docstring); ``raw``: the whole message.
    """

    raw: str
    message_format: str | None = None
    device_type: str | None = None
    device_index: int | None = None
    tried_to_allocate_bytes: int | None = None
    total_capacity_bytes: int | None = None
    free_bytes: int | None = None
    allowed_bytes: int | None = None
    process_in_use_bytes: int | None = None
    other_processes: tuple[tuple[int, int], ...] = field(default_factory=tuple)
    allocated_by_pytorch_bytes: int | None = None
    private_pool_bytes: int | None = None
    reserved_by_pytorch_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None

    @property
    def reserved_total_bytes(self) -> int | None:
        """The allocator's whole reserve: stated (``cuda-reserved``) or allocated + reserved-unallocated."""
        if self.reserved_by_pytorch_bytes is not None:
            return self.reserved_by_pytorch_bytes
        if self.allocated_by_pytorch_bytes is None or self.reserved_unallocated_bytes is None:
            return None
        return self.allocated_by_pytorch_bytes + self.reserved_unallocated_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a JSON line or pandas row); ``other_processes`` becomes a list of [pid, bytes]."""
        out = asdict(self)
        out["other_processes"] = [list(p) for p in self.other_processes]
        return out


def _find(pattern: str, text: str) -> int | None:
    match = re.search(pattern, text, re.IGNORECASE)
    return None if match is None else _bytes(match.group(1), match.group(2))


def parse_oom_message(msg: str) -> OomInfo:
    """Parse a CUDA or CPU out-of-memory message of any torch version into an :class:`OomInfo`.

    Whitespace (line wraps) is normalised first. Never raises: an unreadable message gives ``OomInfo(raw=msg)``.
    """
    raw = msg if isinstance(msg, str) else str(msg)
    text = " ".join(raw.split()).replace("total capacty", "total capacity")  # torch 2.1's spelling
    cpu = re.search(r"DefaultCPUAllocator: .*?you tried to allocate (\d+) bytes", text)
    if cpu is not None:
        return OomInfo(raw=raw, message_format="cpu-allocator", device_type="cpu",
                       tried_to_allocate_bytes=int(cpu.group(1)))
    mps = re.search(r"MPS backend out of memory", text)
    if mps is not None:
        return OomInfo(
            raw=raw, message_format="mps", device_type="mps",
            tried_to_allocate_bytes=_find(rf"Tried to allocate {_SIZE}", text),
            allocated_by_pytorch_bytes=_find(rf"MPS allocated: {_SIZE}", text),
            allowed_bytes=_find(rf"max allowed: {_SIZE}", text),
        )
    if not re.search(r"CUDA (?:out of memory|error: out of memory)", text, re.IGNORECASE):
        if re.search(r"out of memory", text, re.IGNORECASE):  # another backend (XPU, ...): the request only
            tried = _find(rf"Tried to allocate {_SIZE}", text)
            return OomInfo(raw=raw, message_format="other", tried_to_allocate_bytes=tried)
        return OomInfo(raw=raw)
    gpu = re.search(r"\(GPU (\d+);|GPU (\d+) has a total capac", text)
    device_index = None if gpu is None else int(gpu.group(1) or gpu.group(2))
    common = {
        "raw": raw, "device_type": "cuda", "device_index": device_index,
        "tried_to_allocate_bytes": _find(rf"Tried to allocate {_SIZE}", text),
    }
    if re.search(r"has a total capacity", text):
        others = tuple(
            (int(m.group(1)), _bytes(m.group(2), m.group(3)))
            for m in re.finditer(rf"Process (\d+) has {_SIZE} memory in use", text)
        )
        return OomInfo(
            message_format="cuda-sentences",
            total_capacity_bytes=_find(rf"has a total capacity of {_SIZE}", text),
            free_bytes=_find(rf"of which {_SIZE} is free", text),
            allowed_bytes=_find(rf"{_SIZE} allowed;", text),
            process_in_use_bytes=_find(rf"this process has {_SIZE} memory in use", text),
            other_processes=others,
            allocated_by_pytorch_bytes=_find(rf"Of the allocated memory {_SIZE} is allocated by PyTorch", text),
            private_pool_bytes=_find(rf"with {_SIZE} allocated in private pools", text),
            reserved_unallocated_bytes=_find(rf"{_SIZE} is reserved by PyTorch but unallocated", text),
            **common,
        )
    if re.search(r"total capacity;", text):
        cached = _find(rf"{_SIZE} cached\)", text)
        return OomInfo(
            message_format="cuda-cached" if cached is not None else "cuda-reserved",
            total_capacity_bytes=_find(rf"{_SIZE} total capacity;", text),
            free_bytes=_find(rf"{_SIZE} free;", text),
            allowed_bytes=_find(rf"{_SIZE} allowed;", text),
            allocated_by_pytorch_bytes=_find(rf"{_SIZE} already allocated", text),
            reserved_by_pytorch_bytes=_find(rf"{_SIZE} reserved in total by PyTorch", text),
            reserved_unallocated_bytes=cached,
            **common,
        )
    return OomInfo(message_format="cuda-other", **common)


_OOM_WORDS = ("out of memory", "DefaultCPUAllocator", "can't allocate memory", "not enough memory")


_MEANING: tuple[tuple[str, str, str], ...] = (
    ("tried_to_allocate_bytes", "the one request that failed",
     "small next to capacity: the card was already full (look at what holds it); close to or above capacity: "
     "that one tensor is too big (smaller batch or sequence, checkpointing, chunking)"),
    ("total_capacity_bytes", "the card's memory as the driver reports it (GiB, not the marketed GB)",
     "compare with the estimator's peak for this card"),
    ("allowed_bytes", "the cap set by set_per_process_memory_fraction (or MPS's limit)",
     "the capacity that counts for this process: compare requests and peaks with it, not with the card"),
    ("free_bytes", "free on the device, for every process",
     "near zero with little in use by this process: another process holds the card (nvidia-smi)"),
    ("process_in_use_bytes", "this process in total: PyTorch's reserve plus the CUDA context and other libraries",
     "minus the reserve is the context and non-PyTorch memory, a fixed cost to budget for"),
    ("allocated_by_pytorch_bytes", "held by live tensors",
     "the real workload: parameters, gradients, optimizer state, activations, leaks; reduce these"),
    ("private_pool_bytes", "of the allocated, held in private pools (CUDA Graphs, torch.cuda.MemPool)",
     "a captured graph's memory: it stays while the graph lives, and other tensors cannot reuse it"),
    ("reserved_unallocated_bytes", "cached by the allocator but not in a tensor",
     "fragmentation only if the request is at most free + this (the allocator already returned wholly free "
     "segments before raising): then try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; above that no layout "
     "fits the request"),
    ("reserved_by_pytorch_bytes", "the allocator's whole reserve (older messages state it)",
     "reserved minus allocated is the cache and fragmentation"),
)


_STATED = {"tried_to_allocate_bytes": "Tried to allocate", "total_capacity_bytes": "total capacity",
           "allowed_bytes": "allowed", "free_bytes": "of which … is free",
           "process_in_use_bytes": "this process has … memory in use",
           "allocated_by_pytorch_bytes": "allocated by PyTorch", "private_pool_bytes": "allocated in private pools",
           "reserved_unallocated_bytes": "reserved by PyTorch but unallocated",
           "reserved_by_pytorch_bytes": "reserved in total by PyTorch"}
"""Each field as the message words it (torch's ``c10/cuda/CUDACachingAllocator.cpp`` OOM text), for a reader."""


def decode_oom(info: OomInfo) -> list[dict[str, Any]]:
    """One row per field the message states: field (the parser's name), in the message (its words there), bytes,
    GiB, what it is, and what it means for the fix.

    Processes other than this one are one row each ("process N"); fields the message's shape lacks are left out.
    """
    rows: list[dict[str, Any]] = []
    for name, meaning, fix in _MEANING:
        value = getattr(info, name)
        if value is not None:
            rows.append({"field": name, "in the message": _STATED[name], "bytes": value, "GiB": value / 2**30,
                         "meaning": meaning, "for the fix": fix})
    for pid, n in info.other_processes:
        rows.append({"field": f"process {pid}", "in the message": f"process {pid} has … memory in use",
                     "bytes": n, "GiB": n / 2**30,
                     "meaning": "memory in use by a process NVML lists (this one too, when torch cannot match its PID)",
                     "for the fix": "in a container this is usually this process; otherwise a neighbour to stop"})
    return rows


def is_oom_error(exc: BaseException) -> bool:
    """True for ``torch.OutOfMemoryError`` and for a RuntimeError whose message is an out-of-memory message
    (older torch raised plain RuntimeError; the CPU allocator still does)."""
    oom_types = tuple(
        t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t
    )
    if oom_types and isinstance(exc, oom_types):
        return True
    return isinstance(exc, RuntimeError) and any(word in str(exc) for word in _OOM_WORDS)


def clean_allocator(device: Device = None) -> CudaMemoryStats:
    """Free what can be freed after an OOM and start fresh peaks: ``gc.collect()``, then on CUDA
    ``torch.cuda.empty_cache()`` and ``reset_peak_memory_stats``. Returns the allocator stats afterwards
    (``available=False`` on CPU, where only the garbage collection applies)."""
    gc.collect()
    if cuda_unavailable_reason(device) is None and torch.cuda.is_initialized():
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        reset_peaks(device)
    return cuda_memory_stats(device)


@dataclass
class OomCatch:
    """What :func:`catch_oom` caught: ``info`` is None when the block finished without running out of memory."""

    info: OomInfo | None = None

    @property
    def oom(self) -> bool:
        """True when the block ran out of memory."""
        return self.info is not None


@contextlib.contextmanager
def catch_oom(device: Device = None) -> Iterator[OomCatch]:
    """Run a block; if it runs out of memory, record the parsed message instead of raising, then clean up.

    ::

        with catch_oom() as caught:
            step(config)          # tensors created here must not be kept by names outside the block
        if caught.oom:
            rows.append(caught.info.to_dict())

    Other exceptions pass through untouched. On an OOM the traceback's frames are cleared (their local tensors
    released), then :func:`clean_allocator` runs. What the caller must do: hold no reference to big tensors made
    in the failed attempt (a name assigned inside the ``with`` block lives in the caller's frame and keeps its
    tensor alive: prefer :func:`run_catching_oom`, whose function frame dies with the attempt, or ``del`` such
    names), and not keep the exception itself (``sys.last_value`` in a notebook does, for uncaught ones).
    """
    caught = OomCatch()
    try:
        yield caught
    except Exception as exc:
        if not is_oom_error(exc):
            raise
        caught.info = parse_oom_message(str(exc))
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
    if caught.info is not None:  # outside the except block, so the exception and its frames are gone
        clean_allocator(device)


def run_catching_oom(
    fn: Callable[..., T], *args: Any, device: Device = None, **kwargs: Any
) -> tuple[T | None, OomInfo | None]:
    """Call ``fn(*args, **kwargs)``; return ``(result, None)``, or ``(None, OomInfo)`` if it ran out of memory.

    The allocator is cleaned after an OOM as in :func:`catch_oom`; tensors local to ``fn`` are released with
    its frame. Anything ``fn`` stored elsewhere (a global, an attribute, a list passed in) stays alive: that is
    the caller's to drop. Exceptions other than out-of-memory pass through.
    """
    info: OomInfo | None = None
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:
        if not is_oom_error(exc):
            raise
        info = parse_oom_message(str(exc))
        traceback.clear_frames(exc.__traceback__)
    clean_allocator(device)  # after the except block: the exception and fn's frame are gone
    return None, info
