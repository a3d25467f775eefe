"""Hugging Face models built from configs (never downloaded) and measured for real at small shapes.

:func:`build_hf_model` makes ``AutoModelForCausalLM.from_config(config)`` in a dtype and attention implementation;
:func:`measure_hf` runs one training step (forward with ``labels``, backward, AdamW step, zero_grad:
:func:`memlab.model.step.train_step`) on synthetic tokens and counts, exactly and by storage, what the forward
left for backward (:class:`~memlab.measure.accounting.SavedTensorRecorder`) and the model states after the
optimizer step (:func:`~memlab.measure.accounting.model_states`). With ``steps=2`` a second step runs on the same
model and optimizer (AdamW state now exists: the steady step); with ``phase_peaks`` the live tensor bytes peak
inside each phase of each step (:class:`~memlab.measure.live_bytes.PhasePeaks`: on a CPU, storages counted once,
from the parameters, buffers and the call's tensors up). On a CPU these counts are the truth; on CUDA
they sit beside the allocator's numbers. :func:`predict_hf` is the twin prediction from
:func:`memlab.predict.families.reader.from_hf`.

``transformers`` is imported when a function runs, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from memlab.device import device_type
from memlab.errors import SetupError
from memlab.measure.accounting import SavedTensorRecorder, model_states
from memlab.measure.live_bytes import PhasePeaks
from memlab.model.hf import (  # noqa: F401  attention_implementations, call_inputs, pad_counts: re-exported
    DTYPES,
    apply_finetune,
    attention_implementations,
    build_hf_model,
    call_inputs,
    pad_counts,
    quant_state_bytes,
)
from memlab.model.step import Meter, Meters, PhaseMeter, token_ids, train_step, training_step
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf, hf_attention
from memlab.predict.memory.activations import activation_bytes
from memlab.predict.memory.phases import PhaseRow
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.precision import precision_policy
from memlab.predict.spec.setup import Setup
from memlab.run.spec import Run

PRECISION_OF = {"fp32": "fp32", "bf16": "bf16", "fp16": "bf16"}
"""memlab precision policy of a model built in that dtype (pure 16-bit: weights, grads and Adam states)."""

Watch = Callable[[torch.nn.Module, Any, list[torch.Tensor]], contextlib.AbstractContextManager[Meter]]
"""An extra observer of :func:`measure_hf`'s steps: called with the model, the optimizer and the call's tensors
(token ids, labels, mask) before the first step, it returns a context entered around all the steps that yields
the :class:`~memlab.model.step.Meter` each phase reports to (the hf_draws study's MemTracker cross-check)."""


@dataclass(frozen=True)
class HfMeasurement:
    """One real training step of an HF model: exact bytes saved for backward and held as model states."""

    family: str
    attn_implementation: str
    dtype: str
    batch: int
    seq: int
    params: int
    saved_bytes: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    device: str
    recompute: str = "none"
    checkpoint_reentrant: bool = False
    """Under recompute 'full': torch's reentrant checkpoint (``Setup.checkpoint_reentrant``)."""
    autocast: bool = False
    """The forward ran under ``torch.autocast`` to bf16 on an fp32 model (memlab's ``amp-bf16``)."""
    autocast_dtype: str = "bf16"
    """With ``autocast``: its dtype, bf16 (``amp-bf16``) or fp16 (``amp-fp16``: the loss under
    ``torch.amp.GradScaler``)."""
    loss: str = "plain"
    """How the loss was computed (``Setup.loss``; :func:`memlab.model.loss.hf_causal_lm_loss`)."""
    loss_chunk: int = 0
    logits_to_keep: int = 0
    finetune: str = "full"
    """``full``, or ``lora`` for a peft model (:func:`memlab.model.hf.apply_lora`) with the fields below."""
    lora_rank: int = 0
    lora_dropout: float = 0.0
    lora_targets: str = ""
    lora_modules_to_save: str = ""
    frozen_layers: int = 0
    attention_mask: str = "none"
    """The call convention (``Setup.attention_mask``): none, ones or padded (:func:`call_inputs`)."""
    pad_fraction: float = 0.0
    padding_side: str = "right"
    """Where a padded batch's padding sits (``Setup.padding_side``: right or left)."""
    loss_call: str = "labels"
    """``labels`` (the model's own loss) or ``manual`` (cross-entropy on the returned logits; ``Setup.loss_call``)."""
    steps: int = 1
    """Training steps run on the same model and optimizer (1, or 2: the second is the steady step)."""
    step_states_bytes: tuple[int, ...] = ()
    """Model states (parameters + gradients + optimizer state, bytes) after each step's optimizer step."""
    phase_peaks: tuple[PhaseRow, ...] = ()
    """With ``phase_peaks``: live tensor bytes per phase of each step (step ``first``, then ``steady``):
    :class:`~memlab.measure.live_bytes.PhasePeaks` on a CPU, ``max_memory_allocated`` on CUDA."""

    @property
    def states_bytes(self) -> int:
        """Parameters + gradients + optimizer state."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def setup(self, config: TransformerConfig | None = None) -> Setup:
        """The memlab :class:`Setup` this run corresponds to (``config`` tells whether attention dropout moves
        CPU SDPA to the math backend)."""
        dev = device_type(self.device)
        p = config.impl.attention_dropout_or(config.dropout) if config is not None else 0.0
        precision = f"amp-{self.autocast_dtype}" if self.autocast else PRECISION_OF[self.dtype]
        # autocast hands SDPA 16-bit q, k, v (aten/src/ATen/autocast_mode.h AT_FORALL_LOWER_PRECISION_FP): on CUDA
        # the kernel is then picked as for a 16-bit model (flash), not an fp32 one
        kernel_dtype = self.autocast_dtype if self.autocast else self.dtype
        return Setup(batch=self.batch, seq=self.seq, precision=precision, optimizer="adamw",
                     attention=hf_attention(self.attn_implementation, dev, kernel_dtype, p), recompute=self.recompute,
                     checkpoint_reentrant=self.checkpoint_reentrant, loss=self.loss, loss_chunk=self.loss_chunk,
                     logits_to_keep=self.logits_to_keep,
                     finetune=self.finetune, lora_rank=self.lora_rank, lora_dropout=self.lora_dropout,
                     lora_targets=self.lora_targets, lora_modules_to_save=self.lora_modules_to_save,
                     frozen_layers=self.frozen_layers, attention_mask=self.attention_mask,
                     pad_fraction=self.pad_fraction, padding_side=self.padding_side, loss_call=self.loss_call)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class _HfMeter(Meter):
    """The first forward's saved tensors (autocast exits inside the recorder, so its weight-cast cache is released
    as in training) and the model states after each optimizer step, gradients still held (:attr:`states`: the
    first step's)."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, device: torch.device) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device
        self.recorder = SavedTensorRecorder(model)
        self.saved: Any = None
        self.all_states: list[Any] = []

    @property
    def states(self) -> Any:
        """The model states after the first step's optimizer step."""
        return self.all_states[0]

    @contextlib.contextmanager
    def phase(self, step: Any, name: str) -> Iterator[None]:
        record = name == "forward" and self.saved is None
        with self.recorder if record else contextlib.nullcontext():
            yield
        if record:
            self.saved = self.recorder.result()
        elif name == "optimizer step":
            self.all_states.append(model_states(self.model, self.optimizer, device=self.device))


def _checkpointing(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the model a peft wrapper holds) checkpoints its blocks: transformers 5's
    ``is_activation_checkpointing``, else the older ``is_gradient_checkpointing`` (deprecated in 5.x: reading it
    warns)."""
    flag = getattr(model, "is_activation_checkpointing", None)
    return bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def measure_hf(model: torch.nn.Module, *, batch: int, seq: int, attn_implementation: str, seed: int = 0,
               keep_saved: bool = False, autocast: bool = False, autocast_dtype: str = "bf16",
               loss: Any = None, lora: Setup | None = None, attention_mask: str = "none",
               pad_fraction: float = 0.0, padding_side: str = "right", loss_call: str = "labels", steps: int = 1,
               phase_peaks: bool = False, watch: Watch | None = None,
               reentrant: bool = False) -> HfMeasurement | tuple[HfMeasurement, Any]:
    """One training step of ``model`` on random tokens (:func:`memlab.model.step.train_step`): saved-for-backward
    bytes of the forward, then backward and an AdamW step, then the model states (before zero_grad). ``autocast``
    runs the forward under ``torch.autocast`` to bf16 (an fp32 model: PyTorch AMP, what ``Trainer(bf16=True)``
    does; ``autocast_dtype='fp16'``: to fp16 with ``torch.amp.GradScaler``, ``Trainer(fp16=True)``). With
    ``keep_saved`` also returns the recorder's :class:`~memlab.measure.accounting.SavedActivations`.
    ``loss``: a :class:`memlab.model.loss.LossOptions` (chunked, fused, logits_to_keep; None: the model's own).
    ``lora``: the setup ``model`` was wrapped for (:func:`memlab.model.hf.apply_lora`), recorded in the result;
    the optimizer steps only what requires a gradient (the adapters). ``attention_mask``/``pad_fraction``: the
    call convention (:func:`call_inputs`; ``Setup.attention_mask``), ``padding_side`` where the padding sits,
    ``loss_call`` labels or manual (``Setup.loss_call``; ignored when ``loss`` is given: its own ``call``).
    ``steps``: 1, or 2 consecutive steps on the same model and optimizer (the saved bytes are the first forward's;
    :attr:`HfMeasurement.step_states_bytes` holds each step's states). ``phase_peaks``: record
    :attr:`HfMeasurement.phase_peaks` (live bytes from the parameters, buffers, token ids, labels and mask up; see
    :class:`~memlab.measure.live_bytes.PhasePeaks`). ``watch``: an extra observer of the steps (:data:`Watch`).
    ``reentrant``: the model checkpoints with torch's reentrant checkpoint (recorded; :func:`run_hf` builds it)."""
    if steps not in (1, 2) or isinstance(steps, bool):
        raise SetupError(f"steps must be 1 or 2 (the first and the steady step), got {steps!r}")
    cfg = model.config
    dev = next(model.parameters()).device
    idx = token_ids(cfg.vocab_size, batch, seq, dev, seed)
    dtype = next(k for k, v in DTYPES.items() if v == next(model.parameters()).dtype)
    policy = precision_policy(f"amp-{autocast_dtype}" if autocast else PRECISION_OF[dtype])
    step = training_step(model, policy, dev, lambda ps: torch.optim.AdamW(ps, lr=1e-4))
    meter = _HfMeter(model, step.state_holder(), dev)
    from memlab.model.loss import LossOptions, hf_causal_lm_loss

    opts = loss if loss is not None else LossOptions(call=loss_call)
    labels, mask = call_inputs(idx, attention_mask, pad_fraction, padding_side)
    inputs = [t for t in (idx, labels, mask) if t is not None]
    peaks = PhasePeaks(dev, track=[*model.parameters(), *model.buffers(), *inputs]) if phase_peaks else None
    meters: list[Meter] = [meter] + ([PhaseMeter(peaks.phase)] if peaks is not None else [])
    with watch(model, step.state_holder(), inputs) if watch is not None else contextlib.nullcontext() as seen:
        for label in ("first", "steady")[:steps]:
            with peaks if peaks is not None else contextlib.nullcontext():
                train_step(step, lambda: hf_causal_lm_loss(model, idx, labels, opts, mask),
                           meter=Meters(*meters, *([seen] if seen is not None else [])), label=label)
    saved, st = meter.saved, meter.states
    quant = quant_state_bytes(model) if lora is not None and lora.finetune == "qlora" else 0
    m = HfMeasurement(
        family=cfg.model_type, attn_implementation=attn_implementation, dtype=dtype, batch=batch, seq=seq,
        params=sum(p.numel() for p in model.parameters()), saved_bytes=saved.total_bytes,
        params_bytes=st.params_bytes + quant, grads_bytes=st.grads_bytes, optimizer_bytes=st.optimizer_bytes,
        device=str(dev), recompute="full" if _checkpointing(model) else "none", checkpoint_reentrant=reentrant,
        autocast=autocast, autocast_dtype=autocast_dtype, loss=opts.kind, loss_chunk=opts.chunk,
        logits_to_keep=opts.keep,
        attention_mask=attention_mask, pad_fraction=pad_fraction, padding_side=padding_side, loss_call=opts.call,
        steps=steps,
        step_states_bytes=tuple(s.params_bytes + quant + s.grads_bytes + s.optimizer_bytes for s in meter.all_states),
        phase_peaks=tuple(peaks.rows) if peaks is not None else (),
        **({} if lora is None else {
            "finetune": lora.finetune, "lora_rank": lora.lora_rank, "lora_dropout": lora.lora_dropout,
            "lora_targets": lora.lora_targets, "lora_modules_to_save": lora.lora_modules_to_save,
            "frozen_layers": lora.frozen_layers}),
    )
    return (m, saved) if keep_saved else m


def predict_hf(config: TransformerConfig, m: HfMeasurement) -> dict[str, int]:
    """memlab's prediction for the same run: activations (term by term) and model states (the estimator's)."""
    setup = m.setup(config)
    dev = device_type(m.device)
    acts = sum(activation_bytes(config, setup, device_type=dev).values())
    comp = estimate(config, setup, device_type=dev).components()
    return {"activations": int(acts), "params": comp["params"], "grads": comp["grads"],
            "optimizer": comp["optimizer"]}


def run_hf(config: Any, *, attn_implementation: str, dtype: str, batch: int, seq: int, device: str = "cpu",
           seed: int = 0, gradient_checkpointing: bool = False, autocast: bool = False,
           autocast_dtype: str = "bf16", lora: Setup | None = None, attention_mask: str = "none",
           pad_fraction: float = 0.0, padding_side: str = "right", loss_call: str = "labels", steps: int = 1,
           phase_peaks: bool = False, watch: Watch | None = None,
           reentrant: bool = False) -> tuple[TransformerConfig, HfMeasurement]:
    """Build the model from ``config``, measure one step, and return memlab's config for it with the measurement
    (``autocast``: an fp32 model with its forward under ``autocast_dtype`` (bf16, or fp16 with a GradScaler)
    autocast; give ``dtype="fp32"``; ``lora``: a setup
    with ``finetune='lora'``, whose adapters peft adds before the step, :func:`memlab.model.hf.apply_lora`;
    ``attention_mask``/``pad_fraction``/``padding_side``: the call convention, :func:`call_inputs`; ``loss_call``:
    labels or manual, ``Setup.loss_call``; ``steps``, ``phase_peaks``, ``watch``: as :func:`measure_hf`;
    ``reentrant``: with ``gradient_checkpointing``, torch's reentrant checkpoint, ``Setup.checkpoint_reentrant``)."""
    if autocast and dtype != "fp32":
        raise SetupError("autocast runs an fp32 model (dtype='fp32') with a 16-bit forward; got dtype=" + repr(dtype))
    if autocast_dtype not in ("bf16", "fp16"):
        raise SetupError(f"autocast_dtype must be bf16 or fp16, got {autocast_dtype!r}")
    model = build_hf_model(config, attn_implementation=attn_implementation, dtype=dtype, device=device, seed=seed,
                           gradient_checkpointing=gradient_checkpointing, reentrant=reentrant)
    tc = from_hf(model.config.to_dict() if not isinstance(config, dict) else config)
    if lora is not None:
        model = apply_finetune(model, lora, seed=seed)
    m = measure_hf(model, batch=batch, seq=seq, attn_implementation=attn_implementation, seed=seed, autocast=autocast,
                   autocast_dtype=autocast_dtype, lora=lora, attention_mask=attention_mask, pad_fraction=pad_fraction,
                   padding_side=padding_side, loss_call=loss_call, steps=steps, phase_peaks=phase_peaks, watch=watch,
                   reentrant=reentrant)
    del model
    return tc, m  # type: ignore[return-value]


def measure_run(run: Run, seed: int = 0) -> dict[str, int]:
    """Run a shoot-out :class:`~memlab.run.spec.Run` for real on this machine (:func:`run_hf` on
    ``run.device_type``): ``{"states", "activations"}`` in bytes (model states; saved for backward), the measured
    side :func:`memlab.studies.calculators.shoot_out` compares the calculators with. A LoRA run gets its adapters
    from peft (:func:`memlab.model.hf.apply_lora`); a QLoRA run needs CUDA kernels and is refused."""
    _, m = run_hf(run.hf, attn_implementation=run.attn_implementation, dtype=run.dtype, batch=run.batch,
                  seq=run.seq, device=run.device_type, seed=seed,
                  lora=run.setup() if run.finetune != "full" else None)
    return {"states": m.states_bytes, "activations": m.saved_bytes}
