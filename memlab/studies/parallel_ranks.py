"""Pipeline and tensor parallelism measured on real ranks (torchrun: gloo on a CPU), next to their prediction.

:func:`measure_parallel_ranks` launches this file under ``torchrun``
(:func:`memlab.run.distributed.launch.run_script`: killed past its clock, one retry after a rendezvous timeout);
each rank

- runs its stage of the reference GPT under torch.distributed.pipelining's Schedule1F1B and ScheduleGPipe (real
  sends and receives), every storage counted (:func:`memlab.studies.pipeline.trace_stage`), next to
  :func:`memlab.predict.parallel.pipeline.parallel_estimate`;
- runs one AdamW step of DTensor column/row-parallel blocks (:func:`memlab.tracing.tensor_parallel.tensor_parallel`)
  over a gloo mesh, through the one training step (:func:`memlab.model.step.train_step`): its local parameter and
  gradient bytes, next to the estimate's tp shards plus the plan's replicated embedding/head
  (:func:`memlab.tracing.tensor_parallel.replicated_terms`), and the step's peak.

Each rank also counts what it sends (:class:`memlab.measure.comm.CommCounter`, torch's own c10d calls): the
pipeline's sends next to :func:`memlab.predict.parallel.communication.pp_sent_bytes`, the tensor-parallel all-reduces
next to :func:`memlab.predict.parallel.communication.tp_allreduce_buffer_bytes`.

:func:`parallel_ranks_ledger` turns the ranks' rows into one DataFrame (layout, rank, quantity, predicted, measured,
note). ``memlab shard --layouts pp,tp`` prints it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup

SCHEDULES = ("1f1b", "gpipe")
VOTE_BYTES = 4
"""What a real stage sends before its first micro-batch: torch.distributed.pipelining's warm-up vote, one int32
(``_PipelineStage`` in torch/distributed/pipelining/stage.py), counted by :class:`memlab.measure.comm.CommCounter`."""


def pp_setup(schedule: str, ranks: int, batch: int = 2, seq: int = 64) -> Setup:
    """The pipeline setup the ranks run: ``ranks`` stages, ``ranks + 1`` micro-batches, fp32 SGD (no moments)."""
    return Setup(batch=batch, seq=seq, pp=ranks, micro_batches=ranks + 1, pp_schedule=schedule, optimizer="sgd")


def _local_bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        seen[id(st)] = st.nbytes()
    return sum(seen.values())


def _tensor_parallel_step(config: TransformerConfig, batch: int, seq: int, world: int) -> dict[str, int]:
    """One fp32 AdamW step (for-loop) of the tensor-parallel GPT on this rank, run by
    :func:`memlab.model.step.train_step` (forward, backward, optimizer step; gradients left in place): the local
    parameter bytes before it, the local gradient bytes as backward leaves them, the step's peak and what it
    all-reduced."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from memlab.measure.comm import CommCounter
    from memlab.measure.live_bytes import LiveBytes
    from memlab.model.step import Meter, train_step, training_step
    from memlab.predict.spec.precision import precision_policy
    from memlab.tracing.tensor_parallel import tensor_parallel_gpt

    class GradBytes(Meter):
        """Reads the model's local gradient bytes when the backward phase ends (before the optimizer step)."""

        def __init__(self, model: torch.nn.Module) -> None:
            self.model, self.bytes = model, 0

        @contextlib.contextmanager
        def phase(self, step: Any, name: str) -> Iterator[None]:
            yield
            if name == "backward":
                self.bytes = _local_bytes(p.grad for p in self.model.parameters())

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = tensor_parallel_gpt(config, mesh, world)
    step = training_step(model, precision_policy("fp32"), torch.device("cpu"),
                         lambda ps: torch.optim.AdamW(ps, foreach=False))
    idx = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    params = _local_bytes(model.parameters())
    grads = GradBytes(model)
    with LiveBytes(sample_every=None) as live, CommCounter() as comm:
        train_step(step, lambda: model(idx, idx), meter=grads, zero_grad=False)
    return {"params_bytes": params, "grads_bytes": grads.bytes, "step_peak_bytes": live.peak_bytes,
            "comm": comm.totals().to_dict()}


def rank_main(spec: dict[str, Any], out_dir: Path) -> None:
    """One rank: both pipeline schedules, then the tensor-parallel step; writes ``out_dir/rank<R>.json``."""
    import torch.distributed as dist

    from memlab.measure.comm import CommCounter
    from memlab.studies.pipeline import trace_stage

    config = preset(spec["preset"])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows: dict[str, Any] = {"rank": rank, "world_size": world, "preset": spec["preset"]}
    for schedule in SCHEDULES:
        with CommCounter() as comm:
            stage = trace_stage(config, pp_setup(schedule, world, spec["batch"], spec["seq"]), rank)
        rows[f"pp_{schedule}"] = {**stage.to_dict(), "comm": comm.totals().to_dict()}
        dist.barrier()
    rows["tp"] = _tensor_parallel_step(config, spec["batch"], spec["seq"], world)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


def measure_parallel_ranks(preset_name: str = "tiny-gpt", ranks: int = 2, *, batch: int = 2, seq: int = 64,
                           timeout_s: float = 240.0) -> list[dict[str, Any]]:
    """Launch ``ranks`` gloo ranks running :func:`rank_main`; their rows, rank order."""
    from memlab.run.distributed.launch import run_script

    spec = json.dumps({"preset": preset_name, "batch": batch, "seq": seq})
    with tempfile.TemporaryDirectory(prefix="memlab-parallel-") as tmp:
        run_script(Path(__file__), [spec, tmp], ranks, timeout_s=timeout_s)
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(ranks)]


def parallel_ranks_ledger(rows: list[dict[str, Any]], *, batch: int = 2, seq: int = 64) -> Any:
    """Predicted next to measured, per layout, rank and quantity (bytes); the peak's note names its bound."""
    import pandas as pd

    from memlab.predict.estimate import estimate
    from memlab.predict.parallel.communication import pp_sent_bytes, tp_allreduce_buffer_bytes
    from memlab.predict.parallel.pipeline import micro_batch_bytes, parallel_estimate
    from memlab.tracing.tensor_parallel import replicated_terms

    config = preset(rows[0]["preset"])
    world = rows[0]["world_size"]
    out = []
    for schedule in SCHEDULES:
        setup = pp_setup(schedule, world, batch, seq)
        pred = parallel_estimate(config, setup, device_type="cpu").rows
        boundary = micro_batch_bytes(config, setup, device_type="cpu").boundary
        for r in rows:
            got, row = r[f"pp_{schedule}"], pred[r["rank"]]
            out.append({"layout": f"pp {schedule}", "rank": r["rank"], "quantity": "held after the step",
                        "predicted": row.end_bytes, "measured": got["end_bytes"], "note": "exact"})
            out.append({"layout": f"pp {schedule}", "rank": r["rank"], "quantity": "peak",
                        "predicted": row.peak_bytes, "measured": got["peak_bytes"],
                        "note": "a bound: gradients not yet allocated at the peak moment and the backward's "
                        "temporaries as the estimator bounds them"})
            sent = pp_sent_bytes(boundary, setup.micro_batches, world, r["rank"])
            out.append({"layout": f"pp {schedule}", "rank": r["rank"], "quantity": "bytes sent",
                        "predicted": int(sent) + VOTE_BYTES, "measured": got["comm"]["bytes"].get("send", 0),
                        "note": f"the stage boundary per micro-batch, each way [narayanan2021] + torch's "
                        f"{VOTE_BYTES} B warm-up vote (named)"})
    tp_setup = Setup(batch=batch, seq=seq, tp=world)
    bd = estimate(config, tp_setup, device_type="cpu")
    extra = replicated_terms(config, tp_setup)["replicated embedding/head parameters"]
    for r in rows:
        for key, value in (("params_bytes", bd.params_bytes), ("grads_bytes", bd.grads_bytes)):
            out.append({"layout": f"tp {world}", "rank": r["rank"], "quantity": key.removesuffix("_bytes"),
                        "predicted": value + extra, "measured": r["tp"][key],
                        "note": "estimate + the plan's replicated embedding/head (named)"})
        reduced = tp_allreduce_buffer_bytes(batch * seq, config.d_model, config.n_layers, 4,
                                            column_modules=column_modules(config))
        out.append({"layout": f"tp {world}", "rank": r["rank"], "quantity": "all-reduce buffer bytes",
                    "predicted": reduced, "measured": r["tp"]["comm"]["bytes"].get("all_reduce", 0),
                    "note": f"{2 + column_modules(config)} all-reduces a block: torch's plan reduces each "
                    "column-parallel module's input gradient (Megatron's fused q/k/v and gate/up: 4)"})
    return pd.DataFrame(out)


def column_modules(config: TransformerConfig) -> int:
    """Column-parallel modules in one reference GPT block under :data:`~memlab.tracing.tensor_parallel.TP_PLAN`:
    q, k, v and up, plus gate in a SwiGLU MLP."""
    return 3 + (2 if config.mlp == "swiglu" else 1)


if __name__ == "__main__":  # under torchrun: python -m torch.distributed.run ... parallel_ranks.py SPEC OUT_DIR
    rank_main(json.loads(sys.argv[1]), Path(sys.argv[2]))
