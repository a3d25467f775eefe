"""The ``memlab`` command: ``estimate``, ``mfu``, ``gpus``, ``report``, ``measure``, ``ledger``, ``trace``.

Human tables by default (GiB = 2**30 bytes and GB = 10**9 bytes, both labelled), ``--json`` for machines. Bad
input of any kind (unknown names, bad numbers, conflicting options) prints ONE line ``memlab: error: ...`` on
stderr and exits with status 2, never a traceback. The interface is a contract (issue 2, section 6).

Subcommands are data: :data:`COMMANDS` holds ``Command(name, help, add_arguments, run)`` entries; add one to
extend the tool. A ``passthrough`` command gets its remaining arguments unparsed (``args.rest``) and parses them
itself, as ``report`` does with :func:`memlab.course.report.main`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from memlab.errors import MemlabError
from memlab.predict.precision import PRECISION_POLICIES
from memlab.predict.setup import ATTENTION, INFERENCE_WEIGHTS, KV_DTYPES, OPTIMIZERS, RECOMPUTE
from memlab.units import GB, GiB


class _UsageError(Exception):
    """An argparse error, turned into one stderr line by :func:`main`."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print the usage and exit; we want one line
        raise _UsageError(f"{message} (see '{self.prog} --help')")


@dataclass(frozen=True)
class Command:
    """One subcommand: ``add_arguments(parser)`` declares its options, ``run(args) -> exit status`` does the work."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    passthrough: bool = False
    """Hand every remaining argument (``args.rest``) to ``run`` unparsed."""


# -- argument types ---------------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _param_count(text: str) -> int:
    """A parameter count: 124439808, 7.5e9, 7B, 350M, 1.5T (K/M/B/T = 1e3/1e6/1e9/1e12)."""
    scale = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}.get(text.strip()[-1:].lower(), 1)
    body = text.strip()[:-1] if scale != 1 else text.strip()
    try:
        value = float(body) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a parameter count like 7e9 or 7B, got {text!r}") from None
    if not 1 <= value < 1e16 or value != round(value):
        raise argparse.ArgumentTypeError(f"expected a positive whole parameter count, got {text!r}")
    return round(value)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    return 0 if text.strip() == "0" else _positive_int(text)


# -- model selection --------------------------------------------------------------------------------------------
_DIM_ONLY = ("n_kv_heads", "d_ff", "vocab", "mlp", "max_seq", "untied", "positions", "norm", "no_bias")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL := --preset NAME | --d-model H --n-layers L --n-heads A [...] | --params P."""
    g = p.add_argument_group("model (exactly one of: --preset, explicit dimensions, --params)")
    g.add_argument("--preset", metavar="NAME", help="a preset name (memlab.predict.models.PRESETS)")
    g.add_argument("--d-model", type=_positive_int, metavar="H")
    g.add_argument("--n-layers", type=_positive_int, metavar="L")
    g.add_argument("--n-heads", type=_positive_int, metavar="A")
    g.add_argument("--n-kv-heads", type=_positive_int, metavar="K", help="KV heads (GQA/MQA); default A")
    g.add_argument("--d-ff", type=_positive_int, metavar="F", help="MLP width; default 4H (gelu) or Llama rule")
    g.add_argument("--vocab", type=_positive_int, metavar="V", help="vocabulary size (default 50257)")
    g.add_argument("--mlp", choices=("gelu", "swiglu"))
    g.add_argument("--max-seq", type=_positive_int, metavar="S", help="default max(1024, --seq)")
    g.add_argument("--untied", action="store_true", help="separate LM head (default: tied to the embedding)")
    g.add_argument("--positions", choices=("learned", "rotary"))
    g.add_argument("--norm", choices=("layernorm", "rmsnorm"))
    g.add_argument("--no-bias", action="store_true", help="no biases on linear layers and norms")
    g.add_argument("--params", type=_param_count, metavar="P", help="a bare parameter count: model states only")


def model_from_args(args: argparse.Namespace) -> Any:
    """The TransformerConfig (or bare parameter count) the MODEL options describe; MemlabError when ambiguous."""
    from memlab.predict.models import TransformerConfig, preset

    dims = [args.d_model, args.n_layers, args.n_heads]
    chosen = [name for name, given in (("--preset", args.preset is not None), ("explicit dimensions", any(dims)),
                                       ("--params", args.params is not None)) if given]
    if len(chosen) != 1:
        what = " and ".join(chosen) if chosen else "none"
        raise MemlabError(f"give exactly one model: --preset NAME, or --d-model/--n-layers/--n-heads, or --params P "
                          f"(got {what})")
    extra = [f"--{k.replace('_', '-')}" for k in _DIM_ONLY if getattr(args, k) not in (None, False)]
    if chosen[0] != "explicit dimensions":
        if extra:
            raise MemlabError(f"{', '.join(extra)} only apply to explicit dimensions, not to {chosen[0]}")
        return preset(args.preset) if args.preset is not None else args.params
    if not all(dims):
        raise MemlabError("explicit dimensions need all of --d-model, --n-layers and --n-heads")
    fields: dict[str, Any] = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
                              "n_kv_heads": args.n_kv_heads, "d_ff": args.d_ff, "tied_embeddings": not args.untied,
                              "bias": not args.no_bias,
                              "max_seq": args.max_seq or max(1024, getattr(args, "seq", None) or 0)}
    for key, value in (("vocab_size", args.vocab), ("mlp", args.mlp), ("positions", args.positions),
                       ("norm", args.norm)):
        if value is not None:
            fields[key] = value
    return TransformerConfig(**fields)


# -- estimate ---------------------------------------------------------------------------------------------------
def _estimate_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--mode", choices=("train", "inference"), default="train")
    p.add_argument("--batch", type=_positive_int, default=1, metavar="B", help="micro-batch per data-parallel rank")
    p.add_argument("--seq", type=_positive_int, metavar="S", help="sequence length (default min(1024, max_seq))")
    p.add_argument("--precision", choices=list(PRECISION_POLICIES), default="fp32")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--recompute", choices=RECOMPUTE, default="none")
    p.add_argument("--attention", choices=ATTENTION, default="eager",
                   help="eager/math keep the s x s scores; flash/efficient/cudnn are fused")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage (default 0)")
    p.add_argument("--fsdp", choices=("full-shard", "shard-grad-op", "no-shard"), help="= ZeRO 3 / 2 / 0")
    p.add_argument("--world-size", type=_positive_int, default=1, metavar="N", help="data-parallel ranks")
    p.add_argument("--tp", type=_positive_int, default=1, metavar="T", help="tensor-parallel degree")
    p.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    p.add_argument("--weights", choices=INFERENCE_WEIGHTS, default="bf16", help="inference weight dtype")
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default="bf16", help="inference KV-cache dtype")
    p.add_argument("--gpu", metavar="NAME", help="check the fit on this accelerator (see 'memlab gpus')")
    p.add_argument("--cuda-context-mib", type=_non_negative_float, default=0.0, metavar="MIB",
                   help="CUDA context, MiB (default 0: not counted)")
    p.add_argument("--workspace-mib", type=_non_negative_float, default=0.0, metavar="MIB",
                   help="cuBLAS/attention workspaces, MiB (default 0: not counted)")
    p.add_argument("--fragmentation", type=_fraction, default=0.0, metavar="F", help="allocator margin fraction")
    p.add_argument("--gathered-layers", type=_non_negative_int, default=0, metavar="N",
                   help="blocks FSDP/ZeRO-3 holds gathered at once (default 0: not counted)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _estimate_setup(args: argparse.Namespace, model: Any) -> Any:
    from memlab.predict.models import TransformerConfig
    from memlab.predict.setup import Setup

    if args.zero is not None and args.fsdp is not None:
        raise MemlabError("give --zero or --fsdp, not both (FULL_SHARD = ZeRO 3, SHARD_GRAD_OP = ZeRO 2)")
    stage = {"full-shard": 3, "shard-grad-op": 2, "no-shard": 0}[args.fsdp] if args.fsdp else (args.zero or 0)
    seq = args.seq or (min(1024, model.max_seq) if isinstance(model, TransformerConfig) else 1024)
    return Setup(batch=args.batch, seq=seq, mode=args.mode, precision=args.precision, optimizer=args.optimizer,
                 recompute=args.recompute, attention=args.attention, zero_stage=stage, world_size=args.world_size,
                 tp=args.tp, sp=args.sp, inference_weights=args.weights, kv_cache_dtype=args.kv_dtype)


def _pct(v: float | None) -> str:
    return "unknown" if v is None else f"{100 * v:.1f} %"


def _tera(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e12:,.0f}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _size(n: float) -> str:
    return f"{n:>17,.0f} {n / GiB:>10.3f} {n / GB:>10.3f}"


def run_estimate(args: argparse.Namespace) -> int:
    """``memlab estimate``: the per-device breakdown, and a fits verdict with ``--gpu``."""
    from memlab.predict.estimate import Overheads, estimate
    from memlab.predict.fit import fits

    model = model_from_args(args)
    setup = _estimate_setup(args, model)
    ov = Overheads(cuda_context_bytes=int(args.cuda_context_mib * 2**20),
                   workspace_bytes=int(args.workspace_mib * 2**20),
                   fragmentation_fraction=args.fragmentation, gathered_layers=args.gathered_layers)
    bd = estimate(model, setup, overheads=ov)
    verdict = fits(bd, args.gpu) if args.gpu else None
    if args.json:
        out = {"param_count": bd.param_count,
               "per_device": {**bd.components(), "total": bd.total_bytes, "peak": bd.peak_bytes},
               "peak_phase": bd.peak_phase, "peak_step": bd.peak_step, "phases": list(bd.phases),
               "total_is": "the sum of components; 'peak' is the most a step holds at once (fit verdicts use it)",
               "fits": verdict.fits if verdict else None, "assumptions": list(bd.assumptions),
               "units": "bytes", "overhead_terms": bd.overhead, "activation_detail": bd.activation_detail,
               "optimizer_detail": bd.optimizer_detail, "verdict": verdict.to_dict() if verdict else None,
               "model": bd.config if bd.config is not None else {"param_count": bd.param_count}, "setup": bd.setup}
        print(json.dumps(out, indent=2))
        return 0
    name = model.name if bd.config is not None else "bare parameter count"
    s = setup
    print(f"memlab estimate: {name} ({bd.param_count:,} parameters), {s.mode}, batch {s.batch} x seq {s.seq}, "
          f"{s.precision if s.mode == 'train' else s.inference_weights + ' weights'}, "
          f"{s.optimizer + ', ' if s.mode == 'train' else ''}recompute {s.recompute}, attention {s.attention}, "
          f"ZeRO-{s.zero_stage} over {s.world_size} rank(s), tp {s.tp}{' + sp' if s.sp else ''}")
    print(f"\n{'per device':<24}{'bytes':>17} {'GiB':>10} {'GB':>10}")
    for comp, value in bd.components().items():
        print(f"{comp:<24}{_size(value)}")
        detail = {"activations": bd.activation_detail, "optimizer": bd.optimizer_detail,
                  "overhead": bd.overhead}.get(comp, {})
        for key, v in detail.items():
            print(f"  {key:<22}{_size(v)}")
    print(f"{'total (sum)':<24}{_size(bd.total_bytes)}")
    print("\nwhen the bytes appear (held at once; zero_grad: after it):")
    for row in bd.phases:
        mark = "  <- peak" if (row["step"], row["phase"]) == (bd.peak_step, bd.peak_phase) else ""
        print(f"  {row['step'] + ' ' + row['phase']:<34}{_size(row['bytes'])}{mark}")
    print(f"{'peak':<24}{_size(bd.peak_bytes)}")
    print("(GiB = 2**30 bytes, GB = 10**9 bytes)")
    if verdict:
        word = "FITS" if verdict.fits else "DOES NOT FIT"
        print(f"\nverdict: {word} on {verdict.gpu_name} ({verdict.gpu}): peak {verdict.peak_bytes / GiB:.2f} GiB "
              f"({verdict.peak_phase}) "
              f"of {verdict.capacity_bytes / GiB:.2f} GiB ({verdict.capacity_bytes / GB:.1f} GB); headroom "
              f"{verdict.headroom_bytes / GiB:+.2f} GiB")
    else:
        print("\nverdict: none (pass --gpu NAME to check the fit)")
    print("\nassumptions:")
    for line in bd.assumptions:
        print(f"  - {line}")
    return 0


# -- mfu --------------------------------------------------------------------------------------------------------
def _mfu_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--tokens-per-second", type=_positive_float, metavar="X", help="throughput over all --num-gpus")
    p.add_argument("--step-time", type=_positive_float, metavar="SEC", help="seconds per step (with --batch, --seq)")
    p.add_argument("--batch", type=_positive_int, metavar="B", help="sequences per step per device")
    p.add_argument("--seq", type=_positive_int, metavar="S", help="sequence length")
    p.add_argument("--gpu", required=True, metavar="NAME", help="accelerator (see 'memlab gpus')")
    p.add_argument("--num-gpus", type=_positive_int, default=1, metavar="N")
    p.add_argument("--recompute", choices=RECOMPUTE, default="none")
    p.add_argument("--dtype", choices=("fp32", "tf32", "bf16", "fp16", "fp8", "int8"), default="bf16",
                   help="peak FLOP/s column to compare against")
    p.add_argument("--json", action="store_true", help="print JSON")


def run_mfu(args: argparse.Namespace) -> int:
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
    print(f"  MFU                    {_pct(res.mfu)}")
    print(f"  HFU                    {_pct(res.hfu)}")
    print(f"  model FLOPs/token      {res.model_flops_per_token:,.4g}")
    print(f"  achieved FLOP/s        {res.achieved_flops_per_s:,.4g}")
    peak = res.peak_flops_per_s
    print(f"  peak FLOP/s (total)    {'unknown' if peak is None else f'{peak:,.4g}'}  source: {res.peak_source}")
    if res.reason:
        print(f"  note: {res.reason}")
    return 0


# -- gpus -------------------------------------------------------------------------------------------------------
def _gpus_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def _plain(obj: Any) -> Any:
    return obj.to_dict() if hasattr(obj, "to_dict") else asdict(obj) if is_dataclass(obj) else dict(vars(obj))


def run_gpus(args: argparse.Namespace) -> int:
    """``memlab gpus``: the accelerator table (dense peaks), with sources."""
    from memlab.predict import hardware
    rows = list(hardware.list_gpus())
    if args.json:
        print(json.dumps([_plain(a) for a in rows], indent=2, default=str))
        return 0
    print(f"{'key':<14} {'name':<34} {'GiB':>7} {'GB':>7} {'TB/s':>6} {'bf16 TF':>8} {'fp8 TF':>7}  source")
    for a in rows:
        flag = " (unofficial)" if getattr(a, "unofficial", False) else ""
        print(f"{a.key:<14} {a.name[:34]:<34} {a.memory_bytes / GiB:>7.1f} {a.memory_bytes / GB:>7.1f} "
              f"{a.bandwidth_bytes_per_s / 1e12:>6.2f} {_tera(a.peak_flops.get('bf16')):>8} "
              f"{_tera(a.peak_flops.get('fp8')):>7}  {_clip(a.source, 56)}{flag}")
    print("(dense peaks, TF = 10**12 FLOP/s; GiB = 2**30 bytes, GB = 10**9 bytes; full sources with --json)")
    return 0


# -- report (delegates) -----------------------------------------------------------------------------------------
def run_report(args: argparse.Namespace) -> int:
    """``memlab report ...``: hands its arguments to :func:`memlab.course.report.main`."""
    try:
        from memlab.course import report
    except ImportError as exc:
        raise MemlabError(f"'memlab report' is unavailable: memlab.course.report cannot be imported ({exc})") from None
    return int(report.main(list(args.rest)) or 0)


COMMANDS: tuple[Command, ...] = (
    Command("estimate", "predict memory per device (training or inference) and check the fit",
            _estimate_arguments, run_estimate),
    Command("mfu", "model FLOPs utilisation of a measured throughput", _mfu_arguments, run_mfu),
    Command("gpus", "list the accelerator table", _gpus_arguments, run_gpus),
    Command("report", "build the course report (arguments go to memlab.course.report)", lambda p: None, run_report,
            passthrough=True),
    Command("measure", "run the reference model and print predicted vs measured bytes",
            lambda p: _lazy("measure_arguments")(p), lambda a: _lazy("run_measure")(a)),
    Command("ledger", "measure the validation grid and print the estimator's achieved errors",
            lambda p: _lazy("ledger_arguments")(p), lambda a: _lazy("run_ledger")(a)),
    Command("trace", "trace one training step on fake tensors: bytes per phase, the peak, top modules",
            lambda p: __import__("memlab.cli.trace", fromlist=["x"]).add_arguments(p),
            lambda a: __import__("memlab.cli.trace", fromlist=["x"]).run(a)),
)


def _lazy(name: str) -> Callable[..., Any]:
    """A function of :mod:`memlab.cli.measure`, imported only when its subcommand is used (it imports torch)."""
    from memlab.cli import measure as cli_measure
    return getattr(cli_measure, name)
"""The subcommands, in help order. Add a :class:`Command` here to extend ``memlab``."""


def build_parser(commands: tuple[Command, ...] = COMMANDS) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command."""
    parser = _Parser(prog="memlab", description="Predict and measure accelerator memory and compute.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for cmd in commands:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help, add_help=not cmd.passthrough)
        cmd.add_arguments(p)
        if cmd.passthrough:
            p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``memlab`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status (2 on bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        passthrough = {c.name: c for c in COMMANDS if c.passthrough}
        if argv and argv[0] in passthrough:  # its own parser handles everything after the name, --help included
            return passthrough[argv[0]].run(argparse.Namespace(rest=argv[1:]))
        args = parser.parse_args(argv)
        if args.command is None:
            names = ", ".join(c.name for c in COMMANDS)
            raise _UsageError(f"give a command: {names} (see 'memlab --help')")
        return args._run(args)
    except (MemlabError, _UsageError) as exc:
        print(f"memlab: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help and friends
        return exc.code if isinstance(exc.code, int) else 0
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly (Python docs, "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
