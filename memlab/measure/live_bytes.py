"""Live tensor bytes through a step, with the peak inside each phase: the CPU's twin of ``max_memory_allocated``.

A CPU has no allocator statistics torch exposes, so the peak *inside* a phase (the optimizer step's transient,
the top of backward where the logits' gradient exists) cannot be read at its boundaries. :class:`LiveBytes` is a
``TorchDispatchMode`` that registers the storage of every tensor an op returns, drops it when the storage is
freed (a ``weakref.finalize``), and keeps the running total and its peak per phase::

    lb = LiveBytes()
    lb.track(*model.parameters())              # what existed before
    with lb:
        with lb.phase("forward"):
            loss = model(idx, tgt)
        with lb.phase("backward"):
            loss.backward()
    lb.phases  # ({"phase": "forward", "start_bytes", "peak_bytes", "end_bytes"}, ...)

Bytes are storage bytes (``untyped_storage().nbytes()``), each storage counted once, the same count
:mod:`memlab.measure.accounting` uses. It works on real tensors and on fake ones (FakeTensorMode): the counts are
independent of :class:`torch.distributed._tools.mem_tracker.MemTracker`, which ``memlab.run.trace`` uses, so the
two check each other. On CUDA prefer ``torch.cuda.max_memory_allocated`` (the allocator's own count, with its 512 B
rounding): this mode sees tensors, not blocks.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Running total of live storage bytes seen by the dispatcher, with per-phase peaks (see module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._sizes: dict[int, int] = {}
        self.current = 0
        self.peak = 0
        self._phase_peak = 0
        self.phases: list[dict[str, Any]] = []

    # -- storage bookkeeping --------------------------------------------------------------------------------------
    def _add(self, t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
            return
        key = id(st)
        size = st.nbytes()
        if key in self._sizes:
            if self._sizes[key] != size:  # resized in place
                self.current += size - self._sizes[key]
                self._sizes[key] = size
            return
        self._sizes[key] = size
        self.current += size
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self._sizes.pop(key, 0)

    def _bump(self) -> None:
        if self.current > self.peak:
            self.peak = self.current
        if self.current > self._phase_peak:
            self._phase_peak = self.current

    def track(self, *tensors: Any) -> None:
        """Count tensors that existed before the mode was entered (parameters, inputs, optimizer state)."""
        for t in tree_flatten(list(tensors))[0]:
            if isinstance(t, torch.Tensor):
                self._add(t)
        self._bump()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t)
        self._bump()
        return out

    @contextlib.contextmanager
    def phase(self, name: str, **labels: Any) -> Iterator[None]:
        """Record ``start_bytes``, ``peak_bytes`` (the most live at once inside) and ``end_bytes`` of a phase."""
        start = self.current
        self._phase_peak = start
        yield
        self._bump()
        self.phases.append({**labels, "phase": name, "start_bytes": start, "peak_bytes": self._phase_peak,
                            "end_bytes": self.current})


class PhasePeaks:
    """Peak bytes inside each phase on any device: :class:`LiveBytes` on a CPU (or a fake tensor), the caching
    allocator's ``max_memory_allocated`` on CUDA (reset at each phase start). Use as a context around the steps::

        meter = PhasePeaks(device, track=[*model.parameters(), idx, tgt])
        with meter:
            with meter.phase("first", "forward"):
                ...
        meter.rows  # [{"step", "phase", "peak_bytes", "end_bytes", "source"}, ...]
    """

    def __init__(self, device: torch.device, track: Any = ()) -> None:
        self.device = torch.device(device)
        self.rows: list[dict[str, Any]] = []
        self._live = LiveBytes() if self.device.type != "cuda" else None
        self._track = list(tree_flatten(list(track))[0])

    @property
    def source(self) -> str:
        """Where the numbers come from."""
        return "live tensor bytes (memlab.measure.live_bytes)" if self._live is not None else \
            "torch.cuda.max_memory_allocated, reset per phase"

    def __enter__(self) -> PhasePeaks:
        if self._live is not None:
            self._live.track(*self._track)
            self._track = []
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def track(self, *tensors: Any) -> None:
        """Count tensors made outside the meter (optimizer state made in between steps)."""
        if self._live is not None:
            self._live.track(*tensors)

    @contextlib.contextmanager
    def phase(self, step: str, name: str) -> Iterator[None]:
        """Measure one phase of one step (``first`` or ``steady``)."""
        if self._live is not None:
            with self._live.phase(name, step=step):
                yield
            row = self._live.phases[-1]
            self.rows.append({"step": step, "phase": name, "peak_bytes": row["peak_bytes"],
                              "end_bytes": row["end_bytes"], "source": self.source})
            return
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        torch.cuda.synchronize(self.device)
        self.rows.append({"step": step, "phase": name, "peak_bytes": torch.cuda.max_memory_allocated(self.device),
                          "end_bytes": torch.cuda.memory_allocated(self.device), "source": self.source})
