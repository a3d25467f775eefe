"""Launch real data-parallel ranks with torchrun and collect one row per rank and strategy.

:func:`launch` runs ``python -m torch.distributed.run --nproc-per-node N --standalone -m memlab.run.distributed.worker``
(gloo on a CPU, NCCL on GPUs: the worker picks) and returns a :class:`DistributedRun` whose rows are the ranks'
measurements (:mod:`memlab.run.distributed.worker`). Two clocks bound it (:mod:`memlab.run.distributed.supervise`):
every rank has ``start_timeout_s`` to import torch and signal ready (:mod:`memlab.run.distributed.handshake`), and
only then, with all ranks present, does the process-group rendezvous start and ``timeout_s`` run. A start-up or
rendezvous timeout is retried ONCE with a warning; a rank that fails, a second timeout, or work past ``timeout_s``
raises one :class:`memlab.errors.LaunchError` with the failing rank's traceback or the tail of the log, after
torchrun and every rank (each in a session of its own) are killed, so a notebook cell never hangs. More ranks than
the machine holds (:mod:`memlab.run.distributed.capacity`) are refused with a :class:`memlab.errors.SetupError`.

:func:`torchrun_command` builds the same command for many nodes (``--nnodes``, ``--node-rank``,
``--rdzv-backend c10d``, ``--rdzv-endpoint``), as torchrun's documentation describes [pytorch-torchrun]: run it on
every node of a cluster with the same endpoint.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memlab.errors import LaunchError, SetupError
from memlab.predict.spec.model import TransformerConfig
from memlab.run.distributed.capacity import RankCapacity, rank_capacity
from memlab.run.distributed.supervise import Outcome, Stage, supervise
from memlab.run.distributed.worker import ACCELERATOR_ONLY, PROCESS_GROUP_TIMEOUT_S, STRATEGIES

PACKAGE_ROOT = Path(__file__).resolve().parents[3]
"""The folder holding the ``memlab`` package the launcher runs from: the ranks' working directory and first
``PYTHONPATH`` entry, so they import the same memlab as the launcher (a checkout, not another install)."""
START_TIMEOUT_S = 300.0
"""Seconds every rank of a launch has to import torch and signal ready. Warm, a rank is ready in about 2 s; on a
cold package cache, four ranks importing torch at once on two loaded cores left one rank unregistered after 60 s
(memlab issue 23); 300 s is five times that, and only a machine that cannot start the ranks at all waits it out."""
GO_GRACE_S = 60.0
"""Seconds a ready rank waits for go beyond ``start_timeout_s`` before it gives up (its launcher is gone)."""
RENDEZVOUS_TIMEOUT = re.compile(r"DistStoreError[^\n]*|RendezvousTimeoutError[^\n]*|wait timeout after \d+ ?ms|"
                                r"Timed out initializing process group[^\n]*|Socket Timeout[^\n]*")
"""What a rendezvous or TCPStore timeout prints (torch 2.x): a launch that fails with one is retried once."""


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
    collective_timeout_s: float = PROCESS_GROUP_TIMEOUT_S
    """Seconds ``init_process_group``'s store waits and each collective may take (see PROCESS_GROUP_TIMEOUT_S)."""
    fail_rank: int | None = None
    """A rank that raises on purpose before its first strategy (to exercise the error path); None for none."""
    fsdp_units: str = "blocks"
    """FSDP2 wrapping plan of the fsdp2-* strategies (Setup.fsdp_units; memlab.model.fsdp.shard_model)."""
    fsdp_loss: str = "inside"
    """Where the fsdp2-* strategies compute the loss (Setup.fsdp_loss)."""
    fsdp_param_dtype: str = "none"
    """MixedPrecisionPolicy.param_dtype of the fsdp2-* strategies (Setup.fsdp_param_dtype; none: no policy)."""
    fsdp_reduce_dtype: str = "fp32"
    """MixedPrecisionPolicy.reduce_dtype (Setup.fsdp_reduce_dtype)."""
    fsdp_reshard_root: bool = False
    """reshard_after_forward=True on the root unit (Setup.fsdp_reshard_root; False leaves it to FSDP2)."""
    hf_config: dict[str, Any] | None = None
    """A Hugging Face ``config.json``'s dict: every rank then trains ``AutoModelForCausalLM.from_config`` of it
    (:func:`memlab.model.hf.build_hf_model`, fp32, eager attention) instead of the reference GPT, and ``config`` is
    :func:`memlab.predict.families.reader.from_hf` of it (what the estimator predicts). None: the reference GPT of
    ``config``."""

    def __post_init__(self) -> None:
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad or not self.strategies:
            raise SetupError(f"unknown strategies {bad}: choose from {', '.join(STRATEGIES)}")
        repeated = sorted({s for s in self.strategies if self.strategies.count(s) > 1})
        if repeated:
            raise SetupError(f"strategies repeat {', '.join(repeated)}: list each strategy once (each runs on every "
                             "rank; a repeat would count its ranks twice in the mean over ranks)")
        if not isinstance(self.collective_timeout_s, int | float) or self.collective_timeout_s <= 0:
            raise SetupError(f"collective_timeout_s must be a positive number of seconds, got "
                             f"{self.collective_timeout_s!r}")
        for name in ("batch", "seq", "steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SetupError(f"{name} must be a positive integer, got {value!r}")
        from memlab.predict.memory.fsdp import FSDP_LOSS, FSDP_UNITS

        if self.fsdp_param_dtype not in ("none", "bf16", "fp16") or self.fsdp_reduce_dtype not in ("fp32", "bf16",
                                                                                                 "fp16"):
            raise SetupError(f"fsdp_param_dtype must be none, bf16 or fp16 and fsdp_reduce_dtype fp32, bf16 or fp16, "
                             f"got {self.fsdp_param_dtype!r}, {self.fsdp_reduce_dtype!r}")
        if not isinstance(self.fsdp_reshard_root, bool):
            raise SetupError(f"fsdp_reshard_root must be True or False, got {self.fsdp_reshard_root!r}")
        if self.fsdp_units not in FSDP_UNITS or self.fsdp_loss not in FSDP_LOSS:
            raise SetupError(f"fsdp_units must be one of {', '.join(FSDP_UNITS)} and fsdp_loss one of "
                             f"{', '.join(FSDP_LOSS)}, got {self.fsdp_units!r}, {self.fsdp_loss!r}")
        if self.hf_config is not None and not isinstance(self.hf_config, dict):
            raise SetupError(f"hf_config must be a config.json's dict, got {type(self.hf_config).__name__}")
        if self.hf_config is not None and (self.fsdp_units, self.fsdp_loss) != ("blocks", "inside"):
            raise SetupError("a Hugging Face model is sharded block by block (fsdp_units='blocks') and computes its "
                             "loss inside its forward (fsdp_loss='inside')")
        if self.device not in ("auto", "cpu"):
            raise SetupError(f"device must be 'auto' or 'cpu', got {self.device!r}")
        if self.seq > self.config.max_seq and self.config.positions == "learned":
            raise SetupError(f"seq={self.seq} exceeds max_seq={self.config.max_seq}: lower seq")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["strategies"] = list(self.strategies)
        d["fsdp"] = {"units": d.pop("fsdp_units"), "loss": d.pop("fsdp_loss"),  # the worker's spec["fsdp"]
                     "param_dtype": d.pop("fsdp_param_dtype"), "reduce_dtype": d.pop("fsdp_reduce_dtype"),
                     "reshard_root": d.pop("fsdp_reshard_root")}
        d["hf"] = d.pop("hf_config")  # the worker's spec["hf"]: None for the reference GPT
        return d


@dataclass(frozen=True)
class DistributedRun:
    """The rows of one launch (one per rank and strategy), the command, its wall time in seconds (start-up
    included), the seconds until every rank was ready (``ready_s``) and the message of each retry."""

    world_size: int
    rows: tuple[dict[str, Any], ...]
    command: tuple[str, ...]
    wall_s: float
    ready_s: float = float("nan")
    retries: tuple[str, ...] = ()
    log_tail: str = field(default="", repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "rows": list(self.rows), "command": list(self.command),
                "wall_s": self.wall_s, "ready_s": self.ready_s, "retries": list(self.retries)}

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

    def measured(self) -> list[dict[str, Any]]:
        """The rows with ``status == "ok"``; a :class:`LaunchError` naming every strategy's reason when none is."""
        ok = [r for r in self.rows if r.get("status") == "ok"]
        if not ok:
            reasons = {r.get("strategy", "?"): f"{r.get('status')}: {r.get('reason', '')}" for r in self.rows}
            raise LaunchError(f"the launch of {self.world_size} rank(s) measured nothing: every strategy failed or "
                              "was skipped; " + "; ".join(f"{s} {why}" for s, why in reasons.items()))
        return ok


@dataclass(frozen=True)
class _Attempts:
    """What :func:`_supervised` ran: the last attempt's outcome and command, every stage that ran (done ones of the
    first attempt, then the last attempt's), their ready times in seconds and the retry messages."""

    outcome: Outcome
    command: list[str]
    stages: tuple[Stage, ...]
    ready_s: tuple[float, ...]
    retries: tuple[str, ...]


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


def _check_timeouts(**timeouts: float) -> None:
    for name, value in timeouts.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise SetupError(f"{name} must be a positive number of seconds, got {value!r}")


def _retry_reason(out: Outcome, stages: list[Stage], start_timeout_s: float) -> str:
    """Why a failed attempt is worth one more (a rank not ready in time, a rendezvous or store timeout), or ""."""
    if out.failure == "start":
        return (f"rank(s) {', '.join(map(str, out.not_ready))} of {stages[out.stage].ranks} did not signal ready "
                f"(torch imported) within start_timeout_s={start_timeout_s:g} s")
    if out.failure or out.returncode == 0:
        return ""
    texts = [out.log, *(f.read_text(errors="replace") for st in stages for f in st.path.glob("rank*.error"))]
    hit = next((m for t in texts for m in [RENDEZVOUS_TIMEOUT.search(t)] if m), None)
    return f"the ranks' rendezvous timed out ({hit.group(0)})" if hit else ""


def _supervised(what: str, build: Callable[[int, int], tuple[list[str], list[Stage]]], *, timeout_s: float,
                start_timeout_s: float, threads_per_rank: int, root: Path) -> _Attempts:
    """Run ``build(attempt, first_stage)`` (its command and its stages, from stage ``first_stage`` on) under
    :func:`supervise`; after a start-up or rendezvous timeout, warn and run the stages not yet complete ONCE more."""
    done: list[Stage] = []
    ready_s: list[float] = []
    retries: list[str] = []
    for attempt in (0, 1):
        cmd, stages = build(attempt, len(done))
        out = supervise(cmd, stages, cwd=PACKAGE_ROOT, env=_env(threads_per_rank), log_path=root / f"log{attempt}",
                        start_timeout_s=start_timeout_s, timeout_s=timeout_s)
        reason = _retry_reason(out, stages, start_timeout_s) if attempt == 0 else ""
        if not reason:
            return _Attempts(out, cmd, tuple(done + stages), (*ready_s, *out.ready_s), tuple(retries))
        ok = next((i for i, st in enumerate(stages) if not st.complete()), len(stages))
        done, ready_s = done + stages[:ok], ready_s + list(out.ready_s[:ok])
        retries.append(f"{what}: {reason}; a cold or loaded machine starts ranks slowly, so its ranks were killed "
                       "and the launch is retried once")
        warnings.warn(retries[-1], RuntimeWarning, stacklevel=3)
    raise AssertionError("unreachable: the second attempt always returns")


def _raise_for(what: str, out: Outcome, retries: tuple[str, ...], timeout_s: float, start_timeout_s: float) -> None:
    """A :class:`LaunchError` for a run that was killed (start-up or step past its clock); nothing otherwise."""
    again = " (after one retry)" if retries else ""
    left = f"; pid(s) {', '.join(map(str, out.survivors))} survived SIGKILL" if out.survivors else ""
    if out.failure == "start":
        raise LaunchError(f"{what}: rank(s) {', '.join(map(str, out.not_ready))} did not signal ready within "
                          f"start_timeout_s={start_timeout_s:g} s{again}; the machine is too slow or too loaded for "
                          f"this many ranks: launch fewer, or raise start_timeout_s. Killed {out.killed} rank "
                          f"process(es){left}. Last lines of its log:\n{_tail(out.log)}")
    if out.failure == "timeout":
        ready = f" (in {out.ready_s[-1]:.1f} s)" if out.ready_s else ""
        raise LaunchError(f"{what} ran past timeout_s={timeout_s:g} s after its ranks were ready{ready} and was "
                          f"killed with its {out.killed} rank process(es){left}; raise timeout_s or shrink the spec. "
                          f"Last lines of its log:\n{_tail(out.log)}")


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
    """A WorkerSpec whose ``largest`` launch this machine can run and that measures something here."""
    if not isinstance(spec, WorkerSpec):
        raise SetupError(f"spec must be a memlab.run.distributed.launch.WorkerSpec, got {type(spec).__name__}")
    capacity = machine_capacity(spec)
    if not capacity.gpus and all(s in ACCELERATOR_ONLY for s in spec.strategies):
        raise SetupError(f"{', '.join(spec.strategies)} need(s) an accelerator and would be skipped on these CPU "
                         f"ranks: nothing to measure; add a strategy that runs on a CPU "
                         f"({', '.join(s for s in STRATEGIES if s not in ACCELERATOR_ONLY)})")
    capacity.check(largest)


def machine_capacity(spec: WorkerSpec) -> RankCapacity:
    """How many ranks of ``spec`` this machine runs at once (:mod:`memlab.run.distributed.capacity`): one per
    visible GPU for NCCL ranks (``device="auto"`` with GPUs), else bounded by CPU cores and memory."""
    import torch

    gpus = torch.cuda.device_count() if spec.device == "auto" and torch.cuda.is_available() else 0
    return rank_capacity(spec.config, spec.batch, spec.seq, gpus=gpus)


def _spec_json(spec: WorkerSpec, attempt: int, start_timeout_s: float) -> str:
    """The spec as the ranks read it, with the handshake on (memlab's launcher gives go) and the attempt number."""
    return json.dumps(spec.to_dict() | {"attempt": attempt, "handshake_timeout_s": start_timeout_s + GO_GRACE_S})


def run_script(script: Path | str, args: list[str], nproc_per_node: int, *, timeout_s: float = 180.0,
               threads_per_rank: int = 1) -> str:
    """Run any rank script under ``torchrun --standalone`` with the launcher's guarantees: killed with every rank
    after ``timeout_s`` (start-up included: a plain script has no handshake), one retry after a rendezvous or store
    timeout, a :class:`LaunchError` with the log's last lines on a non-zero exit. Returns the log."""
    _check_timeouts(timeout_s=timeout_s)
    what = f"torchrun {Path(script).name} with {nproc_per_node} rank(s)"
    cmd = [*torchrun_command(nproc_per_node), str(script), *map(str, args)]
    with tempfile.TemporaryDirectory(prefix="memlab-dist-") as tmp:
        run = _supervised(what, lambda attempt, first: (cmd, []), timeout_s=timeout_s,
                          start_timeout_s=timeout_s, threads_per_rank=threads_per_rank, root=Path(tmp))
    _raise_for(what, run.outcome, run.retries, timeout_s, timeout_s)
    if run.outcome.returncode != 0:
        raise LaunchError(f"{what} exited with {run.outcome.returncode}. Last lines of its log:\n"
                          f"{_tail(run.outcome.log)}")
    return run.outcome.log


def launch(spec: WorkerSpec, nproc_per_node: int, *, timeout_s: float = 120.0,
           start_timeout_s: float = START_TIMEOUT_S, threads_per_rank: int = 1) -> DistributedRun:
    """Run ``spec`` on ``nproc_per_node`` local ranks with the ``torchrun`` command line; every rank's rows.

    Every rank signals ready once torch is imported; the ranks get ``start_timeout_s`` seconds for that, then
    ``timeout_s`` seconds for the work (the clock starts when all are ready). A rank not ready in time, or a
    rendezvous/store timeout, is retried once with a RuntimeWarning (the message is also in
    :attr:`DistributedRun.retries`). Raises :class:`LaunchError` (with the failing rank's traceback, or the last
    lines of torchrun's log) when a rank fails, when a rank wrote nothing, or past either clock (torchrun and every
    rank are killed first). Raises :class:`SetupError` for more ranks than :func:`machine_capacity` allows.
    ``threads_per_rank`` sets OMP_NUM_THREADS so N ranks do not oversubscribe the CPU cores.
    """
    _check_timeouts(timeout_s=timeout_s, start_timeout_s=start_timeout_s)
    _check_spec(spec, nproc_per_node)
    what = f"torchrun with {nproc_per_node} rank(s)"
    with tempfile.TemporaryDirectory(prefix="memlab-dist-") as tmp:
        def build(attempt: int, first: int) -> tuple[list[str], list[Stage]]:
            path = Path(tmp) / f"attempt{attempt}"
            path.mkdir()
            return ([*torchrun_command(nproc_per_node), "-m", "memlab.run.distributed.worker",
                     _spec_json(spec, attempt, start_timeout_s), str(path)], [Stage(path, nproc_per_node)])

        run = _supervised(what, build, timeout_s=timeout_s, start_timeout_s=start_timeout_s,
                          threads_per_rank=threads_per_rank, root=Path(tmp))
        _raise_for(what, run.outcome, run.retries, timeout_s, start_timeout_s)
        rows = _collect(run.stages[0].path, nproc_per_node, run.outcome.returncode or 0, run.outcome.log)
    out = run.outcome
    ready_s = run.ready_s[0] if run.ready_s else float("nan")
    return DistributedRun(nproc_per_node, rows, tuple(run.command), out.wall_s, ready_s, run.retries, _tail(out.log))


def launch_sweep(spec: WorkerSpec, world_sizes: tuple[int, ...] = (1, 2, 4), *, timeout_s: float = 120.0,
                 start_timeout_s: float = START_TIMEOUT_S, threads_per_rank: int = 1) -> dict[int, DistributedRun]:
    """Run ``spec`` at each world size, one launch after another, from ONE launcher process.

    The launcher (``python -m memlab.run.distributed.worker --sweep``) calls torchrun's launcher API
    (``elastic_launch``, what the ``torchrun`` command runs) for each N and forks the ranks from itself on a CPU, so
    torch is imported once instead of N + 1 times per launch: the same ranks, rendezvous and collectives, a few
    seconds instead of tens. Each launch's ranks get ``start_timeout_s`` to be ready and then ``timeout_s`` for
    their work; the retry (the sizes not yet done) and the errors are :func:`launch`'s. ``wall_s`` of each run is
    the sweep's (its last attempt's).
    """
    sizes = tuple(world_sizes)
    if not sizes or any(not isinstance(n, int) or isinstance(n, bool) or n <= 0 for n in sizes):
        raise SetupError(f"world_sizes must be positive integers, got {world_sizes!r}")
    if len(set(sizes)) != len(sizes):
        raise SetupError(f"world_sizes repeat a size: {world_sizes!r}; list each once")
    _check_timeouts(timeout_s=timeout_s, start_timeout_s=start_timeout_s)
    _check_spec(spec, max(sizes))
    what = f"the launches over {sizes} rank(s)"
    with tempfile.TemporaryDirectory(prefix="memlab-dist-") as tmp:
        def build(attempt: int, first: int) -> tuple[list[str], list[Stage]]:
            path = Path(tmp) / f"attempt{attempt}"
            todo = sizes[first:]
            return ([sys.executable, "-m", "memlab.run.distributed.worker", "--sweep",
                     _spec_json(spec, attempt, start_timeout_s), str(path), ",".join(map(str, todo))],
                    [Stage(path / f"n{n}", n) for n in todo])

        run = _supervised(what, build, timeout_s=timeout_s, start_timeout_s=start_timeout_s,
                          threads_per_rank=threads_per_rank, root=Path(tmp))
        _raise_for(what, run.outcome, run.retries, timeout_s, start_timeout_s)
        code, log = run.outcome.returncode or 0, run.outcome.log
        out: dict[int, DistributedRun] = {}
        for n, stage, ready_s in zip(sizes, run.stages, (*run.ready_s, *[float("nan")] * len(sizes)), strict=False):
            path = stage.path
            if not stage.complete() and not list(path.glob("rank*.error")) and not (path / "rank0.json").exists():
                raise LaunchError(f"the launch with {n} rank(s) did not start or failed (exit {code}). "
                                  f"Last lines of its log:\n{_tail(log)}")
            rows = _collect(path, n, 0 if stage.complete() else code, log)
            out[n] = DistributedRun(n, rows, tuple(torchrun_command(n)), run.outcome.wall_s, ready_s, run.retries,
                                    _tail(log))
    return out
