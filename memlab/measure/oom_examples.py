"""Real CUDA out-of-memory messages, quoted from public reports, and what each field of one means for the fix.

:data:`RECORDED_OOM_MESSAGES` are verbatim messages (the same ones ``tests/measure/test_oom.py`` parses), each
with the report it came from and the torch versions that printed that shape. A chapter on a CPU shows these, so
that every decoded number on its page was printed by a real GPU. :func:`decode_oom` turns a parsed
:class:`~memlab.measure.oom.OomInfo` into one row per field with its meaning and the fix it points to.
Introduced for chapter 01 (anatomy of an OOM).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from memlab.measure.oom import OomInfo


@dataclass(frozen=True)
class RecordedOom:
    """One OOM message as a GPU printed it: the text, where it was reported, and the torch versions of its shape."""

    key: str
    message: str
    source: str
    torch: str

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields."""
        return asdict(self)


RECORDED_OOM_MESSAGES: tuple[RecordedOom, ...] = (
    RecordedOom(
        "sentences-2.2", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a "
        "total capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has "
        "23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        "pytorch/pytorch#16417, comment of 2024-03-13", "torch 2.2 and later (sentences, expandable_segments hint)"),
    RecordedOom(
        "fragmented-2.5", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total "
        "capacity of 31.47 GiB of which 12.73 GiB is free. Including non-PyTorch memory, this process has 18.73 GiB "
        "memory in use. Of the allocated memory 9.08 GiB is allocated by PyTorch, and 9.35 GiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        "murong-xu/CADS#4", "torch 2.5 and later (torch.OutOfMemoryError)"),
    RecordedOom(
        "container-2.1", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 496.00 MiB. GPU 0 has a "
        "total capacty of 14.75 GiB of which 235.06 MiB is free. Process 20398 has 14.52 GiB memory in use. Of the "
        "allocated memory 14.06 GiB is allocated by PyTorch, and 330.42 MiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
        "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
        "FoundationVision/GenerateU#10 (2024-05)", "torch 2.1 ('capacty'; PID not matched, as in a container)"),
    RecordedOom(
        "reserved-1.x", "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 15.90 GiB total "
        "capacity; 13.13 GiB already allocated; 415.88 MiB free; 14.80 GiB reserved in total by PyTorch)",
        "2KangHo/vdsr_pytorch#2 (2020)", "torch 1.4 - 2.0 (one parenthesis)"),
)
"""Verbatim messages, newest shape first (see :mod:`memlab.measure.oom` for every shape the parser reads)."""

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
