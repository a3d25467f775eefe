"""Activation checkpointing strategies measured on the reference GPT: what is kept, the peak, the extra FLOPs.

The reference GPT has three recompute policies of its own (``none``, ``selective``, ``full``: see
:mod:`memlab.model.gpt`). This module adds the two that act on groups of blocks:

- ``every-k``: the blocks in consecutive groups of ``k``, each group checkpointed (only its input is kept; in
  backward the group is recomputed, then differentiated). Megatron-LM's ``--recompute-method uniform
  --recompute-num-layers k``; ``k = 1`` is ``full``.
- ``sequential``: ``torch.utils.checkpoint.checkpoint_sequential(blocks, segments, x)`` as seed 004 writes it.
  Torch checkpoints the first ``segments - 1`` segments and runs the **last one without checkpointing** (its
  source: "the last chunk has to be non-volatile"; [pytorch-checkpoint]), so ``segments=2`` keeps half of the
  blocks' activations.

The square-root argument ([chen2016], "Training Deep Nets with Sublinear Memory Cost"): with ``n`` blocks in
groups of ``k``, backward holds the ``n/k`` group inputs plus one group's internals while it recomputes it, i.e.
``(n/k) * x + k * A`` for a block input of ``x`` bytes and block internals of ``A`` bytes; this is smallest at
``k = sqrt(n * x / A)``, which is ``sqrt(n)`` only when a block keeps as much as its input (``A = x``). A
transformer block keeps about 17 times its input ([korthikanti2022]: ``34 sbh`` against the ``2 sbh``
input in 16-bit), so the optimum is near ``k = 1``: checkpoint every block.

Introduced for chapter 04 (activations and checkpointing).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from memlab.device import resolve_device
from memlab.errors import SetupError
from memlab.measure.accounting import SavedTensorRecorder, model_states
from memlab.measure.live_bytes import LiveBytes
from memlab.model.gpt import GPT
from memlab.model.saved import saved_tensor_category
from memlab.model.step import token_batch
from memlab.predict.compute import flops as flops_mod
from memlab.predict.spec.model import TransformerConfig

STRATEGIES = ("none", "selective", "full", "every-k", "sequential")


class SegmentedGPT(GPT):
    """The reference GPT whose blocks run in checkpointed groups (``every-k``) or through ``checkpoint_sequential``."""

    def __init__(self, config: TransformerConfig, *, strategy: str, k: int = 1, segments: int = 2,
                 **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if strategy not in ("every-k", "sequential"):
            raise SetupError(f"SegmentedGPT strategy must be 'every-k' or 'sequential', got {strategy!r}")
        n = config.n_layers
        if strategy == "every-k" and not 1 <= k <= n:
            raise SetupError(f"k must be between 1 and n_layers={n} for every-k checkpointing, got {k}")
        if strategy == "sequential" and not 1 <= segments <= n:
            raise SetupError(f"segments must be between 1 and n_layers={n} for checkpoint_sequential, got {segments}")
        self.strategy, self.k, self.segments = strategy, k, segments
        self.in_blocks = False

    def _block_fns(self) -> list[Any]:
        return [lambda x, b=block: b(x, self.rotary) for block in self.blocks]

    def run_blocks(self, x: torch.Tensor, cache: Any = None) -> torch.Tensor:
        if cache is not None or not torch.is_grad_enabled():
            return super().run_blocks(x, cache)
        fns = self._block_fns()
        self.in_blocks = True
        try:
            if self.strategy == "sequential":
                return checkpoint_sequential(fns, self.segments, x, use_reentrant=False)
            for start in range(0, len(fns), self.k):
                group = fns[start : start + self.k]

                def run(y: torch.Tensor, group: list[Any] = group) -> torch.Tensor:
                    for fn in group:
                        y = fn(y)
                    return y

                x = checkpoint(run, x, use_reentrant=False)
            return x
        finally:
            self.in_blocks = False

    def checkpointed_fraction(self) -> float:
        """Fraction of blocks whose forward runs twice."""
        n = self.config.n_layers
        if self.strategy == "every-k":
            return 1.0
        return (n // self.segments) * (self.segments - 1) / n


@dataclass(frozen=True)
class CheckpointRun:
    """One strategy measured on one batch: bytes kept for backward, peak live bytes, FLOPs, CPU/GPU time."""

    strategy: str
    label: str
    batch: int
    seq: int
    n_layers: int
    saved_bytes: int
    """Bytes autograd keeps from the forward for backward (distinct storages, parameters excluded)."""
    saved_by_category: dict[str, int] = field(default_factory=dict)
    peak_bytes: int = 0
    """Largest live tensor bytes over forward + backward, parameters and gradients included."""
    params_bytes: int = 0
    recomputed_fraction: float = 0.0
    """Fraction of the blocks' forward FLOPs run a second time in backward."""
    model_flops: float = 0.0
    """Analytic forward + backward FLOPs without recompute (memlab.predict.compute.flops): MFU's numerator."""
    hardware_flops: float = 0.0
    """model_flops plus the recomputed forwards: HFU's numerator."""
    counted_flops: int | None = None
    """FLOPs FlopCounterMode counts in forward + backward (torch's non-reentrant checkpoint may stop early)."""
    time_s: float | None = None
    """Median seconds of un-instrumented forward + backward runs (CUDA events on a GPU, perf_counter on a CPU)."""
    cuda_peak_allocated_bytes: int | None = None
    """``torch.cuda.max_memory_allocated`` over those runs, on CUDA (None elsewhere)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict; ``saved_by_category`` becomes ``saved_<category>_bytes`` keys in :meth:`to_row`."""
        return asdict(self)

    def to_row(self) -> dict[str, Any]:
        """One flat row for a DataFrame."""
        row = {k: v for k, v in asdict(self).items() if k != "saved_by_category"}
        row.update({f"saved {c}": n for c, n in self.saved_by_category.items()})
        return row


def _label(strategy: str, k: int, segments: int) -> str:
    if strategy == "every-k":
        return f"every {k} block{'s' if k > 1 else ''}"
    if strategy == "sequential":
        return f"checkpoint_sequential({segments})"
    return strategy


def build_model(config: TransformerConfig, strategy: str, *, k: int = 1, segments: int = 2,
                attention: str = "eager", device: torch.device | str = "cpu") -> GPT:
    """The reference GPT with ``strategy`` (one of :data:`STRATEGIES`), fp32, in training mode."""
    if strategy not in STRATEGIES:
        raise SetupError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if strategy in ("every-k", "sequential"):
        model: GPT = SegmentedGPT(config, strategy=strategy, k=k, segments=segments, attention=attention,
                                  device=device)
    else:
        model = GPT(config, attention=attention, recompute=strategy, device=device)
    return model.train()


def measure_checkpointing(config: TransformerConfig, strategy: str, *, batch: int = 2, seq: int = 64, k: int = 1,
                          segments: int = 2, attention: str = "eager", device: torch.device | str = "cpu",
                          seed: int = 0, with_counted_flops: bool = True, timing_repeats: int = 3) -> CheckpointRun:
    """Build the reference GPT with ``strategy``, run one forward + backward, and measure it.

    Saved bytes come from :class:`memlab.measure.accounting.SavedTensorRecorder` (checkpointed groups' inputs are
    the category ``block inputs (recompute)``), the peak from :class:`memlab.measure.live_bytes.LiveBytes`,
    FLOPs analytically (:func:`memlab.predict.compute.flops.megatron_iteration_flops`) and counted, and the time (and on
    CUDA the allocator peak) of ``timing_repeats`` further forward + backward runs without any instrumentation.
    """
    if not isinstance(timing_repeats, int) or timing_repeats < 1:
        raise SetupError(f"timing_repeats must be a positive integer, got {timing_repeats!r}")
    dev = resolve_device(device)
    torch.manual_seed(seed)
    model = build_model(config, strategy, k=k, segments=segments, attention=attention, device=dev)
    idx, tgt = token_batch(config.vocab_size, batch, seq, dev, seed)

    def categorize(t: torch.Tensor, scope: tuple[torch.nn.Module, ...]) -> str:
        if getattr(model, "in_blocks", False) and scope and scope[-1] is model:
            return "block inputs (recompute)"
        return saved_tensor_category(t, scope)

    with LiveBytes(sample_every=None) as live:
        live.track(model.parameters(), "params")
        recorder = SavedTensorRecorder(model, categorize=categorize)
        with recorder:
            loss = model(idx, tgt)
        live.mark("backward")
        loss.backward()
        del loss
    saved = recorder.result()

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        model(idx, tgt).backward()

    from memlab.measure.timing import time_fn

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = time_fn(fwd_bwd, device=dev, repeats=timing_repeats, warmup=0)
    cuda_peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    params = model_states(model).params_bytes
    if isinstance(model, SegmentedGPT):
        frac = model.checkpointed_fraction()
    else:
        frac = {"none": 0.0, "selective": None, "full": 1.0}[strategy]
    none = flops_mod.megatron_iteration_flops(config, batch, seq, "none")
    if frac is None:  # selective: memlab.predict.compute.flops knows the attention core's share
        hw = flops_mod.megatron_iteration_flops(config, batch, seq, "selective")
        full = flops_mod.megatron_iteration_flops(config, batch, seq, "full")
        frac = (hw - none) / (full - none)
    else:
        full = flops_mod.megatron_iteration_flops(config, batch, seq, "full")
        hw = none + frac * (full - none)
    counted = None
    if with_counted_flops:
        from memlab.run.runner import count_flops

        model.zero_grad(set_to_none=True)
        counted = count_flops(lambda: model(idx, tgt).backward())
    return CheckpointRun(
        strategy=strategy, label=_label(strategy, k, segments), batch=batch, seq=seq, n_layers=config.n_layers,
        saved_bytes=saved.total_bytes, saved_by_category=saved.by_category(), peak_bytes=live.peak_bytes,
        params_bytes=params, recomputed_fraction=float(frac), model_flops=float(none), hardware_flops=float(hw),
        counted_flops=counted, time_s=statistics.median(times), cuda_peak_allocated_bytes=cuda_peak,
    )


def sqrt_n_model(n_layers: int, block_input_bytes: float, block_internal_bytes: float, k: int) -> float:
    """Bytes held in backward with groups of ``k`` blocks: the ``ceil(n/k)`` group inputs plus one group's
    internals, ``ceil(n/k) * x + k * A`` (Chen et al. 2016, Section 4.1, in bytes instead of layer units)."""
    if k < 1 or n_layers < 1:
        raise SetupError(f"k and n_layers must be positive, got k={k}, n_layers={n_layers}")
    return -(-n_layers // k) * block_input_bytes + k * block_internal_bytes
