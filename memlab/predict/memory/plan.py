"""The part of an estimate that depends on neither batch nor seq, computed once per setup and cached.

``estimate()`` is called in loops over batch and seq (fit searches, sweeps, the course's tables); model states,
the optimizer's step constants and the notes of the count do not change along such a loop. :func:`plan` computes
them from the model, the setup's fields other than ``batch``/``seq`` (:func:`rest_of`), the device type and where
the step counters live; its cache (``functools.lru_cache``, bounded) is keyed on those frozen,
hashable values only, and it reads the setup through a view whose ``batch``/``seq`` are None, so nothing it returns
can depend on them (a read would fail). A hit returns the very :class:`Plan` a miss computed: its dicts are shared
and never changed (the estimator copies what it hands out). The assumptions are not made here:
:mod:`memlab.predict.coverage` says them. Units: bytes. No torch.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Any

from memlab.errors import SetupError
from memlab.predict.memory.finetune import (
    adapter_tensors,
    finetune_states,
    frozen_states,
    frozen_trainable,
    largest_adapter_elements,
    lora_layer_elements,
    saved_module_tensors,
)
from memlab.predict.memory.fsdp import FsdpPlan, plan_of
from memlab.predict.memory.inference import INT4_GROUP
from memlab.predict.memory.phases import step_constants
from memlab.predict.memory.sharding import ShapeSummary, shape_summary, tp_shard_shape, zero_divisors
from memlab.predict.memory.states import (
    ADAM_8BIT_BLOCK,
    ADAM_8BIT_MIN_SIZE,
    ADAM_8BIT_QMAP_BYTES,
    PAGED_OPTIMIZERS,
    adam_moment_bytes,
    optimizer_state_dtype_bytes,
    paged_optimizer_bytes,
    sgd_moment_bytes,
    step_counter_bytes,
)
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.precision import DTYPE_BYTES
from memlab.predict.spec.setup import Setup, SetupView

REST_FIELDS = tuple(name for name in Setup.__dataclass_fields__ if name not in ("batch", "seq"))
"""The :class:`~memlab.predict.spec.setup.Setup` fields a plan depends on: all but ``batch`` and ``seq``, in field
order."""
rest_of = operator.attrgetter(*REST_FIELDS)
"""``rest_of(setup)``: the values of :data:`REST_FIELDS` as a tuple (a view's overrides included): the cache key."""
_BASE = Setup()


@dataclass(frozen=True)
class Plan:
    """What an estimate of one (model, setup without batch/seq, overheads, device) needs that batch and seq do not
    change. Shared between calls: read it, never change its dicts."""

    summ: ShapeSummary | None
    """The model's :func:`~memlab.predict.memory.sharding.shape_summary` on one tp rank (None for a bare count)."""
    states: dict[str, int]
    """``params``, ``grads``, ``optimizer`` bytes per device after TP and ZeRO."""
    states_total: int
    """Their sum."""
    opt_detail: dict[str, int]
    """The optimizer bytes split into moments, master, grad_accum, step_counters (empty for inference)."""
    gather_bytes_per_layer: int
    """Bytes one gathered block adds under ZeRO-3/FSDP (0 where no block is gathered): times
    ``Overheads.gathered_layers``."""
    notes: tuple[str, ...]
    """The notes of the model-state count (a bare count's, quantised weights', host-side step counters')."""
    param_count: int
    step: dict[str, Any]
    """Training: :func:`~memlab.predict.memory.phases.step_constants` of the setup; inference: empty."""
    config_fields: dict[str, Any] | None
    """The config's fields with ``impl`` as ``impl.to_dict()`` (what ``MemoryBreakdown.config`` copies); None for a
    bare count."""
    fsdp: FsdpPlan | None = None
    """The FSDP2 plan when FSDP2 applies (:func:`memlab.predict.memory.fsdp.plan_of`), else None."""
    paged_bytes: int = 0
    """A paged optimizer's states in CUDA managed memory (:func:`paged_bytes_of`): in no state above, no phase."""


@functools.lru_cache(maxsize=1024)
def plan(model: TransformerConfig | int, rest: tuple, device_type: str, step_on_device: bool) -> Plan:
    """The :class:`Plan` of ``model`` (checked by the caller) under the setup whose :data:`REST_FIELDS` values are
    ``rest``, on ``device_type``;
    ``step_on_device``: whether the optimizer's step counters count (resolved). Cached: up to 1024 plans."""
    setup = SetupView(_BASE, batch=None, seq=None, **dict(zip(REST_FIELDS, rest, strict=True)))
    summ = shape_summary(model, setup.tp) if isinstance(model, TransformerConfig) else None  # checks tp
    fsdp = plan_of(model, setup) if summ is not None else None  # type: ignore[arg-type]
    states, opt_detail, notes = _states(model, setup, step_on_device, summ, fsdp)
    per_layer = 0
    if summ is not None and setup.mode == "train" and setup.zero_stage == 3 \
            and setup.world_size > 1:  # FSDP/ZeRO-3 all-gathers a block's full (TP-sharded) parameters
        per_layer = summ.layer_elements * (fsdp.gather_bytes if fsdp is not None else setup.policy.param_bytes)
    step: dict[str, Any] = {}
    if setup.mode == "train":
        before = opt_detail.get("master", 0) + opt_detail.get("grad_accum", 0)
        if summ is not None and setup.finetune == "frozen":  # only the blocks above the frozen ones step
            trainable = frozen_trainable(model, setup)  # type: ignore[arg-type]
            step = step_constants(model, setup, device_type=device_type,  # type: ignore[arg-type]
                                  elements=sum(trainable), largest=max(trainable),
                                  layer_elements=summ.layer_elements, before_step=before, loop_peak=3 * max(trainable))
        elif summ is not None and setup.finetune != "full":  # only the adapters step (memlab.predict.memory.finetune)
            layer = lora_layer_elements(model, setup)  # type: ignore[arg-type]
            largest = largest_adapter_elements(model, setup)  # type: ignore[arg-type]
            step = step_constants(model, setup, device_type=device_type,  # type: ignore[arg-type]
                                  elements=layer * model.n_layers, largest=largest,  # type: ignore[union-attr]
                                  layer_elements=layer, before_step=before, loop_peak=3 * largest)
        elif summ is not None:
            dp = zero_divisors(3 if fsdp is not None else setup.zero_stage, setup.world_size)[0]
            step = step_constants(model, setup, device_type=device_type,  # type: ignore[arg-type]
                                  elements=fsdp.shard_elements if fsdp is not None else math.ceil(summ.elements / dp),
                                  largest=math.ceil(summ.largest_elements / dp),
                                  layer_elements=math.ceil(summ.layer_elements / dp), before_step=before,
                                  loop_peak=math.ceil(summ.loop_peak_elements / dp), fsdp=fsdp)
        else:
            n = math.ceil(model / setup.tp)  # type: ignore[operator]
            step = step_constants(None, setup, device_type=device_type, elements=n, largest=n, layer_elements=0,
                                  before_step=before)
    return Plan(summ=summ, states=states, states_total=sum(states.values()), opt_detail=opt_detail,
                gather_bytes_per_layer=per_layer, notes=tuple(notes),
                param_count=shape_summary(model).param_count if summ is not None else model,  # type: ignore[arg-type]
                step=step, config_fields=None if summ is None else config_fields(model),  # type: ignore[arg-type]
                fsdp=fsdp, paged_bytes=paged_bytes_of(model, setup))


def paged_bytes_of(model: TransformerConfig | int, setup: Any) -> int:
    """Bytes a paged optimizer (:data:`~memlab.predict.memory.states.PAGED_OPTIMIZERS`) keeps in CUDA managed
    memory on one device: the paged part of :func:`~memlab.predict.memory.states.paged_optimizer_bytes` over the
    trainable tensors (every parameter's shard on one tp rank; under LoRA the adapters and modules_to_save). 0 for
    other optimizers, inference, or a bare count (refused with a paged optimizer: memlab.predict.coverage)."""
    if setup.optimizer not in PAGED_OPTIMIZERS or setup.mode != "train" or not isinstance(model, TransformerConfig):
        return 0
    return paged_optimizer_bytes(trainable_tensors(model, setup), setup.optimizer)[1]


def trainable_tensors(config: TransformerConfig, setup: Any) -> list[int]:
    """Elements of each tensor the optimizer steps on one device: the adapters and the modules peft trains in full
    (``finetune`` lora/qlora), or every parameter's shard on one of ``setup.tp`` ranks."""
    if setup.finetune in ("lora", "qlora"):
        return [*adapter_tensors(config, setup), *saved_module_tensors(config, setup)]
    return [math.prod(tp_shard_shape(name, shape, config, setup.tp)) for name, shape, _ in config.param_shapes()]


def config_fields(config: TransformerConfig) -> dict[str, Any]:
    """Shallow field dict of ``config`` (faster than dataclasses.asdict), its ``impl`` as ``impl.to_dict()``."""
    return {**{name: getattr(config, name) for name in config.__dataclass_fields__}, "impl": config.impl.to_dict()}


def _states(model: TransformerConfig | int, setup: Any, step_on_device: bool,
            summ: ShapeSummary | None, fsdp: FsdpPlan | None = None) -> tuple[dict[str, int], dict, list]:
    """(params, grads, optimizer) per device after TP and ZeRO, the optimizer detail, and notes; ``summ``: the
    model's :func:`~memlab.predict.memory.sharding.shape_summary` on one tp rank (None for a bare count); ``fsdp``: the
    FSDP2 plan, whose padded rank-0 shards replace ``ceil(n / N)`` (and shard parameters under ZeRO-2 too)."""
    pol, tp, notes = setup.policy, setup.tp, []
    if summ is None:
        n, tensors = math.ceil(model / tp), 0
        notes.append("bare parameter count: all parameters treated alike (no shapes): per-tensor step counters "
                     "are not counted" + (", TP divides every parameter" if tp > 1 else ""))
    else:
        n, tensors = summ.elements, summ.tensors
    if setup.mode == "inference":
        return _inference_weights(n, summ, setup.inference_weights, notes), {}, notes
    if setup.finetune != "full":
        if summ is None:
            raise SetupError(f"finetune={setup.finetune!r} adapts named modules: give a model config, not a bare "
                             "parameter count")
        states_of = frozen_states if setup.finetune == "frozen" else finetune_states
        states, detail, ft_notes = states_of(model, setup, n, step_on_device)  # type: ignore[arg-type]
        return states, detail, notes + ft_notes
    dp, dg, do = zero_divisors(setup.zero_stage, setup.world_size)
    if fsdp is not None:  # FSDP2: every state is rank 0's padded dim-0 shard (exact), at rest under ZeRO-2 too
        n, dp, dg, do = fsdp.shard_elements, 1, 1, 1
    sb, opt = optimizer_state_dtype_bytes(pol), setup.optimizer
    if opt == "adafactor" and fsdp is not None:
        moments = sb * summ.adafactor_elements / setup.world_size  # type: ignore[union-attr]  # not per shard shape
    elif opt in ("adam", "adamw"):
        moments = adam_moment_bytes(n, sb)
    elif opt in ("sgd", "sgd-momentum"):
        moments = sgd_moment_bytes(n, sb, opt == "sgd-momentum")
    elif opt in PAGED_OPTIMIZERS:  # the allocator's part (one device: coverage refuses ZeRO); the rest is paged
        moments = paged_optimizer_bytes(trainable_tensors(model, setup), opt)[0]  # type: ignore[arg-type]
    elif opt == "adam-8bit":
        moments = summ.adam8bit_bytes if summ else (
            2 * n + 8 * math.ceil(n / ADAM_8BIT_BLOCK) + (ADAM_8BIT_QMAP_BYTES if n >= ADAM_8BIT_MIN_SIZE else 0))
    else:
        moments = sb * summ.adafactor_elements  # type: ignore[union-attr]  # adafactor needs shapes (checked)
    steps = step_counter_bytes(tensors, opt)
    detail = {
        "moments": math.ceil(moments / do) if opt != "adam-8bit" or do == 1 else (  # the shared maps: whole
            math.ceil((moments - ADAM_8BIT_QMAP_BYTES) / do) + ADAM_8BIT_QMAP_BYTES),
        "master": math.ceil(n / do) * pol.master_bytes,
        "grad_accum": math.ceil(n / do) * pol.grad_accum_bytes,
        "step_counters": steps if step_on_device else 0,
    }
    if steps and not step_on_device:
        notes.append(f"{steps} B of per-tensor optimizer step counters live on the host (torch default unless "
                     "fused/capturable): not counted on the device")
    out = {
        "params": math.ceil(n / dp) * pol.param_bytes,
        "grads": math.ceil(n / dg) * pol.grad_bytes,
        "optimizer": sum(detail.values()),
    }
    return out, detail, notes


def _inference_weights(n: int, summ: ShapeSummary | None, weights: str, notes: list) -> dict[str, int]:
    """Inference weight bytes: quantised block matrices (+ scales) and 16-bit embeddings/head/norms."""
    wb = DTYPE_BYTES[weights]
    if weights not in ("int8", "int4"):
        return {"params": math.ceil(n * wb), "grads": 0, "optimizer": 0}
    if summ is None:
        scales = math.ceil(n / INT4_GROUP) * 2.5 if weights == "int4" else 0
        notes.append(f"bare parameter count with {weights}: every parameter counted as quantised"
                     + (" (group-128 scales included)" if weights == "int4" else "; per-row scales not counted"))
        return {"params": math.ceil(n * wb + scales), "grads": 0, "optimizer": 0}
    q = summ.quantizable_elements
    scales = summ.int8_scale_bytes if weights == "int8" else summ.int4_scale_bytes
    notes.append(f"{weights} weights: 2-D block matrices quantised with their scales ({scales} B); embeddings, "
                 "LM head, norms and biases kept in fp16")
    return {"params": math.ceil(q * wb) + scales + 2 * (n - q), "grads": 0, "optimizer": 0}
