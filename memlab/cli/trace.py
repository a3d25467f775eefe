"""``memlab trace``: one training step of a model on fake tensors, phase by phase, beside the estimator's phases.

``memlab trace MODEL [setup flags as estimate] [--hf PATH] [--timeout S] [--json]``. MODEL is a preset name (or
``--preset`` / explicit dimensions, as ``estimate``) for the reference GPT, or a Hugging Face config (``--hf``: a
``config.json``, its folder or a model id in the local HF cache; or a path given as MODEL; then no preset or
dimension flag, one process; ``--hf-config`` is the old spelling). A Hugging Face trace prints its progress to
stderr and stops after ``--timeout`` seconds (default 300) with one line. Prints the bytes held at each phase of
the first and the steady step (trace and formula side by side), marks the peak, lists the top modules by the
activation bytes their forward keeps, and with ``--gpu`` says whether the traced peak fits that accelerator. Nothing
is allocated or downloaded; the step runs on CPU fake tensors (:mod:`memlab.tracing.tracer`). Python warnings raised
on the way are shown only when the trace succeeds (an error is one line).
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

from memlab.cli.args import given_model_options, model_from_args, positive_int
from memlab.cli.estimate import add_arguments as add_estimate_arguments
from memlab.cli.estimate import setup_of
from memlab.cli.hf_source import hf_path, model_info
from memlab.errors import MemlabError
from memlab.units import byte_unit, fmt_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``memlab trace``: the estimate's MODEL and setup options (``--hf``, ``--timeout``), ``--top``,
    ``--json``; ``--hf-config`` is a hidden alias of ``--hf``."""
    p.add_argument("model", nargs="?", metavar="MODEL", help="a preset name or a Hugging Face config.json path")
    add_estimate_arguments(p)
    p.add_argument("--hf-config", dest="hf", type=hf_path, help=argparse.SUPPRESS)
    p.add_argument("--top", type=positive_int, default=8, metavar="N", help="modules listed (default 8)")


def _setup(args: argparse.Namespace, model: Any) -> Any:
    """The estimate's Setup: every Setup field is an option (generated in :mod:`memlab.cli.args`)."""
    return setup_of(args, model)


def _target(args: argparse.Namespace) -> tuple[str, Any]:
    """("hf", config path) or ("gpt", TransformerConfig)."""
    from memlab.predict.models import PRESETS

    hf = args.hf
    if args.model is not None:
        if args.model in PRESETS:
            if args.preset is not None:
                raise MemlabError(f"give the preset once: MODEL {args.model!r} or --preset {args.preset!r}")
            args.preset = args.model
        elif Path(args.model).suffix == ".json" or _is_dir(args.model):
            if hf is not None:
                raise MemlabError("give the Hugging Face config once: MODEL or --hf")
            hf = args.model
        else:
            from memlab.errors import unknown_name

            raise unknown_name("preset (or config.json path)", args.model, list(PRESETS))
    if hf is not None:
        given = given_model_options(args)
        if given:
            raise MemlabError(f"the model comes from the Hugging Face config, so {', '.join(given)} would be ignored: "
                              "drop them (the sizes are the config's), or drop --hf to trace the reference GPT")
        return "hf", hf
    model = model_from_args(args)
    if isinstance(model, int):
        raise MemlabError("memlab trace needs a model to build: give a preset or dimensions, not --params")
    return "gpt", model


def _is_dir(text: str) -> bool:
    """Whether ``text`` names a folder (a config's); False for a name the OS refuses (too long)."""
    try:
        return Path(text).is_dir()
    except (OSError, ValueError):
        return False


def _hf_estimate(path: str, setup: Any) -> Any:
    """The formula for a Hugging Face config when memlab can read one (:func:`memlab.predict.hf.from_hf`), else
    None."""
    from memlab.predict.estimate import estimate
    from memlab.predict.hf import from_hf

    try:
        return estimate(from_hf(path), setup)
    except MemlabError:
        return None


def _num(v: float | None, size: float) -> str:
    return "-" if v is None else f"{v / size:,.3f}"


_ESTIMATE_ONLY = {"cuda_context_mib": "--cuda-context-mib", "workspace_mib": "--workspace-mib",
                  "fragmentation": "--fragmentation", "gathered_layers": "--gathered-layers"}
"""Estimate options a trace has no use for (its CUDA terms are listed after the table instead)."""


def _verdict(peak: int, gpu: str, step: str, phase: str) -> dict[str, Any]:
    """Whether the traced peak (bytes) fits ``gpu``'s table memory: the fields of a
    :class:`~memlab.predict.fit.FitVerdict`, from the trace."""
    from memlab.predict.hardware import gpu as lookup

    acc = lookup(gpu)
    cap = int(acc.memory_bytes)
    return {"fits": peak <= cap, "gpu": acc.key, "gpu_name": acc.name, "capacity_bytes": cap, "peak_bytes": peak,
            "headroom_bytes": cap - peak, "peak_step": step, "peak_phase": phase, "source": "the traced peak (CPU "
            "fake tensors), without the CUDA terms a run adds"}


def run(args: argparse.Namespace) -> int:
    """Trace the step and print the phase table (or JSON); Python warnings are shown only if it succeeds."""
    ignored = [flag for key, flag in _ESTIMATE_ONLY.items() if getattr(args, key, 0)]
    if ignored:
        raise MemlabError(f"{', '.join(ignored)}: overheads of memlab estimate, which a trace would ignore (it lists "
                          "the CUDA terms it cannot see instead): drop them, or run memlab estimate")
    if args.no_trace:
        raise MemlabError("--no-trace is an option of memlab estimate: memlab trace always traces")
    with warnings.catch_warnings(record=True) as caught:
        result, setup, predicted, extra = _trace(args)
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return print_trace(args, result, setup, predicted, extra=extra)


def trace_config(args: argparse.Namespace, target: str) -> tuple[Any, Any]:
    """(trace, setup) of the Hugging Face config at ``target`` under the command's setup options, with progress
    lines on stderr and the ``--timeout`` bound (:mod:`memlab.tracing.progress`)."""
    from memlab.model.hf import hf_config
    from memlab.tracing.hf import trace_hf
    from memlab.tracing.progress import Progress

    cfg = hf_config(target)
    setup = _setup(args, 1)  # a bare count: the estimate's default seq (1024)
    result = trace_hf(cfg, setup, name=f"hf:{Path(target).stem}:{cfg.model_type}", progress=Progress(),
                      timeout=args.timeout)
    return result, setup


def _trace(args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(trace, setup, formula or None, what --json says about the model) of the command's target."""
    from memlab.predict.estimate import estimate

    kind, target = _target(args)
    if kind == "hf":
        from memlab.predict.hf import from_hf, read_config_json

        raw = read_config_json(target)
        result, setup = trace_config(args, target)
        predicted = _hf_estimate(target, setup)
        try:
            model, refused = from_hf(raw), None
        except MemlabError as exc:
            model, refused = None, str(exc)
        return result, setup, predicted, model_info(model, source="trace", config=raw, refused=refused)
    from memlab.tracing.gpt import trace_gpt

    setup = _setup(args, target)
    result = trace_gpt(target, setup)
    return result, setup, estimate(target, setup), model_info(target, source="trace")


def print_trace(args: argparse.Namespace, result: Any, setup: Any, predicted: Any,
                extra: dict[str, Any] | None = None) -> int:
    """The phase table (or JSON) of a finished trace, with the fit verdict when ``--gpu`` is given; ``extra``
    (:func:`memlab.cli.hf_source.model_info`) goes into the JSON and the header."""
    extra = extra or {}
    verdict = (_verdict(result.peak_bytes, args.gpu, result.peak_step, result.peak_phase) if args.gpu is not None
               else None)
    if args.json:
        out = {**result.to_dict(), **extra}
        if predicted is not None:
            out["estimate"] = {"phases": [r.to_dict() for r in predicted.phases], "peak": predicted.peak_bytes,
                               "peak_phase": predicted.peak_phase, "peak_step": predicted.peak_step,
                               "total": predicted.total_bytes}
        out["top_modules"] = result.modules_by_kind(args.top)
        out["verdict"] = verdict
        print(json.dumps(out, indent=2, default=str))
        return 0
    unit, size = byte_unit(result.peak_bytes)
    print(f"memlab trace: {result.model}, batch {setup.batch} x seq {setup.seq}, {setup.precision}, {setup.optimizer}, "
          f"attention {setup.attention}, recompute {setup.recompute} (fake tensors on CPU; GiB = 2**30 bytes)")
    if extra:
        print(f"model: {extra['family']}, source of truth: trace (the real modelling code on fake tensors)"
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
    print(f"top {args.top} modules by activation bytes kept for backward (summed over layers):")
    for m in result.modules_by_kind(args.top):
        name = m["module"] if len(m["module"]) <= 56 else "..." + m["module"][-53:]
        print(f"  {name:<56} x{m['count']:<4} {fmt_bytes(m['activation_bytes']):>12}")
    for note in result.notes:
        print(f"note: {note}")
    print("not seen by a CPU trace (add on CUDA): " + "; ".join(f"{t['term']} ({t['source']})"
                                                                for t in result.cuda_terms))
    if verdict is not None:
        word = "FITS" if verdict["fits"] else "DOES NOT FIT"
        print(f"verdict: {word} on {verdict['gpu_name']} ({verdict['gpu']}): traced peak "
              f"{fmt_bytes(verdict['peak_bytes'], digits=3)} of {fmt_bytes(verdict['capacity_bytes'], digits=3)}, "
              f"headroom {verdict['headroom_bytes'] / 2**30:+.2f} GiB, before the CUDA terms above")
    return 0
