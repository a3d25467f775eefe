"""Run a launcher process (torchrun, or memlab's sweep launcher) and its ranks under two clocks, and kill them all.

:func:`supervise` starts the command in a session of its own with its output going to a file (never a pipe: a rank
that outlives torchrun would hold a pipe open and block the reader until it exits). For each :class:`Stage` (one
launch of N ranks, whose directory receives the handshake files of :mod:`memlab.run.distributed.handshake`) it
waits at most ``start_timeout_s`` for every rank's ready file, gives ``go``, then waits at most ``timeout_s`` for the
stage's results. Past either clock it kills everything: torch's launcher starts each rank in a session of its own
(``start_new_session=True`` in torch.distributed.elastic's subprocess handler), so killing torchrun's process group
leaves the ranks running; the ranks' process groups (from their ready files, and every descendant psutil finds) are
killed too, torchrun first frozen with SIGSTOP so it neither starts nor reaps ranks meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from memlab.run.distributed.handshake import POLL_S, give_go, ready_ranks

REAP_S = 5.0
"""Seconds to wait for killed processes to disappear before reporting the survivors."""


@dataclass(frozen=True)
class Stage:
    """One launch of ``ranks`` ranks writing ``rank<R>.json`` / ``rank<R>.error`` and its handshake files into
    ``path``."""

    path: Path
    ranks: int

    def complete(self) -> bool:
        """Every rank wrote its rows."""
        return all((self.path / f"rank{r}.json").exists() for r in range(self.ranks))

    def done(self) -> bool:
        """Every rank wrote its rows, or one failed."""
        return self.complete() or any(self.path.glob("rank*.error"))


@dataclass(frozen=True)
class Outcome:
    """How a supervised run ended: ``failure`` is "" (the command exited by itself, ``returncode``), ``"start"``
    (ranks ``not_ready`` of stage ``stage`` missed ``start_timeout_s``) or ``"timeout"`` (stage ``stage`` ran past
    ``timeout_s`` after its go); ``killed`` counts the rank processes (and their descendants) signalled,
    ``survivors`` lists any pid still alive after :data:`REAP_S`. Times in seconds: ``wall_s`` the whole run,
    ``ready_s`` per stage from its start to go."""

    returncode: int | None
    log: str
    wall_s: float
    ready_s: tuple[float, ...]
    stages_done: int
    failure: str = ""
    stage: int = -1
    not_ready: tuple[int, ...] = ()
    killed: int = 0
    survivors: tuple[int, ...] = ()


def supervise(cmd: list[str], stages: list[Stage], *, cwd: Path, env: dict[str, str], log_path: Path,
              start_timeout_s: float, timeout_s: float) -> Outcome:
    """Run ``cmd`` through ``stages`` (see the module doc). With no stages (a script without the handshake)
    ``timeout_s`` bounds the whole run."""
    t0 = time.perf_counter()
    tracked: dict[int, float] = {}  # rank pid -> when it was seen ready (wall clock), to tell it from a reused pid
    ready_s: list[float] = []
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    i, stage_t0, go_t = 0, t0, None if stages else t0
    failure, not_ready = "", ()
    while proc.poll() is None:
        now = time.perf_counter()
        if i < len(stages) and go_t is None:
            ready = ready_ranks(stages[i].path)
            tracked.update({int(e["pid"]): float(e["time_s"]) for e in ready.values()})
            if len(ready) >= stages[i].ranks:
                give_go(stages[i].path)
                go_t = now
                ready_s.append(now - stage_t0)
            elif now - stage_t0 > start_timeout_s:
                failure, not_ready = "start", tuple(r for r in range(stages[i].ranks) if r not in ready)
                break
        elif go_t is not None and now - go_t > timeout_s:
            failure = "timeout"
            break
        elif i < len(stages) and stages[i].done():
            i, stage_t0 = i + 1, now
            go_t = None if i < len(stages) else go_t  # after the last stage its clock bounds the launcher's exit
        time.sleep(POLL_S)
    killed, survivors = kill_all(proc, tracked)
    return Outcome(None if failure else proc.returncode, log_path.read_text(errors="replace"),
                   time.perf_counter() - t0, tuple(ready_s), i, failure, i, not_ready, killed, survivors)


def kill_all(proc: subprocess.Popen[bytes], tracked: dict[int, float]) -> tuple[int, tuple[int, ...]]:
    """SIGKILL ``proc``'s process group, every descendant of ``proc`` and the process group of every tracked rank
    (pid -> the wall-clock time it was seen, older than the process that has its pid); wait for them.

    Returns how many processes were signalled and the pids still alive after :data:`REAP_S` seconds. Called after
    a normal exit too: a rank that outlived its launcher is killed then.
    """
    own_group = os.getpgrp()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGSTOP)
    victims: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        victims.update({p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)})
    for pid, seen in tracked.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.create_time() <= seen + 1:  # the rank itself, not a later process with its pid
                victims[pid] = p
    groups = {proc.pid}
    for p in victims.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            groups.add(os.getpgid(p.pid))
    for group in groups - {own_group}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for p in victims.values():
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGCONT)
    proc.wait()
    _, alive = psutil.wait_procs(list(victims.values()), timeout=REAP_S)
    return len(victims), tuple(sorted(p.pid for p in alive))
