"""One rank's predicted memory, as a named breakdown: the single-rank memory model, term by term.

:func:`rank_breakdown` returns a :class:`MemoryBreakdown`: bytes on ONE device for parameters, gradients,
optimizer states, activations, KV cache and named overheads, and the bytes held at each phase of a step. Where each
byte comes from:

- model states per parameter: the :class:`memlab.predict.spec.precision.PrecisionPolicy` (weights, gradients, fp32
  master copy, fp32 accumulation buffer) plus the optimizer's moments. Like the ZeRO paper (Rajbhandari et al. 2019,
  Sec. 3.1, "K = 12" for mixed-precision Adam), the fp32 master copy and the fp32 accumulation buffer are counted as
  **optimizer** state; ``optimizer_detail`` splits them out again.
- sharding: ZeRO stages 0-3 / FSDP over ``setup.world_size`` data-parallel ranks
  (:func:`~memlab.predict.memory.sharding.zero_divisors`), after Megatron tensor parallelism over ``setup.tp`` ranks
  (:func:`~memlab.predict.memory.sharding.tp_shard_shape`).
- activations: :func:`memlab.predict.memory.activations.activation_bytes` (Korthikanti et al. 2022, generalised).
- inference: weights at ``setup.inference_weights`` (with quantisation scales), the KV cache of ``setup.kv_cache``,
  the token ids and the largest moment of generate()'s prefill and decode (:func:`inference_terms`).
- overheads: named terms (:class:`Overheads`), never folded into other components.
- bytes outside torch's allocator, in no component or phase: ``host_bytes`` (offloaded to the host) and
  ``paged_bytes`` (a paged optimizer's states in CUDA managed memory,
  :func:`memlab.predict.memory.plan.paged_bytes_of`).
- phases: the bytes held at each phase of the first and the steady step and their peak
  (:mod:`memlab.predict.memory.phases`): what must fit. ``total_bytes`` stays the sum of the components.

What is modelled, refused or named as left out is not decided here: :mod:`memlab.predict.coverage` says it, and
:func:`memlab.predict.estimate.estimate` asks it before it calls :func:`rank_breakdown`. Units: bytes. GiB = 2**30
bytes, GB = 10**9 bytes. No torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from memlab.errors import SetupError
from memlab.predict.memory.activations import bytes_by_category, split_by_checkpoint, term_rows
from memlab.predict.memory.finetune import largest_matrix_elements
from memlab.predict.memory.inference import (
    decode_transient_bytes,
    kv_cache_bytes,
    prefill_transient_bytes,
    prompt_tokens,
)
from memlab.predict.memory.phases import (
    PhaseRow,
    find_phase,
    inference_phases,
    larger,
    predicted_row,
    step_inputs_with,
    training_phases,
)
from memlab.predict.memory.plan import Plan, plan, rest_of
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup
from memlab.predict.spec.validate import LIMITS, StrictInit, check_fields, check_int, show
from memlab.units import GB, GiB


# -- results ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Overheads(StrictInit):
    """Named memory terms outside model states and activations; each appears in ``MemoryBreakdown.overhead``.

    Defaults are 0 because their size depends on the machine, driver and kernels; each estimate says so in its
    assumptions and how to measure the term. ``gathered_layers`` counts the transformer blocks whose full
    parameters ZeRO-3 holds gathered at once, for setups FSDP2's model does not cover (tensor parallelism): under
    FSDP2 (ZeRO-2/3 over > 1 rank) the phases model the gathered units themselves (:mod:`memlab.predict.memory.fsdp`)
    and 0 reports what the loss moment holds gathered; a value > 0 overrides that component (not the phases).
    """

    _error = SetupError  # what StrictInit raises for an unknown or missing field (a class attribute, not a field)

    cuda_context_bytes: int = field(default=0, metadata=LIMITS["overhead_bytes"].meta())
    """CUDA context, kernels and library handles (outside the caching allocator)."""
    workspace_bytes: int = field(default=0, metadata=LIMITS["overhead_bytes"].meta())
    """cuBLAS / attention workspaces."""
    fragmentation_fraction: float = field(default=0.0, metadata={"max": 1.0, "max_open": True,
                                                                  "why": "a fraction of the managed bytes, below 1"})
    """Allocator margin as a fraction of all allocator-managed bytes (everything but the CUDA context)."""
    gathered_layers: int = field(default=0, metadata={"max": LIMITS["layers"].max, "why": "at most the model's blocks"})
    """Blocks held gathered under ZeRO-3 / FSDP FULL_SHARD (0 = not counted)."""

    def __post_init__(self) -> None:
        check_fields(self, SetupError)  # types and ranges from the annotations (memlab.predict.spec.validate)


_NO_OVERHEADS = Overheads()
"""The default (all terms 0): frozen, so one instance serves every call instead of one validated per estimate."""


@dataclass(frozen=True)
class NamedTerm:
    """A term the estimate leaves out, named with its size: at most ``bytes`` on the phases ``phases`` (their base
    names: ``forward`` also covers ``forward (accumulating)``), with ``sign`` +1 where the real step may hold up to
    that much MORE than the estimate and -1 where it may hold up to that much LESS. ``name`` is the sentence a
    reader sees; ``key`` the row of :data:`memlab.predict.coverage.TABLE` it comes from."""

    name: str
    bytes: int
    phases: tuple[str, ...]
    sign: int
    exact: bool = False
    """Match ``phases`` by the whole name: ``backward`` then leaves ``backward (accumulating)`` out."""
    key: str = ""

    def applies(self, phase: str) -> bool:
        """True when this term can change ``phase`` (``forward``, ``backward (accumulating)``, ...)."""
        return phase in self.phases or (not self.exact and phase.split(" (")[0] in self.phases)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the name, its table row, bytes, sign and phases."""
        return {"name": self.name, "key": self.key, "bytes": self.bytes, "sign": "+" if self.sign > 0 else "-",
                "phases": list(self.phases)}


@dataclass(frozen=True)
class PeakRange:
    """Where the real peak of a step lies, given the terms an estimate names
    (:func:`memlab.predict.coverage.peak_range`), in bytes: at least ``low`` and at most ``high``; ``peak`` is the
    estimate's own. ``terms`` are the named terms behind the range (empty: the estimate claims its peak, and
    ``low == peak == high``)."""

    peak: int
    low: int
    high: int
    terms: tuple[NamedTerm, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``: the three bounds and each term's name, bytes, sign and phases."""
        return {"peak": self.peak, "low": self.low, "high": self.high,
                "terms": [{"name": t.name, "bytes": t.bytes, "sign": "+" if t.sign > 0 else "-",
                           "phases": list(t.phases)} for t in self.terms]}


@dataclass(frozen=True)
class RankBreakdown:
    """One rank of a step, or ranks that hold the same bytes (``rank``: which), in bytes: its model states, its
    saved activations (and KV cache), everything else it holds (overheads, pipeline buffers, transients) and its
    peak. ``detail``: what its parallelism adds (micro-batches in flight, (token, expert) pairs, ...)."""

    rank: str
    holds: str
    states_bytes: int
    activations_bytes: int
    other_bytes: int
    peak_bytes: int
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a DataFrame row)."""
        return asdict(self)


@dataclass(frozen=True)
class StateParts:
    """Model-state bytes on one rank, split: ``params``, ``grads``, ``optimizer`` (with its ``optimizer_detail``)."""

    params: int
    grads: int
    optimizer: int
    optimizer_detail: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Their sum."""
        return self.params + self.grads + self.optimizer

    def __add__(self, other: StateParts) -> StateParts:
        detail = dict(self.optimizer_detail)
        for k, v in other.optimizer_detail.items():
            detail[k] = detail.get(k, 0) + v
        return StateParts(self.params + other.params, self.grads + other.grads, self.optimizer + other.optimizer,
                          detail)

    @classmethod
    def of(cls, bd: MemoryBreakdown) -> StateParts:
        """The states of a breakdown."""
        return cls(bd.params_bytes, bd.grads_bytes, bd.optimizer_bytes, dict(bd.optimizer_detail))


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted bytes on ONE device, by component; ``total_bytes`` is their sum (overhead = sum of its terms).

    A step never holds all components at once: ``phases`` are the bytes held at each phase of the first and the
    steady step (:mod:`memlab.predict.memory.phases`), ``peak_bytes`` the largest of them (at
    ``peak_step``/``peak_phase``).
    "Will it fit?" is a question about ``peak_bytes``; ``total_bytes`` stays the sum of components.
    """

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    """Moments + fp32 master copy + fp32 accumulation buffer (+ device-resident step counters): ZeRO's K."""
    activations_bytes: int
    kv_cache_bytes: int
    overhead: dict[str, int]
    total_bytes: int
    param_count: int
    mode: str
    activation_detail: dict[str, float]
    optimizer_detail: dict[str, int]
    assumptions: tuple[str, ...]
    config: dict[str, Any] | None
    setup: dict[str, Any]
    phases: tuple[PhaseRow, ...] = ()
    """One :class:`~memlab.predict.memory.phases.PhaseRow` per (step, phase) in step order (steps ``first``, ``steady``;
    inference: ``steady`` prefill, decode): ``peak_bytes`` is the predicted peak inside the phase; for
    ``zero_grad``, what is held after it (``end_bytes`` too)."""
    peak_bytes: int = 0
    """The largest phase: what must fit on the device."""
    peak_phase: str = ""
    peak_step: str = ""
    host_bytes: int = 0
    """Host (pinned) memory activation offload takes (``Setup.offload_activations``; 0 without): at least the saved
    activations, plus the matmul weights and the second reference to the log-softmax that save_on_cpu copies too
    (:func:`offload_host_bytes`); with FSDP2's CPU offload (``Setup.fsdp_offload``) also the sharded parameters,
    gradients and optimizer states (:func:`host_states`). Not part of the device's total or peak."""
    paged_bytes: int = 0
    """Paged optimizer states (CUDA managed memory, outside torch's allocator): the states bitsandbytes' paged
    optimizers (``Setup.optimizer`` paged-adamw, paged-adam-8bit) allocate with ``cudaMallocManaged`` for tensors of
    at least 1e5 elements (:func:`memlab.predict.memory.states.paged_tensor_bytes`). Not in any component, phase or
    ``peak_bytes``: torch.cuda.memory_allocated/reserved and the caching allocator's out-of-memory check do not see
    them. They occupy the device while resident (prefetched for the optimizer step; nvidia-smi counts them) and the
    driver evicts them to host RAM when the allocator needs the room: :attr:`device_peak_bytes`. On a CPU, where
    bitsandbytes does not page, they are plain memory beside the rest."""
    named_terms: tuple[NamedTerm, ...] = ()
    """What the estimate leaves out, each with its size, phases and sign (:func:`memlab.predict.coverage.named_terms`):
    listed once, when the estimate is made."""
    peak_range: PeakRange | None = None
    """Where the real peak lies given :attr:`named_terms` (:func:`memlab.predict.coverage.peak_range`); None for a
    breakdown of one rank's parts (:func:`rank_breakdown` alone)."""
    ranks: tuple[RankBreakdown, ...] = ()
    """One row per rank, or per group of ranks holding the same bytes: one row on one device or under pure data
    parallelism; one per pipeline rank under pp; the worst expert-parallel rank under ep. The components above are
    the worst rank's."""
    layout: dict[str, Any] = field(default_factory=dict)
    """What the parallel layout adds beside the ranks (pipeline bubble, all-to-all volume); empty on one device."""

    @property
    def peak_gib(self) -> float:
        """Peak in GiB (2**30 bytes)."""
        return self.peak_bytes / GiB

    def phase_bytes(self, phase: str, step: str = "steady") -> int:
        """Predicted bytes of one phase of one step: its ``peak_bytes``
        (:func:`~memlab.predict.memory.phases.find_phase`; zero_grad: held after it)."""
        return find_phase(self.phases, phase, step).peak_bytes

    @property
    def device_peak_bytes(self) -> int:
        """What the device holds at the peak with the paged optimizer states resident: ``peak_bytes + paged_bytes``
        (what nvidia-smi shows when both fit; the allocator alone decides an out-of-memory error: ``peak_bytes``)."""
        return self.peak_bytes + self.paged_bytes

    @property
    def overhead_bytes(self) -> int:
        """Sum of the named overhead terms."""
        return sum(self.overhead.values())

    def model_state_bytes(self, *, step_counters: bool = True) -> int:
        """Parameters + gradients + optimizer state, bytes; ``step_counters=False`` leaves out Adam's per-tensor
        ``step`` scalars (a few bytes per tensor, not per parameter), as bytes-per-parameter rules do."""
        counters = 0 if step_counters else self.optimizer_detail.get("step_counters", 0)
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes - counters

    @property
    def total_gib(self) -> float:
        """Total in GiB (2**30 bytes)."""
        return self.total_bytes / GiB

    @property
    def total_gb(self) -> float:
        """Total in GB (10**9 bytes)."""
        return self.total_bytes / GB

    def components(self) -> dict[str, int]:
        """The main components in display order: params, grads, optimizer, activations, kv_cache, overhead."""
        return {
            "params": self.params_bytes, "grads": self.grads_bytes, "optimizer": self.optimizer_bytes,
            "activations": self.activations_bytes, "kv_cache": self.kv_cache_bytes, "overhead": self.overhead_bytes,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready): every field plus ``per_device`` = components, total (their sum) and peak."""
        d = asdict(self)
        d["assumptions"] = list(self.assumptions)
        d["phases"] = [r.to_dict() for r in self.phases]
        d["named_terms"] = [term.to_dict() for term in self.named_terms]
        d["peak_range"] = None if self.peak_range is None else self.peak_range.to_dict()
        d["ranks"] = [r.to_dict() for r in self.ranks]
        d["per_device"] = {**self.components(), "total": self.total_bytes, "peak": self.peak_bytes}
        return d

    def to_frame(self) -> Any:
        """pandas DataFrame, one row per main component: bytes, GiB, GB and share of the total."""
        import pandas as pd

        total = self.total_bytes or 1
        rows = [{"component": k, "bytes": v, "GiB": v / GiB, "GB": v / GB, "share": v / total}
                for k, v in self.components().items()]
        return pd.DataFrame(rows)


# -- the estimator ----------------------------------------------------------------------------------------------
def _check_model(model: TransformerConfig | int, setup: Any, seq_max: Any) -> None:
    if isinstance(model, TransformerConfig):
        model.check_seq(seq_max)
        return
    if not isinstance(model, int) or isinstance(model, bool) or model <= 0:
        raise SetupError(f"expected a TransformerConfig or a positive parameter count (int), got {show(model)}")
    check_int("parameter count", model, hi=LIMITS["params"].max, why=LIMITS["params"].why, err=SetupError)


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` computes for one setup (batch and seq scalars, or numpy arrays in a sweep), in bytes."""

    plan: Plan
    """The setup's cached :class:`~memlab.predict.memory.plan.Plan`: what batch and seq do not change."""
    activations: Any
    """Saved activations (training) or the largest transient of a forward (inference)."""
    kv: Any
    """KV cache (inference; 0 in training)."""
    overheads: dict[str, Any]
    """The named overhead terms."""
    activation_detail: dict[str, Any]
    """The activations by category (training) or the transients (inference)."""
    phases: list
    """``(step, phase, bytes)`` per phase of the step, in step order."""


def evaluate(model: TransformerConfig | int, setup: Any, ov: Overheads, device_type: str,
             step_on_device: bool | None) -> Evaluation:
    """Shared core of :func:`rank_breakdown` (scalars) and :func:`memlab.predict.estimate.sweep_totals` (numpy
    batch/seq): the setup's cached plan and the terms that batch and seq change."""
    if device_type not in ("cuda", "cpu"):
        raise SetupError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    _check_model(model, setup, setup.seq if isinstance(setup.seq, int) else np.max(setup.seq))
    if step_on_device is not None and not isinstance(step_on_device, bool):
        raise SetupError(f"step_on_device must be True, False or None, got {show(step_on_device)}")
    on_device = device_type == "cpu" if step_on_device is None else step_on_device
    p = plan(model, rest_of(setup), device_type, on_device)  # checks tp
    kv, act_detail, act_terms = 0, {}, None
    is_cfg = isinstance(model, TransformerConfig)
    if is_cfg:
        if setup.mode == "train":  # listed once: the phases reuse them (memlab.predict.memory.phases.step_inputs_with)
            act_terms = term_rows(model, setup, device_type=device_type)
            act_detail = bytes_by_category(act_terms, setup.tp, setup.sp)
        else:
            inf = inference_terms(model, setup)
            act_detail, kv = inf.prefill, inf.kv
    if setup.mode == "train":
        acts = sum(act_detail.values()) if act_detail else 0
    else:
        acts = functools.reduce(larger, act_detail.values()) if act_detail else 0
    off = host_states(setup)  # FSDP2 CPU offload: the sharded states live on the host
    managed = (0 if off else p.states_total) + acts + kv
    gathered = ov.gathered_layers * p.gather_bytes_per_layer if p.gather_bytes_per_layer else 0
    fsdp = p.step.get("fsdp") if p.fsdp is not None else None
    if fsdp is not None and not ov.gathered_layers:  # FSDP2 modelled per phase: the component is what the loss sees
        gathered = fsdp["forward"]
    buffers = model_buffer_bytes(model) if is_cfg else 0
    terms = {"cuda_context": ov.cuda_context_bytes, "workspace": ov.workspace_bytes, "zero3_gathered_params": gathered,
             "model_buffers": buffers,
             "fragmentation": ov.fragmentation_fraction * (managed + ov.workspace_bytes + gathered + buffers)}
    if setup.finetune == "qlora" and is_cfg:  # one weight dequantised to bf16 at a time
    # (memlab.predict.memory.finetune)
        terms["qlora_dequantised_weight"] = 2 * largest_matrix_elements(model)  # type: ignore[arg-type]
    overhead = sum(terms.values())
    # Under FSDP2 the phases carry the gathered bytes themselves (memlab.predict.memory.fsdp.moments): not added twice
    phase_overhead = overhead - gathered if fsdp is not None else overhead
    states = p.states
    if setup.mode != "train":
        if is_cfg:
            phases = inference_phases(states["params"], acts + inf.prefill_held, inf.decode_held + kv,
                                      overhead)
        else:
            phases = inference_phases(states["params"], 0, 0, overhead)
    else:
        x = step_inputs_with(p.step, model if is_cfg else None, setup, device_type=device_type, terms=act_terms)
        if off:  # the device holds none of the shards, and the optimizer steps on the host
            x = replace(x, optimizer_temporary_bytes=0, optimizer_before_step_bytes=0,
                        fsdp={**x.fsdp, "root_grads_shard": 0, "embed_grads_shard": 0})
            states = {"params": 0, "grads": 0, "optimizer": 0}
        phases = training_phases(states["params"], states["grads"], states["optimizer"], acts, x,
                                 grad_accum_steps=setup.grad_accum_steps, set_to_none=setup.zero_grad_to_none,
                                 overhead=phase_overhead)
    return Evaluation(p, acts, kv, terms, act_detail, phases)


@dataclass(frozen=True)
class InferenceTerms:
    """What a generate()-style prefill and decode hold beyond the weights, bytes per device (arrays in a sweep)."""

    kv: Any
    """The KV cache at its largest: ``seq`` tokens (the decode step's context)."""
    prefill: dict[str, Any]
    """The prefill's moments (:func:`~memlab.predict.memory.inference.prefill_transient_bytes`)."""
    prefill_held: Any
    """Held through the prefill besides its largest moment: the token ids and the cache the prefill holds (a static
    cache's ``seq`` tokens, or the prompt's in a dynamic cache)."""
    decode_held: Any
    """Held through the decode step besides the cache: the token ids and its largest moment
    (:func:`~memlab.predict.memory.inference.decode_transient_bytes`)."""


def inference_terms(model: TransformerConfig, setup: Any) -> InferenceTerms:
    """The inference terms of ``setup``: a prefill of ``seq - 1`` tokens and the decode step to ``seq``
    (:func:`~memlab.predict.memory.inference.prompt_tokens`), the logits of ``setup.logits_to_keep`` positions and
    the ``setup.kv_cache`` cache; the token ids are int64 (b x seq x 8 bytes, as the runner's and generate()'s)."""
    compute = 4 if setup.inference_weights == "fp32" else 2
    b, s, tp = setup.batch, setup.seq, setup.tp
    prompt = prompt_tokens(s)
    kv = kv_cache_bytes(model, b, s, setup.kv_cache_dtype, tp)
    unwritten = kv_cache_bytes(model, 1, 1, setup.kv_cache_dtype, tp) / model.n_layers if setup.kv_cache == "dynamic" \
        else 0
    prefill = prefill_transient_bytes(model, b, prompt, compute, tp, setup.fused_attention, setup.logits_to_keep,
                                      unwritten)
    decode = decode_transient_bytes(model, b, s, compute, tp, setup.fused_attention, setup.kv_cache_dtype,
                                    setup.kv_cache)
    ids = 8 * b * s
    cache_in_prefill = kv if setup.kv_cache == "static" else kv_cache_bytes(model, b, prompt, setup.kv_cache_dtype,
                                                                            tp)
    return InferenceTerms(kv, prefill, ids + cache_in_prefill, ids + functools.reduce(larger, decode.values()))


def model_buffer_bytes(config: TransformerConfig) -> int:
    """Bytes of the model's buffers: the reference GPT's rotary cos and sin tables, fp32 ``max_seq`` x
    ``head_dim / 2`` each (``memlab.model.gpt.Rotary``), so ``4 * max_seq * head_dim`` bytes; for a partial rotary
    (``impl.rotary_fraction``: GPT-J's one fp32 ``(n_positions, rotary_dim)`` sin/cos table,
    [hf-transformers: modeling_gptj.py create_sinusoidal_positions], kept in fp32 whatever the model dtype, as
    measured by memlab.studies.hf_draws) the rotated dimensions only; 0 for learned or no positions and for
    implementations that build the tables per forward (``impl.rotary_tables_per_forward``: Hugging Face's rotary
    keeps only an ``inv_freq`` vector of ``head_dim / 2`` floats, not counted)."""
    if config.positions != "rotary" or config.impl.rotary_tables_per_forward:
        return 0
    return 4 * config.max_seq * round(config.head_dim * config.impl.rotary_fraction)


def overheads_arg(overheads: object) -> Overheads:
    if overheads is None:
        return _NO_OVERHEADS
    if not isinstance(overheads, Overheads):
        raise SetupError(f"overheads must be a memlab.predict.estimate.Overheads or None, got "
                         f"{type(overheads).__name__}: pass Overheads(cuda_context_bytes=...)")
    return overheads


def fields_of(obj: Any) -> dict[str, Any]:
    """Shallow field dict of a frozen dataclass (faster than dataclasses.asdict)."""
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def _config_fields(cached: dict[str, Any]) -> dict[str, Any]:
    """A fresh copy (and a fresh ``impl`` dict) of a plan's :attr:`~memlab.predict.memory.plan.Plan.config_fields`: the
    config's fields with its ``impl`` as ``impl.to_dict()``, listed once per plan (configs are frozen)."""
    out = dict(cached)
    out["impl"] = dict(out["impl"])
    return out


def rank_breakdown(config_or_params: TransformerConfig | int, setup: Setup, *, overheads: Overheads | None = None,
                   device_type: str = "cuda", step_on_device: bool | None = None) -> MemoryBreakdown:
    """One rank's predicted memory under ``setup`` (training or inference, by ``setup.mode``), the setup taken as
    modelled: :func:`memlab.predict.estimate.estimate` asks :mod:`memlab.predict.coverage` first, then calls this and
    adds the assumptions, the named terms and the ranks. ``assumptions`` here are the notes of the model-state count
    only.

    ``config_or_params`` is a :class:`TransformerConfig` or a bare parameter count (model states only).
    ``device_type`` ("cuda" or "cpu") selects the device-dependent activation widths of
    :func:`memlab.predict.memory.activations.activation_bytes`. ``step_on_device``: whether the optimizer's per-tensor
    step counters live on the device; None means "only on a CPU run" (torch hosts them on the CPU unless the
    optimizer is fused or capturable: pass True for those).
    """
    if not isinstance(setup, Setup):
        raise SetupError(f"setup must be a memlab.predict.spec.setup.Setup, got {type(setup).__name__}")
    ov = overheads_arg(overheads)
    e = evaluate(config_or_params, setup, ov, device_type, step_on_device)
    p, acts, kv, terms, act_detail, phases = e.plan, e.activations, e.kv, e.overheads, e.activation_detail, e.phases
    overhead = {k: math.ceil(v) for k, v in terms.items()}
    acts_i, kv_i = math.ceil(acts), math.ceil(kv)
    off = host_states(setup)
    total = (0 if off else p.states_total) + acts_i + kv_i + sum(overhead.values())
    rows = [predicted_row(st, ph, math.ceil(v)) for st, ph, v in phases]
    # The peak row: the largest; ties go to the first step and, within a step, to the later phase (backward starts
    # with what forward ends with): the last row of the largest (bytes, step == "first").
    top = rows[0]
    for row in rows:
        if row.peak_bytes > top.peak_bytes or (row.peak_bytes == top.peak_bytes
                                               and (row.step == "first" or top.step != "first")):
            top = row
    states = {"params": 0, "grads": 0, "optimizer": 0} if off else p.states
    host = (offload_host_bytes(config_or_params, setup, acts_i) if setup.offload_activations else 0) \
        + (math.ceil(p.states_total) if off else 0)
    return MemoryBreakdown(**{
        "params_bytes": states["params"], "grads_bytes": states["grads"], "optimizer_bytes": states["optimizer"],
        "activations_bytes": acts_i, "kv_cache_bytes": kv_i, "overhead": overhead, "total_bytes": total,
        "param_count": p.param_count, "mode": setup.mode,
        "activation_detail": {k: float(v) for k, v in act_detail.items()}, "optimizer_detail": dict(p.opt_detail),
        "assumptions": p.notes,
        "config": _config_fields(p.config_fields) if p.config_fields is not None else None, "setup": fields_of(setup),
        "phases": tuple(rows), "peak_bytes": top.peak_bytes, "peak_phase": top.phase, "peak_step": top.step,
        "host_bytes": host, "paged_bytes": p.paged_bytes,
    })


def host_states(setup: Any) -> bool:
    """True when FSDP2's CPUOffloadPolicy (``Setup.fsdp_offload``) keeps the sharded parameters, gradients and
    optimizer states on the host: the estimate's params/grads/optimizer components are then 0 on the device and
    their bytes are in ``host_bytes``; the gathered units, all-gather buffers and unsharded gradients stay on the
    device (the FSDP2 moments, :func:`memlab.predict.memory.fsdp.moments`)."""
    return setup.fsdp_offload and setup.mode == "train"


def offload_host_bytes(model: TransformerConfig | int, setup: Setup, activations: int) -> int:
    """Host bytes ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` takes for one micro-batch, at least.

    save_on_cpu copies every tensor autograd saves, once per op that saves it [pytorch-autograd]: the activations
    (each storage once here), the matmul weights (parameters; under autocast their 16-bit copies, already in the
    activations, are what matmuls save) and, for the plain loss, the fp32 log-softmax twice (log_softmax's backward
    and nll_loss's both save it). Other tensors saved by two ops (views, a GELU input) are copied twice too and
    are not counted here, and torch's pinned-memory allocator may round each block up: a lower bound (within
    15 % of the traced copies on the reference GPT, tests/predict/memory/test_loss_offload.py)."""
    if not isinstance(model, TransformerConfig):
        return activations
    weights = 0
    if not setup.policy.autocast:
        head = model.vocab_size * model.d_model
        # full recompute: the checkpointed blocks' matmuls save nothing in forward (the head's weight is saved)
        plain = split_by_checkpoint(model, setup)[0]
        matmul = head if plain is None else plain.matmul_param_count()
        matmul -= head if setup.loss == "fused" else 0
        weights = math.ceil(matmul / setup.tp) * setup.policy.param_bytes
    twice = 4 * setup.batch * setup.seq * model.vocab_size // setup.tp if setup.loss == "plain" else 0
    if setup.loss == "plain" and setup.logits_to_keep:
        twice = 4 * setup.batch * min(setup.logits_to_keep, setup.seq) * model.vocab_size // setup.tp
    return activations + weights + twice
