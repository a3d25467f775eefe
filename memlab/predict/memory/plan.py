"""The part of an estimate that depends on neither batch nor seq, computed once per setup and cached.

``estimate()`` is called in loops over batch and seq (fit searches, sweeps, the course's tables); model states,
the optimizer's step constants, the notes and most assumptions do not change along such a loop. :func:`plan` computes
them from the model, the setup's fields other than ``batch``/``seq`` (:func:`rest_of`), the overheads, the device
type and where the step counters live; its cache (``functools.lru_cache``, bounded) is keyed on those frozen,
hashable values only, and it reads the setup through a view whose ``batch``/``seq`` are None, so nothing it returns
can depend on them (a read would fail). A hit returns the very :class:`Plan` a miss computed: its dicts are shared
and never changed (the estimator copies what it hands out). Of the overheads only their truthiness is read here
(the assumptions); their values are applied per call. Units: bytes. No torch.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Any

from memlab.errors import SetupError
from memlab.predict.memory.family_terms import cuda_autocast_gelu_note, manual_loss
from memlab.predict.memory.finetune import (
    finetune_states,
    frozen_states,
    frozen_trainable,
    largest_adapter_elements,
    lora_layer_elements,
)
from memlab.predict.memory.fsdp import FsdpPlan, plan_of
from memlab.predict.memory.inference import INT4_GROUP
from memlab.predict.memory.phases import step_constants
from memlab.predict.memory.sharding import ShapeSummary, shape_summary, zero_divisors
from memlab.predict.memory.states import (
    ADAM_8BIT_BLOCK,
    ADAM_8BIT_MIN_SIZE,
    ADAM_8BIT_QMAP_BYTES,
    adam_moment_bytes,
    optimizer_state_dtype_bytes,
    sgd_moment_bytes,
    step_counter_bytes,
)
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.precision import DTYPE_BYTES
from memlab.predict.spec.setup import Setup, SetupView, resolve_optimizer_impl

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
    assumptions_head: tuple[str, ...]
    """The assumptions before the seq-dependent one (rotary seq beyond max_seq)."""
    assumptions_tail: tuple[str, ...]
    """The assumptions after it, then the notes of the model-state count."""
    param_count: int
    step: dict[str, Any]
    """Training: :func:`~memlab.predict.memory.phases.step_constants` of the setup; inference: empty."""
    config_fields: dict[str, Any] | None
    """The config's fields with ``impl`` as ``impl.to_dict()`` (what ``MemoryBreakdown.config`` copies); None for a
    bare count."""
    fsdp: FsdpPlan | None = None
    """The FSDP2 plan when FSDP2 applies (:func:`memlab.predict.memory.fsdp.plan_of`), else None."""


@functools.lru_cache(maxsize=1024)
def plan(model: TransformerConfig | int, rest: tuple, ov: Any, device_type: str, step_on_device: bool) -> Plan:
    """The :class:`Plan` of ``model`` (checked by the caller) under the setup whose :data:`REST_FIELDS` values are
    ``rest``, with overheads ``ov`` (a :class:`~memlab.predict.estimate.Overheads`) on ``device_type``;
    ``step_on_device``: whether the optimizer's step counters count (resolved). Cached: up to 1024 plans."""
    setup = SetupView(_BASE, batch=None, seq=None, **dict(zip(REST_FIELDS, rest, strict=True)))
    summ = shape_summary(model, setup.tp) if isinstance(model, TransformerConfig) else None  # checks tp
    fsdp = plan_of(model, setup) if summ is not None else None  # type: ignore[arg-type]
    states, opt_detail, notes = _states(model, setup, step_on_device, summ, fsdp)
    per_layer = 0
    if summ is not None and setup.mode == "train" and setup.zero_stage == 3 \
            and setup.world_size > 1:  # FSDP/ZeRO-3 all-gathers a block's full (TP-sharded) parameters
        per_layer = summ.layer_elements * (fsdp.gather_bytes if fsdp is not None else setup.policy.param_bytes)
    head, tail = _assumptions(model, setup, ov, device_type, fsdp)
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
                gather_bytes_per_layer=per_layer, assumptions_head=tuple(head), assumptions_tail=(*tail, *notes),
                param_count=shape_summary(model).param_count if summ is not None else model,  # type: ignore[arg-type]
                step=step, config_fields=None if summ is None else _config_fields(model),  # type: ignore[arg-type]
                fsdp=fsdp)


def _config_fields(config: TransformerConfig) -> dict[str, Any]:
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


CALLS = {
    "none": "the call: model(input_ids, labels=...) with no attention mask",
    "ones": "the call: model(input_ids, attention_mask=ones(b, s), labels=...): transformers builds no mask for SDPA "
            "and the same causal mask for eager, so it saves what the call without a mask saves (measured on CPU "
            "on every tiny HF config, benchmarks/call_conventions.py; not yet on CUDA, assumed the same there as "
            "transformers builds the mask the same way on either)",
    "padded": "the call: a {side}-padded batch, model(input_ids, attention_mask=..., labels=...) with pad_fraction={f} "
              "of the tokens padding (mask 0, labels -100): eager's causal mask changes values, not shapes (it saves "
              "what the call without a mask saves); CPU SDPA keeps the (b, 1, s, s) mask per layer and a GQA "
              "model's repeated K, V (memlab.predict.memory.family_terms.padded_sdpa_rows; measured on CPU on every "
              "tiny "
              "HF config, benchmarks/call_conventions.py; SDPA with a padded batch on CUDA is refused)",
}
"""The assumption line naming the call each ``Setup.attention_mask`` describes."""


def call_line(setup: Any) -> str:
    """The assumption naming the call the estimate describes: :data:`CALLS` for ``Setup.attention_mask`` (with
    ``padding_side``), rewritten for a hand-written loss (``Setup.loss_call='manual'``, no ``labels=``)."""
    line = CALLS[setup.attention_mask].format(f=setup.pad_fraction, side=setup.padding_side)
    if setup.attention_mask == "padded":
        line += ("; left padding saves what right padding saves (measured on CPU on every tiny HF config, "
                 "benchmarks/call_conventions.py: no tensor's shape depends on where the zeros sit); a batch where "
                 "floor(pad_fraction b s) is 0 pads no token and is the all-ones call, whose mask transformers "
                 "drops for SDPA (memlab.predict.memory.family_terms.padding_present)")
    if setup.recompute == "full" and setup.attention_mask != "none":
        line += ("; under gradient checkpointing (non-reentrant) a layer keeps its positional arguments only: the mask "
                 "once where the family hands it positionally (GPT-2: eager's causal mask, or under SDPA a padded "
                 "batch's bool mask), never the rotary cos/sin or position ids, passed by keyword "
                 "(memlab.predict.memory.family_terms.checkpoint_mask_rows; measured on CPU on every tiny HF config)")
    if setup.loss_call != "manual":
        return line
    line = line.replace(", labels=...)", ").logits").replace("labels -100", "targets -100")
    how = ("no fp32 upcast: the log-softmax and its total_weight kept in the logits' 16-bit dtype, 2 B/element "
           "instead of transformers' 4" if manual_loss(setup) else
           "the same log-softmax as labels=... (fp32 logits, or fp32 under autocast, whose CPU and CUDA op lists "
           "both run cross_entropy in fp32 [pytorch-amp])")
    return (line + "; the loss hand-written on those logits, F.cross_entropy(logits.view(-1, V), targets.view(-1)) on "
            f"the user's own next-token targets (no shifted, padded copy of the labels): {how} (measured on CPU on "
            "every tiny HF config, benchmarks/call_conventions.py); its forward moment is modelled as transformers' "
            "loss's, less the fp32 final-norm output under autocast, which traces up to 8 b (s + 1) + 16 t h + 16 B "
            "higher (its padded labels and up to four fp32 t x h tensors its forward still holds while its loss runs; "
            "every tiny HF config, benchmarks/call_conventions.py --trace): an upper bound by that much")


def _assumptions(model: TransformerConfig | int, setup: Any, ov: Any, device_type: str,
                 fsdp: FsdpPlan | None = None) -> tuple[list, list]:
    """The assumptions before and after :func:`rotary_seq_note`'s place (the one that depends on seq)."""
    out = ["bytes per device; GiB = 2**30 B, GB = 1e9 B",
           f"world_size={setup.world_size} counts data-parallel ranks; with tp={setup.tp} the job uses "
           f"{setup.world_size * setup.tp} device(s)"]
    if setup.mode == "train":
        out.append("optimizer = moments + fp32 master copy + fp32 grad-accumulation buffer (ZeRO paper's K)")
        impl = resolve_optimizer_impl(setup.optimizer, setup.optimizer_impl, device_type)
        out.append(f"peak = the most held at once over the phases of the first and steady step "
                   f"(memlab.predict.memory.phases);"
                   f" optimizer step with the {impl} implementation"
                   + (", over model.parameters() in the order the model registers them (a Hugging Face family's "
                      "own: memlab.predict.families.order)" if impl == "for-loop" else "")
                   + "; fit verdicts use the peak, total is the sum")
        if setup.optimizer in ("adam", "adamw", "sgd-momentum", "adafactor") and not setup.policy.master_bytes \
                and setup.finetune in ("full", "frozen"):  # LoRA: fp32 adapters, states (predict.memory.finetune)
            out.append(f"optimizer states in the parameter dtype ({setup.policy.param_bytes} B/element) as torch.optim")
        if setup.zero_stage and setup.world_size == 1:
            out.append("ZeRO/FSDP over 1 rank shards nothing")
        if fsdp is not None:
            out.append(f"FSDP2 ({fsdp.units_name} plan, {len(fsdp.units)} units, loss {setup.fsdp_loss} the root; "
                       + ("ZeRO-3: units reshard after forward" if setup.zero_stage == 3 else
                          "ZeRO-2: parameters sharded at rest and gathered from forward to backward (DeepSpeed's "
                          "stage 2 keeps full 16-bit parameters at rest: add them)")
                       + "): gathered parameters, all-gather buffers, prefetch and unsharded gradients are modelled "
                       "per phase (memlab.predict.memory.fsdp); shards padded to ceil(d0 / N) rows as rank 0 holds "
                       "them")
            from memlab.predict.memory.fsdp import unmodelled

            left = "; ".join(f"{k}: up to {math.ceil(v):,} B ({'/'.join(ph)})"
                             for k, (v, ph) in unmodelled(fsdp, fsdp.grad_bytes).items() if v)
            out.append(f"FSDP2 moments not modelled (memlab.predict.unmodelled.unmodelled_terms): {left}")
            if setup.fsdp_offload:
                out.append("FSDP2 CPUOffloadPolicy: sharded parameters, gradients and optimizer states on the host "
                           "(host_bytes; the optimizer steps there, its temporaries too); the device holds the "
                           "gathered units, their buffers and unsharded gradients. A CPU trace cannot tell host "
                           "from device: memlab.studies.setup_draws checks device + host against it")
            if setup.policy.fsdp_mixed:
                out.append(f"MixedPrecisionPolicy(param_dtype={setup.policy.fsdp_param_dtype}, reduce_dtype="
                           f"{setup.policy.fsdp_reduce_dtype}, output_dtype=None): activations as pure "
                           f"{setup.policy.fsdp_param_dtype} compute")
        elif setup.zero_stage >= 2 and setup.world_size > 1 and setup.mode == "train":
            out.append("tensor parallelism with ZeRO-2/3: FSDP2's gathered parameters are not modelled "
                       "(Overheads(gathered_layers=...) adds blocks)")
        if setup.policy.autocast:
            out.append("autocast's 16-bit weight copies kept for backward are counted in activations; its cast "
                       "cache's copies of the linear biases (saved by no op) in the forward")
        if setup.recompute == "full" and isinstance(model, TransformerConfig):
            out.append("full recompute: the bottom block's backward is taken as one moment; its own gradients "
                       "appearing inside it and the embeddings' produced after it are named with their sizes by "
                       "memlab.predict.unmodelled.unmodelled_terms")
        if setup.loss != "plain" or setup.logits_to_keep:
            out.append(f"loss={setup.loss}" + (f", logits_to_keep={setup.logits_to_keep}" if setup.logits_to_keep
                       else "") + ": the loss's terms follow memlab.model.loss (the fused loss as its pure-torch "
                       "reference: Liger's kernel holds less per chunk); chunked's backward is an upper bound; with "
                       "the loss no longer the largest moment the backward peak may sit at the bottom layer, whose "
                       "term is approximate (a few per cent on the reference GPT; for HF families see "
                       "benchmarks/loss_options.py)")
        hf = isinstance(model, TransformerConfig) and model.impl.family != "reference"
        if setup.attention_mask != "none" or hf:  # memlab's own GPT has no HF call to name
            out.append(call_line(setup))
        gelu = cuda_autocast_gelu_note(model, setup, device_type) if hf else None
        if gelu:
            out.append(gelu)
        if hf and setup.loss == "plain" and not setup.logits_to_keep and not setup.offload_activations:
            out.append("peak: the family's own transients inside forward and backward (norm upcasts, its activation's "
                       "backward, the mask's expansion) are the reference GPT's, hidden by the t x V logits terms at "
                       "a large vocabulary; where they are not, named with their bound by "
                       "memlab.predict.unmodelled.unmodelled_terms (real steps: python benchmarks/hf_draws.py)")
        if setup.offload_activations:
            out.append("activation offload (save_on_cpu, pinned): the device keeps the token ids and the loss's "
                       "tensors while it runs; host_bytes is a lower bound (tensors saved twice are copied twice)")
        if setup.loss != "plain" or setup.logits_to_keep or setup.offload_activations:
            out.append("a chunked or fused loss, kept positions or activation offload: the phases not modelled exactly "
                       "are bounded by the terms memlab.predict.unmodelled.unmodelled_terms names, with their sizes "
                       "(checked on generated setups: python benchmarks/estimate_vs_trace.py --loss-draws 40)")
    else:
        out.append("inference: weights replicated over data-parallel ranks (ZeRO does not apply); no grads/states")
        out.append("KV cache holds setup.seq tokens (prompt + generated) per sequence")
        out.append("activations = largest transient of a full-prompt forward (fp32 logits, MLP inner, or scores)")
    if isinstance(model, TransformerConfig) and model.is_moe and model.impl.grouped_experts:
        out.append(f"mixture of experts ({model.impl.family}): the router's and the top_k routed (token, expert) "
                   f"pairs' saved tensors are counted exactly (sized by tokens x top_k, whatever the routing); all "
                   f"{model.n_experts} experts' weights, grads and states are resident (two 3-D tensors a layer)")
        if model.impl.dense_layers:  # Qwen2-MoE decoder_sparse_step / mlp_only_layers: blocks of two sizes
            sizes = [0] * model.n_layers
            for name, shape, _ in model.param_shapes():
                if name.startswith("blocks."):
                    sizes[int(name.split(".")[1])] += math.prod(shape)
            spread = (max(sizes) - min(sizes)) * setup.policy.grad_bytes / setup.tp
            out.append(f"dense layers {list(model.impl.dense_layers)} among the MoE ones: saved tensors, weights and "
                       f"FLOPs are counted per layer; the peak's one-block moments in backward (a block's gradients) "
                       f"take block 0's size, up to {spread:,.0f} B off where the top or bottom block is of the "
                       "other kind")
    elif isinstance(model, TransformerConfig) and model.is_moe:
        out.append("mixture of experts: routing activations and unchosen experts are named with their sizes by "
                   "memlab.predict.unmodelled.unmodelled_terms")
        out.append(f"mixture of experts: all {model.n_experts} experts' weights (and their grads and states) are "
                   "resident; activations are counted as for one dense MLP per token (the top_k routed copies are "
                   "not modelled yet)")
    if isinstance(model, int):
        out.append("bare parameter count: activations and KV cache need a model config and are 0 here")
    tail = []
    if not ov.cuda_context_bytes:
        tail.append("CUDA context not included (a few hundred MB; PyTorch maintainers cite ~300-400 MB with lazy "
                    "loading, pytorch/pytorch#107667, #109888): measure NVML used minus torch.cuda.memory_reserved() "
                    "after the first CUDA op and pass Overheads(cuda_context_bytes=...)")
    if not ov.workspace_bytes:
        tail.append("cuBLAS/attention workspaces not included: pass Overheads(workspace_bytes=...)")
    if not ov.fragmentation_fraction:
        tail.append("allocator fragmentation not included: measure (reserved - allocated) / allocated at the peak "
                    "(torch.cuda.memory_stats) and pass Overheads(fragmentation_fraction=...)")
    return out, tail


def rotary_seq_note(model: TransformerConfig | int, seq: int, setup: Any = None) -> tuple[str, ...]:
    """The assumption a rotary model run beyond its trained length adds (between the plan's head and tail).

    A sliding-window model (:attr:`~memlab.predict.spec.traits.Implementation.sliding_window`) with ``seq`` at or beyond
    the window raises :class:`~memlab.errors.SetupError` for a fused or math kernel
    (:meth:`~memlab.predict.spec.traits.Implementation.check_window`: transformers then passes SDPA an explicit mask)
    and
    for inference (the KV cache keeps only the window's tokens): neither is modelled."""
    window = None if isinstance(model, int) else model.impl.sliding_window
    if window is not None:
        model.impl.check_window(seq, getattr(setup, "attention", "eager"))
        if getattr(setup, "mode", "train") != "train" and seq >= window:
            raise SetupError(f"{model.name}: seq={seq} reaches its sliding_window={window}: the KV cache then keeps "
                             "only the window's tokens, which the estimate does not model; use a shorter seq")
    if isinstance(model, int) or model.positions != "rotary" or seq <= model.max_seq:
        return ()
    return (f"seq={seq} exceeds the model's trained max_seq={model.max_seq} (rotary: runs, quality aside)",)
