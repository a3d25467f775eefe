"""The one timer: seconds per call of a function, CUDA events on a GPU and ``time.perf_counter`` on a CPU.

Used by the roofline microbenchmarks (:mod:`memlab.measure.roofline`), the runner's timed steps and decode
tokens (:mod:`memlab.run.runner`) and the checkpointing lab. On CUDA a kernel launch returns before the kernel
ends, so wall-clock time around a call measures the launch; CUDA events recorded on the stream around it time the
kernels, read after one synchronize [pytorch-cuda-semantics].
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from memlab.device import resolve_device
from memlab.errors import MemlabError
from memlab.measure.cuda import Device


def time_fn(fn: Callable[[], Any], *, device: Device = None, repeats: int = 5, warmup: int = 2,
            flush_bytes: int = 0) -> list[float]:
    """Seconds per call of ``fn`` for each of ``repeats`` timed calls, after ``warmup`` untimed ones.

    CUDA: CUDA events around each call (a ``flush_bytes`` buffer is zeroed before each, outside the timed
    region), one synchronize at the end. CPU: ``time.perf_counter`` around each call.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise MemlabError(f"repeats must be an integer >= 1, got {repeats!r}.")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise MemlabError(f"warmup must be an integer >= 0, got {warmup!r}.")
    dev = resolve_device(device)
    if dev.type != "cuda":
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return times
    with torch.cuda.device(dev):
        flush = torch.empty(flush_bytes, dtype=torch.uint8, device=dev) if flush_bytes > 0 else None
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(dev)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for start, end in zip(starts, ends, strict=True):
            if flush is not None:
                flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(dev)
        return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends, strict=True)]
