"""Live tensor bytes on any device, op by op and phase by phase: the CPU's twin of the CUDA allocator's counters.

A CPU has no allocator statistics torch exposes, so neither the peak *inside* a phase (the optimizer step's
transient, the top of backward where the logits' gradient exists) nor the bytes between phase boundaries can be
read there. :class:`LiveBytes` is a ``TorchDispatchMode``: every op that runs inside it (forward, backward,
optimizer step) reports its outputs, and each new storage is held by a weak reference whose callback subtracts
its bytes the moment the storage is freed. So ``live_bytes`` is exactly the bytes of storages created inside the
block and still alive (plus what :meth:`LiveBytes.track` added, e.g. the parameters) and ``peak_bytes`` its
maximum. Two views of the same count::

    with LiveBytes() as live:
        live.track(model.parameters(), label="params")   # what existed before
        with live.phase("forward"):                      # start/peak/end bytes of the phase
            loss = model(idx, tgt)
        live.mark("backward")                            # or only a label for what runs from now on
        loss.backward()
    live.phases    # [PhaseRow(step="", phase="forward", peak_bytes=..., end_bytes=..., start_bytes=...), ...]
    live.frame()   # one row per op: op, label, live_bytes, "from <label>" bytes still live

The frame stacks the live bytes by the label under which they were allocated, drawn by
:func:`memlab.compare.plots.live_stacked` after :func:`stacked_by_label`. :class:`PhasePeaks` gives the peak of each
phase on any device (this counter on a CPU, ``max_memory_allocated`` on CUDA).

Bytes are storage bytes (``untyped_storage().nbytes()``), each storage counted once (views share it), the same
count :mod:`memlab.measure.accounting` uses. It works on real tensors and on fake ones (FakeTensorMode): the
counts are independent of :class:`torch.distributed._tools.mem_tracker.MemTracker`, which ``memlab.tracing.tracer``
uses, so the two check each other. What it does not see: the caching allocator (reserved but unallocated bytes,
fragmentation, its 512 B rounding), workspaces that kernels allocate internally, and memory outside torch; on CUDA
prefer ``torch.cuda.max_memory_allocated``. A reference cycle that holds a tensor keeps it live until ``gc`` runs,
exactly as it holds real memory.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from memlab.errors import MemlabError
from memlab.predict.memory.phases import PhaseRow

if TYPE_CHECKING:
    import pandas as pd


class LiveBytes(TorchDispatchMode):
    """Count the bytes of live storages seen by the dispatcher, with per-phase peaks (see the module docstring).

    ``sample_every`` keeps one row of :meth:`frame` per that many ops (1: every op; ``None``: no samples, only the
    counts and :attr:`phases`); the peaks are exact either way.
    """

    def __init__(self, *, sample_every: int | None = 1) -> None:
        super().__init__()
        if sample_every is not None and (isinstance(sample_every, bool) or not isinstance(sample_every, int)
                                         or sample_every < 1):
            raise MemlabError(f"sample_every must be a positive integer or None (no samples), got {sample_every!r}.")
        self.sample_every = sample_every
        self.label = "start"
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_label = "start"
        self.phases: list[PhaseRow] = []
        self.samples: list[dict[str, Any]] = []
        self._live: dict[int, tuple[int, str, weakref.ref]] = {}
        self._by_label: dict[str, int] = {}
        self._phase_peak = 0
        self._ops = 0

    # -- storage bookkeeping --------------------------------------------------------------------------------------
    def _add(self, t: torch.Tensor, label: str) -> None:
        if t.device.type == "meta":
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
            return
        key, n = id(st), st.nbytes()
        entry = self._live.get(key)
        if entry is not None:
            if entry[0] != n:  # resized in place: the change belongs to the label it was allocated under
                self._live[key] = (n, entry[1], entry[2])
                self._count(entry[1], n - entry[0])
            return
        ref = weakref.ref(st, lambda r, key=key: self._free(key, r))
        self._live[key] = (n, label, ref)
        self._count(label, n)

    def _count(self, label: str, n: int) -> None:
        self._by_label[label] = self._by_label.get(label, 0) + n
        self.live_bytes += n
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_label = self.live_bytes, self.label
        if self.live_bytes > self._phase_peak:
            self._phase_peak = self.live_bytes

    def _free(self, key: int, ref: weakref.ref) -> None:
        entry = self._live.get(key)
        if entry is None or entry[2] is not ref:
            return
        n, label, _ = self._live.pop(key)
        self.live_bytes -= n
        self._by_label[label] -= n

    def track(self, tensors: Iterable[Any], label: str = "existing") -> int:
        """Count tensors made before the block (parameters, a batch, optimizer state; nested lists and dicts are
        walked) under ``label``; returns the bytes added."""
        before = self.live_bytes
        for t in tree_flatten(list(tensors))[0]:
            if isinstance(t, torch.Tensor):
                self._add(t, label)
        self._sample()
        return self.live_bytes - before

    # -- labels and phases ----------------------------------------------------------------------------------------
    def mark(self, label: str) -> None:
        """Name what runs from now on (a phase, an iteration); new bytes are attributed to it."""
        self.label = str(label)
        self._sample()

    @contextlib.contextmanager
    def phase(self, name: str, *, label: str | None = None, step: str | int = "") -> Iterator[None]:
        """Mark ``label`` (default ``name``) and append a :class:`~memlab.predict.memory.phases.PhaseRow` of ``step``
        and ``name`` to :attr:`phases` when the block ends: start, peak (the most live at once inside) and end bytes."""
        start = self.live_bytes
        self.mark(name if label is None else label)
        self._phase_peak = start
        yield
        self.phases.append(PhaseRow(step, name, self._phase_peak, end_bytes=self.live_bytes, start_bytes=start))

    def by_label(self) -> dict[str, int]:
        """Live bytes now, by the label under which they were allocated."""
        return {k: v for k, v in self._by_label.items() if v}

    # -- samples --------------------------------------------------------------------------------------------------
    def _sample(self) -> None:
        if self.sample_every is not None:
            self.samples.append({"op": self._ops, "label": self.label, "live_bytes": self.live_bytes,
                                 **{f"from {k}": v for k, v in self._by_label.items()}})

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t, self.label)
        self._ops += 1
        if self.sample_every is not None and self._ops % self.sample_every == 0:
            self._sample()
        return out

    def frame(self) -> pd.DataFrame:
        """One row per sample: op index, label, live bytes, and ``from <label>`` bytes still live (0 if none)."""
        import pandas as pd

        return pd.DataFrame(self.samples).fillna(0)


def stacked_by_label(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``from <label>`` columns of :meth:`LiveBytes.frame` indexed by op, for a stacked area plot."""
    cols = [c for c in frame.columns if c.startswith("from ")]
    return frame.set_index("op")[cols].rename(columns=lambda c: c.removeprefix("from "))


class PhasePeaks:
    """Peak bytes inside each phase on any device: :class:`LiveBytes` on a CPU (or a fake tensor), the caching
    allocator's ``max_memory_allocated`` on CUDA (reset at each phase start). Use as a context around the steps::

        meter = PhasePeaks(device, track=[*model.parameters(), idx, tgt])
        with meter:
            with meter.phase("first", "forward"):
                ...
        meter.rows  # [PhaseRow(step, phase, peak_bytes, end_bytes=..., source=...), ...]
    """

    def __init__(self, device: torch.device, track: Any = ()) -> None:
        self.device = torch.device(device)
        self.rows: list[PhaseRow] = []
        self._live = LiveBytes(sample_every=None) if self.device.type != "cuda" else None
        self._track = list(tree_flatten(list(track))[0])

    @property
    def source(self) -> str:
        """Where the numbers come from."""
        return "live tensor bytes (memlab.measure.live_bytes)" if self._live is not None else \
            "torch.cuda.max_memory_allocated, reset per phase"

    def __enter__(self) -> PhasePeaks:
        if self._live is not None:
            self._live.track(self._track)
            self._track = []
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def track(self, tensors: Iterable[Any]) -> None:
        """Count tensors made outside the meter (optimizer state made in between steps)."""
        if self._live is not None:
            self._live.track(tensors)

    @contextlib.contextmanager
    def phase(self, step: str, name: str) -> Iterator[None]:
        """Measure one phase of one step (``first`` or ``steady``)."""
        if self._live is not None:
            with self._live.phase(name, step=step):
                yield
            row = self._live.phases[-1]
            self.rows.append(PhaseRow(step, name, row.peak_bytes, end_bytes=row.end_bytes, source=self.source))
            return
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        torch.cuda.synchronize(self.device)
        self.rows.append(PhaseRow(step, name, torch.cuda.max_memory_allocated(self.device),
                                  end_bytes=torch.cuda.memory_allocated(self.device), source=self.source))
