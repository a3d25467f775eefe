"""``memlab shard``: launch real data-parallel ranks (torchrun) and print, per strategy, the bytes one rank holds
and the bytes its collectives move, next to the estimator and the ZeRO paper.

``memlab shard --preset tiny-gpt --ranks 2 --strategies ddp,fsdp2-zero3`` runs
:func:`memlab.run.distributed.launch` (gloo on a CPU, NCCL on GPUs) and prints the ledger of
:func:`memlab.compare.sharding.sharding_ledger`; ``--json`` prints the rows instead. More ranks than the machine
runs at once, a repeated strategy, or strategies that all skip on this device are refused before any launch
(``memlab: error: ...``, exit 2); so is a launch that measured nothing, with each strategy's reason.

``memlab shard --hf PATH`` (a config.json, its folder, a shipped name or a cached model id, read offline) trains
transformers' model built from that config on every rank instead (FSDP2 ZeRO-3 by default: ``fully_shard`` on each
decoder layer and the root, :func:`memlab.model.fsdp.shard_model`; ``--strategies`` may add ddp, zero1,
fsdp2-zero2), and prints each rank's measured bytes next to ``memlab estimate --hf PATH --zero 3 --world-size N``
for that rank: ``exact``, or the residual equal to a named term (:func:`named_residuals`: the root unit FSDP2 keeps
gathered, dim-0 padding, a rank's unpadded moments, DDP's buffer broadcast), or said ``not explained``. A config the
formula does not cover is refused (nothing to compare the ranks with; ``memlab estimate --hf`` traces it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from typing import Any

from memlab.cli.args import positive_float, positive_int
from memlab.cli.hf_source import hf_path
from memlab.errors import ConfigError, MemlabError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``memlab shard`` (self-contained: the model is a preset, the rest is the launch)."""
    p.add_argument("--preset", default="tiny-gpt", metavar="NAME",
                   help="the model, the reference GPT on every rank (default tiny-gpt; a preset memlab ships a "
                   "published config of needs ref:NAME: the reference GPT with its sizes)")
    p.add_argument("--ranks", type=positive_int, default=2, metavar="N", help="ranks on this node (default 2)")
    p.add_argument("--strategies", default=None,
                   help="comma-separated: ddp, zero1, fsdp2-zero2, fsdp2-zero3, fsdp2-offload (default: all of them; "
                   "with --hf: fsdp2-zero3)")
    p.add_argument("--batch", type=positive_int, default=2, metavar="B", help="micro-batch per rank")
    p.add_argument("--seq", type=positive_int, default=32, metavar="S")
    p.add_argument("--steps", type=positive_int, default=1, help="steps per strategy; the last one is measured")
    p.add_argument("--cpu", action="store_true", help="gloo on CPU even when GPUs are present")
    p.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS",
                   help="seconds the ranks may work once all have started; then every rank is killed (default 300; "
                        "start-up has its own bound, START_TIMEOUT_S in memlab.run.distributed.launch)")
    p.add_argument("--hf", type=hf_path, metavar="PATH", help="the model from a Hugging Face config.json, a folder "
                   "holding one, or a model id in the local Hugging Face cache (read offline): every rank trains "
                   "transformers' model built from it (FSDP2 on each decoder layer and the root), printed per rank "
                   "next to memlab estimate --hf PATH --zero 3 --world-size N; instead of --preset")
    p.add_argument("--layouts", action="store_true",
                   help="run pipeline (1F1B and GPipe over --ranks stages, --ranks + 1 micro-batches) and tensor "
                   "parallelism (--ranks ways) instead of the data-parallel strategies "
                   "(memlab.studies.parallel_ranks), then trace TP, TP + SP and ring-attention CP over a fake "
                   "--ranks-rank group, every rank (memlab.studies.parallel_traces)")
    p.add_argument("--json", action="store_true", help="print the ranks' rows as JSON")


def run(args: argparse.Namespace) -> int:
    """Launch, then print the ledger (or the rows)."""
    from memlab.compare.sharding import sharding_ledger
    from memlab.predict.families.resolver import shipped
    from memlab.predict.spec.model import preset
    from memlab.run.distributed.launch import WorkerSpec
    from memlab.run.distributed.worker import STRATEGIES

    if args.hf is not None:
        return _run_hf(args)
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
    spec = WorkerSpec(config=config, batch=args.batch, seq=args.seq, strategies=_strategies(args, STRATEGIES),
                      steps=args.steps, device="cpu" if args.cpu else "auto")
    result = _launch(spec, args)
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
    TP + SP and CP traced over a fake group (memlab.studies.parallel_traces)."""
    from memlab.errors import MemlabError
    from memlab.predict.memory.sharding import check_tp
    from memlab.predict.parallel.pipeline import virtual_stage_layers
    from memlab.studies.parallel_ranks import measure_parallel_ranks, parallel_ranks_ledger

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
    from memlab.studies.parallel_traces import traced_parallel_rows

    ranks = tuple(range(args.ranks))
    traced = traced_parallel_rows(config, tp=args.ranks, cp=args.ranks, ranks=ranks,  # type: ignore[arg-type]
                                  batch=args.batch, seq=args.seq)
    print(f"\ntraced on a fake {args.ranks}-rank group (fake tensors, CPU): bytes per rank and phase; left = traced "
          "- predicted - named (0 when exact, <= 0 for a bound)")
    print(traced[["layout", "rank", "phase", "predicted", "traced", "named_bytes", "left", "kind"]]
          .to_string(index=False))
    return 0


def _strategies(args: argparse.Namespace, default: tuple[str, ...]) -> tuple[str, ...]:
    """The strategies ``--strategies`` names, or ``default``."""
    if args.strategies is None:
        return default
    return tuple(s.strip() for s in args.strategies.split(",") if s.strip())


def _launch(spec: Any, args: argparse.Namespace, *, sweep: bool = False) -> Any:
    """:func:`memlab.run.distributed.launch.launch` of ``spec`` on ``--ranks`` ranks (``sweep``: the same ranks
    forked by torchrun's launcher API from one process, :func:`~memlab.run.distributed.launch.launch_sweep`, which
    imports torch and transformers once), a retry's message printed as a note (also when the retry failed too)."""
    from memlab.run.distributed.launch import launch, launch_sweep

    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            if sweep:
                return launch_sweep(spec, (args.ranks,), timeout_s=args.timeout)[args.ranks]
            return launch(spec, args.ranks, timeout_s=args.timeout)
        finally:
            for note in notes:
                print(f"memlab: note: {note.message}", file=sys.stderr)


def _own_rows(d0: int, ranks: int, rank: int) -> int:
    """Dim-0 rows of a tensor of ``d0`` rows that ``rank`` holds unpadded: FSDP2 chunks dim 0 into ``ceil(d0 / N)``
    rows per rank, the last ranks holding the remainder (or nothing) [pytorch-fsdp2-internals]."""
    size = math.ceil(d0 / ranks)
    return max(0, min(size, d0 - rank * size))


def named_residuals(config: Any, row: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """What the formula's per-rank numbers (:func:`memlab.compare.sharding.predicted_rank`, fp32 AdamW) leave out
    for one measured rank ``row``, by component: ``{component: (bytes, name)}``, measured - predicted.

    - FSDP2 ZeRO-3, gathered parameters: the estimator counts one gathered block; the rank holds the root unit's
      parameters (embeddings, final norm, untied head: FSDP2 does not reshard the root after forward) and one
      block, each as its all-gather buffer (``N`` x the padded shard,
      :meth:`memlab.predict.memory.fsdp.FsdpPlan.buffer`);
    - FSDP2 ZeRO-3, communication: ZeRO's 3 Psi against the padded buffers moved: every unit all-gathered in
      forward, the blocks again in backward (not the root), every unit reduce-scattered;
    - FSDP2, optimizer states: the estimator gives rank 0's padded shard; AdamW's two moments are allocated like
      the rank's own (unpadded) rows, so a rank past the remainder holds fewer (8 B per missing element);
    - DDP, communication: the broadcast of the model's buffers before each forward (``broadcast_buffers=True``; a
      rotary ``inv_freq``, say), which ZeRO's 2 Psi does not count (the row's own broadcast volume)."""
    from memlab.predict.memory.fsdp import fsdp_plan, rank0_shard_elements

    strategy, ranks, rank = row["strategy"], int(row["world_size"]), int(row["rank"])
    out: dict[str, tuple[int, str]] = {}
    if strategy == "ddp" and "broadcast" in (row.get("comm") or {}):
        out["comm volume/step"] = (int(row["comm"]["broadcast"]["volume_bytes"]),
                                   "DDP's broadcast of the model's buffers before each forward (broadcast_buffers)")
    if not strategy.startswith("fsdp2") or ranks == 1:
        return out
    shapes = [shape for _, shape, _ in config.param_shapes()]
    missing = sum(rank0_shard_elements(s, ranks) - _own_rows(s[0], ranks, rank) * math.prod(s[1:])
                  for s in shapes if s)
    if missing:
        out["optimizer"] = (-8 * missing, f"AdamW's moments of rank {rank}'s unpadded shard, {missing:,} elements "
                                          "short of rank 0's padded one")
    if strategy != "fsdp2-zero3":
        return out
    plan = fsdp_plan(config, ranks, 3, "blocks", "inside", 4.0, 4.0)
    root = next(u for u in plan.units if u.kind == "root")
    block = plan.of_kind("block")[0]
    out["gathered params"] = (int(plan.buffer(root) + plan.buffer(block) - plan.full(block)),
                              "the root unit's parameters (embeddings, final norm, head), gathered from forward to "
                              "backward, and dim-0 padding to a multiple of N rows")
    moved = 3 * sum(plan.buffer(u) for u in plan.units) - plan.buffer(root)
    out["comm volume/step"] = (int(moved - 3 * 4 * config.param_count()),
                               "FSDP2 all-gathers the root once, not twice (it stays gathered), over padded buffers")
    return out


def residual(error: float, named: tuple[int, str] | None) -> str:
    """``exact``, the residual (measured - predicted, bytes) with its name when it equals a named term of
    :func:`named_residuals`, or the residual printed as not explained."""
    if error == 0:
        return "exact"
    if named is not None and error == named[0]:
        return f"{error:+,.0f} B = {named[1]}"
    return f"{error:+,.0f} B, not explained" + (f" (named: {named[0]:+,} B, {named[1]})" if named else "")


PREDICTED_BY = ("the formula for the ranks' device: memlab estimate --hf PATH --zero 3 --world-size N "
                "(memlab.compare.sharding.predicted_rank); on CPU ranks AdamW's 4-byte step counters share the "
                "rank's memory and are counted, where memlab estimate, which assumes a CUDA device, leaves them on "
                "the host")
"""What the ranks' bytes are printed next to (``--json``: ``predicted_by``)."""

HF_STRATEGIES = ("fsdp2-zero3",)
"""What ``memlab shard --hf`` runs unless ``--strategies`` says otherwise: FSDP2 ZeRO-3, the plan of
``memlab estimate --hf PATH --zero 3``."""


def _run_hf(args: argparse.Namespace) -> int:
    """``memlab shard --hf PATH``: transformers' model on every rank
    (:class:`memlab.run.distributed.launch.WorkerSpec` ``hf_config``), each rank's measured bytes next to the
    estimator's for that rank (:func:`memlab.compare.sharding.sharding_ledger` of the rank's own rows), exact or
    the residual named."""
    from memlab.cli.hf_source import model_info
    from memlab.compare.sharding import sharding_ledger
    from memlab.predict.families.reader import read_config_json
    from memlab.predict.families.resolver import resolve_with_raw
    from memlab.run.distributed.launch import WorkerSpec

    if args.layouts:
        raise MemlabError("--layouts runs the reference GPT's pipeline and tensor-parallel ranks; with --hf only the "
                          "data-parallel strategies run: drop --layouts")
    if args.preset != "tiny-gpt":
        raise MemlabError("the model comes from --hf, so --preset would be ignored: drop one of them")
    raw = read_config_json(args.hf)
    try:
        config = resolve_with_raw(args.hf)[0]
    except ConfigError as exc:  # no formula: nothing to print the ranks next to
        raise MemlabError(f"memlab shard --hf prints each rank next to the formula's sharded estimate, and the formula "
                          f"does not cover this config ({exc}); memlab estimate --hf {args.hf} traces it on one "
                          "rank") from None
    spec = WorkerSpec(config=config, batch=args.batch, seq=args.seq, strategies=_strategies(args, HF_STRATEGIES),
                      steps=args.steps, device="cpu" if args.cpu else "auto", hf_config=raw)
    result = _launch(spec, args, sweep=True)
    info = model_info(config, source="measurement", config=raw)
    ok = result.measured()
    ledgers = [sharding_ledger([r for r in ok if r["rank"] == rank], config).assign(rank=rank)
               for rank in sorted({r["rank"] for r in ok})]
    import pandas as pd

    ledger = pd.concat(ledgers, ignore_index=True)
    ledger["error"] = ledger["measured"] - ledger["predicted"]
    by_rank = {(r["strategy"], r["rank"]): named_residuals(config, r) for r in ok}
    ledger["strategy"] = ledger["experiment"].str.split().str[-2]
    ledger["residual"] = [residual(e, by_rank[(st, rk)].get(c)) for st, rk, c, e in
                          zip(ledger["strategy"], ledger["rank"], ledger["component"], ledger["error"], strict=True)]
    ledger["explained"] = ledger["residual"].map(lambda t: "not explained" not in t)
    if args.json:
        print(json.dumps({**result.to_dict(), **info,
                          "predicted_by": PREDICTED_BY,
                          "per_rank": ledger.to_dict(orient="records")}, indent=1, default=str))
        return 0
    print(f"{info['model_label']}: {args.ranks} rank(s), {result.wall_s:.1f} s; step: {info['calling_convention']}")
    print(f"measured per rank (source of truth: measurement) next to {PREDICTED_BY}")
    print(f"  {'strategy':<12}{'rank':>4}  {'component':<17}{'predicted B':>13}{'measured B':>13}  residual")
    for r in ledger.itertuples():
        print(f"  {r.strategy:<12}{r.rank:>4}  {r.component:<17}{r.predicted:>13,.0f}{r.measured:>13,.0f}  "
              f"{r.residual}")
    for row in result.rows:
        if row.get("status") != "ok" and row.get("rank") == 0:
            print(f"{row['status']} {row['strategy']}: {row.get('reason', '')}")
    return 0
