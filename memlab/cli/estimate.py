"""``memlab estimate``: the per-device memory of a training or inference step, and a fit verdict with ``--gpu``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from memlab.cli.args import (
    MIB,
    add_model_arguments,
    add_setup_arguments,
    bounded_int,
    fraction,
    given_setup_fields,
    gpu_name,
    mebibytes,
    model_from_args,
    positive_float,
    print_json,
    setup_from_args,
)
from memlab.cli.device_view import card, overheads_of, print_peaks, refuse_capacity_without_gpu
from memlab.cli.hf_source import hf_path, model_info, published_twin, with_task
from memlab.errors import ConfigError, MemlabError, SetupError
from memlab.predict.families.resolver import resolve_with_raw
from memlab.predict.spec.validate import LIMITS
from memlab.units import GB, GiB


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``memlab estimate``: MODEL, every Setup field, the fit target and the named overheads."""
    add_model_arguments(p)
    add_setup_arguments(p)
    p.add_argument("--fsdp", choices=("full-shard", "shard-grad-op", "no-shard"), help="= --zero 3 / 2 / 0")
    p.add_argument("--gpu", type=gpu_name, metavar="NAME", help="check the fit on this accelerator (see 'memlab gpus')")
    add_device_arguments(p)
    p.add_argument("--gathered-layers", type=bounded_int(0, LIMITS["layers"].max, "at most the model's blocks"),
                   default=0, metavar="N",
                   help="blocks ZeRO-3 holds gathered, as the gathered component (default 0: FSDP2 is modelled "
                   "per phase; tensor-parallel ZeRO-3 is not counted)")
    g = p.add_argument_group("answers (with --gpu): what fits, and what to switch on to fit")
    g.add_argument("--hf", type=hf_path, metavar="PATH", help="the model from a Hugging Face config.json, a folder "
                   "holding one, or a model id in the local Hugging Face cache (read offline), instead of --preset or "
                   "dimensions; a config or setup the formula does not cover is traced (transformers' modelling code "
                   "on fake tensors) unless --no-trace")
    g.add_argument("--no-trace", action="store_true", help="with --hf: refuse a config or setup the formula does not "
                   "cover instead of tracing it")
    g.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS",
                   help="time bound of a trace (default 300 s); it prints its progress to stderr")
    g.add_argument("--max-batch", action="store_true", help="the largest micro-batch whose device-used peak fits --gpu "
                   "(decided as the verdict is: the peak + the reserve, context, workspaces; the options above apply)")
    g.add_argument("--longest-seq", action="store_true",
                   help="the longest sequence (up to the model's max_seq) whose device-used peak fits --gpu")
    g.add_argument("--serving", type=context_list, metavar="C1,C2,...",
                   help="with --mode inference: the largest batch at each context length (tokens per sequence, "
                   "prompt + generated) whose device-used peak fits --gpu (memlab.predict.fit.serving_table)")
    g.add_argument("--levers", action="store_true", help="rank what to switch on (recompute, attention kernel, "
                   "precision, fused optimizer, chunked/fused loss, logits_to_keep, offload, ZeRO-3, LoRA, QLoRA, "
                   "frozen blocks, 8-bit AdamW) by the device-used peak each gives on --gpu, with its cost, and the "
                   "levers that together make the step fit")
    g.add_argument("--lever-ranks", type=bounded_int(2, LIMITS["ranks"].max, LIMITS["ranks"].why), default=8,
                   metavar="N", help="ranks the ZeRO-3 lever shards over (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--explain", action="store_true", help="list every assumption (the short form comes first)")


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    """The device terms of a ``--gpu`` verdict (memlab.predict.gpu.device), shared with ``memlab trace``: each
    replaces its default term; without ``--gpu`` an estimate adds a given one to its overhead component."""
    p.add_argument("--cuda-context-mib", type=mebibytes, default=None, metavar="MIB",
                   help="CUDA context, MiB (default with --gpu: the documented range, about 254-426 MiB; without "
                   "--gpu: not counted)")
    p.add_argument("--workspace-mib", type=mebibytes, default=None, metavar="MIB",
                   help="cuBLAS/cuBLASLt workspaces, MiB (default with --gpu: PyTorch's per handle and architecture; "
                   "without --gpu: not counted)")
    p.add_argument("--fragmentation", type=fraction, default=None, metavar="F",
                   help="the allocator's reserve as a fraction of allocated bytes (default with --gpu: the trace's "
                   "replay, or the formula's bound; without --gpu: not counted)")
    p.add_argument("--gpu-memory-gib", type=positive_float, default=None, metavar="GIB",
                   help="with --gpu: this capacity instead of the card's table memory (a 96 GB variant, a MIG slice, "
                   "what torch.cuda.mem_get_info reports)")


def context_list(text: str) -> tuple[int, ...]:
    """``"1024,8192"`` -> ``(1024, 8192)``: comma-separated context lengths, each a whole number of tokens in
    1..LIMITS['seq']."""
    one = bounded_int(1, int(LIMITS["seq"].max), LIMITS["seq"].why)
    parts = [t.strip() for t in text.split(",") if t.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated context lengths (e.g. 1024,8192), got {text!r}")
    return tuple(one(t) for t in parts)


def setup_of(args: argparse.Namespace, model: Any, *, library_defaults: bool = True) -> Any:
    """The Setup of ``memlab estimate``'s options (``--fsdp`` as its ZeRO stage); ``library_defaults``: unnamed
    options take the libraries' defaults (attention: the kernel transformers and torch run; ``memlab trace`` passes
    False: a CPU trace runs its kernel on this CPU)."""
    if args.zero_stage is not None and args.fsdp is not None:
        raise MemlabError("give --zero or --fsdp, not both (FULL_SHARD = ZeRO 3, SHARD_GRAD_OP = ZeRO 2)")
    overrides = {"zero_stage": {"full-shard": 3, "shard-grad-op": 2, "no-shard": 0}[args.fsdp]} if args.fsdp else {}
    return setup_from_args(args, model, library_defaults=library_defaults, **overrides)


def _size(n: float) -> str:
    return f"{n:>17,.0f} {n / GiB:>10.3f} {n / GB:>10.3f}"


def run(args: argparse.Namespace) -> int:
    """``memlab estimate``: the breakdown per device (per rank where ranks differ), and a verdict with ``--gpu``."""
    from memlab.predict import coverage
    from memlab.predict.estimate import Overheads, estimate
    from memlab.predict.fit import fits

    refuse_capacity_without_gpu(args)
    model, raw, refused = _model(args)
    if refused is not None:
        return _traced(args, raw, refused)
    setup = _read_regex(args, model, raw, with_task(setup_of(args, model), raw))
    answers = _asked_answers(args, model, setup)
    ranked = _per_rank_layout(args, model, setup)
    guard = _version_guard(args, model)
    ov = _overheads(args, ranked, Overheads)
    device = "cuda"  # the device the command line estimates for (the estimate's and its named terms' widths)
    try:
        bd = estimate(model, setup, overheads=ov, device_type=device)
    except SetupError as exc:
        if _hf_target(args, model) is None or args.no_trace or answers or ranked is not None \
                or coverage.refusal(model, setup, device) != str(exc):
            raise
        return _traced_setup(args, model, raw, setup, str(exc))
    if guard is not None and not args.no_trace and not answers and ranked is None:
        traced = _traced_beside(args, model, raw, setup, bd, guard)
        if traced is not None:
            return traced
    verdict = fits(bd, card(args), device=overheads_of(args)) if args.gpu is not None else None
    device = verdict.device if verdict is not None else None
    # the published twin runs its own library default where the user named no kernel
    auto = getattr(args, "assumed_attention", None) is not None
    twin = published_twin(model, setup.with_(attention="auto") if auto else setup, ov) if ranked is None else None
    found = _answers(args, model, setup, ov)
    span = bd.peak_range if setup.mode == "train" and bd.config is not None else None
    if args.json:
        out = {"param_count": bd.param_count,
               "per_device": {**bd.components(), "total": bd.total_bytes, "peak": bd.peak_bytes},
               "peak_phase": bd.peak_phase, "peak_step": bd.peak_step, "phases": [r.to_dict() for r in bd.phases],
               "total_is": "the sum of components; 'peak' is the most a step holds at once (fit verdicts use it)",
               "fits": device.fits if device else None, "device": device.to_dict() if device else None,
               "assumptions": list(bd.assumptions),
               "units": "bytes", "overhead_terms": bd.overhead, "activation_detail": bd.activation_detail,
               "optimizer_detail": bd.optimizer_detail, "verdict": verdict.to_dict() if verdict else None,
               "assumed": assumed_lines(args, setup, bd),
               "model": bd.config if bd.config is not None else {"param_count": bd.param_count}, "setup": bd.setup,
               "host_bytes": bd.host_bytes, "paged_bytes": bd.paged_bytes,
               "paged_is": "paged optimizer states (CUDA managed memory, outside torch's allocator): in no component, "
                           "phase or peak; the device holds peak + paged_bytes while they are resident", **found,
               "unverified_versions": guard,
               **model_info(model, source="formula", config=raw, mode=setup.mode), "published_model": twin,
               "peak_range": None if span is None else {
                   **span.to_dict(), "exact_peak": exact_peak_hint(span, _hf_target(args, model), setup)},
               "ranks": [r.to_dict() for r in bd.ranks], "layout": bd.layout}
        print_json(out, indent=2)
        return 0
    print(_header(model, setup, bd))
    _print_assumed(args, setup, bd)
    _print_verdict(verdict, device)
    _print(args, model, raw, setup, bd, twin, span)
    _print_answers(found, verdict)
    _print_assumptions(args, bd)
    return 0


def _read_regex(args: argparse.Namespace, model: Any, raw: dict[str, Any] | None, setup: Any) -> Any:
    """``setup`` with a ``--lora-targets`` regex read against the Hugging Face model's module names
    (:func:`memlab.model.hf.read_lora_regex`), the reading said on stderr: whole kinds in every block become their
    comma list (the formula answers); otherwise the regex stays and the formula's refusal sends the call to the
    trace, which passes it to peft."""
    from memlab.predict.spec.setup import is_target_regex

    hf = _hf_target(args, model)
    if setup.finetune not in ("lora", "qlora") or not is_target_regex(setup.lora_targets) or hf is None:
        return setup
    from memlab.model.hf import read_lora_regex

    reading = read_lora_regex(raw if raw is not None else hf, setup.lora_targets)
    print(f"memlab: {reading.why}", file=sys.stderr)
    return setup.with_(lora_targets=reading.kinds) if reading.kinds else setup


def _asked_answers(args: argparse.Namespace, model: Any, setup: Any) -> list[str]:
    """The answer flags given (``--max-batch``, ``--longest-seq``, ``--levers``, ``--serving``), refusing those the
    call cannot answer: without ``--gpu``, for a bare count, levers of an inference step, or serving a training
    one."""
    answers = [flag for flag, on in (("--max-batch", args.max_batch), ("--longest-seq", args.longest_seq),
                                     ("--levers", args.levers), ("--serving", bool(args.serving))) if on]
    if answers and args.gpu is None:
        raise MemlabError(f"{', '.join(answers)} answer(s) for a card: add --gpu NAME (see 'memlab gpus')")
    if answers and isinstance(model, int):
        raise MemlabError(f"{', '.join(answers)} need a model config (--preset, dimensions or --hf), not --params")
    if args.levers and setup.mode != "train":
        raise MemlabError("--levers ranks ways to fit a training step: drop --mode inference")
    if args.serving and setup.mode != "inference":
        raise MemlabError("--serving searches the batch of a served model: add --mode inference")
    return answers


def _print_assumptions(args: argparse.Namespace, bd: Any) -> None:
    """Every assumption with ``--explain``; otherwise how many there are and how to see them."""
    if args.explain:
        print("\nassumptions (all):")
        for line in bd.assumptions:
            print(f"  - {line}")
    else:
        print(f"\n({len(bd.assumptions)} assumptions in all: --explain lists them)")


def assumed_lines(args: argparse.Namespace, setup: Any, bd: Any) -> list[str]:
    """The few assumptions a reader needs before the verdict: the attention kernel and why, the optimizer's
    implementation, the call and its loss, and what the device adds that the peak leaves out."""
    from memlab.predict.spec.setup import resolve_optimizer_impl

    why = getattr(args, "assumed_attention", None)
    lines = [why or f"attention {setup.attention} (as named)"]
    if setup.mode == "train":
        impl = resolve_optimizer_impl(setup.optimizer, setup.optimizer_impl, "cuda")
        named = "" if setup.optimizer_impl != "auto" else " (what torch.optim picks on CUDA)"
        qlora = "" if setup.finetune != "qlora" or "precision" in given_setup_fields(args) else (
            " (QLoRA's bnb_4bit_compute_dtype bf16; --precision amp-fp16 for a card without bf16)"
            if setup.precision == "bf16" else " (a card without bf16: QLoRA's fp16 recipe, bnb_4bit_compute_dtype="
            "float16 under fp16 autocast and a GradScaler)")
        paged = ("; its states of tensors >= 1e5 elements paged (CUDA managed memory, outside torch's allocator)"
                 if bd.paged_bytes else "")
        lines.append(f"optimizer {setup.optimizer}, {impl} implementation{named}{paged}; precision {setup.precision}"
                     f"{qlora}")
        call = "model(input_ids, labels=...): transformers' loss on fp32 logits" if setup.loss_call == "labels" \
            else "logits = model(input_ids).logits, then F.cross_entropy by hand"
        lines.append(f"the call: {call}; loss {setup.loss}"
                     + (f", the last {setup.logits_to_keep} positions" if setup.logits_to_keep else ""))
    else:
        keep = ("every position's logits (a plain forward)" if not setup.logits_to_keep else "the last position's "
                "logits (generate()'s)" if setup.logits_to_keep == 1 else f"the last {setup.logits_to_keep} "
                "positions' logits")
        cache = "dynamic KV cache (generate()'s default)" if setup.kv_cache == "dynamic" else "static KV cache"
        lines.append(f"the call: generate(): a prefill of seq - 1 tokens with {keep}, then decoding with a {cache}")
    left = [k for k, v in bd.overhead.items() if k in ("cuda_context", "workspace", "fragmentation") and not v]
    if left and args.gpu is not None:
        lines.append("the verdict is on device-used (nvidia-smi): the peak's tensors + cuBLAS workspaces (+ DDP "
                     "buckets) + the allocator's reserve + the CUDA context (+ NCCL buffers), each its library's "
                     "default or documented range (--cuda-context-mib, --workspace-mib, --fragmentation override)")
    elif left:
        lines.append(f"live tensors only: {', '.join(left)} not added (--cuda-context-mib, --workspace-mib, "
                     "--fragmentation)")
    return lines


def _print_assumed(args: argparse.Namespace, setup: Any, bd: Any) -> None:
    """The short "what memlab assumed" block, first after the header."""
    print("assumed:")
    for line in assumed_lines(args, setup, bd):
        print(f"  - {line}")


def _per_rank_layout(args: argparse.Namespace, model: Any, setup: Any) -> str | None:
    """The flags of a layout whose ranks differ (``--pp/--cp`` or ``--ep``), refusing what it does not model; None
    on one device or under pure data and tensor parallelism."""
    layout = "--pp/--cp" if setup.pp > 1 or setup.cp > 1 else "--ep" if setup.ep > 1 else None
    if layout is None:
        return None
    if isinstance(model, int):
        raise MemlabError("--pp/--cp place layers and tokens on ranks: give a model config (--preset, dimensions or "
                          "--hf), not --params" if layout == "--pp/--cp" else
                          "--ep places experts on ranks: give a mixture-of-experts config (--preset, dimensions with "
                          "--n-experts, or --hf), not --params")
    flags = [f for f, on in (("--max-batch", args.max_batch), ("--longest-seq", args.longest_seq),
                             ("--levers", args.levers), ("--gathered-layers", args.gathered_layers)) if on]
    if flags:
        raise MemlabError(f"{', '.join(flags)} are not modelled with {layout}: drop them")
    return layout


def _overheads(args: argparse.Namespace, ranked: str | None, overheads: Any) -> Any:
    """The estimate's :class:`~memlab.predict.estimate.Overheads` of the options. A layout whose ranks differ
    (``ranked``) takes the overhead options in its ``--gpu`` verdict only (the per-rank estimate has no overhead
    component): there they need ``--gpu``, refused in one line without it, never ignored."""
    from memlab.cli.device_view import given_overheads

    given = given_overheads(args)
    if ranked is not None:
        if given and args.gpu is None:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
            raise MemlabError(f"{flags}: with {ranked} they go into the --gpu verdict (the worst rank's device-used "
                              "peak): give --gpu NAME too, or drop them")
        return overheads(gathered_layers=args.gathered_layers)
    return overheads(cuda_context_bytes=round(given.get("cuda_context_mib", 0) * MIB),
                     workspace_bytes=round(given.get("workspace_mib", 0) * MIB),
                     fragmentation_fraction=given.get("fragmentation", 0.0), gathered_layers=args.gathered_layers)


def _header(model: Any, setup: Any, bd: Any) -> str:
    """The first line: the model, the step and its layout."""
    name = model.name if bd.config is not None else "bare parameter count"
    s = setup
    line = (f"memlab estimate: {name} ({bd.param_count:,} parameters), {s.mode}, batch {s.batch} x seq {s.seq}, "
            f"{s.precision if s.mode == 'train' else s.inference_weights + ' weights'}, "
            f"{s.optimizer + ', ' if s.mode == 'train' else ''}recompute {s.recompute}"
            f"{f' every {s.recompute_every}' if s.recompute_every > 1 else ''}, attention {s.attention}, "
            f"ZeRO-{s.zero_stage} over {s.world_size} rank(s), tp {s.tp}{' + sp' if s.sp else ''}")
    if s.pp > 1 or s.cp > 1:
        line += (f", pp {s.pp} ({s.pp_schedule}, {s.pp_chunks} chunk(s)), {s.micro_batches} micro-batch(es), "
                 f"cp {s.cp}")
    if s.ep > 1:
        line += f", ep {s.ep} ({s.ep_routing} routing)"
    return line


def _print(args: argparse.Namespace, model: Any, raw: Any, setup: Any, bd: Any, twin: Any, span: Any) -> None:
    """The breakdown: the worst rank's components (the one device's on one device), the phases, every rank where
    ranks differ, the peak and its range."""
    info = model_info(model, source="formula", config=raw, mode=setup.mode)
    print(f"model: {info['model_label']}; source of truth: formula (memlab.predict.estimate); step: "
          f"{info['calling_convention']}")
    if twin is not None:
        name = model.name
        print(f"  {name} as its published code runs it (--preset {name} or --hf {name}): peak "
              f"{twin['peak']:,} B, activations {twin['activations']:,} B (here: {bd.peak_bytes:,} and "
              f"{bd.activations_bytes:,} B)")
    print(f"\n{'per device' if not bd.layout else 'worst rank':<24}{'bytes':>17} {'GiB':>10} {'GB':>10}")
    for comp, value in bd.components().items():
        print(f"{comp:<24}{_size(value)}")
        detail = {"activations": bd.activation_detail, "optimizer": bd.optimizer_detail,
                  "overhead": bd.overhead}.get(comp, {})
        for key, v in detail.items():
            print(f"  {key:<22}{_size(v)}")
    print(f"{'total (sum)':<24}{_size(bd.total_bytes)}")
    if bd.phases:
        print("\nwhen the bytes appear (held at once; zero_grad: after it):")
        for row in bd.phases:
            mark = "  <- peak" if (row.step, row.phase) == (bd.peak_step, bd.peak_phase) else ""
            print(f"  {row.step + ' ' + row.phase:<34}{_size(row.peak_bytes)}{mark}")
    if bd.layout:
        _print_ranks(bd)
    print(f"{'peak':<24}{_size(bd.peak_bytes)}")
    if span is not None and span.terms:
        _print_range(span, _hf_target(args, model), setup)
    if setup.offload_activations or getattr(setup, "fsdp_offload", False):
        what = "; ".join(w for w, on in (("saved activations: at least this", setup.offload_activations),
                                          ("FSDP2 shards, gradients and optimizer states", setup.fsdp_offload)) if on)
        print(f"{'host (pinned, offload)':<24}{_size(bd.host_bytes)}  (not on the device; {what})")
    if bd.paged_bytes:
        print(f"{'paged optimizer states':<24}{_size(bd.paged_bytes)}  (CUDA managed memory, outside torch's "
              "allocator: not in the peak)")
        print(f"{'device, paged resident':<24}{_size(bd.device_peak_bytes)}  (peak + paged: what nvidia-smi shows "
              "when both fit)")
    print("(GiB = 2**30 bytes, GB = 10**9 bytes)")


def _print_ranks(bd: Any) -> None:
    """Every rank of a layout whose ranks differ: pipeline ranks one per row, with the bubble; an expert-parallel
    rank with its (token, expert) pairs and all-to-all volume."""
    layout = bd.layout
    print(f"\n{'rank':<22}{'holds':<34}{'states GiB':>12}{'acts GiB':>10}{'other GiB':>11}{'peak GiB':>10}")
    for r in bd.ranks:
        flight = r.detail.get("in_flight")
        holds = r.holds + (f" ({'+'.join(map(str, flight))} in flight)" if flight else "")
        mark = "  <- worst" if layout.get("worst_rank") is not None and r.rank == str(layout["worst_rank"]) else ""
        print(f"{r.rank[:21]:<22}{holds[:33]:<34}{r.states_bytes / GiB:>12.3f}{r.activations_bytes / GiB:>10.3f}"
              f"{r.other_bytes / GiB:>11.3f}{r.peak_bytes / GiB:>10.3f}{mark}")
    if layout["kind"] == "pipeline":
        print(f"pipeline bubble: {layout['bubble_fraction']:.1%} of the step idle [narayanan2021]")
    else:
        d = bd.ranks[0].detail
        print(f"(token, expert) pairs per MoE layer: {d['sent_pairs']:,} sent, {d['received_pairs']:,} received; "
              f"all-to-all moment {d['all_to_all_bytes'] / GiB:.3f} GiB; {layout['sent_bytes'] / GiB:.3f} GiB sent "
              "per step by all-to-all (memlab.predict.parallel.communication.ep_sent_bytes)")
    print()


def _print_verdict(verdict: Any, device: Any = None) -> None:
    """The verdict on device-used (nvidia-smi) with its three peaks, then the tensor peak against the card."""
    if verdict:
        if device is not None:
            print_peaks(device, f"{verdict.gpu_name} ({verdict.gpu})")
        print(f"tensors alone: peak {verdict.peak_bytes / GiB:.2f} GiB ({verdict.peak_phase}) of "
              f"{verdict.capacity_bytes / GiB:.2f} GiB ({verdict.capacity_bytes / GB:.1f} GB, the table's); headroom "
              f"{verdict.headroom_bytes / GiB:+.2f} GiB before the device terms above")
        if verdict.paged_bytes:
            print(f"  {verdict.paged_note()}")
    else:
        print("verdict: none (pass --gpu NAME to check the fit)")


def _version_guard(args: argparse.Namespace, model: Any) -> str | None:
    """For a Hugging Face family (``--hf``, or a preset read from a published config): the one line (on stderr)
    that says the installed transformers, torch or peft is not the release the family terms were verified against
    (:func:`memlab.predict.spec.versions.unverified_line`), or None. memlab's own GPT is not guarded: its count is of
    memlab's code."""
    import sys

    from memlab.predict.spec.versions import unverified_line

    line = unverified_line() if _hf_target(args, model) is not None else None
    if line is not None:
        print(f"memlab: {line}", file=sys.stderr)
    return line


def _traced_beside(args: argparse.Namespace, model: Any, raw: dict[str, Any] | None, setup: Any, bd: Any,
                   guard: str) -> int | None:
    """The answer under an unverified library release: the trace of the installed code (progress on stderr, the
    ``--timeout`` bound), the formula's phases beside it. None when the trace cannot take this call (its one-line
    reason on stderr): the formula's number follows, the guard's line above it."""
    import sys

    from memlab.cli.traced import print_trace, trace_config

    print(f"memlab: tracing the installed code on fake tensors (source of truth: trace; at most {args.timeout:g} s, "
          "--timeout; --no-trace gives the formula alone)", file=sys.stderr)
    args.top = getattr(args, "top", 8)
    try:
        result, _ = trace_config(args, _hf_target(args, model) or args.hf, setup)
    except MemlabError as exc:
        print(f"memlab: the trace cannot answer this call ({exc}); the formula's number follows, unverified",
              file=sys.stderr)
        return None
    extra = {**model_info(model, source="trace", config=raw), "unverified_versions": guard}
    return print_trace(args, result, setup, bd, extra=extra)


def _hf_target(args: argparse.Namespace, model: Any) -> str | None:
    """What ``--hf`` names this model by: the path given, or a published preset's name (``--hf NAME`` reads the
    same shipped config); None for memlab's own GPT or a bare count."""
    if getattr(getattr(model, "impl", None), "family", "reference") == "reference":
        return None
    from memlab.predict.families.resolver import shipped_name

    return (shipped_name(args.hf) or args.hf) if args.hf else getattr(args, "preset", None)


def exact_peak_hint(span: Any, hf: str | None, setup: Any) -> str | None:
    """Where this config's exact peak comes from when the named terms leave the formula's peak a range wider than
    0.1 % (:data:`memlab.compare.tolerances.TOLERANCE`): the trace of transformers' own code (``memlab trace
    --hf``, the one call the command line describes: no mask, ``labels=``; selective recompute has no transformers
    equivalent). None where the range is that tight or the model is not a Hugging Face config."""
    from memlab.compare.tolerances import TOLERANCE

    if hf is None or span.high - span.low <= TOLERANCE * span.peak or setup.recompute == "selective":
        return None
    # the trace equals real CPU steps (benchmarks/hf_draws.py, verdict 'traced'): cited here, not on every answer
    return (f"the range is wider than 0.1 % of the peak: memlab trace --hf {hf} with the same options gives this "
            "code's exact peak (transformers' own code, run on fake tensors)")


def _print_range(span: Any, hf: str | None, setup: Any) -> None:
    """The real peak's range from the terms the estimate names (:func:`memlab.predict.coverage.peak_range`), and
    where the exact peak comes from when that range is wide (:func:`exact_peak_hint`)."""
    rel = (f"{100 * (span.low - span.peak) / span.peak:+.2f} % / {100 * (span.high - span.peak) / span.peak:+.2f} %"
           if span.peak else "")
    print(f"{'peak range':<24}{span.low:>17,} to {span.high:,} B ({rel}): the real peak, given the terms the "
          "estimate names as left out:")
    for t in span.terms:
        print(f"  {'+' if t.sign > 0 else '-'}{t.bytes:>15,} B  {t.name} ({', '.join(t.phases)})")
    hint = exact_peak_hint(span, hf, setup)
    if hint:
        print(f"  {hint}")


def _model(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None, str | None]:
    """(model, the config dict or None, why the formula refused it or None): the model of ``--hf PATH`` (read
    offline with :func:`memlab.predict.families.reader.from_hf`) or of the MODEL options."""
    if args.hf is None:
        model = model_from_args(args)
        if args.no_trace and _hf_target(args, model) is None:
            raise MemlabError("--no-trace goes with --hf or a published preset (memlab's own GPT, dimensions or a "
                              "count are always the formula's)")
        return model, None, None
    from memlab.cli.args import given_model_options
    from memlab.predict.families.reader import read_config_json

    given = given_model_options(args)
    if given:
        raise MemlabError(f"the model comes from --hf, so {', '.join(given)} would be ignored: drop them (the sizes "
                          "are the config's) or drop --hf")
    raw = read_config_json(args.hf)
    try:
        return resolve_with_raw(args.hf)[0], raw, None
    except ConfigError as exc:
        if args.no_trace:
            raise
        return None, raw, str(exc)


def _traced(args: argparse.Namespace, raw: dict[str, Any], refused: str) -> int:
    """The trace's answer for a config the formula does not cover (point 5 of issue 17): said plainly first."""
    import sys

    from memlab.cli.traced import print_trace, trace_config

    answers = [f for f, on in (("--max-batch", args.max_batch), ("--longest-seq", args.longest_seq),
                               ("--levers", args.levers), ("--serving", bool(args.serving))) if on]
    if answers:
        raise MemlabError(f"the formula does not cover this config ({refused}); {', '.join(answers)} search with the "
                          "formula: drop them to get the trace's answer")
    print(f"memlab: the formula does not cover this config: {refused}\nmemlab: tracing transformers' modelling code "
          f"on fake tensors instead (source of truth: trace; at most {args.timeout:g} s, --timeout; --no-trace "
          "refuses)", file=sys.stderr)
    args.top = getattr(args, "top", 8)
    result, setup = trace_config(args, args.hf, setup_of(args, 1))  # a bare count: the default seq (1024)
    return print_trace(args, result, setup, None, extra=model_info(None, source="trace", config=raw,
                                                                         refused=refused, task=setup.task))


def _traced_setup(args: argparse.Namespace, model: Any, raw: dict[str, Any] | None, setup: Any, refused: str) -> int:
    """The trace's answer for a setup the formula does not model (a row of :mod:`memlab.predict.coverage`) on a
    Hugging Face config: transformers' code on fake tensors, the formula's reason said first. Where the trace cannot
    take the setup either, the refusal stands, with the trace's reason."""
    import sys

    from memlab.cli.traced import print_trace, trace_config

    print(f"memlab: the formula does not model this setup: {refused}\nmemlab: tracing transformers' modelling code "
          f"on fake tensors instead (source of truth: trace; at most {args.timeout:g} s, --timeout; --no-trace "
          "refuses)", file=sys.stderr)
    args.top = getattr(args, "top", 8)
    try:
        result, setup = trace_config(args, _hf_target(args, model), setup)
    except MemlabError as exc:
        raise MemlabError(f"{refused} (the trace cannot take it either: {exc})") from None
    return print_trace(args, result, setup, None, extra=model_info(model, source="trace", config=raw,
                                                                   refused=refused, task=setup.task))


def _answers(args: argparse.Namespace, model: Any, setup: Any, ov: Any) -> dict[str, Any]:
    """``--max-batch``, ``--longest-seq``, ``--serving`` and ``--levers`` answered from the phase-aware peak
    (memlab.predict.fit), each decided on device-used as the verdict is: the card of :func:`card` (``--gpu``,
    ``--gpu-memory-gib``) and the device terms of the options (:func:`memlab.cli.device_view.overheads_of`)."""
    from memlab.predict.estimate import estimate
    from memlab.predict.fit import fits, levers, max_batch, max_seq, plan_to_fit, serving_table

    out: dict[str, Any] = {}
    if args.gpu is None:  # no answer is asked without a card (_asked_answers refused them)
        return out
    gpu, dev = card(args), overheads_of(args)
    if args.max_batch:
        out["max_batch"] = max_batch(model, setup, gpu, overheads=ov, device=dev).to_dict()
    if args.longest_seq:
        out["max_seq"] = max_seq(model, setup, gpu, overheads=ov, device=dev).to_dict()
    if args.serving:
        out["serving"] = serving_table(model, setup, gpu, args.serving, overheads=ov, device=dev)
        out["serving_gpu"] = args.gpu
    if args.levers:
        out["levers"] = [r.to_dict() for r in levers(model, setup, gpu, world_size=args.lever_ranks, overheads=ov,
                                                     device=dev)]
        names, fitted, peak = plan_to_fit(model, setup, gpu, world_size=args.lever_ranks, overheads=ov, device=dev)
        v = fits(estimate(model, fitted, overheads=ov), gpu, device=dev)
        out["to_fit"] = {"levers": names, "peak_bytes": peak, "setup": fitted.to_dict(), "fits": v.fits,
                         "device_bytes": v.used_bytes, "margin_bytes": v.margin_bytes}
    return out


def lever_answers(args: argparse.Namespace) -> dict[str, Any]:
    """``--levers`` for the model and setup options of ``args`` on ``args.gpu`` (``memlab oom`` calls it): the
    levers ranked and the plan that fits (:func:`_answers`), with the card's capacity. A model the formula does not
    cover is one error line (the levers search with the formula)."""
    for flag in ("no_trace", "max_batch", "longest_seq", "serving", "fsdp", "zero_stage", "cuda_context_mib",
                 "workspace_mib", "fragmentation"):
        if not hasattr(args, flag):
            setattr(args, flag, None if flag != "no_trace" else False)
    args.levers, args.gathered_layers = True, 0
    model, _, refused = _model(args)
    if refused is not None:
        raise MemlabError(f"the formula does not cover this config ({refused}); the levers search with the formula")
    setup = setup_of(args, model)
    _asked_answers(args, model, setup)
    found = _answers(args, model, setup, None)
    found["capacity_bytes"] = card(args).memory_bytes
    return found


def print_lever_answers(found: dict[str, Any]) -> None:
    """The levers of :func:`lever_answers`, as ``memlab estimate --levers`` prints them."""
    from types import SimpleNamespace

    _print_answers(found, SimpleNamespace(capacity_bytes=found["capacity_bytes"]))


def _print_answers(found: dict[str, Any], verdict: Any) -> None:
    for key in ("max_batch", "max_seq"):
        if key in found:
            r = found[key]
            both = f"{r['value']:,}" if r["up_to"] in (None, r["value"]) else \
                f"{r['value']:,} for certain, up to {r['up_to']:,}"
            print(f"\n{key.replace('_', ' ')} on {r['gpu']}: {both} ({r['reason']}; decided on device-used: the peak, "
                  "never the sum, + the device terms of the verdict, the allocator's reserve from 0 to its bound)")
    if "serving" in found:
        print(f"\nserving on {found['serving_gpu']}: the largest batch per context (generate()'s prefill and decode; "
              "peak, never the sum; decided on device-used, the margin = capacity - its high end)")
        print("  'max batch' fits for certain (the allocator's reserve at its bound); up to 'may fit' the reserve "
              "decides (memlab trace --gpu --max-batch replays it); above it nothing fits")
        print(f"  {'context':>9} {'max batch':>9} {'may fit':>8} {'peak GiB':>9} {'at':8} {'KV cache GiB':>12} "
              f"{'device GiB':>10} {'margin GiB':>10}")
        for r in found["serving"]:
            print(f"  {r['context']:>9,} {r['max_batch']:>9,} {r['max_batch_up_to']:>8,} {r['peak_bytes'] / GiB:>9.2f} "
                  f"{r['peak_phase']:8} "
                  f"{r['kv_cache_bytes'] / GiB:>12.2f} {r['device_bytes'] / GiB:>10.2f} "
                  f"{r['margin_bytes'] / GiB:>+10.2f}")
    if "levers" in found:
        print(f"\nlevers, ranked by the device-used peak each gives alone (capacity "
              f"{verdict.capacity_bytes / GiB:.2f} GiB; 'peak' = the tensors, 'device' = + the verdict's device "
              "terms at their high end, what fits is decided on; 'reserve decides': fits only with a reserve under the "
              "bound):")
        for r in found["levers"]:
            extra = []
            if r["extra_flops"]:
                extra.append(f"+{r['extra_flops'] / 1e12:,.1f} TFLOP/step")
            if r["host_bytes"]:
                extra.append(f"host {r['host_bytes'] / GiB:,.2f} GiB pinned")
            print(f"  {r['name']:<52}{r['peak_bytes'] / GiB:>9.2f} GiB  {r['peak_phase']:<15}device "
                  f"{r['device_bytes'] / GiB:>6.2f} GiB  {r['word']:<16}"
                  f"margin {r['margin_bytes'] / GiB:+.2f} GiB  {', '.join(extra)}".rstrip())
            print(f"      cost: {r['cost']}")
        fit = found["to_fit"]
        names = " + ".join(fit["levers"]) or "nothing (it fits already)"
        dev = f"device-used {fit['device_bytes'] / GiB:.2f} GiB, margin {fit['margin_bytes'] / GiB:+.2f} GiB"
        if fit["fits"]:
            print(f"to fit, switch on: {names} -> peak {fit['peak_bytes'] / GiB:.2f} GiB, {dev}")
        else:
            print(f"no combination of these levers fits (best: {' + '.join(fit['levers']) or 'none'}, peak "
                  f"{fit['peak_bytes'] / GiB:.2f} GiB, {dev}): a smaller model, a bigger card or more ranks")
