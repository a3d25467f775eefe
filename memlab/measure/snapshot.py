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
  the model would, so the model can be checked byte for byte against a real run.

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
    return AllocationLog(tuple(events), (), f"snapshot device {device} trace ({dropped} frees of blocks allocated "
                                            "before recording left out)")


_GROWS = ("segment_alloc", "segment_map")


def segment_check(snapshot: dict[str, Any] | str | Path, config: AllocatorConfig | None = None,
                  device: int = 0) -> dict[str, Any]:
    """The segments torch cudaMalloc'd (or mapped, with expandable segments) in a snapshot's device trace beside
    those the allocator model cudaMallocs replaying the same allocations (:func:`snapshot_allocation_log`), in
    order: ``snapshot`` and ``model`` (lists of (action, bytes)), ``match``, and the model's peaks. Releases are
    not compared: an ``empty_cache()`` call frees segments, and the trace does not say when the program made one.
    ``config`` must be the ``PYTORCH_CUDA_ALLOC_CONF`` the run used (torch's defaults when None)."""
    seen = [(ev["action"], int(ev.get("size", 0))) for ev in _device_trace(snapshot, device)
            if ev.get("action") in _GROWS]
    r = replay(snapshot_allocation_log(snapshot, device), config)
    model = [(action, size) for action, size in r.segment_log if action in _GROWS]
    return {"snapshot": seen, "model": model, "match": seen == model, "model_reserved_peak_bytes":
            r.total.reserved_bytes, "model_requested_peak_bytes": r.total.requested_bytes, "fits": r.fits}


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
