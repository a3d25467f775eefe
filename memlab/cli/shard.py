"""``memlab shard``: launch real data-parallel ranks (torchrun) and print, per strategy, the bytes one rank holds
and the bytes its collectives move, next to the estimator and the ZeRO paper.

``memlab shard --preset tiny-gpt --ranks 2 --strategies ddp,fsdp2-zero3`` runs
:func:`memlab.run.distributed.launch` (gloo on a CPU, NCCL on GPUs) and prints the ledger of
:func:`memlab.compare.sharding.sharding_ledger`; ``--json`` prints the rows instead.
"""

from __future__ import annotations

import argparse
import json

from memlab.errors import MemlabError


def shard_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``memlab shard``."""
    from memlab.cli import _positive_float, _positive_int, add_model_arguments

    add_model_arguments(p)
    p.add_argument("--ranks", type=_positive_int, default=2, metavar="N", help="ranks on this node (default 2)")
    p.add_argument("--strategies", default="ddp,zero1,fsdp2-zero2,fsdp2-zero3,fsdp2-offload",
                   help="comma-separated: ddp, zero1, fsdp2-zero2, fsdp2-zero3, fsdp2-offload")
    p.add_argument("--batch", type=_positive_int, default=2, metavar="B", help="micro-batch per rank")
    p.add_argument("--seq", type=_positive_int, default=32, metavar="S")
    p.add_argument("--steps", type=_positive_int, default=1, help="steps per strategy; the last one is measured")
    p.add_argument("--cpu", action="store_true", help="gloo on CPU even when GPUs are present")
    p.add_argument("--timeout", type=_positive_float, default=300.0, metavar="SECONDS")
    p.add_argument("--json", action="store_true", help="print the ranks' rows as JSON")


def run_shard(args: argparse.Namespace) -> int:
    """Launch, then print the ledger (or the rows)."""
    from memlab.cli import model_from_args
    from memlab.compare.sharding import sharding_ledger
    from memlab.run.distributed import WorkerSpec, launch

    config = model_from_args(args)
    if isinstance(config, int):
        raise MemlabError("memlab shard runs a real model: give --preset or explicit dimensions, not --params")
    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    spec = WorkerSpec(config=config, batch=args.batch, seq=args.seq, strategies=strategies, steps=args.steps,
                      device="cpu" if args.cpu else "auto")
    run = launch(spec, args.ranks, timeout_s=args.timeout)
    if args.json:
        print(json.dumps(run.to_dict(), indent=1))
        return 0
    ledger = sharding_ledger(list(run.rows), config)
    print(f"{config.name}: {args.ranks} rank(s), {run.wall_s:.1f} s; bytes per rank (mean over ranks)")
    print(ledger[["experiment", "component", "predicted", "measured", "note"]].to_string(index=False))
    skipped = {r["strategy"]: r.get("reason", "") for r in run.rows if r.get("status") == "skipped"}
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    return 0
