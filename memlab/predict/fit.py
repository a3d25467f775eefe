"""Will it fit? A predicted step against a device's memory, and the largest batch or sequence that fits.

Every verdict, search and lever here decides on what the device shows, as ``memlab estimate --gpu`` does: the
estimator's **peak** (the most a step holds at once, :mod:`memlab.predict.memory.phases`, never the sum of components)
plus the caching allocator's reserve, the CUDA context, cuBLAS/cuBLASLt workspaces and NCCL/DDP buffers where they
apply (:func:`memlab.predict.gpu.device.for_estimate`, the one copy of those terms): "fits" is device-used's high
end <= the capacity torch reports (a detected device) or the datasheet's (a table row), the margin named. The
tensor peak (what ``torch.cuda.max_memory_allocated`` counts of the step's tensors) stays beside it in each result.
The formula bounds the allocator's reserve but does not give it, so a search answers from both ends
(:class:`FitSearch`: ``value`` fits for certain, ``up_to`` is where even no reserve stops fitting) and a lever says
whether the reserve decides; :func:`memlab.tracing.fit.traced_search` settles between the ends by replaying the
traced step's allocations. This module imports no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

from memlab.errors import MemlabError, SetupError
from memlab.predict.estimate import MemoryBreakdown, Overheads, estimate
from memlab.predict.gpu.device import (
    CUDA_CONTEXT_HIGH_BYTES,
    DeviceOverheads,
    DevicePeaks,
    for_estimate,
    from_overheads,
)
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import LORA_DEFAULT_RANK, LORA_DEFAULT_TARGETS, Setup
from memlab.predict.spec.validate import LIMITS, check_int, show
from memlab.units import GiB

CUDA_CONTEXT_BYTES = CUDA_CONTEXT_HIGH_BYTES
"""The CUDA context's upper figure, outside the caching allocator, with lazy module loading: the high end of the
documented range a ``--gpu`` verdict counts (:data:`memlab.predict.gpu.device.CUDA_CONTEXT_HIGH_BYTES`, 426 MiB;
PyTorch maintainers' "about 300-400 MB", pytorch/pytorch#107667 and #109888, lies inside it). Bytes. Used only by
:meth:`FitVerdict.margin` of a verdict built without its device peaks (a tensors-only verdict)."""
BORDERLINE_SHARE = 0.95
"""Seed 000's rule of thumb for training memory, "empirical, not a hard standard" [seed-000]: above 95 % of the card
the risk of an out-of-memory error rises sharply (fragmentation, workspaces, the peak's step-to-step variation)."""
ALLOCATED_ONLY = DeviceOverheads(cuda_context_bytes=0, workspace_bytes=0, reserve_bytes=0, nccl_channels=0,
                                 ddp_buckets=False)
"""Every device term 0: pass ``device=ALLOCATED_ONLY`` to decide on the tensor peak alone, against a budget that caps
the step's tensors rather than a card (chapter 01's budget, a CPU's live bytes); device-used then equals the peak."""
DECIDED_ON = "device-used (nvidia-smi), its high end, against the card's capacity"
"""What every fit of this module decides on (:attr:`memlab.predict.gpu.device.DevicePeaks.fits`)."""


@dataclass(frozen=True)
class FitVerdict:
    """Whether a predicted step fits a device's memory, decided on device-used (``device``: allocated, reserved and
    device-used peaks, :class:`~memlab.predict.gpu.device.DevicePeaks`), bytes. :attr:`margin_bytes` = capacity -
    device-used's high end (negative when it does not fit); ``peak_bytes`` is the tensor peak alone and
    ``headroom_bytes`` = capacity - peak_bytes (the allocated-only figures, before the device's terms);
    ``total_bytes`` is the sum of components, shown beside the peak. A verdict built without ``device`` (by hand,
    e.g. a trace's paged note) decides on ``peak_bytes``."""

    fits: bool
    total_bytes: int
    capacity_bytes: int
    headroom_bytes: int
    gpu: str
    gpu_name: str
    peak_bytes: int = 0
    peak_phase: str = ""
    paged_bytes: int = 0
    """Paged optimizer states in CUDA managed memory (``MemoryBreakdown.paged_bytes``): not in the peak that fits."""
    device: DevicePeaks | None = None
    """The three peaks the verdict is decided on (None: a tensors-only verdict)."""

    @property
    def used_bytes(self) -> int:
        """What the verdict compares with the capacity: device-used's high end (the tensor peak without
        ``device``)."""
        return self.device.device_high_bytes if self.device is not None else self.peak_bytes

    @property
    def margin_bytes(self) -> int:
        """Capacity - :attr:`used_bytes`: the margin the verdict is decided on (negative when it does not fit)."""
        return self.capacity_bytes - self.used_bytes

    @property
    def paged_resident(self) -> bool:
        """Whether the paged optimizer states fit beside the device's peak (they stay on the device)."""
        return self.used_bytes + self.paged_bytes <= self.capacity_bytes

    def paged_note(self) -> str:
        """What the paged optimizer states mean for this fit, in one sentence ('' without them)."""
        if not self.paged_bytes:
            return ""
        paged = (f"paged optimizer states {self.paged_bytes / GiB:.2f} GiB (CUDA managed memory, outside torch's "
                 "allocator)")
        if not self.fits:
            return f"{paged} come on top: the step alone does not fit"
        if self.paged_resident:
            both = (self.used_bytes + self.paged_bytes) / GiB
            return f"{paged} fit beside the peak: the device shows up to {both:.2f} GiB while they are resident"
        return (f"{paged} do not fit in the {self.margin_bytes / GiB:.2f} GiB left beside the peak: the step still "
                "fits (torch's allocator never sees them), and the driver pages them to host RAM and back for each "
                "optimizer step: no out-of-memory error, slower steps")

    def margin(self) -> str:
        """``fits``, ``borderline`` or ``does not fit``. With ``device``: does not fit when device-used's low end is
        above the card; borderline when its range straddles the card, or its high end fits but is above
        :data:`BORDERLINE_SHARE` of it (seed 000's rule of thumb: the step-to-step variation decides). Without
        ``device`` (a tensors-only verdict): borderline when the peak plus the CUDA context
        (:data:`CUDA_CONTEXT_BYTES`) is above that share. A stated margin, not a measured one."""
        cap = self.capacity_bytes
        if self.device is not None:
            if self.device.device_low_bytes > cap:
                return "does not fit"
            return "borderline" if not self.fits or self.device.device_high_bytes > BORDERLINE_SHARE * cap \
                else "fits"
        if not self.fits:
            return "does not fit"
        return "borderline" if self.peak_bytes + CUDA_CONTEXT_BYTES > BORDERLINE_SHARE * cap else "fits"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields, :meth:`paged_note`, the margin's word and what the verdict is decided on."""
        return {**asdict(self), "paged_note": self.paged_note(), "margin": self.margin(),
                "margin_bytes": self.margin_bytes, "used_bytes": self.used_bytes,
                "decided_on": DECIDED_ON if self.device is not None else "the tensor peak (no device terms)"}


@dataclass(frozen=True)
class FitSearch:
    """Result of :func:`max_batch` / :func:`max_seq`: the largest ``value`` of ``field`` that fits, from both ends of
    device-used's range (0 if none).

    ``value`` fits **for certain** as the formula models the device: device-used's high end (the allocator's
    reserve at its bound, :func:`memlab.predict.gpu.device.reserve_bound`, the CUDA context's documented high end)
    is under the capacity, as ``memlab estimate --gpu`` says FITS. ``up_to`` is the largest whose **low** end fits
    (no reserve, the context's low end): above it nothing fits, and between the two the caching allocator's reserve
    decides, which the formula bounds but does not give (``memlab trace --gpu --max-batch`` replays it,
    :func:`memlab.tracing.fit.traced_search`). At ``value`` (or at 1 when nothing fits): ``total_bytes`` the tensor
    peak (allocated-only), ``device_bytes`` device-used's high end, ``margin_bytes`` capacity - device_bytes."""

    field: str
    value: int
    reason: str
    total_bytes: int | None
    capacity_bytes: int
    gpu: str
    device_bytes: int | None = None
    margin_bytes: int | None = None
    decided_on: str = DECIDED_ON
    up_to: int | None = None
    """The largest value whose device-used low end fits (>= ``value``; None where not searched)."""
    tried: tuple[tuple[int, int, int, bool], ...] = ()
    """A traced search's candidates in value order: (value, traced tensor peak, device-used's high end, fits)."""

    @property
    def settled(self) -> bool:
        """Whether the two ends agree (no value is left to the allocator's reserve)."""
        return self.up_to is None or self.up_to == self.value

    def words(self) -> str:
        """The answer in a phrase: ``9`` where settled, else ``9 for certain, up to 19``."""
        if self.settled:
            return f"{self.value:,}"
        return f"{self.value:,} for certain, up to {self.up_to:,}"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields."""
        return asdict(self)


def device_overheads(what: MemoryBreakdown | None, overheads: Overheads | None,
                     device: DeviceOverheads | None) -> DeviceOverheads:
    """The device terms a fit decides with: ``device`` when given (``memlab estimate`` builds it from its options),
    else those ``overheads`` names (:func:`memlab.predict.gpu.device.from_overheads`), else the terms a given
    breakdown was estimated with (its ``overhead`` component: each term > 0 replaces its default), else every
    default."""
    if device is not None or overheads is not None or what is None:
        return from_overheads(overheads, device)
    named = {k: int(what.overhead.get(k, 0)) or None for k in ("cuda_context", "workspace", "fragmentation")}
    return DeviceOverheads(cuda_context_bytes=named["cuda_context"], workspace_bytes=named["workspace"],
                           reserve_bytes=named["fragmentation"])


def on_device(gpu: Any, ov: DeviceOverheads) -> DeviceOverheads:
    """``ov`` for the device ``gpu`` names: a CPU (``detect()``'s DeviceInfo of kind ``cpu``) has no CUDA context,
    cuBLAS workspaces, caching-allocator reserve or NCCL buffers, so those terms are 0 there (DDP's bucket copy
    stays: gloo's DDP keeps it too); a GPU keeps ``ov``."""
    from dataclasses import replace

    from memlab.predict.hardware.gpus import DeviceInfo

    if not isinstance(gpu, DeviceInfo) or gpu.kind != "cpu":
        return ov
    return replace(ov, cuda_context_bytes=0, workspace_bytes=0, nccl_channels=0,
                   reserve_bytes=0 if ov.reserve_fraction is None else None)


def device_peaks_of(bd: MemoryBreakdown, key: str, capacity_bytes: int, device: DeviceOverheads) -> DevicePeaks:
    """The device peaks of an estimate on the card ``key`` of ``capacity_bytes``: the one shared call
    (:func:`memlab.predict.gpu.device.for_estimate`), the setup read back from the breakdown."""
    return for_estimate(bd, SimpleNamespace(**bd.setup), key, capacity_bytes, device)


def card_capacity(gpu: Any) -> tuple[str, str, int]:
    """(key, name, memory bytes) of a GPU name, an ``Accelerator`` row, or the DeviceInfo of
    ``memlab.measure.machine.detect()``. A memory that is not a whole number of bytes >= 1 (zero, negative, a
    float) is a :class:`SetupError`: no step fits in it, and a verdict against it would be meaningless."""
    from memlab.predict.hardware.gpus import Accelerator, DeviceInfo

    if isinstance(gpu, str):
        from memlab.predict.hardware.gpus import gpu as lookup

        gpu = lookup(gpu)
    if isinstance(gpu, Accelerator):
        key, name, memory = gpu.key, gpu.name, gpu.memory_bytes
    elif isinstance(gpu, DeviceInfo) and gpu.total_memory_bytes is not None:  # the memory torch reports
        key, name, memory = gpu.accelerator.key if gpu.accelerator else gpu.kind, gpu.name, gpu.total_memory_bytes
    else:
        raise SetupError(f"cannot tell the memory of {show(gpu)}: pass a GPU name (see 'memlab gpus'), an "
                         "Accelerator or detect()'s DeviceInfo")
    limit = LIMITS["overhead_bytes"]
    return key, name, check_int("memory_bytes", memory, hi=int(limit.max), why=limit.why, owner=f"GPU {key!r}",
                                err=SetupError)


def fits(what: MemoryBreakdown | TransformerConfig | int, gpu: Any, setup: Setup | None = None, *,
         overheads: Overheads | None = None, device: DeviceOverheads | None = None) -> FitVerdict:
    """Does ``what`` (a breakdown, or a config/count with ``setup``) fit in ``gpu``'s memory?

    ``gpu``: a name for :func:`memlab.predict.hardware.gpus.gpu`, an ``Accelerator`` row (its table memory), or
    ``memlab.measure.machine.detect()``'s ``DeviceInfo`` (the memory torch reports). Decided on device-used, as
    ``memlab estimate --gpu`` decides: the peak (``MemoryBreakdown.peak_bytes``) plus the allocator's reserve (up
    to :func:`memlab.predict.gpu.device.reserve_bound`), the CUDA context's documented range, cuBLAS/cuBLASLt
    workspaces, NCCL and DDP buffers where the setup has them; fits when device-used's high end <= capacity, the
    margin in ``margin_bytes`` (``headroom_bytes``: capacity - the tensor peak, before those terms). ``device``
    overrides those terms (:class:`DeviceOverheads`; :data:`ALLOCATED_ONLY` decides on the tensor peak alone);
    without it the terms ``overheads`` (or the given breakdown) names replace their defaults
    (:func:`device_overheads`); a CPU device has none of them (:func:`on_device`). A paged optimizer's states
    (``paged_bytes``) are not in the peak: torch's allocator never sees them, and where they do not fit beside it
    the driver pages them to host RAM (:meth:`FitVerdict.paged_note` says which).
    """
    key, name, cap = card_capacity(gpu)
    ov = on_device(gpu, device_overheads(what if isinstance(what, MemoryBreakdown) else None, overheads, device))
    if not isinstance(what, MemoryBreakdown):
        if setup is None:
            raise SetupError("fits() needs a setup when given a model config or parameter count")
        what = estimate(what, setup, overheads=overheads)
    p = device_peaks_of(what, key, cap, ov)
    return FitVerdict(p.fits, what.total_bytes, cap, cap - what.peak_bytes, key, name, what.peak_bytes,
                      what.peak_phase, what.paged_bytes, p)


def _search(config: TransformerConfig, setup: Setup, gpu: Any, field: str, limit: int,
            overheads: Overheads | None, device: DeviceOverheads | None) -> FitSearch:
    if not isinstance(config, TransformerConfig):
        raise SetupError(f"max_{field} needs a model config: with a bare parameter count {field} changes nothing")
    if not isinstance(setup, Setup):
        raise SetupError(f"setup must be a memlab.predict.spec.setup.Setup, got {type(setup).__name__}")
    hi = LIMITS[field].max
    check_int("limit", limit, hi=hi, why=f"Setup's bound on {field}", err=SetupError)
    key, _, cap = card_capacity(gpu)
    ov = on_device(gpu, device_overheads(None, overheads, device))
    seen: dict[int, tuple[int, DevicePeaks]] = {}

    def at(v: int) -> tuple[int, DevicePeaks]:
        if v not in seen:
            bd = estimate(config, setup.with_(**{field: v}), overheads=overheads)
            seen[v] = bd.peak_bytes, device_peaks_of(bd, key, cap, ov)
        return seen[v]

    certain = largest_fitting(lambda v: at(v)[1].device_high_bytes <= cap, limit)
    up_to = largest_fitting(lambda v: at(v)[1].device_low_bytes <= cap, limit, start=max(certain, 1))
    tensors, p = at(max(certain, 1))
    return FitSearch(field, certain, _search_reason(field, certain, up_to, limit, at, cap, key), tensors, cap, key,
                     p.device_high_bytes, p.margin_bytes, up_to=up_to)


def largest_fitting(fits_at: Any, limit: int, *, start: int = 1) -> int:
    """The largest ``v`` in ``start``..``limit`` with ``fits_at(v)`` (0 when even ``start`` does not fit), by
    bisection: ``fits_at`` must be monotone (true up to a value, false above it), as every device-used end is in
    batch and sequence. ``start`` (>= 1) is a value known or assumed to fit."""
    if not fits_at(start):
        return 0
    if fits_at(limit):
        return limit
    lo, hi = start, limit  # fits at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_at(mid) else (lo, mid)
    return lo


def _used(p: DevicePeaks) -> str:
    """device-used's high end and the margin, in words (GiB)."""
    return f"device-used {p.device_high_bytes / GiB:.2f} GiB, margin {p.margin_bytes / GiB:+.2f} GiB"


_FLAG = {"batch": "--max-batch", "seq": "--longest-seq"}
"""The command-line option of each search."""


def _search_reason(field: str, certain: int, up_to: int, limit: int, at: Any, cap: int, key: str) -> str:
    """Why the search stopped where it did, both ends in words."""
    if up_to == 0:
        tensors, p = at(1)
        return (f"even {field}=1 needs device-used {p.device_low_bytes / GiB:.2f} GiB > {cap / GiB:.2f} GiB on {key} "
                f"with no allocator reserve (tensors {tensors / GiB:.2f} GiB)")
    parts = []
    if certain:
        parts.append(f"{field}={certain} fits for certain: {_used(at(certain)[1])}")
    else:
        p = at(1)[1]
        parts.append(f"no {field} fits for certain: {field}=1 needs device-used up to {p.device_high_bytes / GiB:.2f} "
                     f"GiB, margin {p.margin_bytes / GiB:+.2f} GiB")
    if up_to > certain:
        span = f"{field}={certain + 1}" + (f"..{up_to} fit" if up_to > certain + 1 else " fits")
        parts.append(f"{span} only if the caching allocator's reserve stays under the margin (the formula bounds "
                     f"it; memlab trace --gpu {_FLAG[field]} replays it)")
    if up_to < limit:
        low = at(up_to + 1)[1].device_low_bytes
        parts.append(f"{field}={up_to + 1} does not fit: device-used at least {low / GiB:.2f} GiB > "
                     f"{cap / GiB:.2f} GiB")
    else:
        parts.append(f"{limit} is the search limit")
    return "; ".join(parts)


def max_batch(config: TransformerConfig, setup: Setup, gpu: Any, *, limit: int = 1 << 16,
              overheads: Overheads | None = None, device: DeviceOverheads | None = None) -> FitSearch:
    """Largest micro-batch (1..``limit``) whose device-used peak fits ``gpu`` (as :func:`fits` decides), by
    bisection (memory grows with batch)."""
    return _search(config, setup, gpu, "batch", limit, overheads, device)


def max_seq(config: TransformerConfig, setup: Setup, gpu: Any, *, limit: int | None = None,
            overheads: Overheads | None = None, device: DeviceOverheads | None = None) -> FitSearch:
    """Largest sequence length (1..``limit``, default the model's ``max_seq``) whose device-used peak fits ``gpu``
    (as :func:`fits` decides), by bisection."""
    return _search(config, setup, gpu, "seq", config.max_seq if limit is None else limit, overheads, device)


def serving_table(config: TransformerConfig, setup: Setup, gpu: Any, contexts: tuple[int, ...] | list[int], *,
                  limit: int = 1 << 12, overheads: Overheads | None = None,
                  device: DeviceOverheads | None = None) -> list[dict[str, Any]]:
    """The serving search: for each context length in ``contexts`` (tokens per sequence, prompt + generated), the
    largest batch of sequences whose predicted device-used peak fits ``gpu`` (:func:`max_batch` at ``seq`` =
    context; ``max_batch`` fits for certain, ``max_batch_up_to`` where device-used's low end stops fitting, as
    :class:`FitSearch` says), with the tensor peak and the phase it falls in at that batch. ``setup`` must be an
    inference setup (its weights, KV dtype, cache kind, kept logits and attention kernel); ``limit`` caps the
    search (a batch of 4096 sequences is beyond what any engine schedules at once). Rows: ``context``,
    ``max_batch``, ``max_batch_up_to``, ``peak_bytes`` (tensors), ``peak_phase``, ``kv_cache_bytes`` at that batch,
    ``device_bytes`` (device-used's high end at ``max_batch``), ``margin_bytes`` (capacity - device_bytes),
    ``reason``."""
    if not isinstance(setup, Setup) or setup.mode != "inference":
        raise SetupError("serving_table searches inference setups: pass a Setup with mode='inference'")
    rows = []
    for context in contexts:
        at = setup.with_(seq=context)  # a bad context is one SetupError line here
        found = max_batch(config, at, gpu, limit=limit, overheads=overheads, device=device)
        bd = estimate(config, at.with_(batch=max(found.value, 1)), overheads=overheads)
        rows.append({"context": context, "max_batch": found.value, "max_batch_up_to": found.up_to,
                     "peak_bytes": bd.peak_bytes,
                     "peak_phase": bd.peak_phase, "kv_cache_bytes": bd.kv_cache_bytes if found.value else 0,
                     "device_bytes": found.device_bytes, "margin_bytes": found.margin_bytes,
                     "reason": found.reason})
    return rows


# -- what to switch on to fit ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lever:
    """One thing a user can switch on: the :class:`Setup` fields it sets and what it costs, in words.

    A value in ``changes`` is either the field's value, ``"N"`` (the ranks :func:`levers` shards over), or a
    function ``(base setup, model config) -> value`` (e.g. half the model's blocks). ``needs``: (field, values)
    pairs the base setup must have for the lever to apply (e.g. LoRA only from a full fine-tune): a lever that
    does not apply is left out, not ranked."""

    name: str
    changes: tuple[tuple[str, Any], ...]
    cost: str
    needs: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def applies(self, base: Setup) -> bool:
        """Whether ``base`` has every field value this lever needs."""
        return all(getattr(base, k) in values for k, values in self.needs)

    def setup(self, base: Setup, world_size: int, config: TransformerConfig | None = None) -> Setup:
        """``base`` with this lever on (``world_size`` for the sharding levers; ``config`` for the levers sized by
        the model); raises SetupError where invalid."""
        values = {k: (world_size if v == "N" else v(base, config) if callable(v) else v) for k, v in self.changes}
        return base.with_(**values)


def _adapter_precision(base: Setup, config: TransformerConfig | None) -> str:
    """The precision a fine-tuning lever keeps: the base's when memlab models that fine-tune with it, else bf16 (a
    master-weight policy would copy peft's fp32 adapters again, and a frozen base under one is not modelled:
    :meth:`Setup._check_finetune`)."""
    return base.precision if base.precision in ("fp32", "bf16", "amp-bf16") else "bf16"


def _half_the_blocks(base: Setup, config: TransformerConfig | None) -> int:
    """The bottom half of the model's blocks (at least one)."""
    if config is None:
        raise SetupError("the frozen-layers lever needs the model config (its number of blocks)")
    return max(1, config.n_layers // 2)


_FULL_ONLY = (("finetune", ("full",)), ("recompute", ("none", "full")), ("zero_stage", (0,)), ("world_size", (1,)),
              ("tp", (1,)))
"""What memlab's fine-tuning model needs of the base (one device; checkpointing as transformers does it, or none;
any accumulation: :mod:`memlab.predict.coverage`), for the PEFT levers."""

LEVERS: tuple[Lever, ...] = (
    Lever("selective recompute", (("recompute", "selective"),),
          "recomputes the attention core in backward (Korthikanti et al. 2022: a few per cent of the FLOPs)"),
    Lever("full recompute", (("recompute", "full"),), "one more forward per step (hardware FLOPs below)"),
    Lever("fused attention kernel (flash)", (("attention", "flash"),),
          "none in memory; needs a GPU kernel that supports the model (FlashAttention / SDPA flash)"),
    Lever("mixed precision (bf16 weights, fp32 master)", (("precision", "mixed-bf16"),),
          "numerics: bf16 compute; states stay 16 B/param with the fp32 master"),
    Lever("fused optimizer", (("optimizer_impl", "fused"),), "none (one kernel per step; CUDA)"),
    Lever("chunked loss", (("loss", "chunked"),), "the LM head runs twice (forward and recomputed in backward): "
          "+2 t V h FLOPs"),
    Lever("fused linear + cross-entropy (Liger-style)", (("loss", "fused"),),
          "a kernel (liger-kernel) or memlab.model.loss's reference; no extra FLOPs"),
    Lever("logits_to_keep=1", (("logits_to_keep", 1),),
          "changes the objective: the loss reads the last position only (RL / classification-style fine-tunes)"),
    Lever("activation offload (save_on_cpu, pinned)", (("offload_activations", True),),
          "host memory (below) and a host<->device copy of every saved tensor per step"),
    Lever("bf16 weights and optimizer states (no fp32 master)", (("precision", "bf16"),),
          "numerics: bf16 updates lose small steps (no fp32 master copy): 8 B/param with AdamW"),
    Lever("ZeRO-3 / FSDP over N ranks", (("zero_stage", 3), ("world_size", "N")),
          "N devices; all-gathers of parameters per step (memlab.predict.parallel.communication); the gathered blocks "
          "count only with Overheads(gathered_layers=...) / --gathered-layers"),
    Lever(f"LoRA r={LORA_DEFAULT_RANK} on {', '.join(LORA_DEFAULT_TARGETS)} (peft's defaults)",
          (("finetune", "lora"), ("precision", _adapter_precision)),
          "trains only the adapters (Hu et al. 2021): a rank-r update of the adapted projections, not every weight "
          "(the result may trail a full fine-tune); backward skips the frozen weights' gradient GEMMs (fewer FLOPs, "
          "not counted below); the adapters are fp32 (peft's autocast_adapter_dtype)",
          needs=_FULL_ONLY),
    Lever("QLoRA (4-bit NF4 base under LoRA adapters)", (("finetune", "qlora"), ("precision", "bf16")),
          "4-bit base (Dettmers et al. 2023): every forward and backward dequantises each weight to bf16 (extra "
          "compute, one dequantised copy alive at a time), the base carries NF4's quantisation error, and "
          "bitsandbytes' fast 4-bit kernels are CUDA's (its CPU path runs, slowly); trains only the adapters, as LoRA",
          needs=(("finetune", ("full", "lora")), *_FULL_ONLY[1:])),
    Lever("frozen bottom half of the blocks",
          (("finetune", "frozen"), ("frozen_layers", _half_the_blocks), ("precision", _adapter_precision)),
          "the embeddings and the bottom half of the blocks do not learn (requires_grad False), the top half and "
          "the head do: no gradients or optimizer states for the frozen half; backward stops at the lowest trained "
          "block",
          needs=_FULL_ONLY),
    Lever("8-bit AdamW (bitsandbytes AdamW8bit)", (("optimizer", "adam-8bit"),),
          "moments quantised blockwise (Dettmers et al. 2022): 2 B/param + 8 B per 256 (tensors under 4,096 "
          "elements stay fp32) instead of two moments in the state dtype; "
          "a for-loop step (no foreach/fused); a small numerical difference from fp32 moments",
          needs=(("optimizer", ("adamw", "adam")),)),
)
"""The levers :func:`levers` ranks, as data: adding one is one entry."""


@dataclass(frozen=True)
class LeverResult:
    """One lever applied to a setup: its predicted tensor peak (bytes, phase) and whether it fits (decided on
    device-used, ``device_bytes``, with ``margin_bytes`` = capacity - device_bytes), beside the baseline's;
    ``extra_flops`` (hardware FLOPs per step beyond the baseline's) and ``host_bytes`` are what it costs."""

    name: str
    changes: dict[str, Any]
    peak_bytes: int
    peak_phase: str
    fits: bool
    saved_bytes: int
    extra_flops: float
    host_bytes: int
    cost: str
    device_bytes: int = 0
    margin_bytes: int = 0
    device_low_bytes: int = 0
    """device-used's low end (no allocator reserve, the context's low end): above the capacity, it does not fit."""

    @property
    def may_fit(self) -> bool:
        """Whether device-used's low end fits: True where :attr:`fits` is, and where the allocator's reserve
        decides."""
        return self.device_low_bytes <= self.device_bytes + self.margin_bytes  # the capacity

    def word(self) -> str:
        """``fits`` (for certain), ``reserve decides`` (only the low end fits) or ``does not fit``."""
        return "fits" if self.fits else "reserve decides" if self.may_fit else "does not fit"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields and :meth:`word`."""
        return {**asdict(self), "word": self.word()}


def levers(config: TransformerConfig, setup: Setup, gpu: Any, *, world_size: int = 8,
           overheads: Overheads | None = None, table: tuple[Lever, ...] = LEVERS,
           device: DeviceOverheads | None = None) -> list[LeverResult]:
    """Each lever of ``table`` applied alone to ``setup``, ranked by the device-used peak it gives (lowest first:
    the **peak** of :mod:`memlab.predict.memory.phases`, never the sum, plus the device's terms as :func:`fits`
    counts them, ``device`` overriding), with whether it then fits ``gpu`` and its cost. Levers
    that change nothing (already on), that do not apply (:attr:`Lever.needs`) or that this setup or model cannot
    take (a SetupError or ConfigError: e.g. a fused optimizer for Adafactor, frozen embeddings tied to the head)
    are left out. ``world_size``: the ranks the ZeRO lever shards over."""
    from memlab.predict.compute.flops import megatron_iteration_flops

    if not isinstance(config, TransformerConfig):
        raise SetupError("levers need a model config: with a bare parameter count most levers change nothing")
    if not isinstance(setup, Setup) or setup.mode != "train":
        raise SetupError("levers rank ways to fit a training step: pass a Setup with mode='train'")
    check_int("world_size", world_size, hi=LIMITS["ranks"].max, why=LIMITS["ranks"].why, err=SetupError)
    key, _, cap = card_capacity(gpu)
    ov = on_device(gpu, device_overheads(None, overheads, device))
    base = estimate(config, setup, overheads=overheads)

    def flops(s: Setup) -> float:
        return float(megatron_iteration_flops(config, s.batch, s.seq, s.recompute))

    base_flops = flops(setup)
    head = 2 * setup.batch * setup.seq * config.vocab_size * config.d_model
    out = []
    for lever in table:
        if not lever.applies(setup):
            continue
        try:
            changed = lever.setup(setup, world_size, config)
            if changed == setup:
                continue
            bd = estimate(config, changed, overheads=overheads)  # a model the lever cannot take: ConfigError
        except MemlabError:
            continue
        extra = flops(changed) - base_flops + (head if changed.loss == "chunked" and setup.loss != "chunked" else 0)
        name = lever.name.replace(" N ", f" {world_size} ")
        p = device_peaks_of(bd, key, cap, ov)
        out.append(LeverResult(name, {k: getattr(changed, k) for k, _ in lever.changes}, bd.peak_bytes,
                               bd.peak_phase, p.fits, base.peak_bytes - bd.peak_bytes, extra, bd.host_bytes,
                               lever.cost, p.device_high_bytes, p.margin_bytes, p.device_low_bytes))
    return sorted(out, key=lambda r: (r.device_bytes, r.peak_bytes, r.name))


def plan_to_fit(config: TransformerConfig, setup: Setup, gpu: Any, *, world_size: int = 8,
                overheads: Overheads | None = None, table: tuple[Lever, ...] = LEVERS,
                exclude: tuple[str, ...] = ("logits_to_keep=1",),
                device: DeviceOverheads | None = None) -> tuple[list[str], Setup, int]:
    """What to switch on to fit: levers added one at a time, each time the one giving the lowest device-used peak
    (:func:`levers`), until it fits ``gpu`` (as :func:`fits` decides) or no lever lowers it. Returns (lever names
    in order, the setup, its tensor peak bytes; :func:`fits` on that setup gives its device-used peak and margin).
    Levers named in ``exclude`` (by default the one that changes the objective) are not chosen."""
    key, _, cap = card_capacity(gpu)
    ov = on_device(gpu, device_overheads(None, overheads, device))
    chosen: list[str] = []
    bd = estimate(config, setup, overheads=overheads)
    current, peak, used = setup, bd.peak_bytes, device_peaks_of(bd, key, cap, ov).device_high_bytes
    pool = tuple(lv for lv in table if lv.name not in exclude)
    while used > cap:
        ranked = [r for r in levers(config, current, gpu, world_size=world_size, overheads=overheads, table=pool,
                                    device=device) if r.name not in chosen and r.device_bytes < used]
        if not ranked:
            break
        best = ranked[0]
        chosen.append(best.name)
        current, peak, used = current.with_(**best.changes), best.peak_bytes, best.device_bytes  # resolved values
    return chosen, current, peak
