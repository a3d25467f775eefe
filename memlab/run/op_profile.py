"""One training step of the reference GPT, op by op, placed on the roofline and predicted by it.

:func:`profile_step` runs ``torch.profiler`` with ``record_shapes=True`` over one steady-state step (after a
warm-up step that creates the optimizer state), with ``record_function`` ranges for the phases of
:func:`memlab.model.step.train_step` (forward, backward, optimizer step, zero_grad). Every leaf aten
op the table below knows gets FLOPs and bytes **from its recorded shapes and dtypes**:

- matmuls (``mm``, ``addmm``, ``bmm``, ``baddbmm``): 2*m*n*k per product [narayanan2021]; bytes = operands read
  once + result written once (the minimum traffic);
- fused attention (flash / memory-efficient SDPA, forward and backward): torch's own SDPA counts
  (``torch.utils.flop_counter``), bytes = inputs + outputs (the score matrix never touches memory) [dao2022];
- everything else (softmax, norms, GELU, residual adds, the loss, the embedding, the optimizer's element-wise
  updates): :data:`ELEMENTWISE_FLOPS` FLOPs per output element, memlab's convention (not what the hardware
  executes exactly: these ops sit far below the ridge point either way), bytes = inputs + output.

Time per op is the profiler's *self* time (device time on CUDA, CPU time on a CPU), so a composite op such as
``aten::linear`` is not counted twice. :func:`predict_ops` adds the roofline prediction of each op, time =
max(FLOPs / peak, bytes / bandwidth) [williams2009], and its error against the measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from memlab.device import resolve_device
from memlab.errors import SetupError
from memlab.model.step import PhaseMeter, build_training, token_batch, train_step
from memlab.predict.compute.flops import roofline_bound
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

ELEMENT_BYTES = {
    "float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4, "short int": 2,
    "bool": 1, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}
"""Bytes per element of the dtype names the profiler records (``FunctionEvent.input_dtypes``)."""

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION_OPS = (
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
)
ELEMENTWISE_FLOPS: dict[str, tuple[str, float]] = {
    # op: (kind, FLOPs per output element). Transcendentals count as one FLOP each.
    "aten::_softmax": ("softmax", 5), "aten::_softmax_backward_data": ("softmax", 4),
    "aten::_log_softmax": ("loss", 5), "aten::_log_softmax_backward_data": ("loss", 3),
    "aten::nll_loss_forward": ("loss", 1), "aten::nll_loss_backward": ("loss", 1),
    "aten::native_layer_norm": ("norm", 8), "aten::native_layer_norm_backward": ("norm", 14),
    "aten::gelu": ("elementwise", 8), "aten::gelu_backward": ("elementwise", 12),
    "aten::silu": ("elementwise", 4), "aten::silu_backward": ("elementwise", 6),
    "aten::add": ("elementwise", 1), "aten::add_": ("elementwise", 1), "aten::sub": ("elementwise", 1),
    "aten::mul": ("elementwise", 1), "aten::mul_": ("elementwise", 1), "aten::div": ("elementwise", 1),
    "aten::div_": ("elementwise", 1), "aten::rsqrt": ("elementwise", 1), "aten::neg": ("elementwise", 1),
    "aten::tanh": ("elementwise", 1), "aten::masked_fill": ("elementwise", 1),
    "aten::masked_fill_": ("elementwise", 1), "aten::sum": ("elementwise", 1), "aten::mean": ("elementwise", 1),
    "aten::embedding": ("embedding", 0), "aten::embedding_dense_backward": ("embedding", 1),
    "aten::addcmul_": ("optimizer", 2), "aten::addcdiv_": ("optimizer", 2), "aten::lerp_": ("optimizer", 2),
    "aten::sqrt": ("optimizer", 1), "aten::sqrt_": ("optimizer", 1),
    "aten::copy_": ("copy", 0), "aten::fill_": ("copy", 0),
}
"""memlab's per-element FLOP convention for the non-matmul ops of a GPT training step (see the module doc)."""

def _numel(shape: Any) -> int:
    return math.prod(int(d) for d in shape) if isinstance(shape, list | tuple) else 1


def _tensors(shapes: list[Any], dtypes: list[str]) -> list[tuple[list[int], int]]:
    """(shape, element bytes) of each tensor input; tensor lists are flattened, scalars dropped."""
    out = []
    for shape, dtype in zip(shapes, dtypes, strict=False):
        if dtype in ELEMENT_BYTES:
            out.append((list(shape), ELEMENT_BYTES[dtype]))
        elif dtype == "TensorList" and isinstance(shape, list):
            out.extend((list(s), 4) for s in shape if isinstance(s, list))
    return out


def _matmul(name: str, ins: list[tuple[list[int], int]]) -> tuple[float, float] | None:
    """(FLOPs, bytes) of a matmul from its input shapes, or None when the shapes do not fit."""
    ops = ins[1:] if name in ("aten::addmm", "aten::baddbmm") else ins
    if len(ops) < 2:
        return None
    (a, elt), (b, _) = ops[0], ops[1]
    if len(a) != len(b) or len(a) not in (2, 3) or a[-1] != b[-2]:
        return None
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    read = sum(_numel(s) * e for s, e in ins)
    return 2.0 * batch * m * n * k, float(read + batch * m * n * elt)


def _attention(name: str, ins: list[tuple[list[int], int]]) -> tuple[float, float] | None:
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    tensors = [s for s, _ in ins if len(s) == 4]
    if name.endswith("_backward"):
        if len(tensors) < 4:
            return None
        grad, q, k, v = tensors[:4]
        flops = sdpa_backward_flop_count(grad, q, k, v)
        written = sum(_numel(s) * e for s, e in ins if len(s) == 4 and s in (q, k, v))
    else:
        if len(tensors) < 3:
            return None
        q, k, v = tensors[:3]
        flops = sdpa_flop_count(q, k, v)
        written = _numel(q) * ins[0][1]
    return float(flops), float(sum(_numel(s) * e for s, e in ins) + written)


def op_cost(name: str, shapes: list[Any], dtypes: list[str]) -> tuple[str, float, float] | None:
    """(kind, FLOPs, bytes) of one recorded op from its input shapes and dtypes; None for ops not costed
    (views, allocation, copies and composites whose children are costed)."""
    ins = _tensors(shapes, dtypes)
    if not ins:
        return None
    base = name.removesuffix("_backward")
    if name in MATMUL_OPS:
        cost = _matmul(name, ins)
        return None if cost is None else ("matmul", *cost)
    if base in ATTENTION_OPS:
        cost = _attention(name, ins)
        return None if cost is None else ("attention", *cost)
    if name not in ELEMENTWISE_FLOPS:
        return None
    kind, per_element = ELEMENTWISE_FLOPS[name]
    out_shape, out_elt = max(ins, key=lambda t: _numel(t[0]))
    if name == "aten::embedding":  # (weight, indices): rows gathered
        weight, indices = ins[0][0], ins[1][0] if len(ins) > 1 else [1]
        out_elements = _numel(indices) * (weight[-1] if weight else 1)
        return kind, 0.0, float(2 * out_elements * ins[0][1] + _numel(indices) * ins[-1][1])
    out_elements = _numel(out_shape)
    if name == "aten::fill_":  # writes only
        return kind, 0.0, float(out_elements * out_elt)
    read = sum(_numel(s) * e for s, e in ins)
    return kind, float(per_element * out_elements), float(read + out_elements * out_elt)


@dataclass(frozen=True)
class StepProfile:
    """One profiled training step: ``ops`` (one row per recorded op call), phase times and provenance."""

    ops: pd.DataFrame
    """name, kind, phase, shapes, dtypes, self_s, flops, bytes (NaN where not costed)."""
    phase_s: dict[str, float]
    """Wall time of each ``record_function`` phase under the profiler (forward, backward, optimizer step,
    zero_grad: :data:`memlab.model.step.STEP_PHASES`), seconds."""
    device: str
    time_source: str
    """``"self device time"`` (CUDA) or ``"self CPU time"`` (CPU)."""

    def by_op(self) -> pd.DataFrame:
        """Costed ops grouped by (name, phase, shapes): calls, total self time, FLOPs, bytes, intensity, FLOP/s."""
        t = self.ops.dropna(subset=["flops"]).copy()
        t["shapes"] = t["shapes"].astype(str)
        g = (t.groupby(["name", "kind", "phase", "shapes"], as_index=False)
             .agg(calls=("self_s", "size"), self_s=("self_s", "sum"), flops=("flops", "sum"),
                  bytes=("bytes", "sum")))
        g["arithmetic_intensity"] = g["flops"] / g["bytes"]
        g["flops_per_s"] = g["flops"] / g["self_s"]
        g["bytes_per_s"] = g["bytes"] / g["self_s"]
        return g.sort_values("self_s", ascending=False, ignore_index=True)

    def coverage(self) -> float:
        """Fraction of all recorded self time that falls on costed ops."""
        total = float(self.ops["self_s"].sum())
        return float(self.ops.dropna(subset=["flops"])["self_s"].sum()) / total if total else 0.0


def _phase_of(event: Any, ranges: dict[str, tuple[int, int]]) -> str:
    start = event.time_range.start
    for phase, (lo, hi) in ranges.items():
        if lo <= start <= hi:
            return phase
    return "other"


def profile_step(config: TransformerConfig, setup: Setup, device: str | torch.device = "auto", *, seed: int = 0,
                 lr: float = 1e-4) -> StepProfile:
    """Profile one steady-state training step of the reference GPT under ``setup`` (see the module doc)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    if setup.mode != "train":
        raise SetupError("profile_step profiles a training step: use a Setup with mode='train'")
    dev = resolve_device(device)
    model, step = build_training(config, setup, dev, seed=seed, lr=lr)
    idx, tgt = token_batch(config.vocab_size, setup.batch, setup.seq, dev, seed)

    def loss_fn() -> torch.Tensor:
        return model(idx, tgt)

    train_step(step, loss_fn)  # warm-up: creates the optimizer state, picks kernels
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        train_step(step, loss_fn, meter=PhaseMeter(lambda _step, name: record_function(f"memlab::{name}")))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    events = list(prof.events())
    # The CPU-side ranges only: on CUDA each record_function also appears as a GPU annotation, on device time.
    ranges = {e.name.removeprefix("memlab::"): (e.time_range.start, e.time_range.end)
              for e in events if e.name.startswith("memlab::") and str(e.device_type).endswith("CPU")}
    cuda = dev.type == "cuda"
    rows = []
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        self_us = e.self_device_time_total if cuda else e.self_cpu_time_total
        cost = op_cost(e.name, list(e.input_shapes or []), list(e.input_dtypes or []))
        kind, flops, nbytes = cost if cost is not None else (None, math.nan, math.nan)
        rows.append({"name": e.name, "kind": kind, "phase": _phase_of(e, ranges),
                     "shapes": [list(s) if isinstance(s, list) else s for s in (e.input_shapes or [])],
                     "dtypes": list(e.input_dtypes or []), "self_s": self_us / 1e6, "flops": flops,
                     "bytes": nbytes})
    phase_s = {p: (hi - lo) / 1e6 for p, (lo, hi) in ranges.items()}
    return StepProfile(pd.DataFrame(rows), phase_s, str(dev), "self device time" if cuda else "self CPU time")


def predict_ops(ops: pd.DataFrame, peak_flops_per_s: float, bandwidth_bytes_per_s: float,
                min_time_s: float = 0.0) -> pd.DataFrame:
    """Each op's roofline prediction next to its measurement (``ops`` from :meth:`StepProfile.by_op`).

    Adds ``bound_flops_per_s`` = min(peak, intensity x bandwidth), ``predicted_s`` = FLOPs / bound (for FLOP-free
    ops, bytes / bandwidth), ``memory_bound`` (intensity below the ridge point peak / bandwidth) and
    ``time_ratio`` = measured / predicted (1 on the roof; 10 means ten times slower than the roofline allows).
    Ops shorter than ``min_time_s`` in total are dropped (timer resolution and per-call overhead dominate them).
    """
    t = ops[ops["self_s"] > min_time_s].copy()
    bound = roofline_bound(t["arithmetic_intensity"].to_numpy(), peak_flops_per_s, bandwidth_bytes_per_s)
    t["bound_flops_per_s"] = bound
    memory_time = t["bytes"] / bandwidth_bytes_per_s
    t["predicted_s"] = (t["flops"] / t["bound_flops_per_s"]).where(t["flops"] > 0, memory_time)
    t["memory_bound"] = t["arithmetic_intensity"] < peak_flops_per_s / bandwidth_bytes_per_s
    t["time_ratio"] = t["self_s"] / t["predicted_s"]
    return t.reset_index(drop=True)


def time_by_kind(ops: pd.DataFrame) -> pd.DataFrame:
    """Self time, FLOPs and bytes per op kind (matmul, attention, softmax, norm, ...) with each kind's share."""
    g = ops.groupby("kind", as_index=False)[["self_s", "flops", "bytes"]].sum()
    g["time_share"] = g["self_s"] / g["self_s"].sum()
    g["flop_share"] = g["flops"] / g["flops"].sum()
    return g.sort_values("self_s", ascending=False, ignore_index=True)
