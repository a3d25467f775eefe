"""Prediction against measurement, component by component: the ledger every chapter shows.

:func:`compare` puts an estimate (:class:`memlab.predict.estimate.MemoryBreakdown`) beside a measurement
(:class:`memlab.run.runner.Measurement`) of the same config and setup. Relative error is
``(predicted - measured) / measured``: positive means the estimator over-predicts. On CUDA the ledger adds
what the estimator does not model as named residual rows (allocator peak beyond the modelled components,
cached-but-free memory, and memory outside PyTorch's allocator such as the CUDA context), so the gap between
"the formula" and "nvidia-smi" is explained rather than hidden.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from memlab.device import device_type
from memlab.errors import MemlabError
from memlab.predict.estimate import MemoryBreakdown, estimate
from memlab.predict.memory.activations import CATEGORIES
from memlab.predict.memory.phases import PhaseRow
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup

if TYPE_CHECKING:
    import pandas as pd

    from memlab.run.runner import Measurement
    from memlab.tracing.tracer import Trace

COLUMNS = ("experiment", "component", "unit", "predicted", "measured", "abs_error", "rel_error", "note")
"""Columns of every ledger table: ``abs_error = predicted - measured`` (in ``unit``), ``rel_error`` from
:func:`rel_error` (a fraction). Chapters append such rows to their ledger.csv
(:meth:`memlab.course.chapter.Chapter.record_ledger`, which needs the first five and fills the errors); the report
summarises them with :func:`error_summary`."""

REQUIRED = COLUMNS[:5]
"""The columns a ledger row must bring; the errors are computed from them and ``note`` is optional."""

MODEL_COMPONENTS = ("params", "grads", "optimizer", "activations", "kv_cache")


def predict_for(config: TransformerConfig, measurement: Measurement) -> MemoryBreakdown:
    """The estimate of the setup a measurement ran, for the device it ran on."""
    setup = Setup(**measurement.setup)
    return estimate(config, setup, device_type=device_type(measurement.device))


def rel_error(predicted: float | None, measured: float | None) -> float | None:
    """``(predicted - measured) / measured``: positive when the prediction is too high. A zero measurement gives
    0.0 when the prediction is zero too and ``inf`` otherwise (an error no ratio expresses); None (or NaN) on
    either side gives None."""
    if predicted is None or measured is None or predicted != predicted or measured != measured:
        return None
    if measured:
        return (predicted - measured) / measured
    return 0.0 if predicted == 0 else float("inf")


def with_errors(rows: pd.DataFrame) -> pd.DataFrame:
    """A copy of ledger ``rows`` with ``abs_error`` and ``rel_error`` (:func:`rel_error`) filled in where absent."""
    out = rows.copy()
    if "abs_error" not in out.columns:
        out["abs_error"] = out["predicted"] - out["measured"]
    if "rel_error" not in out.columns:
        out["rel_error"] = [rel_error(p, m) for p, m in zip(out["predicted"], out["measured"], strict=True)]
    return out


def _row(experiment: str, component: str, predicted: float | None, measured: float | None, note: str = "") -> dict:
    abs_err = None if predicted is None or measured is None else predicted - measured
    rel_err = rel_error(predicted, measured)
    return {"experiment": experiment, "component": component, "unit": "bytes", "predicted": predicted,
            "measured": measured, "abs_error": abs_err, "rel_error": rel_err, "note": note}


def experiment_label(measurement: Measurement) -> str:
    """A short label: model, precision, optimizer, attention, recompute, batch x seq."""
    s = measurement.setup
    if s["mode"] == "inference":
        return f"{measurement.model} infer {s['inference_weights']} b{s['batch']}x{s['seq']} {s['attention']}"
    return (f"{measurement.model} {s['precision']} {s['optimizer']} {s['attention']} {s['recompute']} "
            f"b{s['batch']}x{s['seq']}")


def compare(predicted: MemoryBreakdown, measurement: Measurement, *, experiment: str | None = None,
            activations_detail: bool = False, trace: Trace | None = None) -> pd.DataFrame:
    """Ledger rows (see :data:`COLUMNS`) for one prediction and its measurement.

    Rows: params, grads, optimizer, activations (and kv_cache for inference), their total; with
    ``activations_detail`` one row per activation category (``activations: <category>``); with per-phase peaks
    in the measurement, one ``phase: <step> <phase>`` row each and ``peak (inside the step)``. On CUDA, residual
    rows: ``allocator peak`` (predicted = modelled total) and the unmodelled parts. With a ``trace``
    (:func:`memlab.tracing.gpt.trace_gpt` of the same setup) a ``traced`` column puts the trace's bytes beside
    formula and measurement: three columns.
    """
    import pandas as pd

    label = experiment or experiment_label(measurement)
    if measurement.status != "ok":
        return pd.DataFrame([_row(label, "total", predicted.total_bytes, None, f"{measurement.status}: "
                                  f"{measurement.error}")], columns=COLUMNS)
    pred = {"params": predicted.params_bytes, "grads": predicted.grads_bytes, "optimizer": predicted.optimizer_bytes,
            "activations": predicted.activations_bytes, "kv_cache": predicted.kv_cache_bytes}
    meas = {"params": measurement.params_bytes, "grads": measurement.grads_bytes,
            "optimizer": measurement.optimizer_bytes, "activations": measurement.activations_bytes,
            "kv_cache": measurement.kv_cache_bytes}
    inference = measurement.setup.get("mode") == "inference"
    rows = []
    for comp in MODEL_COMPONENTS:
        if inference and comp in ("grads", "optimizer", "activations"):
            continue
        if not inference and comp == "kv_cache":
            continue
        rows.append(_row(label, comp, pred[comp], meas[comp]))
        if comp == "activations" and activations_detail:
            for cat in CATEGORIES:
                p = predicted.activation_detail.get(cat, 0)
                m = measurement.activations_by_category.get(cat, 0)
                if p or m:
                    rows.append(_row(label, f"activations: {cat}", p, m))
    modelled = [r for r in rows if ":" not in r["component"]]
    total_p = sum(r["predicted"] for r in modelled)
    total_m = sum(r["measured"] or 0 for r in modelled)
    rows.append(_row(label, "modelled total", total_p, total_m, "sum of the rows above"))
    if measurement.phase_peaks and predicted.phases:
        rows += _phase_rows(label, predicted, measurement.phase_peaks, measurement.phase_peaks[0].source)
    if measurement.cuda_peak_allocated_bytes is not None:
        rows += _cuda_residuals(label, total_p, measurement)
    if trace is None:
        return pd.DataFrame(rows, columns=COLUMNS)
    traced = _traced(trace)
    for r in rows:
        r["traced"] = traced.get(r["component"])
    return pd.DataFrame(rows, columns=[*COLUMNS, "traced"])


def _traced(trace: Trace) -> dict[str, int]:
    """The trace's bytes under the ledger's component names (steady step; token ids counted as activations)."""
    out: dict[str, int] = {}
    if {"forward", "zero_grad"} <= {r.phase for r in trace.phases}:
        out = trace.components()
        out["modelled total"] = sum(out.values())
    for r in trace.phases:
        if r.reliable:
            out[f"phase: {r.step} {r.phase}"] = r.held_bytes
    out["peak (inside the step)"] = trace.peak_bytes
    return out


def _phase_rows(label: str, predicted: MemoryBreakdown, observed: Iterable[PhaseRow],
                source: str) -> list[dict[str, Any]]:
    """``phase: <step> <phase>`` rows (:attr:`PhaseRow.held_bytes`: peak inside the phase; zero_grad: held after it)
    and the ``peak`` row."""
    rows, seen = [], []
    for r in observed:
        if not r.reliable:
            continue
        try:
            p = predicted.phase_bytes(r.phase, r.step)
        except MemlabError:  # a phase the estimator does not model (e.g. a user's custom loop)
            continue
        rows.append(_row(label, f"phase: {r.step} {r.phase}", p, r.held_bytes, source))
        if r.phase != "zero_grad":
            seen.append(r.peak_bytes)
    if seen:
        rows.append(_row(label, "peak (inside the step)", predicted.peak_bytes, max(seen),
                         f"the most held at once; {source}"))
    return rows


def compare_trace(predicted: MemoryBreakdown, trace: Trace, *, experiment: str | None = None) -> pd.DataFrame:
    """Ledger rows (:data:`COLUMNS`) of the formula against ``memlab trace`` (the measured column is the trace):
    one row per phase and the peak. The trace checks the formula at full scale, for any implementation."""
    import pandas as pd

    label = experiment or f"{trace.model} (trace)"
    return pd.DataFrame(_phase_rows(label, predicted, trace.phases, "memlab trace (fake tensors, MemTracker)"),
                        columns=COLUMNS)


def peak_error_grid(*, quick: bool = False) -> list[dict[str, Any]]:
    """The estimator's peak against the trace's over a grid of presets and setups.

    Rows: model, setup label, trace_peak, formula_peak, rel_error, and where each peak is. Sharded points (ZeRO-3
    over 8 ranks) trace FSDP2 over a fake process group; the estimate models FSDP2 per phase
    (memlab.predict.memory.fsdp).
    Imports torch (the tracer) when called.
    """
    from memlab.tracing.gpt import trace_gpt

    small = [("gpt2", Setup(seq=1024, batch=2, precision=p, attention=a, recompute=r))
             for p, a, r in (("fp32", "eager", "none"), ("amp-bf16", "flash", "none"), ("mixed-bf16", "flash", "full"),
                             ("bf16", "math", "selective"), ("fp32", "flash", "full"))]
    small += [("tiny-llama", Setup(seq=256, batch=4, precision=p, attention=a, recompute=r))
              for p, a, r in (("fp32", "eager", "none"), ("amp-bf16", "flash", "selective"))]
    small += [("gpt2-medium", Setup(seq=1024, batch=1, precision="amp-bf16", attention="flash",
                                    optimizer_impl="for-loop"))]
    large = [("llama-2-7b", Setup(seq=4096, precision="fp32", attention="flash")),
             ("llama-2-7b", Setup(seq=4096, precision="mixed-bf16", attention="flash", recompute="selective"))]
    small += [("small-gpt", Setup(seq=256, batch=2, precision="mixed-bf16", attention="flash", zero_stage=3,
                                  world_size=8))]
    large += [(name, Setup(seq=4096, precision="mixed-bf16", attention="flash", zero_stage=3, world_size=8))
              for name in ("llama-2-7b", "llama-2-70b")]
    out = []
    for name, setup in small + ([] if quick else large):
        cfg = preset(name)
        sharded = setup.zero_stage == 3 and setup.world_size > 1
        bd = estimate(cfg, setup)
        label = (f"{setup.precision} {setup.attention} {setup.recompute} b{setup.batch}x{setup.seq}"
                 + (f" ZeRO-{setup.zero_stage}x{setup.world_size}" if setup.world_size > 1 else ""))
        row = {"model": name, "setup": label, "formula_peak": bd.peak_bytes,
               "formula_phase": f"{bd.peak_step} {bd.peak_phase}", "trace_peak": None, "trace_phase": None,
               "rel_error": None, "note": ""}
        t = trace_gpt(cfg, setup)
        row.update(trace_peak=t.peak_bytes, trace_phase=f"{t.peak_step} {t.peak_phase}",
                   rel_error=(bd.peak_bytes - t.peak_bytes) / t.peak_bytes,
                   note="FSDP2 over a fake process group, modelled per phase" if sharded else "")
        out.append(row)
    return out


def _cuda_residuals(label: str, modelled: float, m: Measurement) -> list[dict[str, Any]]:
    """What the estimator's components do not cover on CUDA, each as its own row."""
    rows = [_row(label, "allocator peak (max_memory_allocated)", modelled, m.cuda_peak_allocated_bytes,
                 "measured includes transient buffers: gradients of activations, workspaces, the logits' grad")]
    if m.cuda_peak_reserved_bytes is not None:
        rows.append(_row(label, "residual: reserved but not allocated at peak", None,
                         m.cuda_peak_reserved_bytes - m.cuda_peak_allocated_bytes,
                         "the caching allocator's free blocks (fragmentation and cache)"))
    nvml = m.nvml or {}
    used = nvml.get("process_used_bytes") if nvml.get("available") else None
    if used is not None and m.cuda_peak_reserved_bytes is not None:
        rows.append(_row(label, "residual: outside PyTorch's allocator (process used - reserved)", None,
                         used - m.cuda_peak_reserved_bytes, "CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers"))
    return rows


def ledger(pairs: Iterable[tuple[TransformerConfig, Measurement]], *, activations_detail: bool = False) -> pd.DataFrame:
    """Ledger rows for many measurements (each predicted for the device it ran on)."""
    import pandas as pd

    frames = [compare(predict_for(cfg, m), m, activations_detail=activations_detail) for cfg, m in pairs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def error_summary(table: pd.DataFrame, *, by: str | None = "component") -> pd.DataFrame:
    """Rows, median and max ``|rel_error|`` and the worst experiment, per ``by`` group (one row for the whole
    table when ``by`` is None, which also names the worst row's component). Undefined errors are left out: NaN (a
    side not modelled or not measured) and ``inf`` (a zero measurement, :func:`rel_error`)."""
    import pandas as pd

    t = table.copy()
    t["abs_rel"] = pd.to_numeric(t["rel_error"], errors="coerce").abs()
    t = t[t["abs_rel"] < float("inf")]
    groups = [(None, t)] if by is None else list(t.groupby(by, sort=False))
    out = []
    for key, g in groups:
        if g.empty:
            continue
        worst = g.loc[g["abs_rel"].idxmax()]
        row = {} if by is None else {by: key}
        row.update(rows=len(g), median_abs_rel_error=g["abs_rel"].median(), max_abs_rel_error=worst["abs_rel"],
                   worst_experiment=worst.get("experiment", "?"))
        if by is None:
            row["worst_component"] = worst.get("component", "?")
        out.append(row)
    return pd.DataFrame(out)


def ci_grid() -> list[tuple[TransformerConfig, Setup]]:
    """The CPU validation grid: 48 configs of the reference GPT.

    Attention eager and SDPA flash; recompute none/selective/full; fp32 and amp-bf16; two model sizes
    (tiny-gpt, small-gpt); two batch x sequence points. Each runs in well under a second on a CPU.
    """
    models = [preset("tiny-gpt"), preset("small-gpt")]
    shapes = [(2, 32), (1, 96)]
    out = []
    for cfg, att, rec, prec, (b, s) in itertools.product(
        models, ("eager", "flash"), ("none", "selective", "full"), ("fp32", "amp-bf16"), shapes
    ):
        out.append((cfg, Setup(batch=b, seq=s, precision=prec, attention=att, recompute=rec)))
    return out
