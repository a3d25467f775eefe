"""Real CUDA out-of-memory messages, quoted from public reports, and what each field of one means for the fix.

:data:`RECORDED_OOM_MESSAGES` are verbatim messages (the same ones ``tests/measure/test_oom.py`` parses), each
with the report it came from and the torch versions that printed that shape. A chapter on a CPU shows these, so
that every decoded number on its page was printed by a real GPU. The decoder itself,
:func:`memlab.measure.oom.decode_oom`, lives with the parser; it is re-exported here for older imports.
Introduced for chapter 01 (anatomy of an OOM).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from memlab.measure.oom import decode_oom

__all__ = ["RECORDED_OOM_MESSAGES", "RecordedOom", "decode_oom"]


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
