"""Launch real data-parallel ranks with torchrun and collect one row per rank and strategy.

:func:`launch` runs ``python -m torch.distributed.run --nproc-per-node N --standalone -m memlab.run.distributed.worker``
(gloo on a CPU, NCCL on GPUs: the worker picks), waits at most ``timeout_s``, and returns a
:class:`DistributedRun` whose rows are the ranks' measurements (:mod:`memlab.run.distributed.worker`). A rank
that fails, or a launch that runs past its timeout, raises one :class:`memlab.errors.LaunchError` with the failing
rank's traceback or the tail of the log; the whole process group is killed on a timeout, so a notebook cell never hangs.

:func:`torchrun_command` builds the same command for many nodes (``--nnodes``, ``--node-rank``,
``--rdzv-backend c10d``, ``--rdzv-endpoint``), as torchrun's documentation describes [pytorch-torchrun]: run it on
every node of a cluster with the same endpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memlab.errors import LaunchError, SetupError
from memlab.predict.models import TransformerConfig
from memlab.run.distributed.worker import STRATEGIES

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """What every rank runs: the model, its micro-batch per rank, the strategies in order, steps per strategy."""

    config: TransformerConfig
    batch: int = 2
    seq: int = 32
    strategies: tuple[str, ...] = ("ddp", "zero1", "fsdp2-zero2", "fsdp2-zero3", "fsdp2-offload")
    steps: int = 2
    seed: int = 0
    attention: str = "eager"
    device: str = "auto"
    """auto: NCCL on CUDA when torch sees GPUs, else gloo on CPU; cpu forces gloo."""
    collective_timeout_s: float = 60.0
    fail_rank: int | None = None
    """A rank that raises on purpose before its first strategy (to exercise the error path); None for none."""

    def __post_init__(self) -> None:
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad or not self.strategies:
            raise SetupError(f"unknown strategies {bad}: choose from {', '.join(STRATEGIES)}")
        for name in ("batch", "seq", "steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SetupError(f"{name} must be a positive integer, got {value!r}")
        if self.device not in ("auto", "cpu"):
            raise SetupError(f"device must be 'auto' or 'cpu', got {self.device!r}")
        if self.seq > self.config.max_seq and self.config.positions == "learned":
            raise SetupError(f"seq={self.seq} exceeds max_seq={self.config.max_seq}: lower seq")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["strategies"] = list(self.strategies)
        return d


@dataclass(frozen=True)
class DistributedRun:
    """The rows of one launch (one per rank and strategy), the command and its wall time in seconds."""

    world_size: int
    rows: tuple[dict[str, Any], ...]
    command: tuple[str, ...]
    wall_s: float
    log_tail: str = field(default="", repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "rows": list(self.rows), "command": list(self.command),
                "wall_s": self.wall_s}

    def frame(self) -> Any:
        """pandas DataFrame, one row per (strategy, rank); ``comm`` expanded to ``<op>_volume_bytes`` columns."""
        import pandas as pd

        flat = []
        for r in self.rows:
            row = {k: v for k, v in r.items() if k not in ("comm", "optimizer_by_key")}
            for op, c in (r.get("comm") or {}).items():
                row[f"{op}_calls"] = c["calls"]
                row[f"{op}_volume_bytes"] = c["volume_bytes"]
            flat.append(row)
        return pd.DataFrame(flat)


def torchrun_command(nproc_per_node: int, *, nnodes: int = 1, node_rank: int | None = None,
                     rdzv_endpoint: str | None = None, rdzv_id: str = "memlab",
                     python: str = sys.executable) -> list[str]:
    """The torchrun command line for ``nnodes`` nodes of ``nproc_per_node`` ranks (program arguments not included).

    One node: ``--standalone`` (a local rendezvous). Many nodes: ``--nnodes``, ``--rdzv-backend c10d``,
    ``--rdzv-endpoint HOST:PORT`` (a reachable address of one node) and ``--rdzv-id``; run the same command on every
    node (``node_rank`` is optional with the c10d rendezvous) [pytorch-torchrun].
    """
    for name, value in (("nproc_per_node", nproc_per_node), ("nnodes", nnodes)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SetupError(f"{name} must be a positive integer, got {value!r}")
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc_per_node)]
    if nnodes == 1 and rdzv_endpoint is None:
        return [*cmd, "--standalone"]
    if rdzv_endpoint is None:
        raise SetupError("several nodes need a rendezvous: pass rdzv_endpoint='HOST:PORT' of one node")
    cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
    return [*cmd, "--node-rank", str(node_rank)] if node_rank is not None else cmd


def _tail(text: str, n: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _env(threads_per_rank: int) -> dict[str, str]:
    path = os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "OMP_NUM_THREADS": str(threads_per_rank), "PYTHONPATH": path}


def _run(cmd: list[str], timeout_s: float, threads_per_rank: int, what: str) -> tuple[int, str, float]:
    """Run ``cmd`` in its own session; on timeout kill the whole session (torchrun and every rank)."""
    if not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise SetupError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=PACKAGE_ROOT, env=_env(threads_per_rank), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        raise LaunchError(f"{what} ran past timeout_s={timeout_s:g} s and was killed with its ranks; raise "
                          f"timeout_s or shrink the spec. Last lines of its log:\n{_tail(log or '')}") from None
    return proc.returncode, log or "", time.perf_counter() - t0


def _collect(out: Path, nproc: int, returncode: int, log: str) -> tuple[dict[str, Any], ...]:
    """Every rank's rows from ``out``, or a :class:`LaunchError` naming the first failing rank and its traceback."""
    errors = sorted(out.glob("rank*.error"), key=lambda f: f.stat().st_mtime_ns)  # the first to fail is the cause
    if errors:
        others = f"; {len(errors) - 1} other rank(s) failed after it" if len(errors) > 1 else ""
        raise LaunchError(f"{errors[0].stem} of {nproc} failed first (exit status {returncode}){others}:\n"
                          f"{_tail(errors[0].read_text())}")
    files = [out / f"rank{r}.json" for r in range(nproc)]
    missing = [f.stem for f in files if not f.exists()]
    if returncode != 0 or missing:
        raise LaunchError(f"the launch of {nproc} rank(s) exited with {returncode}; no result from "
                          f"{', '.join(missing) or 'none'}. Last lines of its log:\n{_tail(log)}")
    return tuple(row for f in files for row in json.loads(f.read_text()))


def _check_spec(spec: WorkerSpec, largest: int) -> None:
    if not isinstance(spec, WorkerSpec):
        raise SetupError(f"spec must be a memlab.run.distributed.launch.WorkerSpec, got {type(spec).__name__}")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec.device == "auto" and gpus and largest > gpus:
        raise SetupError(f"{largest} ranks need {largest} GPUs on this node, {gpus} visible: launch fewer ranks, or "
                         "WorkerSpec(device='cpu') for gloo ranks on the CPU")


def run_script(script: Path | str, args: list[str], nproc_per_node: int, *, timeout_s: float = 180.0,
               threads_per_rank: int = 1) -> str:
    """Run any rank script under ``torchrun --standalone`` with the launcher's guarantees: killed with its ranks
    after ``timeout_s``, a :class:`LaunchError` with the log's last lines on a non-zero exit. Returns the log."""
    cmd = [*torchrun_command(nproc_per_node), str(script), *map(str, args)]
    code, log, _ = _run(cmd, timeout_s, threads_per_rank, f"torchrun {Path(script).name} with {nproc_per_node} rank(s)")
    if code != 0:
        raise LaunchError(f"torchrun {Path(script).name} with {nproc_per_node} rank(s) exited with {code}. "
                          f"Last lines of its log:\n{_tail(log)}")
    return log


def launch(spec: WorkerSpec, nproc_per_node: int, *, timeout_s: float = 120.0, threads_per_rank: int = 1) -> \
        DistributedRun:
    """Run ``spec`` on ``nproc_per_node`` local ranks with the ``torchrun`` command line; every rank's rows.

    Raises :class:`LaunchError` (with the failing rank's traceback, or the last lines of torchrun's log) when a
    rank fails, when a rank wrote nothing, or after ``timeout_s`` seconds (torchrun and its ranks are killed).
    ``threads_per_rank`` sets OMP_NUM_THREADS so N ranks do not oversubscribe the CPU cores.
    """
    _check_spec(spec, nproc_per_node)
    with tempfile.TemporaryDirectory(prefix="memlab-dist-") as tmp:
        cmd = [*torchrun_command(nproc_per_node), "-m", "memlab.run.distributed.worker", json.dumps(spec.to_dict()),
               tmp]
        code, log, wall = _run(cmd, timeout_s, threads_per_rank, f"torchrun with {nproc_per_node} rank(s)")
        rows = _collect(Path(tmp), nproc_per_node, code, log)
    return DistributedRun(nproc_per_node, rows, tuple(cmd), wall, _tail(log))


def launch_sweep(spec: WorkerSpec, world_sizes: tuple[int, ...] = (1, 2, 4), *, timeout_s: float = 120.0,
                 threads_per_rank: int = 1) -> dict[int, DistributedRun]:
    """Run ``spec`` at each world size, one launch after another, from ONE launcher process.

    The launcher (``python -m memlab.run.distributed.worker --sweep``) calls torchrun's launcher API
    (``elastic_launch``, what the ``torchrun`` command runs) for each N and forks the ranks from itself on a CPU, so
    torch is imported once instead of N + 1 times per launch: the same ranks, rendezvous and collectives, a few
    seconds instead of tens. ``timeout_s`` bounds the whole sweep; errors as in :func:`launch`. ``wall_s`` of each run
    is the sweep's.
    """
    sizes = tuple(world_sizes)
    if not sizes or any(not isinstance(n, int) or isinstance(n, bool) or n <= 0 for n in sizes):
        raise SetupError(f"world_sizes must be positive integers, got {world_sizes!r}")
    _check_spec(spec, max(sizes))
    with tempfile.TemporaryDirectory(prefix="memlab-dist-") as tmp:
        cmd = [sys.executable, "-m", "memlab.run.distributed.worker", "--sweep", json.dumps(spec.to_dict()), tmp,
               ",".join(map(str, sizes))]
        code, log, wall = _run(cmd, timeout_s, threads_per_rank, f"the launches over {sizes} rank(s)")
        out: dict[int, DistributedRun] = {}
        for n in sizes:
            path = Path(tmp) / f"n{n}"
            if code != 0 and not list(path.glob("rank*.error")) and not (path / "rank0.json").exists():
                raise LaunchError(f"the launch with {n} rank(s) did not start or failed (exit {code}). "
                                  f"Last lines of its log:\n{_tail(log)}")
            rows = _collect(path, n, 0 if (path / f"rank{n - 1}.json").exists() else code, log)
            out[n] = DistributedRun(n, rows, tuple(torchrun_command(n)), wall, _tail(log))
    return out
