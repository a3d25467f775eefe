"""``memlab trace``: one training step of a model on fake tensors, phase by phase, beside the estimator's phases.

``memlab trace MODEL [setup flags as estimate] [--hf PATH] [--timeout S] [--json]``. MODEL is a preset name (or
``--preset`` / explicit dimensions, as ``estimate``: a preset memlab ships a published config of is that config, traced
as ``--hf NAME``; ``ref:NAME`` and the other presets are the reference GPT), or a Hugging Face config (``--hf``: a
``config.json``, its folder or a model id in the local HF cache; or a path given as MODEL; then no preset or
dimension flag, one process; ``--hf-config`` is the old spelling). A Hugging Face trace prints its progress to
stderr and stops after ``--timeout`` seconds (default 300) with one line. Prints the bytes held at each phase of
the first and the steady step (trace and formula side by side), marks the peak, lists the top modules by the
activation bytes their forward keeps, and with ``--gpu`` says whether the traced peak fits that accelerator and
replays the traced allocations through a model of PyTorch's CUDA caching allocator on that card (allocated, active
and reserved peaks per phase, ``--alloc-conf`` or the environment's ``PYTORCH_CUDA_ALLOC_CONF``). Nothing
is allocated or downloaded; the step runs on CPU fake tensors (:mod:`memlab.tracing.tracer`). Python warnings raised
on the way are shown only when the trace succeeds (an error is one line).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from memlab.cli.args import given_model_options, model_from_args, positive_int
from memlab.cli.device_view import refuse_capacity_without_gpu
from memlab.cli.estimate import add_arguments as add_estimate_arguments
from memlab.cli.estimate import setup_of
from memlab.cli.hf_source import hf_path, is_published, model_info, with_task
from memlab.cli.traced import alloc_conf_text, print_trace, refuse_overheads_without_gpu, trace_config
from memlab.errors import MemlabError
from memlab.predict.families.resolver import resolve_with_raw, shipped


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``memlab trace``: the estimate's MODEL and setup options (``--hf``, ``--timeout``), ``--top``,
    ``--json``; ``--hf-config`` is a hidden alias of ``--hf``."""
    p.add_argument("model", nargs="?", metavar="MODEL", help="a preset name or a Hugging Face config.json path")
    add_estimate_arguments(p)
    p.add_argument("--hf-config", dest="hf", type=hf_path, help=argparse.SUPPRESS)
    p.add_argument("--top", type=positive_int, default=8, metavar="N", help="modules listed (default 8)")
    p.add_argument("--alloc-conf", metavar="CONF", default=None,
                   help="PYTORCH_CUDA_ALLOC_CONF for the caching allocator replayed with --gpu (default: the "
                        "environment's, else torch's defaults)")


def _setup(args: argparse.Namespace, model: Any) -> Any:
    """The estimate's Setup: every Setup field is an option (generated in :mod:`memlab.cli.args`)."""
    return setup_of(args, model, library_defaults=False)


def _target(args: argparse.Namespace) -> tuple[str, Any]:
    """("hf", config path) or ("gpt", TransformerConfig)."""
    from memlab.predict.spec.model import PRESETS

    hf = args.hf
    if args.model is not None:
        if args.model.removeprefix("ref:") in PRESETS:
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
    path = shipped(model.name) if is_published(model) else None
    if path is not None:  # a preset named after a published model: its shipped config, as --hf NAME traces it
        table = resolve_with_raw(path)[0].max_seq
        if args.max_seq is not None and args.max_seq != table:
            raise MemlabError(f"--max-seq {args.max_seq}: --preset {args.preset} traces the published config as "
                              f"shipped (max_seq {table:,}); drop --max-seq, or trace the reference GPT with "
                              f"its sizes: --preset ref:{model.name}")
        return "hf", str(path)
    return "gpt", model


def _is_dir(text: str) -> bool:
    """Whether ``text`` names a folder (a config's); False for a name the OS refuses (too long)."""
    try:
        return Path(text).is_dir()
    except (OSError, ValueError):
        return False


def _hf_estimate(path: str, setup: Any) -> Any:
    """The formula for a Hugging Face config when memlab can read one (:func:`memlab.predict.families.reader.from_hf`),
    else None."""
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf

    try:
        return estimate(from_hf(path), setup)
    except MemlabError:
        return None


_ESTIMATE_ONLY = {"gathered_layers": "--gathered-layers"}
"""Estimate options a trace has no use for (it traces FSDP's gathered parameters itself); the overhead options
(``--cuda-context-mib``, ``--workspace-mib``, ``--fragmentation``) go into its ``--gpu`` verdict."""


def run(args: argparse.Namespace) -> int:
    """Trace the step and print the phase table (or JSON); Python warnings are shown only if it succeeds."""
    ignored = [flag for key, flag in _ESTIMATE_ONLY.items() if getattr(args, key, 0)]
    if ignored:
        raise MemlabError(f"{', '.join(ignored)}: an option of memlab estimate, which a trace would ignore (it "
                          "traces FSDP's gathered parameters itself): drop it, or run memlab estimate")
    refuse_overheads_without_gpu(args)
    refuse_capacity_without_gpu(args)
    if args.no_trace:
        raise MemlabError("--no-trace is an option of memlab estimate: memlab trace always traces")
    if args.alloc_conf is not None and args.gpu is None:
        raise MemlabError("--alloc-conf sets the caching allocator replayed on --gpu's card: give --gpu NAME too")
    if args.gpu is not None:
        from memlab.predict.gpu.alloc_conf import parse_alloc_conf

        parse_alloc_conf(alloc_conf_text(args))  # a bad setting is one line before the trace, not after
    _refuse_formula_searches(args)
    with warnings.catch_warnings(record=True) as caught:
        result, setup, predicted, extra, trace_at, config, seq_limit = _trace(args)
        found = _searches(args, setup, config if predicted is not None else None, trace_at, seq_limit)
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    code = print_trace(args, result, setup, predicted, extra={**extra, **found} if args.json else extra)
    if not args.json:
        _print_searches(found)
    return code


def _refuse_formula_searches(args: argparse.Namespace) -> None:
    """``--serving`` and ``--levers`` search with the formula (memlab estimate); ``--max-batch`` and
    ``--longest-seq`` need the card they search against: one line each, before any trace."""
    formula_only = [flag for key, flag in (("serving", "--serving"), ("levers", "--levers")) if getattr(args, key)]
    if formula_only:
        raise MemlabError(f"{', '.join(formula_only)}: memlab estimate answers them with the formula; memlab trace "
                          "searches --max-batch and --longest-seq by tracing")
    if (args.max_batch or args.longest_seq) and args.gpu is None:
        flag = "--max-batch" if args.max_batch else "--longest-seq"
        raise MemlabError(f"{flag} searches what fits a card: add --gpu NAME (see memlab gpus)")


def _searches(args: argparse.Namespace, setup: Any, config: Any, trace_at: Any,
              seq_limit: int | None) -> dict[str, Any]:
    """``--max-batch`` / ``--longest-seq`` by tracing (:func:`memlab.tracing.fit.traced_search`), between the
    formula's two ends where the formula answers (``config``: its model, None where it does not); ``seq_limit``:
    the model's longest sequence (its position table), the sequence search's bound. {} when neither is asked."""
    asked = [(k, f) for k, f, on in (("max_batch", "batch", args.max_batch), ("max_seq", "seq", args.longest_seq))
             if on]
    if not asked:
        return {}
    from memlab.cli.device_view import card, overheads_of
    from memlab.predict.fit import max_batch, max_seq
    from memlab.predict.gpu.alloc_conf import parse_alloc_conf
    from memlab.tracing.fit import traced_search

    gpu, ov, conf = card(args), overheads_of(args), parse_alloc_conf(alloc_conf_text(args))
    out: dict[str, Any] = {}
    for key, field in asked:
        formula = None
        limit = None
        if field == "seq":
            if seq_limit is None:
                raise MemlabError("--longest-seq needs the model's longest sequence, and its config names none "
                                  "(max_position_embeddings, n_positions, ...): search --max-batch at a --seq instead")
            limit = seq_limit
        if config is not None:
            search = max_batch if field == "batch" else max_seq
            formula = search(config, setup, gpu, device=ov)
        found = traced_search(trace_at, setup, field, gpu, formula=formula, limit=limit, overheads=ov,
                              alloc_conf=conf, progress=lambda line: print(f"memlab: {line}", file=sys.stderr))
        out[key] = {**found.to_dict(), "formula": formula.to_dict() if formula is not None else None}
    return out


_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
"""Where Hugging Face configs name their longest sequence (the position table transformers builds)."""


def _positions(raw: dict[str, Any]) -> int | None:
    """The longest sequence a Hugging Face config names (:data:`_POSITION_KEYS`, the first whole number), else None."""
    for key in _POSITION_KEYS:
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _print_searches(found: dict[str, Any]) -> None:
    """The traced answers, the formula's two ends beside them."""
    for key, r in found.items():
        ends = "" if r["formula"] is not None else "; the formula does not cover this setup"
        print(f"\n{key.replace('_', ' ')} on {r['gpu']} (traced): {r['value']:,} ({r['reason']}{ends})")
        print(f"  decided on {r['decided_on']}")


def _trace(args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, Any], Any, Any, int | None]:
    """(trace, setup, formula or None, what --json says about the model, a function tracing the same target under
    another setup, the model's TransformerConfig or None, its longest sequence or None) of the command's target."""
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.versions import unverified_line

    kind, target = _target(args)
    if kind == "hf":
        from memlab.predict.families.reader import read_config_json

        raw = read_config_json(target)
        unverified = unverified_line()
        if unverified is not None:
            print(f"memlab: {unverified} (the trace is the answer; the formula column is beside it)",
                  file=sys.stderr)
        setup = with_task(_setup(args, 1), raw)  # a bare count: the default seq (1024); the head architectures names
        result, setup = trace_config(args, target, setup)
        predicted = _hf_estimate(target, setup)
        try:
            model, refused = resolve_with_raw(target)[0], None
        except MemlabError as exc:
            model, refused = None, str(exc)
        if predicted is None and model is not None:  # a setup the formula does not model: its reason, by name
            from memlab.predict import coverage

            refused = coverage.refusal(model, setup)
        return (result, setup, predicted, model_info(model, source="trace", config=raw, refused=refused,
                                                     task=setup.task),
                lambda s: trace_config(args, target, s)[0], model,
                model.max_seq if model is not None else _positions(raw))
    from memlab.tracing.gpt import trace_gpt

    setup = _setup(args, target)
    result = trace_gpt(target, setup)
    return (result, setup, estimate(target, setup), model_info(target, source="trace"),
            lambda s: trace_gpt(target, s), target, target.max_seq)
