"""``memlab mfu``: model FLOPs utilisation of a measured throughput against a GPU's dense peak [chowdhery2022].

The throughput is given directly (``--tokens-per-second``, over all ``--num-gpus``) or as a step time with the
sequences it processed: ``--global-batch`` (sequences per optimizer step over ALL GPUs, as papers and Megatron logs
report it; use it for tensor- or pipeline-parallel jobs, where several GPUs share one batch) or ``--batch``
(sequences per step per data-parallel replica, multiplied by ``--num-gpus``: right only when every GPU processes
its own batch, i.e. pure data parallelism). An MFU above 100 % of the peak is impossible and is an error naming the
likely mistake; ``--json`` never prints NaN or Infinity. The model is any MODEL option or ``--hf PATH`` (a Hugging Face
config read offline, as ``memlab estimate --hf`` reads it); ``--finetune lora|qlora|frozen`` (with Setup's
``--lora-rank``, ``--lora-targets``, ``--lora-modules-to-save``, ``--frozen-layers``) counts a fine-tuning step's
FLOPs (:func:`memlab.predict.compute.flops.step_flops`) instead of full training's 6N.
"""

from __future__ import annotations

import argparse
from typing import Any

from memlab.cli.args import (
    add_model_arguments,
    add_setup_arguments,
    bounded_int,
    given_model_options,
    given_setup_fields,
    gpu_name,
    model_from_args,
    positive_float,
    print_json,
    setup_options,
)
from memlab.cli.hf_source import hf_path, model_label
from memlab.errors import MemlabError
from memlab.predict.spec.setup import RECOMPUTE
from memlab.predict.spec.validate import LIMITS
from memlab.units import fmt_pct

FINETUNE_FIELDS = ("finetune", "lora_rank", "lora_targets", "lora_modules_to_save", "frozen_layers")
"""The Setup fields ``memlab mfu`` takes (Setup's own flags): what trains, which is what the FLOPs depend on."""

_GLOBAL_BATCH_WHY = "ten million sequences per step over all GPUs, about 1000x the largest published global batches"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``memlab mfu``: MODEL, the throughput (or step time and batch), the GPU and the dtype."""
    add_model_arguments(p)
    p.add_argument("--hf", type=hf_path, metavar="PATH", help="the model from a Hugging Face config.json, a folder "
                   "holding one, a config memlab ships or a model id in the local Hugging Face cache (read offline), "
                   "instead of the MODEL options")
    add_setup_arguments(p, exclude=tuple(o.field for o in setup_options() if o.field not in FINETUNE_FIELDS))
    g = p.add_argument_group("throughput (one of --tokens-per-second, or --step-time with a batch and --seq)")
    g.add_argument("--tokens-per-second", type=positive_float, metavar="X", help="throughput over all --num-gpus")
    g.add_argument("--step-time", type=positive_float, metavar="SEC", help="seconds per optimizer step")
    batch = g.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=bounded_int(1, LIMITS["batch"].max, _GLOBAL_BATCH_WHY), metavar="B",
                       help="sequences per step over ALL GPUs (papers, Megatron logs); use this for tensor- or "
                            "pipeline-parallel jobs")
    batch.add_argument("--batch", type=bounded_int(1, LIMITS["batch"].max, LIMITS["batch"].why), metavar="B",
                       help="sequences per step per data-parallel replica, multiplied by --num-gpus: only for pure "
                            "data parallelism (every GPU its own batch)")
    p.add_argument("--seq", type=bounded_int(1, LIMITS["seq"].max, LIMITS["seq"].why), metavar="S",
                   help="sequence length trained on (at most the model's max_seq with learned positions)")
    p.add_argument("--gpu", type=gpu_name, required=True, metavar="NAME", help="accelerator (see 'memlab gpus')")
    p.add_argument("--num-gpus", type=bounded_int(1, 10**7, "ten million devices, 100x the largest clusters"),
                   default=1, metavar="N", help="devices the throughput was measured over (default 1)")
    p.add_argument("--recompute", choices=RECOMPUTE, default="none")
    p.add_argument("--recompute-every", type=bounded_int(1, LIMITS["layers"].max, LIMITS["layers"].why), default=1,
                   metavar="K", help="with --recompute full: every K-th block recomputed (torchtitan's layer policy)")
    p.add_argument("--dtype", choices=("fp32", "tf32", "bf16", "fp16", "fp8", "int8"), default="bf16",
                   help="peak FLOP/s column to compare against")
    p.add_argument("--json", action="store_true", help="print JSON")


def _tokens_per_second(args: argparse.Namespace) -> float:
    from memlab.predict.compute import flops

    batch_given = args.batch is not None or args.global_batch is not None
    if (args.tokens_per_second is None) == (args.step_time is None):
        raise MemlabError("give exactly one of --tokens-per-second X or --step-time SEC (with --global-batch or "
                          "--batch, and --seq)")
    if args.tokens_per_second is not None:
        if batch_given:
            raise MemlabError("--batch/--global-batch turn --step-time into tokens per second; with "
                              "--tokens-per-second leave them out")
        return args.tokens_per_second
    if not batch_given or args.seq is None:
        raise MemlabError("--step-time needs --global-batch B (sequences over all GPUs) or --batch B (per data-"
                          "parallel replica), and --seq S, to turn the step time into tokens per second")
    if args.global_batch is not None:
        return flops.step_time_to_tokens_per_second(args.step_time, args.global_batch, args.seq, num_devices=1)
    return flops.step_time_to_tokens_per_second(args.step_time, args.batch, args.seq, num_devices=args.num_gpus)


def _model(args: argparse.Namespace) -> Any:
    """The model of ``--hf PATH`` (:func:`memlab.predict.families.resolve` of the config.json) or of the MODEL
    options; MODEL options beside ``--hf`` are one error (they would be ignored)."""
    if args.hf is None:
        return model_from_args(args)
    given = given_model_options(args)
    if given:
        raise MemlabError(f"the model comes from --hf, so {', '.join(given)} would be ignored: drop them (the sizes "
                          "are the config's) or drop --hf")
    from memlab.predict.families.resolver import resolve

    return resolve(args.hf)


def _finetune(args: argparse.Namespace) -> Any:
    """The :class:`~memlab.predict.spec.setup.Setup` of the fine-tuning options, or None without ``--finetune``
    (full training: PaLM's 6N + attention). QLoRA computes in bf16 (its ``bnb_4bit_compute_dtype``)."""
    from memlab.predict.spec.setup import Setup

    given = {k: v for k, v in given_setup_fields(args).items() if k in FINETUNE_FIELDS}  # --recompute is mfu's
    if not given:
        return None
    if given.get("finetune") == "qlora":
        given["precision"] = "bf16"
    return Setup(**given)


def run(args: argparse.Namespace) -> int:
    """``memlab mfu``: model FLOPs utilisation of a measured throughput against the GPU's dense peak."""
    from memlab.predict.compute import flops
    from memlab.predict.hardware import gpus as hardware

    tps = _tokens_per_second(args)
    model = _model(args)
    finetune = _finetune(args)
    if args.seq is None and not isinstance(model, int):
        raise MemlabError("a model config needs --seq S (the trained sequence length) for the attention FLOPs; "
                          "or give --params P to use 6N")
    acc = hardware.gpu(args.gpu)
    res = flops.mfu(model, tps, accelerator=acc, num_devices=args.num_gpus, dtype=args.dtype, seq=args.seq,
                    recompute=args.recompute, finetune=finetune, recompute_every=args.recompute_every)
    if res.verdict == "implausible":
        raise MemlabError(f"{res.reason} (tokens/s {tps:,.4g} x FLOPs/token {res.model_flops_per_token:,.4g} = "
                          f"{res.achieved_flops_per_s:,.4g} FLOP/s against a peak of {res.peak_flops_per_s:,.4g})")
    if args.json:
        print_json({"mfu": res.mfu, "hfu": res.hfu, "peak_flops": res.peak_flops_per_s,
                    "flops_per_token": res.model_flops_per_token, "tokens_per_second": tps, "gpu": acc.key,
                    **res.to_dict(), "model_label": model_label(model),
                    "finetune": finetune.group("fine-tuning") if finetune is not None else None}, indent=2)
        return 0
    print(f"memlab mfu: {getattr(model, 'name', 'bare parameter count')} on {args.num_gpus} x {acc.name} ({acc.key}), "
          f"{tps:,.1f} tokens/s, {args.dtype} dense peak; model: {model_label(model)}")
    print(f"  MFU                    {fmt_pct(res.mfu)}")
    print(f"  HFU                    {fmt_pct(res.hfu)}")
    print(f"  model FLOPs/token      {res.model_flops_per_token:,.4g}")
    print(f"  achieved FLOP/s        {res.achieved_flops_per_s:,.4g}")
    peak = res.peak_flops_per_s
    print(f"  FLOPs counted          {res.formula}")
    print(f"  peak FLOP/s (total)    {'unknown' if peak is None else f'{peak:,.4g}'}  source: {res.peak_source}")
    if res.reason:
        print(f"  note: {res.reason}")
    return 0
