"""The estimate: one question, one answer. ``estimate(config, setup)`` answers every setup memlab models, on one
device or per rank, with one result, a :class:`~memlab.predict.memory.breakdown.MemoryBreakdown`:

1. :mod:`memlab.predict.coverage` is asked whether memlab models the case; if not, one
   :class:`~memlab.errors.SetupError` line says why and the way out.
2. The bytes: one rank's (:func:`memlab.predict.memory.breakdown.rank_breakdown`); under pipeline or context
   parallelism each pipeline rank's (:func:`memlab.predict.parallel.pipeline.parallel_estimate`); under expert
   parallelism an expert-parallel rank's (:func:`memlab.predict.parallel.experts.expert_estimate`). One device is
   one rank.
3. The result carries what the next stage needs, computed once: its assumptions, the terms it names as left out
   and the real peak's range (:mod:`memlab.predict.coverage`), and its ranks. Its components are the worst rank's.

:func:`sweep_totals` runs the same formula on numpy arrays of batch and seq for fast sweeps (one rank). Units:
bytes. No torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from memlab.errors import SetupError
from memlab.predict import coverage
from memlab.predict.memory.breakdown import (
    MemoryBreakdown,
    Overheads,
    PeakRange,
    RankBreakdown,
    StateParts,
    evaluate,
    fields_of,
    host_states,
    model_buffer_bytes,
    overheads_arg,
    rank_breakdown,
)
from memlab.predict.memory.phases import peak_of
from memlab.predict.memory.plan import config_fields
from memlab.predict.memory.sharding import shape_summary
from memlab.predict.parallel.experts import expert_estimate
from memlab.predict.parallel.pipeline import parallel_estimate, state_parts
from memlab.predict.spec.kernels import resolved
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import DEVICE_TYPES, Setup, SetupView
from memlab.predict.spec.validate import LIMITS, show

__all__ = ["MemoryBreakdown", "Overheads", "estimate", "model_buffer_bytes", "sweep_totals"]


def estimate(config_or_params: TransformerConfig | int, setup: Setup, *, overheads: Overheads | None = None,
             device_type: str = "cuda", step_on_device: bool | None = None) -> MemoryBreakdown:
    """Predicted memory of ``setup`` (training or inference, by ``setup.mode``) on each rank, the worst rank's as
    the components.

    ``config_or_params`` is a :class:`~memlab.predict.spec.model.TransformerConfig` or a bare parameter count (model
    states only). ``device_type`` ("cuda" or "cpu") selects the device-dependent widths. ``step_on_device``:
    whether the optimizer's per-tensor step counters live on the device; None means "only on a CPU run" (torch
    hosts them on the CPU unless the optimizer is fused or capturable: pass True for those). A case memlab does
    not model raises :class:`~memlab.errors.SetupError` (:func:`memlab.predict.coverage.refusal`). ``attention='auto'``
    is the kernel the libraries run (:func:`memlab.predict.spec.kernels.resolved`), said first in the assumptions.
    """
    _check_arguments(setup, device_type)
    setup, kernel = resolved(config_or_params, setup, device_type=device_type)  # attention='auto': the library's
    bd = _estimate(config_or_params, setup, overheads_arg(overheads), device_type, step_on_device)
    return bd if kernel is None else replace(bd, assumptions=(kernel, *bd.assumptions))


def _estimate(config_or_params: TransformerConfig | int, setup: Setup, ov: Overheads, device_type: str,
              step_on_device: bool | None) -> MemoryBreakdown:
    """:func:`estimate` of a setup that names its attention kernel."""
    coverage.check(config_or_params, setup, device_type)
    if setup.pp > 1 or setup.cp > 1:
        return _pipeline(_config(config_or_params, "--pp/--cp place layers and tokens"), setup, ov, device_type)
    if setup.ep > 1:
        return _experts(_config(config_or_params, "--ep places experts"), setup, ov, device_type)
    bd = rank_breakdown(config_or_params, setup, overheads=ov, device_type=device_type,
                        step_on_device=step_on_device)
    head, tail = coverage.assumptions(config_or_params, setup, ov, device_type)
    terms = coverage.named_terms(config_or_params, setup, bd, device_type)
    one = RankBreakdown(rank=_every_rank(setup), holds=_holds(setup), states_bytes=bd.model_state_bytes(),
                        activations_bytes=bd.activations_bytes + bd.kv_cache_bytes, other_bytes=bd.overhead_bytes,
                        peak_bytes=bd.peak_bytes)
    return replace(bd, assumptions=(*head, *coverage.rotary_seq_note(config_or_params, setup.seq), *tail,
                                    *bd.assumptions),
                   named_terms=terms, peak_range=coverage.peak_range(bd, terms), ranks=(one,))


def _check_arguments(setup: object, device_type: object) -> None:
    if not isinstance(setup, Setup):
        raise SetupError(f"setup must be a memlab.predict.spec.setup.Setup, got {type(setup).__name__}")
    if device_type not in DEVICE_TYPES:
        raise SetupError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")


def _config(model: TransformerConfig | int, what: str) -> TransformerConfig:
    if not isinstance(model, TransformerConfig):
        raise SetupError(f"{what} on ranks: give a model config, not a bare parameter count")
    return model


def _every_rank(setup: Setup) -> str:
    n = setup.world_size * setup.tp
    return "the one device" if n == 1 else f"each of {n} ranks"


def _holds(setup: Setup) -> str:
    shard = f"1/{setup.tp} of each layer (tp)" if setup.tp > 1 else "every layer"
    return shard + (f", states sharded over {setup.world_size} (ZeRO-{setup.zero_stage})"
                    if setup.zero_stage and setup.world_size > 1 and setup.mode == "train" else "")


def _multi_rank(config: TransformerConfig, setup: Setup, ov: Overheads, device_type: str, states: StateParts,
                activations: int,
                other: dict[str, int], peak: tuple[int, str], ranks: tuple[RankBreakdown, ...],
                layout: dict[str, Any], notes: tuple[str, ...]) -> MemoryBreakdown:
    """The result of a layout whose ranks differ: the worst rank's components (``states``: its model states, split),
    no phases (per-rank phases are not modelled: ``peak`` is the worst rank's bytes and its moment), every rank in
    ``ranks``; the layout's own assumptions, then the overheads the estimate leaves out."""
    _, tail = coverage.assumptions(config, setup, ov, device_type)
    return MemoryBreakdown(
        params_bytes=states.params, grads_bytes=states.grads, optimizer_bytes=states.optimizer,
        activations_bytes=activations, kv_cache_bytes=0, overhead=other,
        total_bytes=states.total + activations + sum(other.values()),
        param_count=shape_summary(config).param_count, mode="train", activation_detail={},
        optimizer_detail=dict(states.optimizer_detail), assumptions=(*notes, *tail),
        config=config_fields(config), setup=fields_of(setup),
        peak_bytes=peak[0], peak_phase=peak[1], peak_step="steady", peak_range=PeakRange(peak[0], peak[0], peak[0], ()),
        ranks=ranks, layout=layout)


def _pipeline(config: TransformerConfig, setup: Setup, ov: Overheads, device_type: str) -> MemoryBreakdown:
    """Pipeline and context parallelism: one row per pipeline rank
    (:func:`memlab.predict.parallel.pipeline.parallel_estimate`); the worst decides the fit."""
    if ov != Overheads():
        raise SetupError("overheads are not modelled per pipeline rank: drop them with pp > 1 or cp > 1")
    rep = parallel_estimate(config, setup, device_type=device_type)
    ranks = tuple(RankBreakdown(
        rank=str(r.rank), holds=r.holds, states_bytes=r.states_bytes, activations_bytes=r.activations_bytes,
        other_bytes=r.buffers_bytes + r.transient_bytes, peak_bytes=r.peak_bytes,
        detail={"params": r.params, "in_flight": list(r.in_flight), "buffers_bytes": r.buffers_bytes,
                "transient_bytes": r.transient_bytes, "end_bytes": r.end_bytes}) for r in rep.rows)
    w = rep.worst
    return _multi_rank(config, setup, ov, device_type, state_parts(w.params, setup), w.activations_bytes,
                       {"pipeline_buffers": w.buffers_bytes, "transient": w.transient_bytes}, (w.peak_bytes,
                       "backward"), ranks, {"kind": "pipeline", "worst_rank": w.rank,
                                           "bubble_fraction": rep.bubble_fraction}, rep.assumptions)


def _experts(config: TransformerConfig, setup: Setup, ov: Overheads, device_type: str) -> MemoryBreakdown:
    """Expert parallelism: one expert-parallel rank (:func:`memlab.predict.parallel.experts.expert_estimate`;
    every rank alike under balanced routing, the busiest under worst)."""
    if ov != Overheads():
        raise SetupError("overheads are not modelled per expert-parallel rank: drop them with ep > 1")
    rep = expert_estimate(config, setup, device_type=device_type)
    rank = RankBreakdown(
        rank=f"each of {setup.ep} ep ranks" if setup.ep_routing == "balanced" else "the busiest ep rank",
        holds=f"{rep.local_experts} of {config.n_experts} experts a layer", states_bytes=rep.states_bytes,
        activations_bytes=rep.activations_bytes, other_bytes=rep.buffers_bytes + rep.transient_bytes,
        peak_bytes=rep.peak_bytes,
        detail={"local_experts": rep.local_experts, "dense_params": rep.dense_params,
                "expert_params": rep.expert_params, "sent_pairs": rep.sent_pairs, "received_pairs": rep.received_pairs,
                "routed_activations_bytes": rep.routed_activations_bytes, "all_to_all_bytes": rep.all_to_all_bytes})
    return _multi_rank(config, setup, ov, device_type, rep.states, rep.activations_bytes,
                       {"model_buffers": rep.buffers_bytes, "transient": rep.transient_bytes},
                       (rep.peak_bytes, rep.peak_phase), (rank,),
                       {"kind": "experts", "ep": rep.ep, "routing": rep.routing, "sent_bytes": rep.sent_bytes},
                       rep.assumptions)


# -- vectorised sweeps --------------------------------------------------------------------------------------------
def _size_array(name: str, values: Any, hi: int) -> np.ndarray:
    """``values`` as a float64 array of whole numbers in [1, hi]; anything else raises SetupError with the fix."""
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise SetupError(f"{name} must be a number or an array of whole numbers, got {show(values)} ({exc})") from None
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise SetupError(f"{name} must hold whole numbers (ints), got dtype {arr.dtype} ({show(values)})")
    arr = arr.astype(np.float64)
    if arr.size == 0:
        raise SetupError(f"{name} is empty: pass at least one value")
    if not np.all(np.isfinite(arr)):
        raise SetupError(f"{name} must be finite: got NaN or infinity in {show(values)}")
    if np.any(arr != np.round(arr)):
        raise SetupError(f"{name} must hold whole numbers, got fractions in {show(values)}")
    if np.min(arr) < 1 or np.max(arr) > hi:
        raise SetupError(f"{name} must lie in [1, {hi:,}] (Setup's bounds), got {np.min(arr):g}..{np.max(arr):g}")
    return arr


def sweep_totals(config_or_params: TransformerConfig | int, setup: Setup, *, batch: Any = None, seq: Any = None,
                 overheads: Overheads | None = None, device_type: str = "cuda",
                 step_on_device: bool | None = None, peak: bool = False) -> np.ndarray:
    """Total bytes per device (``peak=True``: the peak over the step's phases) for arrays of ``batch`` and ``seq``
    (broadcast together), vectorised.

    Runs the same formula functions as :func:`estimate` with numpy arrays in place of the setup's batch/seq;
    every other field comes from ``setup``. Values are float64 (exact below 2**53 bytes) and equal
    ``estimate(...).total_bytes`` (``.peak_bytes``) up to the per-component rounding up to whole bytes. One rank:
    layouts whose ranks differ (pp, cp, ep) are :func:`estimate`'s.
    """
    _check_arguments(setup, device_type)
    setup = resolved(config_or_params, setup, device_type=device_type)[0]
    if setup.pp > 1 or setup.cp > 1 or setup.ep > 1:
        raise SetupError(f"pp={setup.pp}, cp={setup.cp}, ep={setup.ep}: ranks hold different bytes; sweep_totals "
                         "sweeps one rank: use estimate() per setup")
    b = _size_array("batch", setup.batch if batch is None else batch, LIMITS["batch"].max)
    s = _size_array("seq", setup.seq if seq is None else seq, LIMITS["seq"].max)
    try:
        b, s = np.broadcast_arrays(b, s)
    except ValueError:
        raise SetupError(f"batch (shape {b.shape}) and seq (shape {s.shape}) do not broadcast together: pass "
                         "arrays of one shape, or one of them as a scalar") from None
    view = SetupView(setup, batch=b, seq=s)
    coverage.check(config_or_params, view, device_type)
    e = evaluate(config_or_params, view, overheads_arg(overheads), device_type, step_on_device)
    if peak:
        return peak_of(e.phases) + np.zeros_like(b)
    states = 0 if host_states(setup) else e.plan.states_total
    return states + e.activations + e.kv + sum(e.overheads.values()) + np.zeros_like(b)
