"""``memlab measure`` and ``memlab ledger``: run the reference model and print prediction against measurement.

``measure`` runs one config (the same MODEL options as ``estimate``) and prints the ledger, component by
component. ``ledger`` runs the validation grid (:func:`memlab.compare.ledger.ci_grid`, 48 configs on a CPU in well
under a minute) as a resumable sweep and prints the achieved errors per component.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from memlab.cli.args import (
    add_model_arguments,
    add_setup_arguments,
    bounded_int,
    device_arg,
    model_from_args,
    output_file,
    print_json,
    setup_from_args,
    writing,
)
from memlab.cli.hf_source import hf_path, is_published, model_info, model_label
from memlab.errors import MemlabError
from memlab.predict.families.resolver import resolve_with_raw, shipped
from memlab.predict.spec.validate import LIMITS

SHARDING_FIELDS = ("zero_stage", "world_size", "tp", "sp")
"""Setup fields ``measure`` leaves out: one process measures one device (sharded runs go through torchrun)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``memlab measure``: MODEL and the Setup fields one device can run (no sharding)."""
    add_model_arguments(p)
    add_setup_arguments(p, exclude=SHARDING_FIELDS)
    p.add_argument("--device", type=device_arg, default="auto", help="auto (cuda when available), cpu or cuda[:N]")
    p.add_argument("--steps", type=bounded_int(1, LIMITS["steps"].max, LIMITS["steps"].why), default=2, metavar="N",
                   help="timed steps (training) or decoded tokens (inference; at most seq - 1)")
    p.add_argument("--hf", type=hf_path, metavar="PATH", help="measure transformers' AutoModelForCausalLM built from "
                   "this config (a config.json, its folder, or a model id in the local HF cache; never downloads) "
                   "instead of the reference GPT")
    p.add_argument("--json", action="store_true", help="print JSON")


def _table(frame: object) -> str:
    import pandas as pd

    assert isinstance(frame, pd.DataFrame)
    cols = ["component", "predicted", *(["traced"] if "traced" in frame.columns else []), "measured", "rel_error"]
    t = frame[cols].copy()
    for col in [c for c in ("predicted", "traced", "measured") if c in t.columns]:
        t[col] = t[col].map(lambda v: "-" if v is None or v != v else f"{v:,.0f}")
    t["rel_error"] = t["rel_error"].map(lambda v: "-" if v is None or v != v else f"{100 * v:+.3f} %")
    return t.to_string(index=False)


def run(args: argparse.Namespace) -> int:
    """Run one config on the device and print predicted vs measured bytes per component."""
    from memlab.compare.ledger import compare, predict_for
    from memlab.run.runner import run_step

    if args.hf is not None:
        return _run_hf(args)
    model = model_from_args(args)
    if isinstance(model, int):
        raise MemlabError("memlab measure needs a model to build: give --preset or explicit dimensions, not --params")
    path = shipped(model.name) if is_published(model) else None
    if path is not None:  # a preset named after a published model: its shipped config, measured as --hf NAME
        if args.max_seq is not None and args.max_seq != resolve_with_raw(path)[0].max_seq:
            raise MemlabError(f"--max-seq {args.max_seq}: --preset {args.preset} measures the published config as "
                              f"shipped; drop --max-seq, or measure the reference GPT with its sizes: --preset "
                              f"ref:{model.name}")
        args.hf, args.preset, args.max_seq = str(path), None, None
        return _run_hf(args, preset=model.name)
    from memlab.device import device_string, device_type

    setup = setup_from_args(args, model, device_type=device_type(device_string(args.device)))  # auto: this device's
    if setup.task not in ("auto", "causal-lm"):
        raise MemlabError(f"--task {setup.task}: memlab measure runs the reference GPT, a causal LM; a task head is "
                          f"traced: memlab trace --hf CONFIG --task {setup.task}")
    m = run_step(model, setup, args.device, steps=args.steps)
    traced = None
    if setup.mode == "train" and m.status == "ok":  # the third column: the same step on fake tensors
        from memlab.tracing.gpt import trace_gpt

        traced = trace_gpt(model, setup, device_type=device_type(m.device))
    table = compare(predict_for(model, m), m, activations_detail=True, trace=traced)
    if args.json:
        print_json({"measurement": m.to_dict(), "ledger": table.to_dict(orient="records"),
                    "model_label": model_label(model)}, default=str)
        return 0
    print(f"memlab measure: {model.name} on {m.device} ({m.device_name}), status {m.status}; model: "
          f"{model_label(model)}")
    if m.status != "ok":
        print(f"  {m.error}")
        return 1
    print(_table(table))
    if m.step_time_s is not None:
        print(f"\nstep time {m.step_time_s * 1e3:.1f} ms, {m.tokens_per_s:,.0f} tokens/s, "
              f"MFU {'unknown' if m.mfu is None else f'{100 * m.mfu:.1f} %'}"
              + (f" ({m.mfu_reason})" if m.mfu_reason else ""))
    if m.decode_time_per_token_s is not None:
        print(f"\nprefill {m.prefill_time_s * 1e3:.1f} ms, decode {m.decode_time_per_token_s * 1e3:.2f} ms/token "
              f"({m.tokens_per_s:,.0f} tokens/s over the batch)")
    print("(relative error = (predicted - measured) / measured; on a CPU bytes are exact storage counts; traced = "
          "memlab trace of the same step on fake tensors)")
    return 0


_HF_FIELDS = {"batch", "seq", "precision", "attention", "recompute", "checkpoint_reentrant", "optimizer", "mode"}
"""Setup fields a measured Hugging Face step honours (:func:`memlab.run.hf.run_hf`: AdamW, one training step)."""


def _hf_implementation(model: Any, setup: Any, dev: str, dtype: str) -> str:
    """transformers' ``attn_implementation`` for the setup's kernel on ``dev``: eager, or sdpa where torch dispatches
    SDPA to that kernel here (:func:`memlab.predict.families.reader.hf_attention`); another kernel is one error line."""
    from memlab.device import device_type
    from memlab.predict.families.reader import hf_attention

    impl = "eager" if setup.attention == "eager" else "sdpa"
    p = model.impl.attention_dropout_or(model.dropout) if model is not None else 0.0
    runs = hf_attention(impl, device_type(dev), dtype, p)
    if runs != setup.attention:
        raise MemlabError(f"attention {setup.attention}: transformers' sdpa runs as {runs} here ({dev}, "
                          f"{setup.precision}): use --attention eager or that kernel")
    return impl


def _run_hf(args: argparse.Namespace, preset: str | None = None) -> int:
    """``measure --hf`` (or ``--preset NAME`` of a shipped published config, ``preset``): one real training step of
    the Hugging Face model, beside the formula when it covers it."""
    from memlab.cli.args import given_model_options, given_setup_fields
    from memlab.device import device_string, device_type
    from memlab.model.hf import build_hf_model
    from memlab.predict.families.reader import read_config_json
    from memlab.run.hf import measure_hf, predict_hf, run_hf

    given = given_model_options(args)
    if given:
        raise MemlabError(f"the model comes from --hf, so {', '.join(given)} would be ignored: drop them")
    other = sorted(set(given_setup_fields(args)) - _HF_FIELDS)
    hint = "" if preset is None else (f" (--preset {preset} is the published model; --preset ref:{preset} measures "
                                      "the reference GPT with its sizes)")
    if other:
        raise MemlabError(f"measure --hf runs one plain AdamW training step: {', '.join(other)} not supported there"
                          + hint)
    raw = read_config_json(args.hf)
    try:
        model, refused = resolve_with_raw(args.hf)[0], None
    except MemlabError as exc:
        model, refused = None, str(exc)
    setup = setup_from_args(args, model if model is not None else 1,
                            device_type=device_type(device_string(args.device)))  # --attention auto: this device's
    dtype = {"fp32": ("fp32", False), "bf16": ("bf16", False), "amp-bf16": ("fp32", True)}.get(setup.precision)
    rc = setup.recompute + (f" every {setup.recompute_every}" if setup.recompute_every > 1 else "")
    if setup.mode != "train" or setup.optimizer != "adamw" or dtype is None or rc not in ("none", "full"):
        raise MemlabError(f"measure --hf runs a training step with AdamW, precision fp32, bf16 or amp-bf16, recompute "
                          f"none or full; got {setup.mode}, {setup.optimizer}, {setup.precision}, recompute {rc}{hint}")
    dev = device_string(args.device)
    impl = _hf_implementation(model, setup, dev, dtype[0])
    kw = {"attn_implementation": impl, "batch": setup.batch, "seq": setup.seq}
    ckpt = {"gradient_checkpointing": setup.recompute == "full", "reentrant": setup.checkpoint_reentrant}
    if model is not None:
        _, m = run_hf(args.hf, dtype=dtype[0], device=dev, autocast=dtype[1], **ckpt, **kw)
    else:  # no formula to return beside it (run_hf's from_hf would refuse): the same build and step, measured
        built = build_hf_model(args.hf, attn_implementation=impl, dtype=dtype[0], device=dev, **ckpt)
        m = measure_hf(built, autocast=dtype[1], reentrant=setup.checkpoint_reentrant, **kw)
    measured = {"activations": m.saved_bytes, "params": m.params_bytes, "grads": m.grads_bytes,
                "optimizer": m.optimizer_bytes}
    predicted = None
    if model is not None:
        try:
            predicted = predict_hf(model, m)
        except MemlabError as exc:  # a setup the formula refuses (a coverage row): the measurement alone
            refused = str(exc)
    info = model_info(model, source="measurement", config=raw, refused=refused)
    if args.json:
        print_json({"measurement": m.to_dict(), "measured": measured, "predicted": predicted, **info}, default=str)
        return 0
    print(f"memlab measure: {m.family} from {args.hf} on {m.device}, batch {m.batch} x seq {m.seq}, "
          f"{setup.precision}, attn_implementation {impl}; step: {info['calling_convention']}")
    print(f"model: {info['model_label']}")
    print(f"  {'component':<14}{'predicted':>16}{'measured':>16}{'rel_error':>12}")
    for key, value in measured.items():
        pred = None if predicted is None else predicted[key]
        err = "-" if pred is None or not value else f"{100 * (pred - value) / value:+.3f} %"
        print(f"  {key:<14}{'-' if pred is None else f'{pred:,}':>16}{value:>16,}{err:>12}")
    if refused is not None:
        print(f"no formula column: {refused} (memlab trace --hf gives the exact bytes of this code)")
    print("(activations = bytes saved for backward; on a CPU bytes are exact storage counts)")
    return 0


def add_ledger_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``memlab ledger``."""
    p.add_argument("--device", type=device_arg, default="auto", help="auto (cuda when available), cpu or cuda[:N]")
    p.add_argument("--out", type=output_file, default=None, metavar="PATH",
                   help="resumable sweep file (default build/ledger/ci-<device>.jsonl)")
    p.add_argument("--fresh", action="store_true", help="start the sweep file over")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--published", action="store_true",
                   help="instead of measuring: the published GPU measurements (data/published/ledger.csv) with "
                        "memlab's prediction of each, the residual and what explains it")
    p.add_argument("--chapter", type=bounded_int(0, 99, "the course's chapters are numbered 00 to 99"), default=None,
                   metavar="NN", help="with --published: only the rows bearing on this chapter")


def run_ledger(args: argparse.Namespace) -> int:
    """Measure the validation grid and print the achieved error per component (``--published``: the published
    GPU figures beside memlab's predictions)."""
    if args.published:
        return _run_published(args)
    if args.chapter is not None:
        raise MemlabError("--chapter filters the published rows: use it with --published")
    from memlab.compare.ledger import ci_grid, error_summary, ledger
    from memlab.device import device_string
    from memlab.run.sweep import measurement_of, read_rows, sweep

    dev = device_string(args.device)
    path = args.out or output_file(str(Path("build/ledger") / f"ci-{dev.replace(':', '')}.jsonl"))
    with writing(path):
        if args.fresh and path.exists():
            path.unlink()
        sweep(ci_grid(), path, device=dev, steps=1, with_counted_flops=False, with_mfu=False,
              progress=not args.json)
        pairs = [measurement_of(r) for r in read_rows(path)]
    table = ledger(pairs, activations_detail=True)
    summary = error_summary(table)
    failed = [m for _, m in pairs if m.status != "ok"]
    if args.json:
        print_json({"configs": len(pairs), "failed": len(failed), "summary": summary.to_dict(orient="records")})
        return 0 if not failed else 1
    print(f"memlab ledger: {len(pairs)} configs on {dev}, {len(failed)} failed; sweep file {path}")
    s = summary.copy()
    for col in ("median_abs_rel_error", "max_abs_rel_error"):
        s[col] = s[col].map(lambda v: f"{100 * v:.4f} %")
    print(s.to_string(index=False))
    return 0 if not failed else 1


def _fmt(value: float | None, unit: str) -> str:
    """A figure in its unit (``-`` when absent)."""
    if value is None or value != value:
        return "-"
    return f"{value:,.3g} {unit}" if abs(value) < 100 else f"{value:,.0f} {unit}"


def _published_lines(frame: Any) -> list[str]:
    """Three lines per published row: figure against prediction, the setup and source, what explains it."""
    lines = []
    for r in frame.itertuples(index=False):
        res = "-" if r.residual is None or r.residual != r.residual else f"{100 * r.residual:+.1f} %"
        default = "" if r.predicted_default is None or r.predicted_default != r.predicted_default else \
            f" (memlab defaults: {_fmt(r.predicted_default, r.unit)})"
        lines.append(f"{r.row_id:<11} {r.kind:<15} published {_fmt(r.figure, r.unit):>16}   memlab "
                     f"{_fmt(r.predicted, r.unit):>16}{default}   residual {res}   [{r.status}]")
        lines.append(f"    {r.model}; {r.gpu}; {r.source_id}: {r.locator}")
        if _present(getattr(r, "allocated", None)):
            lines.append(f"    {_device_line(r)}")
        lines.append(f"    {r.memlab_figure + '; ' if r.memlab_figure else ''}{r.note}")
    return lines


def _present(v: Any) -> bool:
    return v is not None and v == v


def _device_line(r: Any) -> str:
    """memlab's allocated, reserved and device-used figures of a memory row, the residual against the matching
    kind's range named."""
    u = r.unit
    high = "" if not _present(r.residual_high) or r.residual_high == r.residual else \
        f"; residual at the range's high end {100 * r.residual_high:+.1f} %"
    return (f"memlab allocated {_fmt(r.allocated, u)}, reserved {_fmt(r.reserved_low, u)}..{_fmt(r.reserved_high, u)}"
            f", device-used {_fmt(r.device_low, u)}..{_fmt(r.device_high, u)} (residual against the {r.kind} "
            f"figure's match{high})")


def _run_published(args: argparse.Namespace) -> int:
    """``memlab ledger --published``: every published row with memlab's figure, residual and note; a summary."""
    from memlab.compare.published import PUBLISHED_CSV, published_rows
    from memlab.compare.published_predict import published_frame, residual_summary

    if args.out is not None or args.fresh:
        raise MemlabError("--out and --fresh belong to the measured sweep; --published reads the published ledger")
    rows = published_rows(chapter=None if args.chapter is None else f"{args.chapter:02d}")
    if not rows:
        raise MemlabError(f"no published row bears on chapter {args.chapter:02d}")
    frame = published_frame(rows)
    summary = residual_summary(frame)
    if args.json:
        print_json({"rows": frame.to_dict(orient="records"), "summary": summary.to_dict(orient="records")},
                   default=str)
        return 0
    print(f"memlab ledger --published: {len(rows)} published GPU figures from {frame['source_id'].nunique()} "
          f"sources ({PUBLISHED_CSV.relative_to(PUBLISHED_CSV.parents[2])}). memlab predicts one device's peak "
          "allocated bytes (memlab.predict.estimate), the reserved and device-used (nvidia-smi) ranges on top "
          "(memlab.predict.gpu.device), and MFU from FLOPs; residual = (predicted - published) / published against "
          "the figure of the row's kind (a range's low end; median_abs_residual_high: its high end; within_range: "
          "rows inside the range); nothing is tuned to these rows.\n")
    print("\n".join(_published_lines(frame)))
    s = summary.copy()
    for col, spec in (("median_abs_residual", ".1f"), ("worst_residual", "+.1f"), ("median_abs_residual_high", ".1f")):
        if col in s:
            s[col] = s[col].map(lambda v, spec=spec: "-" if v is None or v != v else f"{100 * v:{spec}} %")
    if "within_range" in s:
        s["within_range"] = s["within_range"].map(lambda v: "-" if v is None or v != v else f"{int(v)}")
    print("\nresidual by kind of figure (rows memlab predicts; 'other' = the source does not say which peak):")
    print(s.fillna("-").to_string(index=False))
    return 0
