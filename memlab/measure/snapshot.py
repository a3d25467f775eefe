"""CUDA allocator snapshots read offline, and fragmentation reproduced with and without expandable segments.

- :func:`snapshot_timeline`: a snapshot written by :func:`memlab.measure.cuda.record_memory_history` (the pickle
  https://pytorch.org/memory_viz opens) as a DataFrame: one row per allocator event of the device trace, with the
  bytes allocated after it, stacked by a category read from the Python frames that made each allocation
  (forward, backward, optimizer, other; a heuristic on function and file names, stated as such).
- :func:`fragmentation_probe`: in a fresh Python process (``PYTORCH_CUDA_ALLOC_CONF`` is read once, when CUDA
  initialises), fill a capped card with equal blocks, free every other one, then ask for one tensor smaller than
  all the freed memory together but larger than any hole. With the default allocator the holes sit inside
  segments that still hold live blocks, so they cannot be released and the request fails with much memory
  "reserved but unallocated"; with ``expandable_segments:True`` the allocator can unmap the holes' pages and map
  them again at the end of its one growing segment. Returns what happened, as data.

- :func:`load_snapshot`: a snapshot file read with a restricted unpickler that builds only what a snapshot holds
  (dicts, lists, tuples, strings, numbers, booleans, None) and refuses anything else in one line, so reading a
  file (its own, a user's, a published one) never runs code; :func:`snapshot_timeline` reads files through it.
- :func:`snapshot_allocation_log` and :func:`segment_check`: a snapshot's device trace as the allocation log the
  allocator model replays (:mod:`memlab.predict.gpu.replay`), and the segments torch cudaMalloc'd beside the ones
  the model would, so the model can be checked byte for byte against a real run; :func:`seed_events` rebuilds the
  segments the allocator held before the history began, so a snapshot recorded mid-run compares from its start.
- :func:`reduce_snapshot` / :func:`expand_reduced`: what the check reads of a snapshot as a small JSON (no frames,
  addresses replaced by their rank), so a snapshot can be shared and checked offline
  (``data/published/allocator_snapshots/``).

Both need CUDA for real data; :func:`snapshot_timeline` also reads a snapshot dict, which is how it is tested on
a CPU. Introduced for chapter 01 (anatomy of an OOM).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memlab.errors import MemlabError
from memlab.predict.gpu.alloc_conf import AllocatorConfig
from memlab.predict.gpu.allocator import AllocationLog
from memlab.predict.gpu.replay import replay

if TYPE_CHECKING:
    import pandas as pd

_CATEGORY_WORDS = (
    ("optimizer", ("optim", "_multi_tensor", "_single_tensor", "step")),
    ("backward", ("backward", "_engine_run_backward", "autograd")),
    ("forward", ("forward",)),
)


def _category(frames: list[dict[str, Any]]) -> str:
    text = " ".join(f"{f.get('filename', '')}:{f.get('name', '')}" for f in frames)
    for cat, words in _CATEGORY_WORDS:
        if any(w in text for w in words):
            return cat
    return "other"


SNAPSHOT_TYPES = "dicts, lists, tuples, strings, numbers, booleans and None"
"""What ``torch.cuda.memory._snapshot()`` returns and ``_dump_snapshot`` pickles (the ``Snapshot`` / ``Segment`` /
``Block`` / ``Frame`` / ``TraceEntry`` TypedDicts of torch/cuda/memory.py ``_snapshot``: ints, strings, lists,
``segment_pool_id`` / ``pool_id`` tuples); plain pickle opcodes build all of them, so no class is ever looked up."""


class _SnapshotUnpickler(pickle.Unpickler):
    """An unpickler that looks up no class or function: ``find_class`` (GLOBAL / STACK_GLOBAL, how a pickle names
    a callable such as ``os.system`` to call through ``__reduce__``) and persistent ids are refused, so only the
    built-in containers and scalars a snapshot holds can be built (the "restricting globals" recipe of the pickle
    module's documentation, with nothing allowed)."""

    def __init__(self, fh: Any, where: str) -> None:
        super().__init__(fh)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        raise MemlabError(f"{self.where} is not a plain memory snapshot: it asks to load {module}.{name}, and a "
                          f"snapshot holds only {SNAPSHOT_TYPES}; memlab does not load it (that could run code)")

    def persistent_load(self, pid: Any) -> Any:
        raise MemlabError(f"{self.where} is not a plain memory snapshot: it has a persistent id ({pid!r})")


def load_snapshot(source: str | Path | bytes) -> dict[str, Any]:
    """A ``torch.cuda.memory._dump_snapshot`` pickle (a path, or its bytes) as the dict it holds, built by
    :class:`_SnapshotUnpickler`: anything but :data:`SNAPSHOT_TYPES` (a class, a function, a ``__reduce__`` call)
    raises one :class:`~memlab.errors.MemlabError` line before it runs, as does a file that is no pickle or holds no
    snapshot dict. Also reads the older snapshots that are a list of segments (``{"segments": [...]}`` then)."""
    if isinstance(source, bytes):
        where, data = "the snapshot bytes", source
    else:
        path = Path(source)
        if not path.is_file():
            raise MemlabError(f"no snapshot at {path}: write one with memlab.measure.cuda.record_memory_history")
        where, data = str(path), path.read_bytes()
    try:
        out = _SnapshotUnpickler(io.BytesIO(data), where).load()
    except MemlabError:
        raise
    except Exception as exc:  # a truncated or foreign file: pickle raises many kinds
        why = (str(exc).splitlines() or [""])[0][:200]
        raise MemlabError(f"{where} is not a readable pickle ({type(exc).__name__}: {why})") from None
    if isinstance(out, list):
        out = {"segments": out}
    if not isinstance(out, dict):
        raise MemlabError(f"{where} holds a {type(out).__name__}, not a torch.cuda.memory._snapshot() dict")
    return out


def snapshot_timeline(snapshot: dict[str, Any] | str | Path, device: int = 0) -> pd.DataFrame:
    """Allocated bytes after each ``alloc`` / ``free_completed`` event of ``device``'s trace, by category.

    Columns: event, action, size, category, allocated_bytes, and one ``<category>`` column each with the live
    bytes that category allocated. Events other than alloc and free_completed (segment maps, OOM markers) are
    kept with no change of bytes, so an ``oom`` event shows where the failure happened.
    """
    import pandas as pd

    if not isinstance(snapshot, dict):
        snapshot = load_snapshot(snapshot)
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or device >= len(traces):
        raise MemlabError(f"the snapshot has no device trace {device}: is it a torch.cuda.memory._snapshot()?")
    live: dict[int, tuple[int, str]] = {}
    by_cat: dict[str, int] = {}
    rows = []
    for i, ev in enumerate(traces[device]):
        action, addr, size = ev.get("action"), ev.get("addr"), int(ev.get("size", 0))
        cat = ""
        if action == "alloc":
            cat = _category(ev.get("frames", []))
            live[addr] = (size, cat)
            by_cat[cat] = by_cat.get(cat, 0) + size
        elif action == "free_completed" and addr in live:
            size, cat = live.pop(addr)
            by_cat[cat] -= size
        rows.append({"event": i, "action": action, "size": size, "category": cat,
                     "allocated_bytes": sum(by_cat.values()), **by_cat})
    return pd.DataFrame(rows).fillna(0)


def _device_trace(snapshot: dict[str, Any] | str | Path, device: int) -> list[dict[str, Any]]:
    if not isinstance(snapshot, dict):
        snapshot = load_snapshot(snapshot)
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or not 0 <= device < len(traces) or not isinstance(traces[device], list):
        raise MemlabError(f"the snapshot has no device trace {device}: record it with "
                          "torch.cuda.memory._record_memory_history() (memlab.measure.cuda.record_memory_history)")
    return [ev for ev in traces[device] if isinstance(ev, dict)]


def snapshot_allocation_log(snapshot: dict[str, Any] | str | Path, device: int = 0) -> AllocationLog:
    """The allocations (``alloc``: address, requested size) and frees (``free_completed``, when the block is back in
    the cache) of a snapshot's device trace, as the :class:`~memlab.predict.gpu.allocator.AllocationLog` the
    allocator model replays. A free of a block allocated before recording began is left out (its allocation is not
    in the trace); how many is said in the log's ``source``. A snapshot recorded from an empty cache (after
    ``torch.cuda.empty_cache()``) gives the model the allocator's whole history."""
    events, dropped = _history(snapshot, device)
    return AllocationLog(events, (), f"snapshot device {device} trace ({dropped} frees of blocks allocated "
                                     "before recording left out)")


def _history(snapshot: dict[str, Any] | str | Path, device: int) -> tuple[tuple[Any, ...], int]:
    """(the trace's allocations and frees as replay events, the frees of blocks allocated before recording)."""
    events: list[tuple[int, int] | tuple[int]] = []
    live: set[int] = set()
    dropped = 0
    for ev in _device_trace(snapshot, device):
        action, addr = ev.get("action"), ev.get("addr")
        if action == "alloc" and isinstance(addr, int):
            events.append((addr, int(ev.get("size", 0))))
            live.add(addr)
        elif action == "free_completed" and isinstance(addr, int):
            if addr in live:
                events.append((addr,))
                live.discard(addr)
            else:
                dropped += 1
    return tuple(events), dropped


_GROWS = ("segment_alloc", "segment_map")


def _snapshot_dict(snapshot: dict[str, Any] | str | Path) -> dict[str, Any]:
    return snapshot if isinstance(snapshot, dict) else load_snapshot(snapshot)


def seed_events(snapshot: dict[str, Any] | str | Path, device: int = 0) -> list[tuple[int, int] | tuple[int]]:
    """Events that rebuild, in an empty allocator model, the segments the allocator already held when the snapshot's
    history began (a segment of the final ``segments`` list whose address no ``segment_alloc`` of the trace made),
    with the blocks that stayed live through the whole trace (allocated blocks whose address the trace never
    allocates) where they sit and the rest of each segment free, so the model starts where the GPU's allocator
    started. Each segment is filled in address order (a live-through block as itself; the free stretch between
    them as one block, or in a small-pool segment as pieces of at most 1 MiB, the small pool's largest request)
    and the free stretches are released at the end, so they merge as the allocator merges them. Keys are negative
    (a snapshot's keys are addresses). A block allocated before the history and freed during it is not placed (its
    place is not recorded): :func:`snapshot_allocation_log` counts those frees. Expandable segments are not
    seeded."""
    from memlab.predict.gpu.alloc_conf import K_SMALL_SIZE

    snap = _snapshot_dict(snapshot)
    trace = _device_trace(snap, device)
    grown = {ev.get("addr") for ev in trace if ev.get("action") in _GROWS}
    allocated = {ev.get("addr") for ev in trace if ev.get("action") == "alloc"}
    events: list[tuple[int, int] | tuple[int]] = []
    frees: list[tuple[int]] = []
    key = -1
    for seg in sorted(snap.get("segments", ()), key=lambda x: x.get("address", 0)):
        if seg.get("device", device) != device or seg.get("address") in grown or seg.get("is_expandable"):
            continue
        small = seg.get("segment_type") == "small"
        for size, kept in _stretches(seg, allocated):
            pieces = ([size] if kept or not small
                      else [min(K_SMALL_SIZE, size - i) for i in range(0, size, K_SMALL_SIZE)])
            for piece in pieces:
                events.append((key, piece))
                if not kept:
                    frees.append((key,))
                key -= 1
    return events + frees


def _stretches(segment: dict[str, Any], allocated: set[Any]) -> list[tuple[int, bool]]:
    """A segment's blocks in address order as (bytes, live through the trace), free neighbours merged."""
    out: list[tuple[int, bool]] = []
    for block in segment.get("blocks", ()):
        kept = block.get("state") == "active_allocated" and block.get("address") not in allocated
        size = int(block.get("size", 0))
        if out and not kept and not out[-1][1]:
            out[-1] = (out[-1][0] + size, False)
        else:
            out.append((size, kept))
    return out


def segment_check(snapshot: dict[str, Any] | str | Path, config: AllocatorConfig | None = None,
                  device: int = 0) -> dict[str, Any]:
    """The segments torch cudaMalloc'd (or mapped, with expandable segments) in a snapshot's device trace beside
    those the allocator model cudaMallocs replaying the same allocations (:func:`snapshot_allocation_log`), in
    order: ``snapshot`` and ``model`` (lists of (action, bytes)), ``match``, and the model's peaks. The segments the
    allocator held before the history began are rebuilt first (:func:`seed_events`; ``seeded_segments`` says how
    many), so a snapshot recorded mid-run compares from the same start. Releases are not compared: an
    ``empty_cache()`` call frees segments, and the trace does not say when the program made one. ``config`` must be
    the ``PYTORCH_CUDA_ALLOC_CONF`` the run used (torch's defaults when None). ``layout_match``: whether the model's
    segments at the end hold the snapshot's blocks (sizes, in use or free, in address order), segment by segment;
    ``unplaced_frees``: frees of blocks allocated before the history, which no seed can place."""
    from memlab.predict.gpu.allocator import CachingAllocatorModel
    from memlab.predict.gpu.replay import _apply_event

    snap = _snapshot_dict(snapshot)
    seen = [(ev["action"], int(ev.get("size", 0))) for ev in _device_trace(snap, device)
            if ev.get("action") in _GROWS]
    seed = seed_events(snap, device)
    m = CachingAllocatorModel(config)
    live: dict[int, Any] = {}
    for i, ev in enumerate(seed):
        _apply_event(m, live, i, ev)
    seeded = len(m.segment_log)
    log = snapshot_allocation_log(snap, device)
    unplaced = _history(snap, device)[1]
    r = replay(AllocationLog(tuple(seed) + log.events, (), log.source), config)
    model = [(action, size) for action, size in r.segment_log[seeded:] if action in _GROWS]
    for i, ev in enumerate(log.events):
        _apply_event(m, live, i, ev)
    layout = sorted(tuple(seg) for seg in m.segments()) == sorted(
        tuple((int(b.get("size", 0)), b.get("state") != "inactive") for b in seg.get("blocks", ()))
        for seg in snap.get("segments", ()) if seg.get("device", device) == device)
    return {"snapshot": seen, "model": model, "match": seen == model, "seeded_segments": seeded,
            "layout_match": layout, "model_reserved_peak_bytes": r.total.reserved_bytes,
            "model_end_reserved_bytes": r.total.end_reserved_bytes,
            "snapshot_reserved_bytes": sum(int(x.get("total_size", 0)) for x in snap.get("segments", ())
                                           if x.get("device", device) == device),
            "model_requested_peak_bytes": r.total.requested_bytes, "fits": r.fits, "source": log.source,
            "unplaced_frees": unplaced}


_REDUCED_ACTIONS = ("alloc", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap")
REDUCED_FORMAT = "memlab reduced allocator snapshot v1"
"""The ``format`` key of :func:`reduce_snapshot`'s dict."""


def reduce_snapshot(snapshot: dict[str, Any] | str | Path, device: int = 0, *,
                    provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """What :func:`segment_check` reads of a snapshot, as a small JSON-ready dict: the device trace's allocator
    events (action, address rank, bytes) and the final segments' blocks (bytes, state, address rank). Addresses are
    replaced by their rank among the snapshot's addresses (order and identity kept, nothing else); no frame, file
    or stack is kept, so a snapshot can be shared and checked without the program that made it. ``provenance``
    (where the snapshot came from) is stored beside. :func:`expand_reduced` gives back a snapshot-shaped dict."""
    snap = _snapshot_dict(snapshot)
    trace = [ev for ev in _device_trace(snap, device) if ev.get("action") in _REDUCED_ACTIONS]
    segs = [seg for seg in snap.get("segments", ()) if seg.get("device", device) == device]
    addrs = sorted({ev.get("addr") for ev in trace if isinstance(ev.get("addr"), int)}
                   | {seg.get("address") for seg in segs} | {b.get("address") for seg in segs
                                                           for b in seg.get("blocks", ()) if "address" in b})
    rank = {a: i for i, a in enumerate(addrs)}
    return {"format": REDUCED_FORMAT, "provenance": provenance or {},
            "events": [[_REDUCED_ACTIONS.index(ev["action"]), rank[ev.get("addr")], int(ev.get("size", 0))]
                       for ev in trace],
            "segments": [{"address": rank[seg.get("address")], "total_size": int(seg.get("total_size", 0)),
                          "segment_type": seg.get("segment_type", "large"),
                          "is_expandable": bool(seg.get("is_expandable", False)),
                          "blocks": [[int(b.get("size", 0)), b.get("state", ""), rank.get(b.get("address"), -1)]
                                     for b in seg.get("blocks", ())]} for seg in segs]}


def expand_reduced(reduced: dict[str, Any] | str | Path) -> dict[str, Any]:
    """A :func:`reduce_snapshot` dict (or its JSON file) as the snapshot-shaped dict :func:`segment_check` and
    :func:`snapshot_allocation_log` read (device 0). A file of another format is one :class:`MemlabError` line."""
    d = reduced
    if not isinstance(d, dict):
        try:
            d = json.loads(Path(reduced).read_text())
        except (OSError, ValueError) as exc:
            raise MemlabError(f"cannot read a reduced snapshot from {reduced}: {exc}") from None
    if not isinstance(d, dict) or d.get("format") != REDUCED_FORMAT:
        raise MemlabError(f"not a reduced allocator snapshot (format {REDUCED_FORMAT!r}): {str(reduced)[:80]}")
    trace = [{"action": _REDUCED_ACTIONS[a], "addr": k, "size": n, "stream": 0} for a, k, n in d["events"]]
    segments = [{"device": 0, "address": seg["address"], "total_size": seg["total_size"], "stream": 0,
                 "segment_type": seg["segment_type"], "is_expandable": seg["is_expandable"],
                 "blocks": [{"size": n, "state": state, "address": k} for n, state, k in seg["blocks"]]}
                for seg in d["segments"]]
    return {"segments": segments, "device_traces": [trace]}


_PROBE = r"""
import json, sys, torch
cap, block, n, request = (int(a) for a in sys.argv[1:5])
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(cap / total, 0)
out = {"capacity_bytes": cap, "block_bytes": block, "blocks": n, "request_bytes": request}
blocks = []
try:
    for _ in range(n):
        blocks.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
    del blocks[1::2]  # every other block freed: holes between live blocks, inside shared segments
    out["before_request"] = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
    try:
        x = torch.empty(request, dtype=torch.uint8, device="cuda")
        out["status"] = "ok"
    except torch.OutOfMemoryError as exc:
        out["status"] = "oom"
        out["message"] = str(exc)
    out["after"] = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
except torch.OutOfMemoryError as exc:
    out["status"] = "oom while filling"
    out["message"] = str(exc)
print(json.dumps(out))
"""


def fragmentation_probe(capacity_bytes: int, *, block_bytes: int = 5 * 2**20, fill: float = 0.8,
                        request_fraction: float = 0.3, expandable_segments: bool = False,
                        timeout_s: float = 120.0) -> dict[str, Any]:
    """Run the interleaved-allocation probe in a subprocess on CUDA device 0 and return what happened.

    The probe caps the allocator at ``capacity_bytes`` (``set_per_process_memory_fraction``), allocates
    ``block_bytes`` tensors until ``fill`` of it is used (5 MiB blocks share 20 MiB segments in the caching
    allocator's large pool), frees every other one, and requests one tensor of ``request_fraction`` of the
    capacity: less than what was freed, but larger than any hole. Raises :class:`MemlabError` when the
    subprocess fails for another reason than an OOM (no CUDA, ...).
    """
    for name, v in (("capacity_bytes", capacity_bytes), ("block_bytes", block_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise MemlabError(f"{name} must be a positive integer, got {v!r}")
    if not 0 < fill < 1 or not 0 < request_fraction < fill / 2:
        raise MemlabError(f"need 0 < fill < 1 and 0 < request_fraction < fill/2 (less than what is freed), got "
                          f"fill={fill}, request_fraction={request_fraction}")
    env = dict(os.environ)
    conf = [c for c in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if c and "expandable_segments" not in c]
    if expandable_segments:
        conf.append("expandable_segments:True")
    env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(conf)
    n = int(fill * capacity_bytes // block_bytes)
    args = [sys.executable, "-c", _PROBE, str(capacity_bytes), str(block_bytes), str(n),
            str(int(request_fraction * capacity_bytes))]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise MemlabError(f"the fragmentation probe failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["expandable_segments"] = expandable_segments
    return out
