"""When the bytes appear: predicted bytes held at each phase of a training step (or inference), and the peak.

A step never holds gradients and all activations at once, and it holds transients that the sum of components
has no term for. This module predicts the **peak inside** each phase, for the **first** step (optimizer state
appears inside its optimizer step) and the **steady** state, from the components the estimator already has.
``P``, ``G``, ``O``, ``A`` are per-device parameters, gradients, optimizer state and saved activations; ``t`` tokens
per micro-batch, ``V`` the vocabulary (divided by ``tp``), ``h`` the model width.

- forward: ``P + O + G_held + A + logits`` where the fp32 logits are alive while the loss is computed (``4tV``;
  ``6tV`` when the head computes in 16 bits: the 16-bit logits and their fp32 copy; ``8tV`` under autocast, as
  traced on CPU); under full
  recompute also inside a block's forward, whose d_ff-wide tensors exist until it returns.
- first step: no optimizer state yet, except what a master-weight wrapper allocates up front (the fp32 copy).
- backward, the largest of three moments (gradients appear while activations are freed, both linearly in the
  layers, so the largest is at an end or at the bottom layer):
  start, ``P + O + G_held + A + 8tV`` (the gradients of the log-softmax and of the logits, fp32);
  bottom layer, ``P + O + G - G_layer + A_layer + T_layer (+ block inputs under full recompute)`` (one block's
  saved tensors as without recompute less its MLP's, which its MLP backward has consumed; its backward temporaries
  ``T_layer``: the d_ff-wide gradients or the s x s score gradients of eager/math attention, three h-wide ones);
  end, ``P + O + G`` plus, for tied embeddings, the head's and the embedding's gradient contributions before they are
  summed (``2 V h`` gradient bytes).
- optimizer step: ``P + G + O + T_opt`` with ``T_opt`` by implementation ([pytorch-optim], torch/optim/adamw.py):
  for-loop Adam keeps two temporaries of the tensor being stepped (``sqrt`` and the division) beside the previous
  tensor's ``denom``, still bound to the loop variable (2 x a tensor + the one before it, at worst); foreach one
  temporary per parameter at once (``_foreach_sqrt``: all parameters, state dtype, 4 B/param in fp32); fused
  none; SGD none; a master-weight wrapper holds fp32 copies of every 16-bit gradient during the step (4 B/param).
  In the first step ``O`` is allocated inside this phase.
- zero_grad: what is held *after* it, ``P + O`` (+ ``G`` with ``set_to_none=False``); the batch's token ids are
  held by the loop through the optimizer step and after it.
- gradient accumulation (``grad_accum_steps > 1``): from the second micro-batch on, ``G_held = G`` (gradients
  persist across micro-steps): phases ``forward (accumulating)``, ``backward (accumulating)``.
- inference: ``prefill`` = weights + KV cache + the largest prefill transient; ``decode`` = weights + KV cache +
  one token's transient.

Every side of the comparison gives its phases as :class:`PhaseRow` records (the estimate, the trace, the runner's
in-step peaks, the live counter) and looks one up with :func:`find_phase`.

Terms were checked against ``memlab.tracing.tracer`` (MemTracker on fake tensors [pytorch-memtracker], the reference
GPT): the start-of-backward and optimizer-step terms are exact; the bottom-layer term is within a few per cent.
Pure numpy arithmetic (works on arrays of batch/seq); no torch. Units: bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from memlab.errors import MemlabError, SetupError
from memlab.predict.activations import shared_widths, term_rows
from memlab.predict.frozen import unchecked
from memlab.predict.models import TransformerConfig
from memlab.predict.optimizer_states import optimizer_state_dtype_bytes
from memlab.predict.precision import precision_policy
from memlab.predict.setup import resolve_optimizer_impl

PHASES = ("forward", "backward", "optimizer step", "zero_grad")
"""Training phases in step order (``zero_grad`` is the bytes held after it; the others the peak inside)."""
STEPS = ("first", "steady")

_MODEL_LEVEL = ("token ids", "head & loss")
_NOT_PER_LAYER = (*_MODEL_LEVEL, "mlp")
"""Categories left out of one block's saved bytes (besides the final norm and the LM head's 16-bit copy)."""
_HEAD_COPY = "16-bit copy of LM-head weight"
_TOKEN_IDS = ("input token ids", "target token ids")
LOSS_BYTES = 4
"""The fp32 scalar loss, alive from the end of forward into backward."""


@dataclass(frozen=True)
class PhaseRow:
    """The bytes one phase of one step holds: the one record of ``MemoryBreakdown.phases`` (predicted),
    ``Trace.phases`` (traced), ``Measurement.phase_peaks`` (measured in the step) and ``LiveSteps.phases`` (live
    tensor bytes). Bytes throughout; a field a side does not know is ``None`` or empty.

    The estimate's ``peak_bytes`` is the predicted peak inside the phase (this module's formulas), except for
    ``zero_grad``, whose formula is what is held *after* it: there ``end_bytes`` is that same number, and
    ``peak_bytes`` repeats it (the estimator has no formula for the moment inside ``zero_grad``).
    :attr:`held_bytes` is the number a prediction is compared on, the same rule for every side.
    """

    step: str | int
    """``first`` or ``steady`` (estimate, trace, runner); the step number from 1 in ``LiveSteps``."""
    phase: str
    """``forward``, ``backward``, ``optimizer step``, ``zero_grad`` (``... (accumulating)``); ``prefill``/``decode``."""
    peak_bytes: int
    """The most held at once inside the phase."""
    end_bytes: int | None = None
    """Held when the phase ends (``None``: not known, as in a predicted phase other than zero_grad)."""
    start_bytes: int | None = None
    """Held when the phase starts (the live counter's rows)."""
    by_category: dict[str, int] = field(default_factory=dict)
    """Bytes by trace category at the phase's peak (``memlab.tracing.tracer.CATEGORIES``; traces only)."""
    end_by_category: dict[str, int] = field(default_factory=dict)
    """Bytes by trace category when the phase ends (traces only)."""
    source: str = ""
    """Where measured numbers come from (live tensor bytes on a CPU, ``max_memory_allocated`` on CUDA)."""
    reliable: bool = True
    """False for a traced phase known not to be what a real run holds (left out of the trace's peak)."""

    @property
    def held_bytes(self) -> int:
        """The bytes compared with a prediction: ``peak_bytes``, for ``zero_grad`` ``end_bytes`` (held after it)."""
        if self.phase == "zero_grad" and self.end_bytes is not None:
            return self.end_bytes
        return self.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (the categories copied)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> PhaseRow:
        """The row :meth:`to_dict` wrote, or an older dict row with fewer keys (a sweep file's ``phase_peaks``:
        step, phase, peak_bytes, end_bytes, source). Unknown or missing keys raise :class:`MemlabError`."""
        if not isinstance(row, dict):
            raise MemlabError(f"a phase row must be a dict, got {type(row).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(row) - known)
        missing = [k for k in ("step", "phase", "peak_bytes") if k not in row]
        if unknown or missing:
            raise MemlabError(f"phase row {row!r}: " + "; ".join(
                ([f"unknown keys {', '.join(unknown)}"] if unknown else [])
                + ([f"missing {', '.join(missing)}"] if missing else [])))
        return cls(**{k: dict(v) if k in ("by_category", "end_by_category") else v for k, v in row.items()})


def predicted_row(step: str, phase: str, peak_bytes: int) -> PhaseRow:
    """The estimator's :class:`PhaseRow` of one phase: ``end_bytes`` repeats ``peak_bytes`` for ``zero_grad`` (what is
    held after it) and is None otherwise; the measured-side fields are empty. Equal to ``PhaseRow(step, phase,
    peak_bytes, end_bytes=...)``, built by :func:`~memlab.predict.frozen.unchecked` (eight rows per estimate)."""
    return unchecked(PhaseRow, {"step": step, "phase": phase, "peak_bytes": peak_bytes,
                                "end_bytes": peak_bytes if phase == "zero_grad" else None, "start_bytes": None,
                                "by_category": {}, "end_by_category": {}, "source": "", "reliable": True})


def find_phase(rows: Iterable[PhaseRow], phase: str, step: str | int = "steady") -> PhaseRow:
    """The row of ``phase`` in ``step`` (``first``/``steady``, or a step number); raises :class:`SetupError`
    naming the phases there are."""
    seen = tuple(rows)
    for row in seen:
        if row.phase == phase and row.step == step:
            return row
    where = f"step {step}" if isinstance(step, int) else f"the {step} step"
    raise SetupError(f"no phase {phase!r} in {where}: phases are {', '.join(sorted({r.phase for r in seen}))}")


@dataclass(frozen=True)
class StepInputs:
    """What the phase model needs beyond P, G, O, A (bytes per device; arrays allowed for the activation terms)."""

    logits_elements: Any
    """t * V / tp: elements of one fp32 logits tensor on this rank."""
    layer_activation_bytes: Any
    """One block's saved bytes as without recompute, less its MLP's (consumed when the block's peak comes)."""
    layer_temporary_bytes: Any
    """One block's backward temporaries (d_ff-wide or score gradients, three h-wide ones)."""
    block_forward_bytes: Any
    """Inside a block's forward under full recompute: its d_ff-wide tensors and one h-wide one."""
    recompute_inputs_bytes: Any
    """Block inputs kept by full recompute (0 otherwise)."""
    head_loss_bytes: Any
    """The log-softmax and loss tensors (absent while the blocks run)."""
    layer_grad_bytes: float
    tied_head_grad_bytes: float
    """2 V h gradient bytes for tied embeddings at the end of backward (0 when untied)."""
    optimizer_temporary_bytes: float
    optimizer_before_step_bytes: float
    """Optimizer-side bytes that exist before the first step: fp32 master copy and accumulation buffer."""
    persistent_grads: bool
    """Gradients that exist from the start (fp32 gradient buffers of a master-weight wrapper)."""
    forward_logits_bytes_per_element: float
    """Transient logits bytes per element at the end of forward: 4 (fp32), 6 (16-bit logits and their fp32 copy),
    8 under autocast (as traced on CPU)."""
    full_recompute: bool
    input_bytes: Any = 0
    """The batch's token ids (counted in A while saved; held by the training loop through the whole step)."""


def _layer_terms(config: TransformerConfig, setup: Any, device_type: str, own: list | None = None) -> dict[str, Any]:
    """One block's terms on one tp rank: saved bytes (without recompute, less the MLP's), backward temporaries,
    the transient of its forward, and the model-level head/loss and recompute terms. ``own``: the setup's
    :func:`~memlab.predict.activations.term_rows` when the caller has listed them (listed here otherwise)."""
    tp, sp = setup.tp, setup.sp
    rep = tp if sp else 1  # the divisor of a replicated row: ``tp if (sharded or sp) else 1`` is ``tp`` or ``rep``
    if own is None:
        own = term_rows(config, setup, device_type=device_type)
    # Each sum adds its rows in list order (as ``sum`` over the ActivationTerms did); a row is (name, category, count,
    # width, sharded[, note]), its bytes count * width / (tp if sharded or sp else 1) (ActivationTerm.bytes).
    # Without recompute the block's terms are the setup's own, picked out of them; otherwise listed as without
    # recompute, block rows only (model_level=False: the rows the filter below leaves out are not listed).
    per = recompute_inputs = head = inputs = 0
    own_is_block = setup.recompute == "none"
    if not own_is_block:
        for row in term_rows(config, setup, device_type=device_type, recompute="none", model_level=False):
            if row[1] != "mlp":
                per += row[2] * row[3] / (tp if row[4] else rep)
    for row in own:
        name, category = row[0], row[1]
        size = row[2] * row[3] / (tp if row[4] else rep)
        if own_is_block and category not in _NOT_PER_LAYER and not name.startswith("final norm") \
                and name != _HEAD_COPY:
            per += size
        if category == "block inputs (recompute)":
            recompute_inputs += size
        elif category == "head & loss":
            head += size
        if name in _TOKEN_IDS:
            inputs += size
    w = shared_widths(setup.precision, device_type)
    t = setup.batch * setup.seq
    n_f = 3 if config.mlp == "swiglu" else 2
    mlp = n_f * t * config.ffn * w["compute"] / setup.tp
    attn = 0
    if setup.attention in ("eager", "math"):
        probs = w["probs"] if setup.attention == "eager" else 4
        attn = 2 * setup.batch * config.n_heads * setup.seq * setup.seq * probs / setup.tp
    return {
        "layer": per / config.n_layers,
        "temp": larger(mlp, attn) + 3 * t * config.d_model * w["residual"],
        "block_forward": mlp + t * config.d_model * w["compute"],
        "recompute_inputs": recompute_inputs,
        "head": head,
        "inputs": inputs,
    }


def larger(a: Any, b: Any) -> Any:
    """``np.maximum(a, b)``; for two Python scalars (a scalar estimate) without numpy's per-call cost (the value is
    the same; the type stays Python's, where numpy's would be an ``np.float64``/``np.int64``)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return b if b > a else a


def optimizer_temporary_bytes(optimizer: str, impl: str, policy: Any, elements: int, largest: int,
                              loop_peak: int | None = None) -> float:
    """Transient bytes inside ``optimizer.step()`` beyond the states (see the module docstring).

    ``largest``: the largest tensor's elements; ``loop_peak``: the for-loop's worst moment in elements (2 x a
    tensor + the previous one, :attr:`memlab.predict.sharding.ShapeSummary.loop_peak_elements`; default 2 x
    ``largest``).
    """
    sb = optimizer_state_dtype_bytes(policy)
    if impl == "fused" or optimizer in ("sgd", "sgd-momentum"):
        core = 0
    elif impl == "foreach":
        core = sb * elements
    elif optimizer == "adam-8bit":
        core = 5 * 4 * largest  # memlab's Adam8bit: fp32 gradient, decoded m and v, the update, padding
    else:
        core = sb * (2 * largest if loop_peak is None else loop_peak)
    wrapper = 4 * elements if (policy.master_bytes and not policy.grad_accum_bytes and policy.grad_bytes == 2) else 0
    return float(core + wrapper)


def step_inputs(config: TransformerConfig | None, setup: Any, *, device_type: str, elements: int, largest: int,
                layer_elements: int, before_step: float = 0.0, loop_peak: int | None = None,
                terms: list | None = None) -> StepInputs:
    """:class:`StepInputs` of ``config`` under ``setup`` (``config=None``: a bare count, no activation terms).

    ``elements``/``largest``/``layer_elements``: parameters on this device, its largest tensor, one block's;
    ``before_step``: optimizer-side bytes allocated before the first step (master copy, accumulation buffer);
    ``terms``: the setup's :func:`~memlab.predict.activations.term_rows` when the caller has listed them.
    """
    const = step_constants(config, setup, device_type=device_type, elements=elements, largest=largest,
                           layer_elements=layer_elements, before_step=before_step, loop_peak=loop_peak)
    return step_inputs_with(const, config, setup, device_type=device_type, terms=terms)


def step_constants(config: TransformerConfig | None, setup: Any, *, device_type: str, elements: int, largest: int,
                   layer_elements: int, before_step: float = 0.0, loop_peak: int | None = None) -> dict[str, Any]:
    """The :class:`StepInputs` fields that depend on neither batch nor seq (arguments as :func:`step_inputs`), by
    name: the estimator computes them once per setup (:mod:`memlab.predict.plan`) and :func:`step_inputs_with`
    adds the batch/seq terms."""
    pol = setup.policy
    impl = resolve_optimizer_impl(setup.optimizer, setup.optimizer_impl, device_type)
    adapters = setup.finetune in ("lora", "qlora")  # only fp32 adapters train (memlab.predict.finetune)
    opt_t = optimizer_temporary_bytes(setup.optimizer, impl, precision_policy("fp32") if adapters else pol,
                                      elements, largest, loop_peak)
    persistent = bool(pol.master_bytes and pol.grad_bytes == 4)
    if config is None:
        return {"layer_grad_bytes": 0.0, "tied_head_grad_bytes": 0.0, "optimizer_temporary_bytes": opt_t,
                "optimizer_before_step_bytes": before_step, "persistent_grads": persistent,
                "forward_logits_bytes_per_element": 4, "full_recompute": False}
    gb = 4 if adapters else pol.grad_bytes
    return {
        "layer_grad_bytes": layer_elements * gb,
        "tied_head_grad_bytes": 2 * config.vocab_size * config.d_model * gb / setup.tp
        if config.tied_embeddings and not adapters else 0.0,
        "optimizer_temporary_bytes": opt_t, "optimizer_before_step_bytes": before_step, "persistent_grads": persistent,
        "forward_logits_bytes_per_element": 4 if pol.compute_dtype == "fp32" else (8 if pol.autocast else 6),
        "full_recompute": setup.recompute == "full",
    }


def step_inputs_with(const: dict[str, Any], config: TransformerConfig | None, setup: Any, *, device_type: str,
                     terms: list | None = None) -> StepInputs:
    """:class:`StepInputs` from :func:`step_constants`' ``const`` and the batch/seq terms of ``setup``: built with
    :func:`~memlab.predict.frozen.unchecked` (once per estimate; StepInputs has no checks to skip)."""
    if config is None:
        return unchecked(StepInputs, {"logits_elements": 0, "layer_activation_bytes": 0, "layer_temporary_bytes": 0,
                                      "block_forward_bytes": 0, "recompute_inputs_bytes": 0, "head_loss_bytes": 0,
                                      **const, "input_bytes": 0})
    lt = _layer_terms(config, setup, device_type, terms)
    return unchecked(StepInputs, {
        "logits_elements": setup.batch * setup.seq * config.vocab_size / setup.tp,
        "layer_activation_bytes": lt["layer"], "layer_temporary_bytes": lt["temp"],
        "block_forward_bytes": lt["block_forward"], "recompute_inputs_bytes": lt["recompute_inputs"],
        "head_loss_bytes": lt["head"], **const, "input_bytes": lt["inputs"],
    })


def training_phases(p: Any, g: Any, o: Any, a: Any, x: StepInputs, *, grad_accum_steps: int = 1,
                    set_to_none: bool = True, overhead: Any = 0) -> list[tuple[str, str, Any]]:
    """``(step, phase, bytes)`` for the first and the steady step (module docstring); ``overhead`` is added to all.

    Works elementwise on numpy arrays (a vectorised sweep) as on scalars.
    """
    fwd_logits = x.forward_logits_bytes_per_element * x.logits_elements
    bwd_logits = 8 * x.logits_elements
    end = g + x.tied_head_grad_bytes
    out = []
    for step in STEPS:
        o_held = x.optimizer_before_step_bytes if step == "first" else o
        for micro in range(min(grad_accum_steps, 2)):
            first_micro = micro == 0
            holds = x.persistent_grads or not (first_micro and (step == "first" or set_to_none))
            g_held = g if holds else 0
            tag = "" if first_micro else " (accumulating)"
            base = p + o_held
            fwd = base + g_held + a + fwd_logits + LOSS_BYTES
            if x.full_recompute:
                fwd = larger(fwd, base + g_held + a - x.head_loss_bytes + x.block_forward_bytes)
            start = base + g_held + a + bwd_logits + LOSS_BYTES
            below = g if holds else larger(g - x.layer_grad_bytes, 0)
            bottom = base + below + x.layer_activation_bytes + x.layer_temporary_bytes + x.recompute_inputs_bytes
            out.append((step, "forward" + tag, fwd + overhead))
            out.append((step, "backward" + tag, larger(larger(start, bottom), base + end) + overhead))
        out.append((step, "optimizer step", p + g + o + x.optimizer_temporary_bytes + x.input_bytes + overhead))
        out.append((step, "zero_grad", p + o + (0 if set_to_none and not x.persistent_grads else g) + x.input_bytes
                    + overhead))
    return out


def inference_phases(weights: Any, kv: Any, prefill_transient: Any, decode_transient: Any,
                     overhead: Any = 0) -> list[tuple[str, str, Any]]:
    """``(step, phase, bytes)`` for inference: ``prefill`` then ``decode`` (step is ``steady`` for both)."""
    return [("steady", "prefill", weights + kv + prefill_transient + overhead),
            ("steady", "decode", weights + kv + decode_transient + overhead)]


def peak_of(phases: list[tuple[str, str, Any]]) -> Any:
    """The largest phase bytes (elementwise for arrays)."""
    peak = phases[0][2]
    for _, _, v in phases[1:]:
        peak = np.maximum(peak, v)
    return peak
