"""Replaying a step's allocation log through the allocator model: peaks reserved, active and requested, per phase.

:func:`replay` runs an :class:`~memlab.predict.gpu.allocator.AllocationLog` (or a list of events) through
:class:`~memlab.predict.gpu.allocator.CachingAllocatorModel` and returns a :class:`Replay`: the whole log's peaks
and each phase's, counted from the phase's start as after ``torch.cuda.reset_peak_memory_stats()``, and where it
ran out of memory if it did. A model of the allocator's rules, not a GPU measurement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from memlab.errors import MemlabError
from memlab.predict.gpu.alloc_conf import AllocatorConfig
from memlab.predict.gpu.allocator import AllocationLog, Block, CachingAllocatorModel, Event


@dataclass(frozen=True)
class ReplayPeaks:
    """Peaks over a span of events (the whole log or one phase), bytes; each from the span's start."""

    label: str
    reserved_bytes: int
    """Peak reserved: segments cudaMalloc'd (or pages mapped) and not yet released."""
    active_bytes: int
    """Peak active: rounded blocks in use (torch's ``active_bytes``, and ``allocated_bytes`` on one stream)."""
    requested_bytes: int
    """Peak requested: the bytes asked for (torch's ``requested_bytes``; the trace's live bytes)."""
    reserved_at_peak_bytes: int
    """Reserved when the requested bytes peak."""
    fragmentation_bytes: int
    """Reserved minus requested when the requested bytes peak: rounding, cached free blocks, unsplit tails."""
    largest_free_bytes: int
    """The largest cached free block when the requested bytes peak."""
    end_reserved_bytes: int
    """Reserved at the span's end."""


@dataclass(frozen=True)
class Replay:
    """One replay of an :class:`AllocationLog` (module docstring): the whole log's peaks and each phase's."""

    config: AllocatorConfig
    capacity_bytes: int | None
    total: ReplayPeaks
    phases: tuple[ReplayPeaks, ...]
    segments_allocated: int
    """cudaMalloc calls (page mappings with expandable segments)."""
    alloc_retries: int
    """Times every cached block was released to retry (``num_alloc_retries``)."""
    oom_event: int | None = None
    """The event whose allocation failed (the replay stops there); None when every allocation fit."""
    oom_request_bytes: int = 0
    segment_log: tuple[tuple[str, int], ...] = field(default=(), repr=False)
    """``segment_alloc`` / ``segment_free`` / ``segment_map`` / ``segment_unmap`` with their bytes, in order."""

    @property
    def fits(self) -> bool:
        """Every allocation succeeded within the capacity."""
        return self.oom_event is None

    def phase(self, label: str) -> ReplayPeaks:
        """The peaks of one phase, by its label (``"steady backward"``)."""
        for p in self.phases:
            if p.label == label:
                return p
        raise MemlabError(f"no phase {label!r} in this replay; phases: {', '.join(p.label for p in self.phases)}")

    def to_frame(self) -> Any:
        """pandas DataFrame: one row per phase and one for the whole log."""
        import pandas as pd

        return pd.DataFrame([asdict(p) for p in (*self.phases, self.total)])


class _Span:
    """Running peaks over a span of events (:class:`ReplayPeaks` as it is built)."""

    def __init__(self, label: str, m: CachingAllocatorModel) -> None:
        self.label = label
        self.reserved, self.active, self.requested = m.reserved, m.active, m.requested
        self.at_peak = (m.reserved, m.largest_free())

    def update(self, m: CachingAllocatorModel) -> None:
        self.reserved = max(self.reserved, m.reserved)
        self.active = max(self.active, m.active)
        if m.requested > self.requested:
            self.requested, self.at_peak = m.requested, (m.reserved, m.largest_free())

    def peaks(self, m: CachingAllocatorModel) -> ReplayPeaks:
        return ReplayPeaks(self.label, self.reserved, self.active, self.requested, self.at_peak[0],
                           self.at_peak[0] - self.requested, self.at_peak[1], m.reserved)


def _event(i: int, ev: Any) -> tuple[int, int | None]:
    if not isinstance(ev, tuple) or len(ev) not in (1, 2) or not all(isinstance(v, int) for v in ev):
        raise MemlabError(f"event {i} is {ev!r}: give (key, nbytes) for an allocation and (key,) for its free")
    if len(ev) == 2 and ev[1] < 0:
        raise MemlabError(f"event {i} allocates {ev[1]} bytes: sizes are >= 0")
    return ev[0], (ev[1] if len(ev) == 2 else None)


def _phase_starts(phases: Sequence[tuple[str, str, int, int]], n: int) -> dict[int, list[int]]:
    """Phase indices by the event they start at; a span outside the log raises."""
    starts: dict[int, list[int]] = {}
    for j, (step, name, start, end) in enumerate(phases):
        if not 0 <= start <= end <= n:
            raise MemlabError(f"phase {step} {name} spans events {start}..{end} of a log of {n}")
        starts.setdefault(start, []).append(j)
    return starts


def _apply_event(m: CachingAllocatorModel, live: dict[int, Block | None], i: int, ev: Any) -> bool:
    """One event on ``m``; False when it is an allocation that does not fit (an OOM)."""
    key, nbytes = _event(i, ev)
    if nbytes is None:
        if key not in live:
            raise MemlabError(f"event {i} frees key {key}, which is not allocated")
        b = live.pop(key)
        if b is not None:
            m.free(b)
        return True
    if key in live:
        raise MemlabError(f"event {i} allocates key {key} again while it is live")
    b = m.malloc(nbytes) if nbytes > 0 else None
    if b is None and nbytes > 0:
        return False
    live[key] = b
    return True


def replay(log: AllocationLog | Iterable[Event], config: AllocatorConfig | None = None, *,
           capacity_bytes: int | None = None) -> Replay:
    """Replay ``log`` (an :class:`AllocationLog` or a list of :data:`Event` tuples) through
    :class:`CachingAllocatorModel` with ``config`` (torch's defaults) on a device of ``capacity_bytes`` (None:
    unlimited). Zero-byte allocations take no block (the allocator returns a null pointer for them). A free of a
    key that is not live, or a second allocation under a live key, raises :class:`~memlab.errors.MemlabError`."""
    if not isinstance(log, AllocationLog):
        log = AllocationLog(tuple(log))
    m, n = CachingAllocatorModel(config, capacity_bytes), len(log.events)
    starts, total = _phase_starts(log.phases, n), _Span("all", m)
    open_: dict[int, _Span] = {}
    peaks: list[ReplayPeaks | None] = [None] * len(log.phases)
    live: dict[int, Block | None] = {}
    oom = None
    for i, ev in enumerate(log.events):
        for j in starts.get(i, ()):
            open_[j] = _Span(f"{log.phases[j][0]} {log.phases[j][1]}".strip(), m)
        for j in [j for j in open_ if log.phases[j][3] == i]:
            peaks[j] = open_.pop(j).peaks(m)
        if not _apply_event(m, live, i, ev):
            oom = i
            break
        if len(ev) == 2:
            total.update(m)
            for s in open_.values():
                s.update(m)
    for j in range(len(log.phases)):
        if peaks[j] is None:
            span = open_.get(j) or _Span(f"{log.phases[j][0]} {log.phases[j][1]}".strip(), m)
            peaks[j] = span.peaks(m)
    return Replay(m.config, capacity_bytes, total.peaks(m), tuple(p for p in peaks if p is not None),
                  m.num_device_alloc, m.num_alloc_retries, oom,
                  0 if oom is None else int(log.events[oom][1]), tuple(m.segment_log))
