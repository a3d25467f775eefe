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

Both need CUDA for real data; :func:`snapshot_timeline` also reads a snapshot dict, which is how it is tested on
a CPU. Introduced for chapter 01 (anatomy of an OOM).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memlab.errors import MemlabError

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


def snapshot_timeline(snapshot: dict[str, Any] | str | Path, device: int = 0) -> pd.DataFrame:
    """Allocated bytes after each ``alloc`` / ``free_completed`` event of ``device``'s trace, by category.

    Columns: event, action, size, category, allocated_bytes, and one ``<category>`` column each with the live
    bytes that category allocated. Events other than alloc and free_completed (segment maps, OOM markers) are
    kept with no change of bytes, so an ``oom`` event shows where the failure happened.
    """
    import pandas as pd

    if not isinstance(snapshot, dict):
        path = Path(snapshot)
        if not path.exists():
            raise MemlabError(f"no snapshot at {path}: write one with memlab.measure.cuda.record_memory_history")
        with path.open("rb") as fh:
            snapshot = pickle.load(fh)  # a file this process (or torch) wrote: only load trusted snapshots
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
