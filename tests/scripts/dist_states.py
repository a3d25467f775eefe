"""Run under torchrun (gloo, CPU): what memlab's accounting reports on each rank under FSDP2 and ZeRO-1.

``python -m torch.distributed.run --nproc_per_node N --standalone tests/scripts/dist_states.py OUT_DIR`` trains one
step of a tiny GPT (odd vocab and position rows, so FSDP2 has to pad its dim-0 shards) twice:

- FSDP2: ``fully_shard`` on every block and on the root, AdamW over the sharded (DTensor) parameters;
- ZeRO-1: a plain model with ``torch.distributed.optim.ZeroRedundancyOptimizer`` (AdamW);
- FSDP1: ``FullyShardedDataParallel`` (one flat parameter, ``device_id=cpu``, ``use_orig_params=False``), AdamW.

Each rank writes ``OUT_DIR/rank<R>.json`` with its config and :func:`memlab.measure.accounting.model_states` of
both; the test computes the expected shard sizes from the sharding rules and compares.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

from memlab.measure.accounting import model_states
from memlab.model.gpt import GPT
from memlab.predict.spec.model import TransformerConfig, preset


def config() -> TransformerConfig:
    """tiny-gpt with 511 vocabulary rows and 33 position rows: dim 0 does not divide by 2."""
    return preset("tiny-gpt").with_(vocab_size=511, max_seq=33)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: TransformerConfig) -> None:
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    model(idx, idx).backward()
    optimizer.step()


def measure(rank: int, world: int) -> dict:
    """Both runs on this rank; every model, optimizer and pending collective handle dies when this returns."""
    cfg = config()
    torch.manual_seed(0)

    sharded = GPT(cfg)
    for block in sharded.blocks:
        fully_shard(block)
    fully_shard(sharded)
    opt = torch.optim.AdamW(sharded.parameters(), foreach=False)
    _step(sharded, opt, cfg)
    fsdp = model_states(sharded, opt)
    is_dtensor = all(type(p).__name__ == "DTensor" for p in sharded.parameters())

    plain = GPT(cfg)
    zero = ZeroRedundancyOptimizer(plain.parameters(), optimizer_class=torch.optim.AdamW, foreach=False)
    _step(plain, zero, cfg)
    zero1 = model_states(plain, zero)

    torch.manual_seed(0)
    flat = FullyShardedDataParallel(GPT(cfg), device_id=torch.device("cpu"), use_orig_params=False)
    flat_opt = torch.optim.AdamW(flat.parameters(), foreach=False)
    _step(flat, flat_opt, cfg)
    fsdp1 = model_states(flat, flat_opt)
    flat_numel = [p.numel() for p in flat.parameters()]

    return {"rank": rank, "world_size": world, "config": cfg.to_dict(), "fsdp_params_are_dtensors": is_dtensor,
            "fsdp": fsdp.to_dict() | {"optimizer_by_key": fsdp.optimizer_by_key},
            "zero1": zero1.to_dict() | {"optimizer_by_key": zero1.optimizer_by_key},
            "fsdp1": fsdp1.to_dict() | {"optimizer_by_key": fsdp1.optimizer_by_key, "flat_numel": flat_numel}}


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    result = measure(rank, world)
    # Free FSDP/ZeRO state (and the gloo work handles it may hold) while the process group is alive: work objects
    # destroyed after destroy_process_group or at interpreter exit can abort the process.
    gc.collect()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()  # no rank tears the group down while another is still in a collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
