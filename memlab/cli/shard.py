"""``memlab shard``: launch real data-parallel ranks (torchrun) and print, per strategy, the bytes one rank holds
and the bytes its collectives move, next to the estimator and the ZeRO paper.

``memlab shard --preset tiny-gpt --ranks 2 --strategies ddp,fsdp2-zero3`` runs
:func:`memlab.run.distributed.launch` (gloo on a CPU, NCCL on GPUs) and prints the ledger of
:func:`memlab.compare.sharding.sharding_ledger`; ``--json`` prints the rows instead. More ranks than the machine
runs at once, a repeated strategy, or strategies that all skip on this device are refused before any launch
(``memlab: error: ...``, exit 2); so is a launch that measured nothing, with each strategy's reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from memlab.cli.args import positive_float, positive_int
from memlab.errors import MemlabError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``memlab shard`` (self-contained: the model is a preset, the rest is the launch)."""
    p.add_argument("--preset", default="tiny-gpt", metavar="NAME",
                   help="the model, the reference GPT on every rank (default tiny-gpt; a preset memlab ships a "
                   "published config of needs ref:NAME: the reference GPT with its sizes)")
    p.add_argument("--ranks", type=positive_int, default=2, metavar="N", help="ranks on this node (default 2)")
    p.add_argument("--strategies", default="ddp,zero1,fsdp2-zero2,fsdp2-zero3,fsdp2-offload",
                   help="comma-separated: ddp, zero1, fsdp2-zero2, fsdp2-zero3, fsdp2-offload")
    p.add_argument("--batch", type=positive_int, default=2, metavar="B", help="micro-batch per rank")
    p.add_argument("--seq", type=positive_int, default=32, metavar="S")
    p.add_argument("--steps", type=positive_int, default=1, help="steps per strategy; the last one is measured")
    p.add_argument("--cpu", action="store_true", help="gloo on CPU even when GPUs are present")
    p.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS",
                   help="seconds the ranks may work once all have started; then every rank is killed (default 300; "
                        "start-up has its own bound, START_TIMEOUT_S in memlab.run.distributed.launch)")
    p.add_argument("--hf", metavar="PATH", help="not supported: the ranks run the reference GPT (a Hugging Face "
                   "model is not sharded here); memlab estimate --hf PATH --zero N gives its sharded formula")
    p.add_argument("--layouts", action="store_true",
                   help="run pipeline (1F1B and GPipe over --ranks stages, --ranks + 1 micro-batches) and tensor "
                   "parallelism (--ranks ways) instead of the data-parallel strategies "
                   "(memlab.compare.parallel_ranks), then trace TP, TP + SP and ring-attention CP over a fake "
                   "--ranks-rank group, every rank (memlab.compare.parallel_traces)")
    p.add_argument("--json", action="store_true", help="print the ranks' rows as JSON")


def run(args: argparse.Namespace) -> int:
    """Launch, then print the ledger (or the rows)."""
    from memlab.cli.hf_source import shipped
    from memlab.compare.sharding import sharding_ledger
    from memlab.predict.models import preset
    from memlab.run.distributed.launch import WorkerSpec, launch

    if args.hf is not None:
        raise MemlabError("memlab shard runs the reference GPT on each rank; a Hugging Face model is not sharded here "
                          f"(no FSDP2 wrapping of transformers' modules): use memlab estimate --hf {args.hf} --zero 3 "
                          "--world-size N for its sharded formula")
    name = args.preset.removeprefix("ref:")
    config = preset(name)
    if not args.preset.startswith("ref:") and shipped(config.name) is not None:
        raise MemlabError(f"memlab shard runs the reference GPT on each rank, and --preset {args.preset} names the "
                          f"published model (its shipped config): say --preset ref:{config.name} for the reference GPT "
                          f"with {config.name}'s sizes, or memlab estimate --preset {config.name} --zero 3 "
                          "--world-size N for the published model's sharded formula")
    args.preset = name
    if args.layouts:
        return _run_layouts(args, config)
    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    spec = WorkerSpec(config=config, batch=args.batch, seq=args.seq, strategies=strategies, steps=args.steps,
                      device="cpu" if args.cpu else "auto")
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            result = launch(spec, args.ranks, timeout_s=args.timeout)
        finally:  # a retry's message, also when the retry failed too
            for note in notes:
                print(f"memlab: note: {note.message}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
        return 0
    ledger = sharding_ledger(result.measured(), config)
    print(f"{config.name}: {args.ranks} rank(s), {result.wall_s:.1f} s; bytes per rank (mean over ranks)")
    print(ledger[["experiment", "component", "predicted", "measured", "note"]].to_string(index=False))
    for row in result.rows:
        if row.get("status") != "ok" and row.get("rank") == 0:
            print(f"{row['status']} {row['strategy']}: {row.get('reason', '')}")
    return 0


def _run_layouts(args: argparse.Namespace, config: object) -> int:
    """``memlab shard --layouts``: pipeline and tensor-parallel ranks measured, next to their prediction; then TP,
    TP + SP and CP traced over a fake group (memlab.compare.parallel_traces)."""
    from memlab.compare.parallel_ranks import measure_parallel_ranks, parallel_ranks_ledger
    from memlab.errors import MemlabError
    from memlab.predict.parallel import virtual_stage_layers
    from memlab.predict.sharding import check_tp

    if args.ranks < 2:
        raise MemlabError("--layouts needs --ranks 2 or more (pipeline stages and tensor-parallel ranks)")
    virtual_stage_layers(config.n_layers, args.ranks)  # type: ignore[attr-defined]
    check_tp(config, args.ranks)  # type: ignore[arg-type]
    if args.seq % args.ranks:
        raise MemlabError(f"--layouts traces context parallelism over --ranks {args.ranks}: --seq {args.seq} must be "
                          "a multiple of it")
    if config.dropout > 0 or config.impl.parallel_block:  # type: ignore[attr-defined]
        raise MemlabError("--layouts traces the sequence-parallel plan, written for sequential blocks without "
                          "dropout: use a preset without dropout or a parallel block")
    rows = measure_parallel_ranks(args.preset, args.ranks, batch=args.batch, seq=args.seq, timeout_s=args.timeout)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    ledger = parallel_ranks_ledger(rows, batch=args.batch, seq=args.seq)
    print(f"{args.preset}: {args.ranks} gloo rank(s) (CPU); bytes per rank")
    print(ledger.to_string(index=False))
    from memlab.compare.parallel_traces import traced_parallel_rows

    ranks = tuple(range(args.ranks))
    traced = traced_parallel_rows(config, tp=args.ranks, cp=args.ranks, ranks=ranks,  # type: ignore[arg-type]
                                  batch=args.batch, seq=args.seq)
    print(f"\ntraced on a fake {args.ranks}-rank group (fake tensors, CPU): bytes per rank and phase; left = traced "
          "- predicted - named (0 when exact, <= 0 for a bound)")
    print(traced[["layout", "rank", "phase", "predicted", "traced", "named_bytes", "left", "kind"]]
          .to_string(index=False))
    return 0
