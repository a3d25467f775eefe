"""One rank of a data-parallel memory experiment, run under torchrun by :func:`memlab.run.distributed.launch`.

``python -m torch.distributed.run --nproc-per-node N --standalone -m memlab.run.distributed.worker SPEC_JSON OUT_DIR``
runs every strategy of the spec on the reference GPT, one after the other in the same process group (process
start-up is the slow part of a launch, so one launch serves all strategies of one N):

- ``ddp``: ``DistributedDataParallel``, AdamW (ZeRO stage 0);
- ``zero1``: DDP + ``torch.distributed.optim.ZeroRedundancyOptimizer`` (AdamW states partitioned: stage 1);
- ``fsdp2-zero2``: FSDP2 ``fully_shard`` [pytorch-fsdp2] by :func:`memlab.model.fsdp.shard_model` (the plan the
  trace and the estimator use; the spec's ``fsdp`` dict may name ``units``, ``param_dtype``, ``reduce_dtype`` and
  where the ``loss`` is computed), ``reshard_after_forward=False``
  (parameters stay gathered from forward to backward: ZeRO-2-like memory with sharded states and gradients);
- ``fsdp2-zero3``: the same with ``reshard_after_forward=True`` (ZeRO-3: each block re-gathered in backward);
- ``fsdp2-offload``: ZeRO-3 plus ``CPUOffloadPolicy`` (sharded parameters, gradients and AdamW states in host
  memory; needs an accelerator, skipped with the reason on a CPU-only run).

The model is the reference GPT of ``spec["config"]``, or, with ``spec["hf"]`` (a Hugging Face config.json's dict,
``WorkerSpec.hf_config``), ``AutoModelForCausalLM.from_config`` of it (:func:`memlab.model.hf.build_hf_model`), its
decoder layers sharded as the reference GPT's blocks are and its loss its own (:func:`memlab.model.fsdp.step_loss`).
For each it trains ``steps`` steps (:func:`memlab.model.step.train_step`: fp32, AdamW's for-loop, gradients freed by
``zero_grad``; synthetic tokens, a different batch per rank) and reports, per rank:
exact local bytes of parameters, gradients and optimizer state (:func:`memlab.measure.accounting.model_states`,
on the device and on the host), the largest bytes of gathered (unsharded) parameters seen during a step, and
every collective the step issued (counted at the dispatcher, ``c10d::*`` ops, which DDP's C++ reducer and FSDP2's
Python code both go through), as ZeRO's volume convention (:mod:`memlab.predict.parallel.communication`).

Under memlab's launcher a rank first signals ready and waits for go (:mod:`memlab.run.distributed.handshake`), so
``init_process_group`` starts with every rank present. DDP (and ZeRO-1 under it) over an MoE model sets
``find_unused_parameters``: an expert no token chose has no gradient. Each rank writes ``OUT_DIR/rank<R>.json`` (a
list of rows) or, on failure, ``OUT_DIR/rank<R>.error`` with the traceback, then exits non-zero so torchrun stops
the others.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from memlab.device import device_type
from memlab.measure.accounting import model_states, storage_key
from memlab.measure.cuda import synchronize
from memlab.model.fsdp import step_loss
from memlab.model.gpt import GPT
from memlab.model.hf import build_hf_model
from memlab.model.step import Meter, TrainingStep, token_batch, train_step
from memlab.predict.families.reader import from_hf
from memlab.predict.parallel.communication import collective_volume_bytes
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.precision import precision_policy
from memlab.run.distributed.handshake import handshake

STRATEGIES = ("ddp", "zero1", "fsdp2-zero2", "fsdp2-zero3", "fsdp2-offload")
ACCELERATOR_ONLY = ("fsdp2-offload",)
"""Strategies a CPU-only run skips (with the reason): offloading moves shards from an accelerator to the host."""
PROCESS_GROUP_TIMEOUT_S = 300.0
"""Seconds ``init_process_group``'s store may wait for a peer and each collective may take. memlab's launcher
starts the rendezvous only when every rank has imported torch (the handshake), so this covers a rank descheduled on
a loaded machine (N ranks time-sharing few cores), not a slow import; five times the 60 s that ran out in memlab
issue 23. The launcher's own ``timeout_s`` still stops a hung launch sooner."""

# c10d op -> (collective, index of the argument holding the full buffer). Functional collectives
# (_c10d_functional, used by DTensor) give the local input and the group size instead.
_C10D = {
    "allreduce_": ("all_reduce", 0), "allreduce_coalesced_": ("all_reduce", 0),
    "_allgather_base_": ("all_gather", 0), "allgather_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "broadcast_": ("broadcast", 0),
}
_FUNCTIONAL = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter", "broadcast": "broadcast"}


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, list | tuple):
        return sum(_nbytes(y) for y in x)
    return 0


class StepProbe(TorchDispatchMode):
    """Counts the collectives dispatched while active and samples the bytes of gathered parameters.

    ``params`` is a callable returning the model's currently registered parameters: FSDP2 registers the
    unsharded (plain) tensors while a module is gathered and the DTensor shards otherwise, so the plain ones
    are what is gathered at that moment. Sampling happens at every dispatched op (cheap for small models).
    """

    def __init__(self, params: Any, sample: bool) -> None:
        super().__init__()
        self.params, self.sample = params, sample
        self.comm: dict[str, dict[str, int]] = {}
        self.gathered_peak_bytes = 0

    def _record(self, op: str, buffer_bytes: int) -> None:
        row = self.comm.setdefault(op, {"calls": 0, "buffer_bytes": 0, "volume_bytes": 0})
        row["calls"] += 1
        row["buffer_bytes"] += buffer_bytes
        row["volume_bytes"] += collective_volume_bytes(op, buffer_bytes)

    def _gathered(self) -> int:
        seen, total = set(), 0
        for p in self.params():
            if type(p).__name__ == "DTensor":
                continue
            key = storage_key(p)
            if key is not None and key not in seen:
                seen.add(key)
                total += p.untyped_storage().nbytes()
        return total

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        ns, _, name = str(func.name()).partition("::")
        if ns == "c10d" and name in _C10D:
            op, i = _C10D[name]
            self._record(op, _nbytes(args[i]))
        elif ns == "_c10d_functional" and name in _FUNCTIONAL:
            op = _FUNCTIONAL[name]
            size = _nbytes(args[0]) * (args[2] if op == "all_gather" else 1)
            self._record(op, size)
        out = func(*args, **kwargs)
        if self.sample:
            self.gathered_peak_bytes = max(self.gathered_peak_bytes, self._gathered())
        return out


class _RankStep(Meter):
    """One step on this rank: ``probe`` active from the forward to the end of the optimizer step, timed between
    synchronizes; on the ``last`` step also the gradients as the optimizer sees them (before its step; FSDP2: the
    reduced shards) and the states after it, on the device and on the host."""

    def __init__(self, wrapped: torch.nn.Module, optimizer: Any, device: torch.device, probe: StepProbe,
                 last: bool) -> None:
        self.wrapped, self.optimizer, self.device, self.probe, self.last = wrapped, optimizer, device, probe, last
        self.t0 = 0.0
        self.time_s: float | None = None
        self.grads: int | None = None
        self.states: dict[str, Any] | None = None

    @contextlib.contextmanager
    def phase(self, step: Any, name: str) -> Iterator[None]:
        if name == "forward":
            synchronize(self.device)
            self.t0 = time.perf_counter()
            self.probe.__enter__()
        try:
            yield
        except BaseException:
            if name != "zero_grad":
                self.probe.__exit__(None, None, None)
            raise
        if name == "backward" and self.last:
            self.grads = model_states(self.wrapped, None, device=self.device).grads_bytes
        elif name == "optimizer step":
            self.probe.__exit__(None, None, None)
            synchronize(self.device)
            self.time_s = time.perf_counter() - self.t0
            if self.last:
                self.states = {"device": model_states(self.wrapped, self.optimizer, device=self.device),
                               "host": model_states(self.wrapped, self.optimizer, device=torch.device("cpu"))}


def _wrap(strategy: str, model: torch.nn.Module, device: torch.device, config: TransformerConfig,
          fsdp: dict[str, Any] | None = None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The strategy applied to ``model`` (the reference GPT or a transformers causal LM; ``config`` its memlab
    config) and its AdamW; FSDP2 strategies by :func:`memlab.model.fsdp.shard_model`
    with the spec's ``fsdp`` plan (``units``, ``param_dtype``, ``reduce_dtype``, ``reshard_root``; defaults: blocks,
    none, fp32, False)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    from memlab.model.fsdp import shard_model

    fsdp = fsdp or {}
    ids = [device.index] if device.type == "cuda" else None
    # An MoE expert that no token of this rank's batch chose has no gradient: DDP's reducer would wait for it
    # forever (and the peers in the all-reduce with it). find_unused_parameters marks such parameters ready after
    # each forward (a graph traversal per step), as torch's DDP documentation prescribes for models like this one.
    unused = config.n_experts > 1
    if strategy == "ddp":
        ddp = DistributedDataParallel(model, device_ids=ids, find_unused_parameters=unused)
        return ddp, torch.optim.AdamW(ddp.parameters(), foreach=False)
    if strategy == "zero1":
        ddp = DistributedDataParallel(model, device_ids=ids, find_unused_parameters=unused)
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, foreach=False)
    shard_model(model, zero_stage=2 if strategy == "fsdp2-zero2" else 3, units=fsdp.get("units", "blocks"),
                param_dtype=fsdp.get("param_dtype", "none"), reduce_dtype=fsdp.get("reduce_dtype", "fp32"),
                offload=strategy == "fsdp2-offload", reshard_root=bool(fsdp.get("reshard_root", False)))
    return model, torch.optim.AdamW(model.parameters(), foreach=False)


def run_strategy(strategy: str, spec: dict[str, Any], rank: int, world: int, device: torch.device) -> dict[str, Any]:
    """Train ``spec["steps"]`` steps under ``strategy`` on this rank and measure the last one (see module doc)."""
    hf = spec.get("hf")
    cfg = from_hf(hf, name=spec["config"]["name"]) if hf is not None else TransformerConfig(**spec["config"])
    batch, seq, seed = int(spec["batch"]), int(spec["seq"]), int(spec.get("seed", 0))
    base = {"strategy": strategy, "rank": rank, "world_size": world, "device": str(device),
            "backend": dist.get_backend(), "model": cfg.name, "batch": batch, "seq": seq, "status": "ok"}
    if strategy in ACCELERATOR_ONLY and device.type != "cuda":
        return base | {"status": "skipped", "reason": "CPUOffloadPolicy moves shards from an accelerator to the "
                       "host; on a CPU-only run both are the same memory"}
    torch.manual_seed(seed)
    init_device = "cpu" if strategy == "fsdp2-offload" else device
    if hf is not None:  # transformers' modelling code, built as memlab builds it everywhere (fp32, eager)
        model = build_hf_model(hf, attn_implementation=spec.get("attention", "eager"), device=init_device, seed=seed)
    else:
        model = GPT(cfg, attention=spec.get("attention", "eager"), device=init_device)
    wrapped, opt = _wrap(strategy, model, device, cfg, spec.get("fsdp"))
    idx, tgt = token_batch(cfg.vocab_size, batch, seq, device, seed + 1000 * rank)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step = TrainingStep(precision_policy("fp32"), device, opt)
    n_steps = int(spec.get("steps", 2))
    meter = None
    for i in range(n_steps):
        last = i == n_steps - 1
        probe = StepProbe(lambda w=wrapped: list(w.parameters()), sample=last and strategy.startswith("fsdp2"))
        meter = _RankStep(wrapped, opt, device, probe, last)
        where = spec.get("fsdp", {}).get("loss", "inside") if strategy.startswith("fsdp2") else "inside"
        train_step(step, lambda w=wrapped, where=where: step_loss(w, idx, tgt, where), meter=meter, label=i)
    assert meter is not None and meter.states is not None
    probe, grads, dev, host = meter.probe, meter.grads, meter.states["device"], meter.states["host"]
    row = base | {
        "params_bytes": dev.params_bytes, "grads_bytes": grads, "optimizer_bytes": dev.optimizer_bytes,
        "optimizer_by_key": dev.optimizer_by_key,
        "host_params_bytes": host.params_bytes if device.type == "cuda" else 0,
        "host_optimizer_bytes": host.optimizer_bytes if device.type == "cuda" else 0,
        "gathered_peak_bytes": probe.gathered_peak_bytes, "comm": probe.comm,
        "comm_volume_bytes": sum(c["volume_bytes"] for c in probe.comm.values()),
        "step_time_s": meter.time_s, "param_count": cfg.param_count(),
        "family": cfg.impl.family,
    }
    if device.type == "cuda":
        row["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    del wrapped, opt, model, probe, step, meter
    gc.collect()
    return row


def _guarded(strategy: str, spec: dict[str, Any], rank: int, world: int, device: torch.device) -> dict[str, Any]:
    """:func:`run_strategy`, with an error that every rank raises alike (an unsupported option on this device, say)
    recorded as a row with ``status="error"`` so the other strategies still run."""
    try:
        return run_strategy(strategy, spec, rank, world, device)
    except (RuntimeError, ValueError, NotImplementedError, AssertionError) as exc:
        gc.collect()
        dist.barrier()
        return {"strategy": strategy, "rank": rank, "world_size": world, "device": str(device), "status": "error",
                "reason": f"{type(exc).__name__}: {exc}"[:500]}


def rank_main(spec: dict[str, Any], out_dir: Path) -> None:
    """Initialise the process group (NCCL on CUDA, gloo on CPU), run every strategy, write this rank's rows.

    Under memlab's launcher (``handshake_timeout_s`` in the spec) the rank first signals ready and waits for go
    (:mod:`memlab.run.distributed.handshake`), so ``init_process_group`` starts with every rank present."""
    out_dir = Path(out_dir)
    if "handshake_timeout_s" in spec:
        handshake(out_dir, int(os.environ["RANK"]), int(spec.get("attempt", 0)), float(spec["handshake_timeout_s"]))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_type(spec.get("device", "auto")) == "cuda"
    if use_cuda and local >= torch.cuda.device_count():
        raise RuntimeError(f"local rank {local} has no GPU ({torch.cuda.device_count()} visible): launch at most that "
                           "many ranks per node, or set WorkerSpec(device='cpu') for gloo ranks")
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = spec.get("backend") or ("nccl" if use_cuda else "gloo")
    timeout = timedelta(seconds=float(spec.get("collective_timeout_s", PROCESS_GROUP_TIMEOUT_S)))
    dist.init_process_group(backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        if spec.get("fail_rank") == rank:
            raise RuntimeError(f"rank {rank} fails on purpose (WorkerSpec.fail_rank={rank})")
        rows = [_guarded(s, spec, rank, world, device) for s in spec["strategies"]]
    except BaseException:
        (out_dir / f"rank{rank}.error").write_text(traceback.format_exc())
        raise
    gc.collect()  # free gloo work handles while the group is alive
    (out_dir / f"rank{rank}.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def sweep_main(spec: dict[str, Any], out_dir: Path, world_sizes: list[int]) -> int:
    """Launch ``rank_main`` on each world size in turn through torchrun's own launcher (``elastic_launch``, the
    function behind ``torchrun``), forking the ranks from this process so torch and FSDP are imported once.

    Rows go to ``out_dir/n<N>/rank<R>.json``. Returns 0, or 1 after the first failed launch.
    """
    # DDP and FSDP import these at first use: imported here, before forking, they are imported once.
    import torch._dynamo
    import torch.distributed.fsdp
    import torch.distributed.optim
    import torch.nn.parallel
    if spec.get("hf") is not None:  # transformers and the family's modelling module, once (a meta build: no bytes)
        from transformers import AutoModelForCausalLM

        from memlab.model.hf import hf_config, quiet_transformers

        with quiet_transformers(), torch.device("meta"):
            AutoModelForCausalLM.from_config(hf_config(spec["hf"]))
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    method = "spawn" if device_type(spec.get("device", "auto")) == "cuda" else "fork"
    for n in world_sizes:
        path = Path(out_dir) / f"n{n}"
        path.mkdir(parents=True, exist_ok=True)
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n, rdzv_backend="c10d",
                              rdzv_endpoint="localhost:0", run_id=f"memlab-{os.getpid()}-{n}", max_restarts=0,
                              start_method=method, monitor_interval=0.05)
        try:
            elastic_launch(config, rank_main)(spec, path)
        except ChildFailedError as exc:
            print(f"launch with {n} rank(s) failed: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--sweep":
        sys.exit(sweep_main(json.loads(sys.argv[2]), Path(sys.argv[3]), [int(n) for n in sys.argv[4].split(",")]))
    rank_main(json.loads(sys.argv[1]), Path(sys.argv[2]))
