"""Run under torchrun (gloo, CPU, 2 ranks): pipeline and tensor parallelism measured on real ranks.

``python -m torch.distributed.run --nproc_per_node 2 --standalone tests/scripts/dist_parallel.py OUT_DIR``:

- PP: each rank runs its stage of the reference GPT under torch.distributed.pipelining's Schedule1F1B and
  ScheduleGPipe (real sends and receives over gloo), every storage counted with LiveBytes
  (:func:`memlab.compare.pipeline.trace_stage`), next to :func:`memlab.predict.parallel.parallel_estimate`;
- TP: DTensor column/row-parallel blocks (:func:`memlab.tracing.tensor_parallel.tensor_parallel`) over a 2-rank gloo
  mesh, one AdamW step; the local parameter and gradient bytes and the step's peak (LiveBytes).

Each rank writes ``OUT_DIR/rank<R>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from memlab.compare.pipeline import trace_stage
from memlab.predict.models import preset
from memlab.predict.setup import Setup

CONFIG = preset("tiny-gpt")


def _local_bytes(tensors: object) -> int:
    seen: dict[int, int] = {}
    for t in tensors:  # type: ignore[attr-defined]
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        seen[id(st)] = st.nbytes()
    return sum(seen.values())


def tensor_parallel_step(rank: int, world: int) -> dict[str, int]:
    from torch.distributed.device_mesh import init_device_mesh

    from memlab.measure.live_bytes import LiveBytes
    from memlab.model.gpt import GPT
    from memlab.tracing.tensor_parallel import tensor_parallel

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = tensor_parallel(GPT(CONFIG), mesh, world)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    idx = torch.randint(0, CONFIG.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    params = _local_bytes(model.parameters())
    with LiveBytes(sample_every=None) as live:
        model(idx, idx).backward()
        grads = _local_bytes(p.grad for p in model.parameters())
        opt.step()
    return {"params_bytes": params, "grads_bytes": grads, "step_peak_bytes": live.peak_bytes}


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows: dict[str, object] = {"rank": rank, "world_size": world}
    for schedule in ("1f1b", "gpipe"):
        setup = Setup(batch=2, seq=64, pp=world, micro_batches=3, pp_schedule=schedule, optimizer="sgd")
        rows[f"pp_{schedule}"] = trace_stage(CONFIG, setup, rank).to_dict()
        dist.barrier()
    rows["tp"] = tensor_parallel_step(rank, world)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
