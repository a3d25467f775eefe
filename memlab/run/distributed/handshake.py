"""The readiness handshake between memlab's launcher and its ranks (plain files, no torch).

A rank started by memlab's launcher (:mod:`memlab.run.distributed.launch`) writes ``ready-rank<R>.json`` into its
launch's directory once torch and memlab are imported (its pid, process group and session, so the launcher can kill
it even after torch moved it into a session of its own), then waits for the launcher's ``go`` file before
``init_process_group``. The launcher writes ``go`` when every rank is ready, so the process-group rendezvous starts
with all ranks present: a rank slow to import torch (a cold package cache, N processes on few cores) delays the
start instead of running a peer's store wait out (memlab issue 23: ``DistStoreError: wait timeout after 60000ms``).
The launcher's clock for the step starts at ``go``.

Two variables let the tests play a slow or a hung rank; a rank honours them only under pytest
(``PYTEST_CURRENT_TEST`` set, which pytest exports to the processes a test starts):

- ``MEMLAB_TEST_RANK_DELAY="R:SECONDS"``: rank R sleeps that long before it signals ready, on the launch's first
  attempt only (a cold start: the issue's second run passed in 17 s);
- ``MEMLAB_TEST_RANK_HANG="R"``: rank R signals ready, then sleeps forever (a rank that never finishes).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

READY_PREFIX = "ready-rank"
GO = "go"
POLL_S = 0.05
"""Seconds between looks at the handshake files (launcher and ranks)."""
DELAY_VAR = "MEMLAB_TEST_RANK_DELAY"
HANG_VAR = "MEMLAB_TEST_RANK_HANG"


def ready_path(out_dir: Path, rank: int) -> Path:
    """The file rank ``rank`` writes when it is ready."""
    return Path(out_dir) / f"{READY_PREFIX}{rank}.json"


def signal_ready(out_dir: Path, rank: int) -> None:
    """Write this rank's ready file atomically (pid, process group, session, wall clock in s)."""
    path = ready_path(out_dir, rank)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rank": rank, "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                               "time_s": time.time()}))
    tmp.replace(path)


def ready_ranks(out_dir: Path) -> dict[int, dict[str, int | float]]:
    """The ready files found in ``out_dir``, by rank."""
    found = {}
    for f in Path(out_dir).glob(f"{READY_PREFIX}*.json"):
        try:
            entry = json.loads(f.read_text())
        except (OSError, ValueError):  # replaced while we read it: seen at the next look
            continue
        found[int(entry["rank"])] = entry
    return found


def give_go(out_dir: Path) -> None:
    """The launcher's signal that every rank is ready."""
    (Path(out_dir) / GO).write_text(str(time.time()))


def wait_for_go(out_dir: Path, timeout_s: float) -> None:
    """Block until the launcher's ``go`` file exists; TimeoutError after ``timeout_s`` seconds (launcher gone)."""
    deadline = time.monotonic() + timeout_s
    while not (Path(out_dir) / GO).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no go from memlab's launcher within {timeout_s:g} s of signalling ready")
        time.sleep(POLL_S)


def _under_pytest() -> bool:
    return "PYTEST_CURRENT_TEST" in os.environ


def injected_delay_s(rank: int, attempt: int) -> float:
    """Seconds rank ``rank`` sleeps before it signals ready (``MEMLAB_TEST_RANK_DELAY``, first attempt, pytest)."""
    value = os.environ.get(DELAY_VAR, "")
    if not value or attempt != 0 or not _under_pytest():
        return 0.0
    who, _, seconds = value.partition(":")
    return float(seconds) if int(who) == rank else 0.0


def hangs(rank: int) -> bool:
    """Whether rank ``rank`` plays a rank that never finishes (``MEMLAB_TEST_RANK_HANG``, pytest only)."""
    value = os.environ.get(HANG_VAR, "")
    return bool(value) and _under_pytest() and int(value) == rank


def handshake(out_dir: Path, rank: int, attempt: int, timeout_s: float) -> None:
    """A rank's side: the test-only delay or hang, ``ready``, then wait for ``go`` (at most ``timeout_s``)."""
    time.sleep(injected_delay_s(rank, attempt))
    signal_ready(out_dir, rank)
    while hangs(rank):
        time.sleep(3600)
    wait_for_go(out_dir, timeout_s)
