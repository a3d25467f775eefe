"""The printing half of ``memlab trace``, shared with ``memlab estimate --hf`` when the formula does not cover a
config: :func:`trace_config` traces a Hugging Face config (progress on stderr, a time bound) and
:func:`print_trace` prints a finished trace's phase table or JSON, with the fit verdict for ``--gpu``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from memlab.cli.device_view import capacity_bytes, given_overheads, print_peaks
from memlab.errors import MemlabError
from memlab.units import byte_unit, fmt_bytes


def _num(v: float | None, size: float) -> str:
    return "-" if v is None else f"{v / size:,.3f}"


def _verdict(peak: int, gpu: str, step: str, phase: str, paged: int = 0, capacity: int | None = None) -> dict[str, Any]:
    """Whether the traced peak (bytes) fits ``gpu``'s table memory: the fields of a
    :class:`~memlab.predict.fit.FitVerdict`, from the trace; ``paged``: a paged optimizer's states (the trace's
    ``paged_bytes``), outside the peak, and what they mean (:meth:`~memlab.predict.fit.FitVerdict.paged_note`)."""
    from memlab.predict.fit import FitVerdict
    from memlab.predict.hardware.gpus import gpu as lookup

    acc = lookup(gpu)
    cap = int(acc.memory_bytes) if capacity is None else capacity
    note = FitVerdict(peak <= cap, peak, cap, cap - peak, acc.key, acc.name, peak, phase, paged).paged_note()
    return {"fits": peak <= cap, "gpu": acc.key, "gpu_name": acc.name, "capacity_bytes": cap, "peak_bytes": peak,
            "headroom_bytes": cap - peak, "peak_step": step, "peak_phase": phase, "paged_bytes": paged,
            "paged_note": note, "source": "the traced peak (CPU fake tensors), without the CUDA terms a run adds"}


def alloc_conf_text(args: argparse.Namespace) -> str:
    """The allocator settings a replay uses: ``--alloc-conf``, else the environment's ``PYTORCH_ALLOC_CONF`` or
    ``PYTORCH_CUDA_ALLOC_CONF`` (torch reads the first before the second, c10/core/AllocatorConfig.h), else ""
    (torch's defaults)."""
    import os

    given = getattr(args, "alloc_conf", None)
    if given is not None:
        return given
    return os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""


def _replay(args: argparse.Namespace, result: Any, setup: Any, predicted: Any) -> tuple[dict[str, Any], Any] | None:
    """With ``--gpu``: the trace's allocations replayed through the caching allocator model in the room the card
    leaves it (:func:`memlab.predict.gpu.device.for_trace`: the capacity less the context, NCCL's buffers and the
    workspaces), with the settings of :func:`alloc_conf_text` and with ``expandable_segments:True`` added; and the
    device peaks decided on that replay. None without ``--gpu`` or without a log."""
    if args.gpu is None or not result.allocations.events:
        return None
    from dataclasses import asdict, replace

    from memlab.cli.device_view import overheads_of
    from memlab.predict.gpu.alloc_conf import parse_alloc_conf
    from memlab.predict.gpu.device import allocator_room, for_trace, terms

    cap, text = capacity_bytes(args), alloc_conf_text(args)
    conf, ov = parse_alloc_conf(text), overheads_of(args)
    grads = predicted.grads_bytes if predicted is not None else 0
    device, r = for_trace(result, setup, args.gpu, cap, config=conf, grads_bytes=grads, overheads=ov)
    room = allocator_room(cap, terms(args.gpu, setup, ov, grads))
    e = result.replay(replace(conf, expandable_segments=True), capacity_bytes=room)
    whole = r if r.fits else result.replay(conf)  # where the card runs out: the reserve the whole step would ask
    rep = {"alloc_conf": text, "capacity_bytes": cap, "allocator_room_bytes": room, "fits": r.fits,
           "oom_event": r.oom_event, "alloc_retries": r.alloc_retries,
           "uncapped_reserve_bytes": whole.total.reserved_bytes - whole.total.requested_bytes,
           "oom_request_bytes": r.oom_request_bytes, "total": asdict(r.total),
           "phases": [{**asdict(p), "reliable": row.reliable} for p, row in zip(r.phases, result.phases, strict=True)],
           "expandable_reserved_peak_bytes": e.total.reserved_bytes,
           "expandable_fits": e.fits, "events": len(result.allocations),
           "source": "a model of PyTorch's CUDA caching allocator (torch 2.13 rules, memlab.predict.gpu) replayed on "
                     "the traced allocations in the room the card leaves it (capacity - the CUDA context, NCCL's "
                     "buffers and the workspaces): not a GPU measurement"}
    return rep, device


def _print_replay(rep: dict[str, Any]) -> None:
    """The replay's peaks per phase: requested bytes (the trace's) beside the modelled allocated (torch's
    ``memory_allocated``: the rounded blocks in use, active_bytes on one stream) and reserved bytes."""
    conf, t = rep["alloc_conf"] or "torch's defaults", rep["total"]
    unit, size = byte_unit(t["reserved_bytes"])
    print(f"caching allocator, modelled (PyTorch's rules replayed on the {rep['events']:,} traced allocations and "
          f"frees; not a GPU measurement; PYTORCH_CUDA_ALLOC_CONF: {conf}):")
    print(f"  {'phase':<34} {'requested ' + unit:>14} {'allocated ' + unit:>14} {'reserved ' + unit:>14} "
          f"{'frag. ' + unit:>10}")
    for p in rep["phases"]:
        print(f"  {p['label']:<34} {_num(p['requested_bytes'], size):>14} {_num(p['active_bytes'], size):>14} "
              f"{_num(p['reserved_bytes'], size):>14} {_num(p['fragmentation_bytes'], size):>10}"
              + ("" if p["reliable"] else "  (unreliable on fake tensors)"))
    print(f"  peak reserved {fmt_bytes(t['reserved_bytes'], digits=3)} ({t['reserved_bytes']:,} B; "
          f"max_memory_reserved), allocated {fmt_bytes(t['active_bytes'], digits=3)} (max_memory_allocated: rounded "
          f"blocks), requested {fmt_bytes(t['requested_bytes'], digits=3)} (the trace's peak); largest cached free "
          f"block at the requested peak {fmt_bytes(t['largest_free_bytes'], digits=3)}; with "
          f"expandable_segments:True reserved {fmt_bytes(rep['expandable_reserved_peak_bytes'], digits=3)}")
    if rep["fits"] and rep["alloc_retries"]:
        print(f"  on the card the allocator runs out of room {rep['alloc_retries']:,} time(s), frees its cached blocks "
              "and retries: the step fits, each flush costs time (torch.cuda.memory_stats()['num_alloc_retries'])")
    if not rep["fits"]:
        print(f"  the replay runs out of the {fmt_bytes(rep['allocator_room_bytes'], digits=3)} the card leaves the "
              f"allocator ({fmt_bytes(rep['capacity_bytes'], digits=3)} less the context, NCCL and workspaces) at "
              "allocation event "
              f"{rep['oom_event']:,} ({fmt_bytes(rep['oom_request_bytes'], digits=3)} requested), after releasing "
              "its cached blocks" + ("; with expandable_segments:True it fits" if rep["expandable_fits"] else ""))


def trace_config(args: argparse.Namespace, target: str, setup: Any) -> tuple[Any, Any]:
    """(trace, setup) of the Hugging Face config ``target`` names (any spelling of
    :func:`memlab.predict.families.resolver.locate`) under ``setup``, with progress lines on stderr and
    the ``--timeout`` bound (:mod:`memlab.tracing.progress`); the setup returned has its ``task`` resolved (``auto``
    is the head the trace built: :func:`memlab.model.tasks.resolve_task`)."""
    from memlab.model.hf import hf_config
    from memlab.model.tasks import resolve_task
    from memlab.predict.families.resolver import locate
    from memlab.tracing.hf import trace_hf
    from memlab.tracing.progress import Progress

    cfg = hf_config(locate(target), task=setup.task)  # a published name is its shipped config, not a model type
    task = resolve_task(cfg, setup.task)
    head = "" if task == "causal-lm" else f":{task}"
    result = trace_hf(cfg, setup, name=f"hf:{Path(target).stem}:{cfg.model_type}{head}", progress=Progress(),
                      timeout=args.timeout)
    return result, setup.with_(task=task)


def _print_json(args: argparse.Namespace, result: Any, predicted: Any, extra: dict[str, Any],
                verdict: dict[str, Any] | None, rep: dict[str, Any] | None = None, device: Any = None) -> int:
    """The trace as JSON, with the formula's phases beside it where it answers, the top modules and the verdict."""
    out = {**result.to_dict(), **extra}
    if predicted is not None:
        out["estimate"] = {"phases": [r.to_dict() for r in predicted.phases], "peak": predicted.peak_bytes,
                           "peak_phase": predicted.peak_phase, "peak_step": predicted.peak_step,
                           "total": predicted.total_bytes}
    out["top_modules"] = result.modules_by_kind(args.top)
    out["verdict"] = verdict
    out["allocator_replay"] = rep
    out["device"] = device.to_dict() if device is not None else None
    print(json.dumps(out, indent=2, default=str))
    return 0


def _recompute(setup: Any) -> str:
    """``recompute full every k`` for full recompute of every k-th block (k > 1), else ``recompute <policy>``."""
    return f"recompute {setup.recompute}" + (f" every {setup.recompute_every}" if setup.recompute_every > 1 else "")


def print_trace(args: argparse.Namespace, result: Any, setup: Any, predicted: Any,
                extra: dict[str, Any] | None = None) -> int:
    """The phase table (or JSON) of a finished trace, with the fit verdict when ``--gpu`` is given; ``extra``
    (:func:`memlab.cli.hf_source.model_info`) goes into the JSON and the header."""
    extra = extra or {}
    refuse_overheads_without_gpu(args)
    verdict = (_verdict(result.peak_bytes, args.gpu, result.peak_step, result.peak_phase, result.paged_bytes,
                        capacity_bytes(args))
               if args.gpu is not None
               else None)
    replayed = _replay(args, result, setup, predicted) if verdict is not None else None
    rep, device = replayed if replayed is not None else (None, None)
    if args.json:
        return _print_json(args, result, predicted, extra, verdict, rep, device)
    unit, size = byte_unit(result.peak_bytes)
    print(f"memlab trace: {result.model}, batch {setup.batch} x seq {setup.seq}, {setup.precision}, {setup.optimizer}, "
          f"attention {result.setup.get('attention', setup.attention)}, {_recompute(setup)} (fake tensors on CPU; "
          "GiB = 2**30 bytes)")
    if extra:
        label = extra.get("model_label", extra["family"])
        print(f"model: {label}; source of truth: trace (the real modelling code on fake tensors)"
              + ("" if predicted is not None else "; no formula column: "
                 + extra.get("formula_refused", "the formula does not cover it")))
    print(f"  {'step':<7} {'phase':<26} {'trace ' + unit:>12} {'formula ' + unit:>12} {'error':>8}")
    for row in result.phases:
        traced = row.held_bytes
        pred = None
        if predicted is not None:
            try:
                pred = predicted.phase_bytes(row.phase, row.step)
            except MemlabError:
                pred = None
        err = "-" if pred is None or not traced else f"{100 * (pred - traced) / traced:+.1f} %"
        mark = "  <- peak" if (row.step, row.phase) == (result.peak_step, result.peak_phase) else ""
        if not row.reliable:
            mark = "  (unreliable on fake tensors: see the notes)"
        label = row.phase + (" (after)" if row.phase == "zero_grad" else "")
        print(f"  {row.step:<7} {label:<26} {_num(traced, size):>12} {_num(pred, size):>12} {err:>8}{mark}")
    cats = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in result.peak_by_category.items() if v)
    print(f"peak: {fmt_bytes(result.peak_bytes, digits=3)} ({result.peak_bytes:,} B) in the {result.peak_step} "
          f"step's {result.peak_phase}: {cats}")
    if predicted is not None:
        print(f"formula: peak {fmt_bytes(predicted.peak_bytes, digits=3)} ({predicted.peak_step} "
              f"{predicted.peak_phase}); sum of components {fmt_bytes(predicted.total_bytes, digits=3)}")
    if setup.offload_activations:
        est_host = f"; the formula's lower bound {fmt_bytes(predicted.host_bytes, digits=3)}" if predicted else ""
        print(f"host (pinned, offloaded activations): {fmt_bytes(result.host_bytes, digits=3)} "
              f"({result.host_bytes:,} B) copied per forward{est_host}")
    if result.paged_bytes:
        print(f"paged optimizer states: {fmt_bytes(result.paged_bytes, digits=3)} ({result.paged_bytes:,} B; CUDA "
              "managed memory on a GPU, outside torch's allocator: in no phase above)")
    print(f"top {args.top} modules by activation bytes kept for backward (summed over layers):")
    for m in result.modules_by_kind(args.top):
        name = m["module"] if len(m["module"]) <= 56 else "..." + m["module"][-53:]
        print(f"  {name:<56} x{m['count']:<4} {fmt_bytes(m['activation_bytes']):>12}")
    for note in result.notes:
        print(f"note: {note}")
    print("not seen by a CPU trace (add on CUDA): " + "; ".join(f"{t['term']} ({t['source']})"
                                                                for t in result.cuda_terms))
    if verdict is not None:
        _print_verdict(verdict, rep, device)
    return 0


def refuse_overheads_without_gpu(args: argparse.Namespace) -> None:
    """A trace uses ``--cuda-context-mib``, ``--workspace-mib`` and ``--fragmentation`` only in its ``--gpu``
    verdict: without ``--gpu`` they are refused in one line, never ignored."""
    given = [f"--{k.replace('_', '-')}" for k in given_overheads(args)]
    if given and args.gpu is None:
        raise MemlabError(f"{', '.join(given)}: a trace uses them in the --gpu verdict (device-used peak): give "
                          "--gpu NAME too, or drop them")


def _print_verdict(verdict: dict[str, Any], rep: dict[str, Any] | None, device: Any = None) -> None:
    """The ``--gpu`` verdict on device-used (when the trace has an allocation log), the traced peak against the
    card, then the caching allocator replayed on that card."""
    word = "FITS" if verdict["fits"] else "DOES NOT FIT"
    if device is not None:
        print_peaks(device, f"{verdict['gpu_name']} ({verdict['gpu']})")
    print(f"{'tensors alone' if device is not None else 'verdict'}: {word} on {verdict['gpu_name']} "
          f"({verdict['gpu']}): traced peak "
          f"{fmt_bytes(verdict['peak_bytes'], digits=3)} of {fmt_bytes(verdict['capacity_bytes'], digits=3)}, "
          f"headroom {verdict['headroom_bytes'] / 2**30:+.2f} GiB, before the CUDA terms above")
    if verdict["paged_note"]:
        print(f"  {verdict['paged_note']}")
    if rep is not None:
        _print_replay(rep)
