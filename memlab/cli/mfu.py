"""``memlab mfu``: model FLOPs utilisation of a measured throughput against a GPU's dense peak [chowdhery2022]."""

from __future__ import annotations

import argparse
import json

from memlab.cli.args import add_model_arguments, model_from_args, positive_float, positive_int
from memlab.errors import MemlabError
from memlab.predict.setup import RECOMPUTE
from memlab.units import fmt_pct


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--tokens-per-second", type=positive_float, metavar="X", help="throughput over all --num-gpus")
    p.add_argument("--step-time", type=positive_float, metavar="SEC", help="seconds per step (with --batch, --seq)")
    p.add_argument("--batch", type=positive_int, metavar="B", help="sequences per step per device")
    p.add_argument("--seq", type=positive_int, metavar="S", help="sequence length")
    p.add_argument("--gpu", required=True, metavar="NAME", help="accelerator (see 'memlab gpus')")
    p.add_argument("--num-gpus", type=positive_int, default=1, metavar="N")
    p.add_argument("--recompute", choices=RECOMPUTE, default="none")
    p.add_argument("--dtype", choices=("fp32", "tf32", "bf16", "fp16", "fp8", "int8"), default="bf16",
                   help="peak FLOP/s column to compare against")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    """``memlab mfu``: model FLOPs utilisation of a measured throughput against the GPU's dense peak."""
    from memlab.predict import flops, hardware
    if (args.tokens_per_second is None) == (args.step_time is None):
        raise MemlabError("give exactly one of --tokens-per-second X or --step-time SEC (with --batch and --seq)")
    if args.step_time is not None and (args.batch is None or args.seq is None):
        raise MemlabError("--step-time needs --batch and --seq to turn the step time into tokens per second")
    model = model_from_args(args)
    if args.seq is None and not isinstance(model, int):
        raise MemlabError("a model config needs --seq S (the trained sequence length) for the attention FLOPs; "
                          "or give --params P to use 6N")
    acc = hardware.gpu(args.gpu)
    tps = args.tokens_per_second
    if tps is None:
        tps = flops.step_time_to_tokens_per_second(args.step_time, args.batch, args.seq, num_devices=args.num_gpus)
    res = flops.mfu(model, tps, accelerator=acc, num_devices=args.num_gpus, dtype=args.dtype, seq=args.seq,
                    recompute=args.recompute)
    if args.json:
        out = {"mfu": res.mfu, "hfu": res.hfu, "peak_flops": res.peak_flops_per_s,
               "flops_per_token": res.model_flops_per_token, "tokens_per_second": tps, "gpu": acc.key,
               **res.to_dict()}
        print(json.dumps(out, indent=2))
        return 0
    print(f"memlab mfu: {getattr(model, 'name', 'bare parameter count')} on {args.num_gpus} x {acc.name} ({acc.key}), "
          f"{tps:,.1f} tokens/s, {args.dtype} dense peak")
    print(f"  MFU                    {fmt_pct(res.mfu)}")
    print(f"  HFU                    {fmt_pct(res.hfu)}")
    print(f"  model FLOPs/token      {res.model_flops_per_token:,.4g}")
    print(f"  achieved FLOP/s        {res.achieved_flops_per_s:,.4g}")
    peak = res.peak_flops_per_s
    print(f"  peak FLOP/s (total)    {'unknown' if peak is None else f'{peak:,.4g}'}  source: {res.peak_source}")
    if res.reason:
        print(f"  note: {res.reason}")
    return 0
