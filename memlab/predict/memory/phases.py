"""When the bytes appear: predicted bytes held at each phase of a training step (or inference), and the peak.

A step never holds gradients and all activations at once, and it holds transients that the sum of components
has no term for. This module predicts the **peak inside** each phase, for the **first** step (optimizer state
appears inside its optimizer step) and the **steady** state, from the components the estimator already has.
``P``, ``G``, ``O``, ``A`` are per-device parameters, gradients, optimizer state and saved activations; ``t`` tokens
per micro-batch, ``V`` the vocabulary (divided by ``tp``), ``h`` the model width.

- forward: ``P + O + G_held + A + logits`` where the fp32 logits are alive while the loss is computed (``4tV``;
  ``6tV`` when the head computes in 16 bits: the 16-bit logits and their fp32 copy; under autocast also the fp32
  final-norm output, ``4th``, as traced); under full recompute also inside a block's forward (d_ff-wide tensors).
- first step: no optimizer state yet, except what a master-weight wrapper allocates up front (the fp32 copy).
- backward, the largest of three moments (gradients appear while activations are freed, both linearly in the
  layers, so the largest is at an end or at the bottom layer):
  start, ``P + O + G_held + A + 8tV`` (the gradients of the log-softmax and of the logits, fp32);
  bottom layer, ``P + O + G - G_layer - G_emb + ids + A_layer + max(T_layer, M_mlp)`` (one block's saved tensors
  as without recompute less its MLP's; its backward temporaries ``T_layer``: the d_ff-wide gradients or the s x s
  score gradients of eager/math attention, three h-wide ones; or the moment inside its MLP's backward ``M_mlp``: the
  MLP's saved tensors but the down projection's input, its d_ff-wide gradients, the output's gradient and the down
  projection's gradients, :func:`_mlp_moment`; the embeddings' gradients ``G_emb`` come after it; under full
  recompute no other checkpoint's input is alive by then, and block 0's is its first norm's input);
  end, ``P + O + G + ids`` plus the gradient of the embeddings' output while their backward runs or, for tied
  embeddings, the head's and the embedding's gradients before they are summed.
- optimizer step: ``P + G + O + T_opt`` with ``T_opt`` by implementation ([pytorch-optim], torch/optim/adamw.py):
  for-loop Adam keeps two temporaries of the tensor being stepped (``sqrt`` and the division) beside the previous
  tensor's ``denom``, still bound to the loop variable (2 x a tensor + the one before it, at worst); foreach one
  temporary per parameter at once (``_foreach_sqrt``: all parameters, state dtype, 4 B/param in fp32); fused
  none; SGD none; a master-weight wrapper holds fp32 copies of every 16-bit gradient during the step (4 B/param).
  In the first step ``O`` is allocated inside this phase.
- the loss (``Setup.loss``, ``logits_to_keep``; :mod:`memlab.predict.memory.loss`): :func:`loss_transients` gives the
  end-of-forward and start-of-backward transients in place of the plain ``4tV``-``8tV`` and ``8tV`` terms.
- activation offload (``Setup.offload_activations``, save_on_cpu): the forward and backward-start moments hold the
  loop's token ids and the loss's saved tensors (copied back) instead of ``A``; the bottom-layer moment is kept.
- zero_grad: what is held *after* it, ``P + O`` (+ ``G`` with ``set_to_none=False``); the batch's token ids are
  held by the loop through the optimizer step and after it.
- gradient accumulation (``grad_accum_steps > 1``): from the second micro-batch on, ``G_held = G`` (gradients
  persist across micro-steps): phases ``forward (accumulating)``, ``backward (accumulating)``.
- inference: ``prefill`` = weights + KV + the largest prefill transient; ``decode`` = weights + KV + one token's.

Every side of the comparison gives its phases as :class:`PhaseRow` records (the estimate, the trace, the runner's
in-step peaks, the live counter) and looks one up with :func:`find_phase`.

Terms were checked against ``memlab.tracing.tracer`` (MemTracker on fake tensors [pytorch-memtracker], the reference
GPT): the start-of-backward and optimizer-step terms are exact; the bottom-layer term is within a few per cent.
Pure numpy arithmetic (works on arrays of batch/seq); no torch. Units: bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from memlab.errors import MemlabError, SetupError
from memlab.predict.memory.activations import (
    autocast_bias_copy_bytes,
    autocast_block_copy_bytes,
    shared_widths,
    split_by_checkpoint,
    term_rows,
)
from memlab.predict.memory.family_terms import loss_call_transients
from memlab.predict.memory.loss import chunk_tokens, hf_kept_labels, kept_copy, kept_positions, targets_saved
from memlab.predict.memory.rows import RowName
from memlab.predict.memory.states import ADAM_8BIT_BLOCK, ADAM_8BIT_MIN_SIZE, optimizer_state_dtype_bytes
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.precision import precision_policy
from memlab.predict.spec.setup import CHECKPOINTED, resolve_optimizer_impl

PHASES = ("forward", "backward", "optimizer step", "zero_grad")
"""Training phases in step order (``zero_grad`` is the bytes held after it; the others the peak inside)."""
STEPS = ("first", "steady")

_MODEL_LEVEL = ("token ids", "head & loss")
_NOT_PER_LAYER = (*_MODEL_LEVEL, "mlp")
"""Categories left out of one block's saved bytes (besides the final norm and the LM head's 16-bit copy)."""
_HEAD_COPY = RowName.HEAD_COPY
_TOKEN_IDS = (RowName.INPUT_IDS, RowName.TARGET_IDS)
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
    held after it) and is None otherwise; the measured-side fields are empty."""
    return PhaseRow(step, phase, peak_bytes, end_bytes=peak_bytes if phase == "zero_grad" else None)


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
    """What the checkpoints keep at the bottom block's backward (:func:`_held_at_bottom`; 0 without recompute)."""
    checkpoint_inputs_bytes: Any
    """Under full recompute, every checkpoint's input (the blocks' inputs), all held at the end of the forward
    (FSDP2's copy-out moment of the last block); ``recompute_inputs_bytes`` is what the bottom block's backward
    still holds of them."""
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
    """Transient logits bytes per element at the end of forward: 4 (fp32), 6 (16-bit logits and their fp32 copy;
    autocast too)."""
    full_recompute: bool
    input_bytes: Any = 0
    """The batch's token ids (counted in A while saved; held by the training loop through the whole step)."""
    loss_forward_bytes: Any = 0
    """Transient bytes of the LM head and loss at the end of forward, beyond what they keep
    (:func:`loss_transients`)."""
    loss_backward_bytes: Any = 0
    """Transient bytes of the loss's backward at the start of backward, beyond what it keeps."""
    head_input_bytes: Any = 0
    """The LM head's saved input (part of ``head_loss_bytes``)."""
    unsaved_input_bytes: Any = 0
    """Token ids the loop holds that no op saves (the fused loss's targets; copied kept positions'): in
    ``input_bytes``, not in A."""
    lowest_checkpoint_bytes: Any = None
    """Under ``recompute_every`` k > 1, held beyond the gradients at the backward of the lowest checkpointed block
    (block k - 1): the k - 1 blocks below it with everything they keep, its input, and its recomputed tensors and
    temporaries as the bottom block's (0 otherwise)."""
    blocks_below_checkpoint: int = 0
    """k - 1 under ``recompute_every`` k: the blocks below the lowest checkpointed one."""
    top_layer: bool = False
    """Count the top block's backward moment (A held, its temporaries and gradients): set for the non-plain losses
    and kept positions, where no t x V gradient dominates the start of backward (an upper bound)."""
    offload: bool = False
    """Saved activations live on the host (``Setup.offload_activations``): the device keeps only the token ids the
    loop holds, and takes each saved tensor back when backward reads it (the loss's at the start of backward)."""
    cast_cache_bytes: float = 0.0
    """Autocast's cast cache beyond what is saved for backward, held until the autocast region (the forward) ends:
    16-bit copies of every block's linear biases (saved by no op), and under full recompute of every block's weights
    too (without full recompute those are saved, in ``A``); 0 without autocast."""
    final_norm_output_bytes: Any = 0
    """Under autocast, the fp32 final-norm output the forward still holds (a local variable) while the loss is
    computed inside it: the head saved its 16-bit copy, so it is in no saved term (``4 t h``, as traced); 0 when
    the loss is computed outside the model (the forward has returned)."""
    offload_forward_bytes: Any = 0
    """Under activation offload and autocast, what the device still holds at the end of forward beyond the token ids
    and the loss's saved tensors: autocast's cast cache keeps the 16-bit weight copies that the saved tensors (now
    on the host) shared, every block's (without full recompute; with it they are in ``cast_cache_bytes``) and, for
    the plain loss, the head's; and the head's saved input, its 16-bit cast, has gone to the host (the fp32 hidden
    state it was cast from is ``final_norm_output_bytes``). 0 without offload or autocast."""
    block_saved_bytes: Any = 0
    """Without recompute, one block's saved bytes, its MLP's included (what each block below the one in backward
    still holds: :func:`memlab.predict.memory.fsdp.moments`' mid-backward moment); 0 otherwise."""
    fsdp: dict[str, float] | None = None
    """FSDP2's additions per moment (:func:`memlab.predict.memory.fsdp.moments`, plus ``root_grads_shard``: the root's
    sharded gradient bytes, which appear only at the end of backward; ``embed_grads_shard``: the embedding unit's,
    reduce-scattered only after block 0's backward; ``inputs_only``: 1.0 when every block keeps exactly its input,
    so that the last block's copy-out moment is modelled); None without FSDP2."""
    mlp_moment_bytes: Any = 0
    """Beyond ``layer_activation_bytes``, inside the bottom block's MLP backward: its MLP's saved tensors but the
    down projection's input (freed when that projection's backward ends), the MLP's backward temporaries (the
    d_ff-wide gradients of ``layer_temporary_bytes``) and the block output's gradient (h wide)."""
    down_grad_bytes: float = 0.0
    """The bottom block's down projection's gradients (weight and bias), made before its MLP's moment (0 for a
    mixture of experts: its experts' are named with the block's own gradients); under FSDP2 unsharded, in the
    gathered dtype (``MixedPrecisionPolicy.param_dtype``), until the block's reduce-scatter."""
    bottom_input_bytes: Any = 0
    """The loop's token ids (``input_bytes``) at the bottom block's moments (0 under torchtitan's ``op`` policy,
    whose bottom-block moment is the one measured before these terms:
    tests/predict/memory/test_recompute_policies.py)."""
    embedding_input_grad_bytes: Any = 0
    """At the end of backward, the gradient of the embeddings' output (``t h``, the residual width) while the
    embeddings' backward makes their gradients (0 where they do not train, under FSDP2, under ``op`` and under
    activation offload, where the traced end of backward holds no such tensor beside the gradients)."""
    embedding_grad_bytes: float = 0.0
    """The embeddings' gradients (positions; tokens when untied: a tied one is the head's, made at the top), made
    after the bottom block's backward: not yet there at its moments unless gradients are held from the start."""


def layer_terms(config: TransformerConfig, setup: Any, device_type: str, own: list | None = None) -> dict[str, Any]:
    """One block's terms on one tp rank: saved bytes (without recompute, less the MLP's), backward temporaries,
    the transient of its forward, and the model-level head/loss and recompute terms. ``own``: the setup's
    :func:`~memlab.predict.memory.activations.term_rows` when the caller has listed them (listed here otherwise)."""
    from memlab.predict.memory.activations import row_divisor  # (an import line of its own would not fit 500 lines)

    tp, sp = setup.tp, setup.sp
    if own is None:
        own = term_rows(config, setup, device_type=device_type)
    # Each sum adds its rows in list order (as ``sum`` over the ActivationTerms did); a row is (name, category, count,
    # width, sharded[, note]), its bytes count * width / row_divisor(row, tp, sp) (ActivationTerm.bytes).
    # Without recompute the block's terms are the setup's own, picked out of them; otherwise listed as without
    # recompute, block rows only (model_level=False: the rows the filter below leaves out are not listed).
    per = recompute_inputs = head = inputs = head_input = mlp_saved = 0
    copies = False  # the block saves autocast's 16-bit weight copies (the down projection's among them)
    own_is_block = setup.recompute == "none"
    whole = 0  # one block's saved bytes as without recompute, its MLP's included (recompute_every's moment)
    if not own_is_block:
        for row in term_rows(config, setup, device_type=device_type, recompute="none", model_level=False):
            size = row[2] * row[3] / row_divisor(row, tp, sp)
            whole += size
            if row[1] != "mlp":
                per += size
            else:
                mlp_saved += size
            copies = copies or row[1] == "autocast weight copies"
    for row in own:
        name, category = row[0], row[1]
        size = row[2] * row[3] / row_divisor(row, tp, sp)
        in_block = category not in _MODEL_LEVEL and not name.startswith("final norm") and name != _HEAD_COPY
        if own_is_block and in_block:
            whole += size
            if category != "mlp":
                per += size
            else:
                mlp_saved += size
        copies = copies or (own_is_block and category == "autocast weight copies")
        if category == "block inputs (recompute)":
            recompute_inputs += size
        elif category == "head & loss":
            head += size
            if name == RowName.HEAD_INPUT:
                head_input += size
        if name in _TOKEN_IDS:
            inputs += size
    w = shared_widths(setup.policy.name, device_type)
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
        "mlp_moment": _mlp_moment(config, setup, w, mlp_saved / config.n_layers, copies, mlp),
        "block_forward": mlp + t * config.d_model * w["compute"],
        "recompute_inputs": recompute_inputs,
        "block": whole / config.n_layers,
        "head": head, "head_input": head_input,
        "inputs": inputs,
    }


def _mlp_moment(config: TransformerConfig, setup: Any, w: dict[str, int], saved: Any, copies: bool, temps: Any) -> Any:
    """Held beyond the rest of the bottom block's saved tensors inside its MLP's backward, at the MLP's d_ff-wide
    gradients (``temps``): the MLP's ``saved`` tensors but the down projection's input and (``copies``: under
    autocast) its 16-bit weight copy, which only that projection's backward read and which are freed when it ends,
    and the block output's gradient (h wide); under autocast, before the activation's gradients, the down
    projection's 16-bit weight gradient beside its fp32 cast and its input's gradient, if larger. Traced on the
    reference GPT (SwiGLU: the gate's and up projection's outputs and the SiLU's beside three d_ff-wide gradients;
    GELU: its input beside two; 1-32 layers, fp32, bf16 and bf16 autocast: to tens of bytes,
    tests/predict/memory/test_bottom_block.py). A mixture of experts' MLP rows are one dense MLP per token: its
    routed copies and the experts' own order are named (memlab.predict.coverage, MoE routing)."""
    t = setup.batch * setup.seq
    weight16 = copies * config.ffn * config.d_model * 2 / setup.tp
    down = t * config.ffn * w["compute"] / setup.tp + weight16
    # under autocast the down projection's 16-bit weight gradient is cast to fp32 for AccumulateGrad beside its
    # input's gradient, before the activation's backward makes the other d_ff-wide ones: the larger moment
    temps = larger(temps, t * config.ffn * w["compute"] / setup.tp + weight16)  # (its input's gradient beside)
    return saved - down + temps + t * config.d_model * w["residual"]


def _held_at_bottom(config: TransformerConfig, setup: Any, kept: Any) -> Any:
    """Of ``kept``, the bytes every checkpoint keeps (block inputs; under ``op`` also the policy's outputs), what the
    bottom block's backward moment counts: all of them under full recompute of every block (as calibrated on the
    reference GPT's trace, tests/studies/test_setup_draws.py), none under ``recompute_every`` > 1 (block 0 runs
    without a checkpoint, and the others' have been freed by their backward), block 0's share under ``op`` (the
    policy's outputs are many per block: the others' are freed by then, measured on fake-tensor traces,
    tests/predict/memory/test_recompute_policies.py)."""
    if setup.recompute == "op":
        return kept / config.n_layers
    return 0


def _lowest_checkpoint(config: TransformerConfig, setup: Any, lt: dict[str, Any]) -> Any:
    """:attr:`StepInputs.lowest_checkpoint_bytes` from :func:`layer_terms`' ``lt``: None unless full recompute of
    every k-th block (k > 1) checkpoints one at least; the k - 1 blocks below the lowest keep everything
    (``lt["block"]`` each), it keeps its input and recomputes (one block's ``layer`` and ``temp``)."""
    k, n = setup.recompute_every, config.n_layers
    if setup.recompute != "full" or k == 1 or k > n:
        return None
    return (k - 1) * lt["block"] + lt["layer"] + lt["temp"] + lt["recompute_inputs"] / (n // k)


def _mid_backward(x: StepInputs, f: dict[str, float], bottom: Any, holds: bool) -> Any:
    """FSDP2 ZeRO-3's moment in block k's backward (k = 1 or L - 2, linear in k): the bottom block's moment with
    block k's prefetch (``f["mid"]``) and the saved tensors of the blocks below it, less their gradients; block k's
    MLP moment holds its down projection's unsharded gradient as the bottom block's does (``down_grad_bytes``, in
    the gathered dtype): the torchtitan peer's small model at 8 ranks without recompute, 24,584 B low before, 8 B
    now (tests/predict/memory/test_fsdp.py)."""
    slope = x.block_saved_bytes - (0 if holds else x.layer_grad_bytes)
    return bottom + f["mid"] + larger(slope, slope * f["mid_blocks"])


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
    tensor + the previous one, :attr:`memlab.predict.memory.sharding.ShapeSummary.loop_peak_elements`; default 2 x
    ``largest``).
    """
    sb = optimizer_state_dtype_bytes(policy)
    if impl == "fused" or optimizer in ("sgd", "sgd-momentum"):
        core = 0
    elif impl == "foreach":
        core = sb * elements
    elif optimizer in ("adam-8bit", "paged-adam-8bit"):
        core = adam8bit_step_bytes(largest, sixteen_bit_grads=sb == 2)
    else:
        core = sb * (2 * largest if loop_peak is None else loop_peak)
    wrapper = 4 * elements if (policy.master_bytes and not policy.grad_accum_bytes and policy.grad_bytes == 2) else 0
    return float(core + wrapper)


def adam8bit_step_bytes(largest: int, *, sixteen_bit_grads: bool) -> int:
    """Temporaries of memlab's 8-bit Adam step (:class:`memlab.model.optimizers.Adam8bit`, the stand-in for
    bitsandbytes' AdamW8bit and PagedAdamW8bit) at its worst, the largest tensor's ``n`` elements, bytes: its two
    moments decoded to fp32 and padded to whole blocks of 256 (``8 * ceil(n / 256) * 256``) beside the
    bias-corrected first moment and ``denom`` (``8 n``), and a 16-bit gradient's fp32 copy (``4 n``); a tensor under
    4096 elements keeps fp32 moments and has only the last two (the moment each update holds, step by step, in the
    stand-in's docstring; checked against its trace, tests/predict/memory/test_paged_optimizers.py)."""
    grad = 4 * largest if sixteen_bit_grads else 0
    if largest < ADAM_8BIT_MIN_SIZE:
        return 8 * largest + grad
    return 8 * ADAM_8BIT_BLOCK * math.ceil(largest / ADAM_8BIT_BLOCK) + 8 * largest + grad


def step_inputs(config: TransformerConfig | None, setup: Any, *, device_type: str, elements: int, largest: int,
                layer_elements: int, before_step: float = 0.0, loop_peak: int | None = None,
                terms: list | None = None) -> StepInputs:
    """:class:`StepInputs` of ``config`` under ``setup`` (``config=None``: a bare count, no activation terms).

    ``elements``/``largest``/``layer_elements``: parameters on this device, its largest tensor, one block's;
    ``before_step``: optimizer-side bytes allocated before the first step (master copy, accumulation buffer);
    ``terms``: the setup's :func:`~memlab.predict.memory.activations.term_rows` when the caller has listed them.
    """
    const = step_constants(config, setup, device_type=device_type, elements=elements, largest=largest,
                           layer_elements=layer_elements, before_step=before_step, loop_peak=loop_peak)
    return step_inputs_with(const, config, setup, device_type=device_type, terms=terms)


def step_constants(config: TransformerConfig | None, setup: Any, *, device_type: str, elements: int, largest: int,
                   layer_elements: int, before_step: float = 0.0, loop_peak: int | None = None,
                   fsdp: Any = None) -> dict[str, Any]:
    """The :class:`StepInputs` fields that depend on neither batch nor seq (arguments as :func:`step_inputs`), by
    name: the estimator computes them once per setup (:mod:`memlab.predict.memory.plan`) and :func:`step_inputs_with`
    adds the batch/seq terms."""
    pol = setup.policy
    impl = resolve_optimizer_impl(setup.optimizer, setup.optimizer_impl, device_type)
    adapters = setup.finetune in ("lora", "qlora")  # only fp32 adapters train (memlab.predict.memory.finetune)
    opt_t = optimizer_temporary_bytes(setup.optimizer, impl, precision_policy("fp32") if adapters else pol,
                                      elements, largest, loop_peak)
    persistent = bool(pol.master_bytes and pol.grad_bytes == 4)
    if config is None:
        return {"layer_grad_bytes": 0.0, "tied_head_grad_bytes": 0.0, "optimizer_temporary_bytes": opt_t,
                "optimizer_before_step_bytes": before_step, "persistent_grads": persistent,
                "forward_logits_bytes_per_element": 4, "full_recompute": False, "offload": False, "fsdp": None,
                "cast_cache_bytes": 0.0}
    gb = 4 if adapters else pol.grad_bytes
    op = setup.recompute == "op"  # its bottom-block moment as measured (StepInputs.bottom_input_bytes)
    extra = None
    if fsdp is not None:
        from memlab.predict.memory.fsdp import moments

        extra = dict(moments(fsdp))
        extra["root_grads_shard"] = sum(u.shard_elements for u in fsdp.units if u.kind == "root") * gb
        # a unit of its own (the torchtitan plan), the embedding reduce-scatters after block 0's backward
        extra["embed_grads_shard"] = sum(u.shard_elements for u in fsdp.units if u.kind == "embed") * gb
        # every block keeps exactly its input (the copy-out moment's activations are the token ids and the inputs)
        extra["inputs_only"] = float(setup.recompute == "full" and setup.recompute_every == 1
                                     and not setup.offload_activations)
    return {
        "layer_grad_bytes": layer_elements * gb,
        # (under FSDP2 the root's gradients are its moments', and named: memlab.predict.coverage)
        "embedding_grad_bytes": 0.0 if adapters or setup.finetune == "frozen" or fsdp is not None or op
        else _embedding_elements(config) * gb / setup.tp,
        # under FSDP2 the block's unsharded gradient, in the gathered dtype, until its reduce-scatter
        "down_grad_bytes": 0.0 if op or adapters or setup.finetune == "frozen"
        else _down_grad_elements(config, setup.tp) * (fsdp.grad_bytes if fsdp is not None else gb),
        "tied_head_grad_bytes": 2 * config.vocab_size * config.d_model * gb / setup.tp
        if config.tied_embeddings and not adapters else 0.0,
        "optimizer_temporary_bytes": opt_t, "optimizer_before_step_bytes": before_step, "persistent_grads": persistent,
        "forward_logits_bytes_per_element": 4 if pol.compute_dtype == "fp32" else 6,
        "full_recompute": setup.recompute in CHECKPOINTED, "offload": setup.offload_activations, "fsdp": extra,
        # the checkpointed blocks' weight copies (saved by no op; recompute_every: every k-th block's); a frozen base:
        # only what trains is cached
        "cast_cache_bytes": _cast_cache(config, setup) if pol.autocast else 0.0,
    }


def _embedding_elements(config: TransformerConfig) -> int:
    """Elements of the embeddings whose gradients come after the blocks' backward: positions, and tokens when untied
    (a tied table's gradient is the head's, made at the top of backward)."""
    return sum(math.prod(shape) for name, shape, _ in config.param_shapes()
               if name.startswith("pos_emb.") or (name.startswith("tok_emb.") and not config.tied_embeddings))


def _down_grad_elements(config: TransformerConfig, tp: int) -> float:
    """Elements of block 0's down projection's gradients on one tp rank (row-parallel: the weight split, the bias
    whole); 0 for a mixture of experts (its bottom block is taken as one moment, named)."""
    if config.is_moe:
        return 0.0
    return sum(math.prod(shape) / (tp if name.endswith("weight") else 1) for name, shape, _ in config.param_shapes()
               if name.startswith("blocks.0.mlp.down."))


def _cast_cache(config: TransformerConfig, setup: Any) -> float:
    """:attr:`StepInputs.cast_cache_bytes` under autocast (a frozen base: only what trains is cached,
    :func:`memlab.predict.memory.finetune.autocast_cache_bytes`)."""
    blocks = _block_copies(config, setup, 1)  # the checkpointed blocks' (recompute_every: every k-th block's)
    biases = autocast_bias_copy_bytes(config, setup.tp)
    if setup.finetune == "full":
        return blocks + biases
    from memlab.predict.memory.finetune import autocast_cache_bytes

    return autocast_cache_bytes(config, setup, blocks, biases)


def step_inputs_with(const: dict[str, Any], config: TransformerConfig | None, setup: Any, *, device_type: str,
                     terms: list | None = None) -> StepInputs:
    """:class:`StepInputs` from :func:`step_constants`' ``const`` and the batch/seq terms of ``setup``."""
    if config is None:
        return StepInputs(**{"logits_elements": 0, "layer_activation_bytes": 0, "layer_temporary_bytes": 0,
                                      "block_forward_bytes": 0, "recompute_inputs_bytes": 0,
                                      "checkpoint_inputs_bytes": 0, "head_loss_bytes": 0,
                                      **const, "input_bytes": 0, "loss_forward_bytes": 0, "loss_backward_bytes": 0,
                                      "head_input_bytes": 0, "unsaved_input_bytes": 0, "top_layer": False,
                                      "offload_forward_bytes": 0, "final_norm_output_bytes": 0})
    lt = layer_terms(config, setup, device_type, terms)
    mask = 8 * setup.batch * setup.seq * (setup.attention_mask != "none")  # an HF call's int64 mask, the loop's
    if setup.loss == "plain" and not setup.logits_to_keep:  # the default, without a call
        logits = setup.batch * setup.seq * config.vocab_size / setup.tp
        fwd, bwd = (n * logits for n in loss_call_transients(setup, const["forward_logits_bytes_per_element"], 8))
        unsaved, top = 0, False
    else:
        logits = setup.batch * kept_positions(setup) * config.vocab_size / setup.tp
        fwd, bwd = loss_transients(config, setup, logits, const["forward_logits_bytes_per_element"], device_type)
        # the top block's moment, unless a checkpoint recomputes it (recompute_every k: when k divides the layers)
        top = not setup.offload_activations and (setup.recompute not in CHECKPOINTED
                                                 or config.n_layers % setup.recompute_every != 0)
        # targets no op saves are still held by the training loop
        padded = config.impl.loss_labels_padded
        unsaved = (1 - targets_saved(setup, padded)) * setup.batch * setup.seq * 8
        # the loop holds the step's ids; HF's padded copy of the kept labels (the target row then) is not the loop's
        b = setup.batch
        lt["inputs"] += unsaved - hf_kept_labels(setup, padded) * (b * kept_positions(setup) + (b == 1)) * 8
    off_fwd = 0
    if setup.offload_activations and setup.policy.autocast:
        plain = setup.loss == "plain"
        head_copy = (config.vocab_size * config.d_model
                     + config.vocab_size * (config.impl.head_bias and not config.tied_embeddings)) * 2 / setup.tp
        off_fwd = _block_copies(config, setup, 0) + plain * (head_copy - lt["head_input"])
    return StepInputs(**{
        "offload_forward_bytes": off_fwd,
        "logits_elements": logits,
        "layer_activation_bytes": lt["layer"], "layer_temporary_bytes": lt["temp"],
        "mlp_moment_bytes": lt["mlp_moment"] * (setup.recompute != "op"),
        "block_forward_bytes": lt["block_forward"],
        "recompute_inputs_bytes": _held_at_bottom(config, setup, lt["recompute_inputs"]),
        "checkpoint_inputs_bytes": lt["recompute_inputs"],
        "block_saved_bytes": lt["block"] if setup.recompute == "none" else 0,
        "lowest_checkpoint_bytes": _lowest_checkpoint(config, setup, lt),
        "blocks_below_checkpoint": setup.recompute_every - 1 if setup.recompute == "full" else 0,
        "head_loss_bytes": lt["head"], **const, "input_bytes": lt["inputs"] + mask,
        "loss_forward_bytes": fwd, "loss_backward_bytes": bwd, "head_input_bytes": lt["head_input"],
        "unsaved_input_bytes": unsaved + mask, "top_layer": top,
        "bottom_input_bytes": (lt["inputs"] + mask) * (setup.recompute != "op"),
        "embedding_input_grad_bytes": setup.batch * setup.seq * config.d_model
        * shared_widths(setup.policy.name, device_type)["residual"] / (setup.tp if setup.sp else 1)
        * (setup.recompute != "op" and const["fsdp"] is None and setup.finetune == "full"
           and not setup.offload_activations),
        # the plain loss inside the model under autocast (not a hand-written one): the fp32 final-norm output lives
        "final_norm_output_bytes": 4 * setup.batch * setup.seq * config.d_model / (setup.tp if setup.sp else 1)
        if setup.policy.autocast and setup.loss == "plain" and not setup.logits_to_keep and setup.loss_call == "labels"
        and not (const["fsdp"] is not None and setup.fsdp_loss == "outside") else 0,
    })


def _block_copies(config: TransformerConfig, setup: Any, checkpointed: int) -> float:
    """Autocast's 16-bit copies of the blocks' weights (bytes on one tp rank) of the blocks that run with a checkpoint
    (``checkpointed=1``: their ops save none, the cast cache holds them) or without one (0: saved for backward)."""
    part = split_by_checkpoint(config, setup)[checkpointed]
    return autocast_block_copy_bytes(part, setup.tp) if part is not None else 0.0


def loss_transients(config: TransformerConfig, setup: Any, logits: Any, per_logit: float,
                    device_type: str) -> tuple[Any, Any]:
    """(end of forward, start of backward) transient bytes of the LM head and loss beyond what they keep, on one
    tp rank (:mod:`memlab.predict.memory.loss`). ``logits``: the elements of one logits tensor (``t' V / tp``);
    ``per_logit``: bytes per logit alive at the end of a plain forward (4, 6 or 8).

    plain: ``per_logit x logits`` and ``8 x logits`` (the fp32 gradients of the log-softmax and the logits).
    chunked: one chunk's fp32 logits and log-softmax (``8 c V``) and three fp32 scalars (the running sum, the
    chunk's loss and total_weight) in forward; in backward the recomputed chunk beside its gradients.
    fused: one chunk's logits, log-softmax and gradient in forward; nothing in backward (the kept gradients are
    scaled in place and handed on).
    """
    kind = setup.loss
    w = shared_widths(setup.precision, device_type)
    V, h, cw = config.vocab_size, config.d_model, w["compute"]
    # with the kept positions copied (activations.loss_rows), the whole hidden state is alive while the loss runs
    hidden = kept_copy(setup) * setup.batch * setup.seq * h * cw
    if kind == "plain":
        return per_logit * logits + hidden, 8 * logits
    tk = setup.batch * kept_positions(setup)
    c = chunk_tokens(tk, V, h, setup.loss_chunk)
    chunk_logits = c * V / setup.tp
    gb = setup.policy.grad_bytes
    # under autocast the 16-bit copy of the head weight (and bias) autocast caches until forward ends: no op saves
    # it (the chunks' checkpoints and the fused loss save none of their intermediates)
    copy = (V * h + V * (config.impl.head_bias and not config.tied_embeddings)) * 2 / setup.tp \
        if setup.policy.autocast else 0
    if kind == "chunked":
        # backward, the first chunk: the recomputed chunk (logits, log-softmax) beside its fp32 gradients, then
        # its weight gradient (h x V), made contiguous for AccumulateGrad, beside the log-softmax; with the input's
        # gradient buffer (t' h) and the chunk's (c h). The larger of the two moments, each taken at its most (an
        # upper bound: the trace is within a few per cent below it, tests/predict/memory/test_loss_offload.py)
        around = (tk + c) * h * cw + 4
        # under autocast the weight's gradient is the matmul's 16-bit one and its fp32 cast for AccumulateGrad (2 + 4
        # bytes per weight, as traced), not three copies in the gradient dtype
        weight_grad = (2 + gb if setup.policy.autocast else 3 * gb) * V * h / setup.tp
        return 8 * chunk_logits + 12 + hidden + copy, larger(16 * chunk_logits, 4 * chunk_logits + weight_grad) + around
    # fused: the head's input (the forward's hidden state, t x h) is alive beside the chunk, and the cast cache
    t = setup.batch * setup.seq
    return 8 * chunk_logits + t * h * w["residual"] + copy, 0


def training_phases(p: Any, g: Any, o: Any, a: Any, x: StepInputs, *, grad_accum_steps: int = 1,
                    set_to_none: bool = True, overhead: Any = 0) -> list[tuple[str, str, Any]]:
    """``(step, phase, bytes)`` for the first and the steady step (module docstring); ``overhead`` is added to all.

    Works elementwise on numpy arrays (a vectorised sweep) as on scalars.
    """
    fwd_logits, bwd_logits = x.loss_forward_bytes, x.loss_backward_bytes
    # the embeddings' backward: every gradient, the gradient of their output, and the loop's token ids; tied, the
    # head's gradient waits beside the embedding's for their sum (then the output's gradient is gone)
    end = g + x.bottom_input_bytes + larger(x.tied_head_grad_bytes,
                                            x.tied_head_grad_bytes / 2 + x.embedding_input_grad_bytes)
    f = x.fsdp
    if f is not None:  # FSDP2: the root's gradients stay full until its reduce-scatter ends backward
        end = g - f["root_grads_shard"] + f["end"] + x.tied_head_grad_bytes
    out = []
    for step in STEPS:
        o_held = x.optimizer_before_step_bytes if step == "first" else o
        for micro in range(min(grad_accum_steps, 2)):
            first_micro = micro == 0
            holds = x.persistent_grads or not (first_micro and (step == "first" or set_to_none))
            g_held = g if holds else 0
            tag = "" if first_micro else " (accumulating)"
            base = p + o_held
            # offload: the device keeps the loop's token ids, and the loss's saved tensors while the loss runs
            a_fwd = x.input_bytes + x.head_loss_bytes + x.offload_forward_bytes if x.offload \
                else a + x.unsaved_input_bytes
            fwd = base + g_held + a_fwd + fwd_logits + x.final_norm_output_bytes + LOSS_BYTES + x.cast_cache_bytes \
                + (f["forward"] if f else 0)
            if x.full_recompute:
                # (under full recompute offload_forward_bytes is the head's part only, not there yet)
                fwd = larger(fwd, base + g_held + a_fwd - x.head_loss_bytes
                             - (x.offload_forward_bytes if x.offload else 0) + x.block_forward_bytes
                             + x.cast_cache_bytes + (f["block_forward"] if f else 0))
                if f and f["inputs_only"]:  # FSDP2: the last block's copy-out, the unit before it still gathered
                    fwd = larger(fwd, base + g_held + x.input_bytes + x.unsaved_input_bytes
                                 + x.checkpoint_inputs_bytes + x.cast_cache_bytes + f["copy_out"])
            # offload: the loss's saved tensors but the head's input copied back at the start of backward
            a_start = (x.input_bytes + x.head_loss_bytes - x.head_input_bytes if x.offload
                       else a + x.unsaved_input_bytes)
            start = base + g_held + a_start + bwd_logits + LOSS_BYTES + (f["start"] if f else 0)
            below = g if holds else larger(g - x.layer_grad_bytes, 0)
            if f:
                below = below - (0 if holds else f["root_grads_shard"] + f["embed_grads_shard"]) \
                    + f["root_grads_full"] + f["bottom"]
            # the bottom block's backward: its attention's moment or, before it, its MLP's (the down projection's
            # gradients made)
            bottom = base + below - (0 if holds else x.embedding_grad_bytes) + x.bottom_input_bytes \
                + x.layer_activation_bytes + x.recompute_inputs_bytes + larger(
                x.layer_temporary_bytes, x.mlp_moment_bytes + (0 if holds else x.down_grad_bytes))
            back = larger(larger(start, bottom), base + end)
            if f and f["mid_blocks"]:  # FSDP2 ZeRO-3: block k's backward, k = 1 or L - 2 (linear in k)
                back = larger(back, _mid_backward(x, f, bottom, holds))
            if x.lowest_checkpoint_bytes is not None:  # recompute_every: the lowest checkpointed block's moment,
                # before the k - 1 blocks below it have gradients (unless gradients are held from the start)
                below_k = below if holds else below - (x.blocks_below_checkpoint * x.layer_grad_bytes)
                back = larger(back, base + below_k + x.lowest_checkpoint_bytes)
            if x.top_layer:  # the top block's backward with (nearly) all activations held: no logits term hides it
                back = larger(back, base + g_held + a_start - x.head_input_bytes + x.layer_temporary_bytes
                              + (0 if holds else x.layer_grad_bytes))
            out.append((step, "forward" + tag, fwd + overhead))
            out.append((step, "backward" + tag, back + overhead))
        out.append((step, "optimizer step", p + g + o + x.optimizer_temporary_bytes + x.input_bytes + overhead))
        out.append((step, "zero_grad", p + o + (0 if set_to_none and not x.persistent_grads else g) + x.input_bytes
                    + overhead))
    return out


def inference_phases(weights: Any, prefill: Any, decode: Any, overhead: Any = 0) -> list[tuple[str, str, Any]]:
    """``(step, phase, bytes)`` for inference: ``prefill`` then ``decode`` (step is ``steady`` for both), each the
    weights, the overheads and what the phase holds at its largest moment (KV cache, token ids, transient:
    :func:`memlab.predict.memory.breakdown.inference_terms`)."""
    return [("steady", "prefill", weights + prefill + overhead), ("steady", "decode", weights + decode + overhead)]


def peak_of(phases: list[tuple[str, str, Any]]) -> Any:
    """The largest phase bytes (elementwise for arrays)."""
    peak = phases[0][2]
    for _, _, v in phases[1:]:
        peak = np.maximum(peak, v)
    return peak
