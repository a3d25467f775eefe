"""The CUDA caching allocator's documented rules, as a small pure model a CPU can run and draw.

A CPU run has no caching allocator, so chapter 01 cannot *measure* fragmentation here. What it can do is apply the
rules PyTorch's allocator follows (c10/cuda/CUDACachingAllocator.cpp, ``[pytorch-caching-allocator]``; the CUDA
semantics notes, ``[pytorch-cuda-memory]``) to a sequence of requests and frees, and show the segments that result:

- every request is rounded up to a multiple of 512 B (``kMinBlockSize``), so a 4-byte scalar holds 512 B;
- requests of at most 1 MiB (``kSmallSize``) come from the *small pool*, whose segments are 2 MiB
  (``kSmallBuffer``); larger ones from the *large pool*: under 10 MiB (``kMinLargeAlloc``) a new segment is 20 MiB
  (``kLargeBuffer``), from 10 MiB on it is the request rounded up to 2 MiB (``kRoundLarge``);
- a request takes the smallest free cached block of its pool that fits (best fit); a larger block is *split*
  when the rest is at least 512 B (small pool) or more than 1 MiB (large pool), and never when the block is at
  least ``max_split_size_mb`` (an "oversize" block, which also never serves a request under that size, nor one
  more than 20 MiB smaller than itself);
- a freed block stays cached in its segment and merges with free neighbours; a segment goes back to the driver
  only when wholly free, and only by ``empty_cache`` or by the OOM path;
- when ``cudaMalloc`` fails, the allocator first releases every wholly free cached segment and retries; only then
  it raises the OOM. So ``empty_cache`` cannot prevent an OOM in the same process.

Not modelled by this small picture (named, not guessed): one pool per CUDA stream (``record_stream`` keeps a block
until the other stream is done), ``expandable_segments`` (segments that grow by mapping 2 MiB pages, so freed pages
inside them can be unmapped), ``roundup_power2_divisions`` and ``garbage_collection_threshold``, CUDA graphs' private
pools. The full model of the allocator, which has them, is :mod:`memlab.predict.gpu` (``Trace.replay()``);
:func:`settings_table` and :func:`demo_on_model` put the two side by side for chapters 01 and 08.

Introduced for chapter 01 (anatomy of an OOM).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memlab.errors import SetupError

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from memlab.predict.gpu.replay import Replay
    from memlab.tracing.tracer import Trace

KIB, MIB = 2**10, 2**20
MIN_BLOCK_BYTES = 512
"""kMinBlockSize: every size is rounded up to a multiple of 512 B [pytorch-caching-allocator]."""
SMALL_SIZE_BYTES = 1 * MIB
"""kSmallSize: requests of at most 1 MiB use the small pool."""
SMALL_BUFFER_BYTES = 2 * MIB
"""kSmallBuffer: the small pool's segment size."""
MIN_LARGE_ALLOC_BYTES = 10 * MIB
"""kMinLargeAlloc: large-pool requests under 10 MiB get a kLargeBuffer segment."""
LARGE_BUFFER_BYTES = 20 * MIB
"""kLargeBuffer: the segment size for 1-10 MiB requests."""
ROUND_LARGE_BYTES = 2 * MIB
"""kRoundLarge: requests of 10 MiB and more get a segment of their size rounded up to 2 MiB."""


def rounded_size(nbytes: int) -> int:
    """Bytes the allocator hands out for a request of ``nbytes``: a multiple of 512 B, at least 512 B."""
    _check_bytes("nbytes", nbytes, allow_zero=True)
    return max(MIN_BLOCK_BYTES, -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


def pool_of(nbytes: int) -> str:
    """``"small"`` for a rounded request of at most 1 MiB, else ``"large"``."""
    return "small" if rounded_size(nbytes) <= SMALL_SIZE_BYTES else "large"


def segment_size(nbytes: int) -> int:
    """Bytes a new segment takes from the driver (``cudaMalloc``) for a request of ``nbytes``."""
    size = rounded_size(nbytes)
    if size <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if size < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def _check_bytes(name: str, value: Any, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise SetupError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer of bytes, "
                         f"got {value!r}")


@dataclass
class _Block:
    offset: int
    size: int
    tensor: str | None = None  # None: free (cached)


@dataclass
class _Segment:
    pool: str
    size: int
    blocks: list[_Block] = field(default_factory=list)

    @property
    def allocated(self) -> int:
        return sum(b.size for b in self.blocks if b.tensor is not None)


@dataclass(frozen=True)
class AllocatorResult:
    """What :func:`replay` ends with: the segments, the totals, and the OOM (if one was raised). Bytes throughout.

    ``segments``: one dict per segment (``pool``, ``size_bytes``, ``blocks``: ``(offset, size, tensor or None)``).
    ``oom``: None, or a dict with the request, the rounded size, the free-and-retry outcome and the totals at the
    failure (``reserved_unallocated_bytes``, ``largest_free_block_bytes``, ``driver_free_bytes``).
    ``released_on_retry_bytes``: cached segments the OOM path gave back to the driver before raising.
    """

    capacity_bytes: int
    segments: tuple[dict[str, Any], ...]
    allocated_bytes: int
    reserved_bytes: int
    requested_bytes: int
    oom: dict[str, Any] | None
    released_on_retry_bytes: int
    timeline: tuple[tuple[int, int], ...] = ()
    """``(allocated_bytes, reserved_bytes)`` after each event, in order."""

    @property
    def reserved_unallocated_bytes(self) -> int:
        """Reserved minus allocated: cached blocks no tensor uses (what an OOM message calls "reserved but
        unallocated")."""
        return self.reserved_bytes - self.allocated_bytes


class _Allocator:
    def __init__(self, capacity_bytes: int, max_split_bytes: int | None) -> None:
        self.capacity = capacity_bytes
        self.max_split = max_split_bytes if max_split_bytes is not None else 2**62
        self.segments: list[_Segment] = []
        self.where: dict[str, tuple[_Segment, _Block]] = {}
        self.requested = 0
        self.released_on_retry = 0

    @property
    def reserved(self) -> int:
        return sum(s.size for s in self.segments)

    def _fits(self, block: _Block, size: int) -> bool:
        if block.tensor is not None or block.size < size:
            return False
        if size < self.max_split <= block.size:
            return False  # an oversize block never serves a small request
        return not (size >= self.max_split and block.size >= size + LARGE_BUFFER_BYTES)

    def _best_fit(self, pool: str, size: int) -> tuple[_Segment, _Block] | None:
        found = [(b.size, i, s, b) for i, s in enumerate(self.segments) if s.pool == pool
                 for b in s.blocks if self._fits(b, size)]
        return None if not found else min(found, key=lambda t: (t[0], t[1]))[2:]

    def _split(self, seg: _Segment, block: _Block, size: int) -> None:
        rest = block.size - size
        keep = rest >= MIN_BLOCK_BYTES if seg.pool == "small" else (size < self.max_split and rest > SMALL_SIZE_BYTES)
        if keep:
            block.size = size
            seg.blocks.insert(seg.blocks.index(block) + 1, _Block(block.offset + size, rest))

    def _release_free_segments(self) -> int:
        gone = [s for s in self.segments if s.allocated == 0]
        self.segments = [s for s in self.segments if s.allocated != 0]
        return sum(s.size for s in gone)

    def malloc(self, name: str, nbytes: int) -> dict[str, Any] | None:
        size, pool = rounded_size(nbytes), pool_of(nbytes)
        found = self._best_fit(pool, size)
        released = 0
        if found is None:
            new = segment_size(nbytes)
            if self.reserved + new > self.capacity:  # cudaMalloc fails: free every wholly free segment, retry
                released = self._release_free_segments()
                self.released_on_retry += released
            if self.reserved + new > self.capacity:
                free_blocks = [b.size for s in self.segments for b in s.blocks if b.tensor is None]
                return {"tensor": name, "tried_to_allocate_bytes": nbytes, "rounded_bytes": size, "pool": pool,
                        "segment_bytes": new, "released_on_retry_bytes": released,
                        "allocated_bytes": sum(s.allocated for s in self.segments),
                        "reserved_bytes": self.reserved,
                        "reserved_unallocated_bytes": self.reserved - sum(s.allocated for s in self.segments),
                        "largest_free_block_bytes": max(free_blocks, default=0),
                        "driver_free_bytes": self.capacity - self.reserved}
            seg = _Segment(pool, new, [_Block(0, new)])
            self.segments.append(seg)
            found = (seg, seg.blocks[0])
        seg, block = found
        self._split(seg, block, size)
        block.tensor = name
        self.where[name] = (seg, block)
        self.requested += nbytes
        return None

    def free(self, name: str) -> None:
        if name not in self.where:
            raise SetupError(f"free of {name!r}, which is not allocated (allocate it first, free it once)")
        seg, block = self.where.pop(name)
        block.tensor = None
        merged: list[_Block] = []
        for b in seg.blocks:  # merge with free neighbours inside the segment
            if merged and merged[-1].tensor is None and b.tensor is None:
                merged[-1].size += b.size
            else:
                merged.append(b)
        seg.blocks = merged


def replay(events: Iterable[tuple[str, str] | tuple[str, str, int]], capacity_bytes: int, *,
           max_split_size_mb: int | None = None, stop_at_oom: bool = True) -> AllocatorResult:
    """Apply the allocator's rules to ``events``: ``("alloc", name, nbytes)`` or ``("free", name)``.

    ``capacity_bytes`` is what the driver can give this process (segments are taken from it whole).
    ``max_split_size_mb`` as in ``PYTORCH_CUDA_ALLOC_CONF``. The first request that fails after the free-and-retry
    path ends the replay (``stop_at_oom``) or is recorded and skipped.
    """
    _check_bytes("capacity_bytes", capacity_bytes)
    if max_split_size_mb is not None:
        _check_bytes("max_split_size_mb", max_split_size_mb)
        if max_split_size_mb * MIB <= SMALL_SIZE_BYTES:
            raise SetupError(f"max_split_size_mb must be above 1 (the small pool's limit), got {max_split_size_mb}")
    alloc = _Allocator(capacity_bytes, None if max_split_size_mb is None else max_split_size_mb * MIB)
    oom = None
    timeline: list[tuple[int, int]] = []
    for event in events:
        kind, name, *rest = event
        if kind == "alloc" and len(rest) == 1:
            _check_bytes(f"the size of {name!r}", rest[0])
            if name in alloc.where:
                raise SetupError(f"{name!r} is allocated twice: free it first or use another name")
            failed = alloc.malloc(name, rest[0])
            if failed is not None:
                oom = oom or failed
                if stop_at_oom:
                    break
        elif kind == "free" and not rest:
            alloc.free(name)
        else:
            raise SetupError(f"an event is ('alloc', name, nbytes) or ('free', name), got {event!r}")
        timeline.append((sum(s.allocated for s in alloc.segments), alloc.reserved))
    segments = tuple({"pool": s.pool, "size_bytes": s.size,
                      "blocks": tuple((b.offset, b.size, b.tensor) for b in s.blocks)} for s in alloc.segments)
    return AllocatorResult(capacity_bytes, segments, sum(s.allocated for s in alloc.segments), alloc.reserved,
                           alloc.requested, oom, alloc.released_on_retry, tuple(timeline))


def interleaved_frees(n: int, block_bytes: int, request_bytes: int) -> list[tuple[str, str] | tuple[str, str, int]]:
    """The classic fragmentation pattern: ``n`` equal tensors, every other one freed, then one larger request."""
    _check_bytes("block_bytes", block_bytes)
    _check_bytes("request_bytes", request_bytes)
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise SetupError(f"n must be an integer of at least 2, got {n!r}")
    events: list[tuple[str, str] | tuple[str, str, int]] = [("alloc", f"t{i}", block_bytes) for i in range(n)]
    events += [("free", f"t{i}") for i in range(0, n, 2)]
    return [*events, ("alloc", "big", request_bytes)]


def draw_segments(result: AllocatorResult, *, title: str, source: str = "") -> Any:
    """One horizontal bar per segment (MiB), live blocks filled, cached free blocks hatched; a matplotlib Figure."""
    import matplotlib.pyplot as plt

    n = max(len(result.segments), 1)
    fig, ax = plt.subplots(figsize=(8, 0.45 * n + 1.6), layout="constrained")
    for row, seg in enumerate(result.segments):
        for offset, size, tensor in seg["blocks"]:
            live = tensor is not None
            ax.barh(row, size / MIB, left=offset / MIB, color="tab:blue" if live else "white",
                    edgecolor="black", hatch=None if live else "//", linewidth=0.6)
            if size / MIB >= 1.5:
                ax.text((offset + size / 2) / MIB, row, tensor or "free", ha="center", va="center", fontsize=7,
                        color="white" if live else "black")
    ax.set_yticks(range(len(result.segments)),
                  [f"segment {i} ({s['pool']}, {s['size_bytes'] / MIB:.0f} MiB)" for i, s in
                   enumerate(result.segments)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("offset in the segment (MiB); blue: a live tensor's block, hatched: cached, free")
    ax.set_title(title + (f"\n{source}" if source else ""), fontsize=9)
    return fig


def record_allocations(run: Any) -> list[tuple[str, str] | tuple[str, str, int]]:
    """The storages ``run()`` creates and frees, in order, as :func:`replay` events (each storage once; views share
    it; empty storages are skipped, as the allocator serves them without memory).

    A ``TorchDispatchMode`` sees every op's outputs; a weak reference on each new storage records its free. Works
    on any device, so a CPU run gives the request sequence a CUDA step would send its allocator (sizes as the CPU
    kernels allocate them; CUDA kernels' workspaces are not in it).
    """
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    events: list[tuple[str, str] | tuple[str, str, int]] = []
    live: dict[int, tuple[str, Any]] = {}

    def freed(key: int, name: str, ref: Any) -> None:
        entry = live.get(key)
        if entry is not None and entry[1] is ref:
            live.pop(key)
            events.append(("free", name))

    class _Log(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    _add(t)
            return out

    def _add(t: torch.Tensor) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key, n = id(st), st.nbytes()
        if key in live or n == 0:
            return
        name = f"s{len(events)}"
        ref = weakref.ref(st, lambda r, key=key, name=name: freed(key, name, r))
        live[key] = (name, ref)
        events.append(("alloc", name, n))

    with _Log():
        run()
    return events


# -- the full allocator model on a chapter's own step (chapters 01 and 08) ------------------------------------------
MODEL_LABEL = "a model of CUDACachingAllocator (torch 2.13 rules) replayed on the traced step, not a GPU measurement"
"""How every number of :func:`settings_table` and :func:`demo_on_model` is labelled: the allocator's rules
(:mod:`memlab.predict.gpu.allocator`, read from ``c10/cuda/CUDACachingAllocator.cpp`` of torch 2.13) applied to the
sizes and lifetimes the fake-tensor trace saw."""
SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:20")
"""The ``PYTORCH_CUDA_ALLOC_CONF`` values chapter 01 compares: torch's defaults (""), expandable segments, and the
smallest ``max_split_size_mb`` torch 2.13 accepts: ``large_segment_size_mb``, 20 by default (the parser refuses less
with "max_split_size_mb too small, must be >= ", :mod:`memlab.predict.gpu.alloc_conf`)."""


def setting_name(conf: str) -> str:
    """A reader's name for a ``PYTORCH_CUDA_ALLOC_CONF`` value ("" is torch's defaults)."""
    return conf or "torch's defaults"


def phase_table(result: Replay) -> pd.DataFrame:
    """One row per phase of a :class:`~memlab.predict.gpu.replay.Replay` (bytes): the peaks of the bytes requested
    (the live tensors), allocated (their 512 B-rounded blocks) and reserved (segments), each from the phase's start;
    reserved minus requested when the requested bytes peak (rounding, cached free blocks, unsplit tails), and the
    largest cached free block then."""
    import pandas as pd

    return pd.DataFrame([{"phase": p.label, "requested_bytes": p.requested_bytes, "allocated_bytes": p.active_bytes,
                          "reserved_bytes": p.reserved_bytes, "unused_at_peak_bytes": p.fragmentation_bytes,
                          "largest_free_bytes": p.largest_free_bytes} for p in result.phases])


def settings_table(trace: Trace, settings: tuple[str, ...] = SETTINGS) -> pd.DataFrame:
    """The whole step replayed once per ``PYTORCH_CUDA_ALLOC_CONF`` value (parsed by
    :func:`memlab.predict.gpu.alloc_conf.parse_alloc_conf`; "" is torch's defaults), one row each, bytes: the peaks
    requested, allocated and reserved, the unused reserve and largest free block when the requested bytes peak, and
    the segments taken from the driver (cudaMalloc calls, or page mappings with expandable segments).
    A bad setting raises the parser's one-line :class:`~memlab.errors.MemlabError`."""
    import pandas as pd

    rows = []
    for conf in settings:
        r = trace.replay(conf)
        rows.append({"setting": setting_name(conf), "requested_bytes": r.total.requested_bytes,
                     "allocated_bytes": r.total.active_bytes, "reserved_bytes": r.total.reserved_bytes,
                     "unused_at_peak_bytes": r.total.fragmentation_bytes,
                     "largest_free_bytes": r.total.largest_free_bytes, "segments": r.segments_allocated})
    return pd.DataFrame(rows)


def as_model_events(events: Iterable[tuple[str, str] | tuple[str, str, int]]) -> list[tuple[int, ...]]:
    """This module's ``("alloc", name, nbytes)`` / ``("free", name)`` events as the full model's ``(key, nbytes)`` /
    ``(key,)`` (:data:`memlab.predict.gpu.allocator.Event`), one integer key per name."""
    keys: dict[str, int] = {}
    out: list[tuple[int, ...]] = []
    for event in events:
        kind, name, *rest = event
        if kind == "alloc" and len(rest) == 1:
            keys[name] = len(keys)
            out.append((keys[name], rest[0]))
        elif kind == "free" and not rest and name in keys:
            out.append((keys[name],))
        else:
            raise SetupError(f"an event is ('alloc', name, nbytes) or ('free', name) of an allocated name, "
                             f"got {event!r}")
    return out


def demo_on_model(events: list[tuple[str, str] | tuple[str, str, int]], capacity_bytes: int,
                  settings: tuple[str, ...] = SETTINGS) -> pd.DataFrame:
    """``events`` (this module's form) on a device of ``capacity_bytes``, through this module's small rules
    (:func:`replay`, no settings) and through the full model once per setting: whether every request was served,
    and the peak reserved bytes. The full model stops at its first failed request; so does :func:`replay`."""
    import pandas as pd

    from memlab.predict.gpu.alloc_conf import parse_alloc_conf
    from memlab.predict.gpu.replay import replay as model_replay

    small = replay(events, capacity_bytes)
    rows = [{"rules": "chapter's small picture (this section)", "setting": setting_name(""),
             "served": small.oom is None, "reserved_bytes": max(r for _, r in small.timeline)}]
    log = as_model_events(events)
    for conf in settings:
        r = model_replay(log, parse_alloc_conf(conf), capacity_bytes=capacity_bytes)
        rows.append({"rules": "full model (torch 2.13)", "setting": setting_name(conf), "served": r.fits,
                     "reserved_bytes": r.total.reserved_bytes})
    return pd.DataFrame(rows)


def nvidia_smi_view(result: Replay, context_bytes: int, context_source: str, *, workspace_bytes: int = 0,
                    workspace_source: str = "") -> pd.DataFrame:
    """What nvidia-smi would show for a replayed step, built up from the tensors, one row per layer (bytes): the
    requested peak (the live tensors), the rounding of their blocks (allocated peak minus requested peak), the
    cached free blocks the segments add (reserved peak minus allocated peak), the cuBLAS/cuBLASLt workspaces
    (``workspace_bytes``, cited by ``workspace_source``: they come from the allocator, but no fake-tensor trace sees
    them; :func:`memlab.predict.gpu.device.workspace_bytes`) and the CUDA context outside the allocator
    (``context_bytes``, cited by ``context_source``). The rows add up to reserved + workspaces + context, what
    nvidia-smi counts for the process [pytorch-cuda-memory]."""
    import pandas as pd

    _check_bytes("context_bytes", context_bytes, allow_zero=True)
    _check_bytes("workspace_bytes", workspace_bytes, allow_zero=True)
    t = result.total
    model = "allocator model (torch 2.13 rules), not measured"
    rows = [("the tensors (requested peak)", t.requested_bytes, "fake-tensor trace"),
            ("+ rounding to 512 B blocks", t.active_bytes - t.requested_bytes, model),
            ("+ cached free blocks in the segments", t.reserved_bytes - t.active_bytes, model),
            *([("+ cuBLAS workspaces", workspace_bytes, workspace_source)] if workspace_bytes else []),
            ("+ CUDA context and kernels", context_bytes, context_source)]
    return pd.DataFrame([{"layer": name, "bytes": b, "source": src} for name, b, src in rows])
