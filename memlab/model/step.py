"""Precision policies at run time: what dtype the model is built in, autocast, loss scaling, master weights.

:data:`memlab.predict.spec.precision.PRECISION_POLICIES` says how many bytes each policy keeps per parameter; this
module makes a real training step keep exactly those bytes, so the accounting can check the estimator:

- ``fp32`` / ``amp-*``: fp32 model, a plain optimizer; ``amp-*`` runs the forward under ``torch.autocast``
  and ``amp-fp16`` scales the loss with ``torch.amp.GradScaler``.
- ``bf16``: the model and the optimizer states in bf16.
- ``mixed-*``: a 16-bit model plus :class:`MasterWeights`, which keeps fp32 master weights the optimizer steps
  on and copies them back into the model after each step (Micikevicius et al. 2018; Rajbhandari et al. 2019).
  ``mixed-bf16-fp32-grads`` accumulates every gradient into a persistent fp32 buffer as soon as backward
  produces it and frees the 16-bit one (Megatron-LM's main grads); ``mixed-fp16-fp32-accum`` keeps both.

:func:`train_step` is the one phased loop every caller runs (the tracer, the runner, live steps, the profiler,
the step-time lab, the Hugging Face run, the torchrun worker, the tensor-parallel ranks): forward -> backward per
micro-batch, then the optimizer step and ``zero_grad``, each phase inside a :class:`Meter`'s context, which is where
the callers differ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from memlab.device import torch_dtype
from memlab.errors import SetupError
from memlab.predict.spec.precision import PrecisionPolicy

if TYPE_CHECKING:
    from memlab.predict.spec.model import TransformerConfig
    from memlab.predict.spec.setup import Setup


def model_dtype(policy: PrecisionPolicy) -> torch.dtype:
    """dtype the model's parameters are built in: 16-bit for ``mixed-*`` and ``bf16``, else fp32."""
    return torch.float32 if policy.param_bytes == 4 else torch_dtype(policy.compute_dtype)


def autocast(policy: PrecisionPolicy, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for ``amp-*`` policies, a no-op context otherwise."""
    if not policy.autocast:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch_dtype(policy.compute_dtype))


def _unique_params(model: nn.Module) -> list[nn.Parameter]:
    seen: set[int] = set()
    out = []
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


class MasterWeights:
    """fp32 master weights (and optionally fp32 gradient buffers) for a 16-bit model.

    ``make_optimizer`` builds the inner optimizer over the master tensors. ``step()`` moves gradients to the
    masters, unscales and checks them when a loss scale is used, steps, and copies the masters back into the
    16-bit model. States it adds are reported by :meth:`memlab_state_tensors` for exact accounting.
    """

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
        policy: PrecisionPolicy,
        *,
        loss_scale: float | None = None,
    ) -> None:
        self.params = _unique_params(model)
        self.master = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.optimizer = make_optimizer(self.master)
        self.loss_scale = loss_scale
        self.skipped_steps = 0
        self.fp32_grads = policy.grad_bytes == 4
        self.fp32_accum = policy.grad_accum_bytes == 4
        self.buffers: list[torch.Tensor] = []
        self._handles: list[Any] = []
        if self.fp32_grads or self.fp32_accum:
            self.buffers = [torch.zeros_like(m) for m in self.master]
            for p, buf in zip(self.params, self.buffers, strict=True):
                self._handles.append(p.register_post_accumulate_grad_hook(self._accumulate(buf)))

    def _accumulate(self, buf: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            buf.add_(p.grad)
            if self.fp32_grads:  # the fp32 buffer *is* the gradient: free the 16-bit one now
                p.grad = None

        return hook

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss multiplied by the loss scale (unchanged without one)."""
        return loss * self.loss_scale if self.loss_scale else loss

    @torch.no_grad()
    def step(self) -> bool:
        """One optimizer step on the masters; False (and the scale halved) when gradients overflowed."""
        for i, (p, m) in enumerate(zip(self.params, self.master, strict=True)):
            m.grad = self.buffers[i] if self.buffers else (None if p.grad is None else p.grad.float())
            if m.grad is not None and self.loss_scale:
                m.grad.div_(self.loss_scale)
        if self.loss_scale and not all(torch.isfinite(m.grad).all() for m in self.master if m.grad is not None):
            self.loss_scale /= 2
            self.skipped_steps += 1
            self._release()
            return False
        self.optimizer.step()
        for p, m in zip(self.params, self.master, strict=True):
            p.copy_(m)
        self._release()
        return True

    def _release(self) -> None:
        for m in self.master:
            if not self.buffers:
                m.grad = None  # transient fp32 copies of 16-bit grads

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear model gradients; fp32 buffers are zeroed in place (they persist, as in Megatron-LM)."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        for buf in self.buffers:
            buf.zero_()

    def memlab_state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Tensors this wrapper keeps, by role: ``master``; ``grads`` (fp32 buffers that replace the 16-bit
        gradients) or ``grad_accum`` (fp32 buffers kept beside them)."""
        out: dict[str, list[torch.Tensor]] = {"master": list(self.master)}
        if self.buffers:
            out["grads" if self.fp32_grads else "grad_accum"] = list(self.buffers)
        return out

    def remove_hooks(self) -> None:
        """Detach the gradient hooks from the model."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


@dataclass
class TrainingStep:
    """The pieces of one training step under a precision policy, run by :func:`train_step`.

    ``set_to_none`` is what :meth:`zero_grad` does (``Setup.zero_grad_to_none``); ``grad_accum_steps`` how many
    micro-batches :func:`train_step` runs before the optimizer step (``Setup.grad_accum_steps``).
    """

    policy: PrecisionPolicy
    device: torch.device
    optimizer: Any
    scaler: Any = None
    set_to_none: bool = True
    grad_accum_steps: int = 1
    offload: Any = None
    """An :class:`memlab.model.offload.OffloadActivations` the forward runs inside (``Setup.offload_activations``)."""

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """autocast for ``amp-*`` (nothing otherwise), inside the activation offload's hooks when there are any."""
        if self.offload is None:
            return autocast(self.policy, self.device)
        stack = contextlib.ExitStack()
        stack.enter_context(self.offload)
        stack.enter_context(autocast(self.policy, self.device))
        return stack

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the (scaled) loss."""
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        elif isinstance(self.optimizer, MasterWeights):
            self.optimizer.scale(loss).backward()
        else:
            loss.backward()

    def step(self) -> None:
        """Optimizer step (through the GradScaler or the master weights where the policy has them)."""
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def zero_grad(self) -> None:
        """Free the gradients (``set_to_none``, PyTorch's default) or zero-fill them in place."""
        self.optimizer.zero_grad(set_to_none=self.set_to_none)

    def state_holder(self) -> Any:
        """What :func:`memlab.measure.accounting.model_states` should read optimizer state from."""
        return self.optimizer


def training_step(
    model: nn.Module,
    policy: PrecisionPolicy,
    device: torch.device,
    make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    *,
    loss_scaling: bool = True,
    set_to_none: bool = True,
    grad_accum_steps: int = 1,
    offload: Any = None,
) -> TrainingStep:
    """Wire ``model`` (already built in :func:`model_dtype`) for training under ``policy``.

    ``loss_scaling=False`` leaves out the policy's loss scale (GradScaler, or the master weights' scale and its
    finite check): the fake-tensor trace needs that, since the check reads tensor values a fake tensor lacks.
    ``offload``: an :class:`memlab.model.offload.OffloadActivations` around each forward (None: no offload).
    """
    if policy.master_bytes:
        scale = 2.0**12 if policy.grad_scaler and loss_scaling else None
        return TrainingStep(policy, device, MasterWeights(model, make_optimizer, policy, loss_scale=scale),
                            set_to_none=set_to_none, grad_accum_steps=grad_accum_steps, offload=offload)
    optimizer = make_optimizer(_unique_params(model))
    scaler = torch.amp.GradScaler(device.type) if policy.grad_scaler and loss_scaling else None
    return TrainingStep(policy, device, optimizer, scaler, set_to_none=set_to_none,
                        grad_accum_steps=grad_accum_steps, offload=offload)


def check_single_process(setup: Setup) -> None:
    """Refuse what one process on one device does not run: gradient accumulation (the trace and the estimator
    model it), ZeRO/FSDP sharding, data and tensor parallelism (torchrun). Raises :class:`SetupError`; shared by
    :func:`build_training` and :func:`memlab.run.runner.run_step`, so every measured step refuses alike."""
    if setup.grad_accum_steps != 1:
        raise SetupError("a single-process run measures one micro-batch per step: set grad_accum_steps=1 (memlab "
                         "trace and the estimator model accumulation)")
    if setup.zero_stage or setup.world_size > 1 or setup.tp > 1:
        raise SetupError("a single-process run measures one device; ZeRO/FSDP and tensor parallelism run under "
                         "torchrun")


def build_training(config: TransformerConfig, setup: Setup, device: torch.device, *, seed: int = 0,
                   lr: float = 1e-4) -> tuple[nn.Module, TrainingStep]:
    """The reference GPT for ``setup`` (dtype from its precision policy, attention kernel, recompute), seeded with
    ``seed`` and in train mode, and its :class:`TrainingStep`: ``setup.optimizer`` run by ``setup.optimizer_impl``,
    ``zero_grad`` by ``setup.zero_grad_to_none``. How :func:`memlab.run.runner.run_step`, the live-bytes steps,
    the profiler and the step-time lab build the step they measure; setups one process cannot run are refused
    (:func:`check_single_process`)."""
    from memlab.model.gpt import GPT
    from memlab.model.loss import LossOptions
    from memlab.model.optimizers import build_optimizer

    check_single_process(setup)
    if setup.offload_activations and device.type != "cuda":
        raise SetupError("activation offload is measured on a CUDA device (on a CPU the host and the device are one "
                         "memory): trace it instead (memlab trace --offload counts the device bytes and what moves)")
    if setup.activation_memory_budget < 1:
        raise SetupError("activation_memory_budget below 1 is torch.compile's; memlab runs the eager step: use "
                         "recompute='op', 'full' (with recompute_every) or 'selective'")
    if setup.checkpoint_reentrant:
        raise SetupError("checkpoint_reentrant is transformers' checkpointing as peft's kbit preparation leaves "
                         "it; the reference GPT checkpoints non-reentrant: run a Hugging Face config (memlab measure "
                         "--hf), or drop checkpoint_reentrant")
    torch.manual_seed(seed)
    model = GPT(config, attention=setup.attention, recompute=setup.recompute, recompute_every=setup.recompute_every,
                device=device, dtype=model_dtype(setup.policy), loss=LossOptions.of(setup)).train()
    offload = None
    if setup.offload_activations:
        from memlab.model.offload import OffloadActivations

        offload = OffloadActivations()
    return model, training_step(model, setup.policy, device,
                                lambda ps: build_optimizer(setup.optimizer, ps, lr, setup.optimizer_impl),
                                set_to_none=setup.zero_grad_to_none, offload=offload)


# -- the one training step loop -------------------------------------------------------------------------------
STEP_PHASES = ("forward", "backward", "optimizer step", "zero_grad")
"""The phases :func:`train_step` runs, in order; micro-batches after the first of an accumulating step are
``forward (accumulating)`` and ``backward (accumulating)``."""


class Step(Protocol):
    """What :func:`train_step` runs: a :class:`TrainingStep`, or the tracer's step over a user's optimizer."""

    grad_accum_steps: int

    def forward_context(self) -> contextlib.AbstractContextManager[Any]: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> None: ...

    def zero_grad(self) -> None: ...

    def state_holder(self) -> Any:
        """The optimizer (or its wrapper), None for a step without one."""
        ...


class Meter:
    """What :func:`train_step` reports to; this base measures nothing.

    :meth:`phase` is a context around each phase (``step`` is the caller's label: ``"first"``, ``"steady"``, a step
    number); :meth:`loss` receives each micro-batch's loss right after its forward. The loop drops its own
    reference to the loss inside the backward phase, so a meter that keeps it (``loss.detach()``, to read it after
    the step as a loop that logs does) is what holds its storage.
    """

    def phase(self, step: Any, name: str) -> contextlib.AbstractContextManager[Any]:
        """The context around phase ``name`` of step ``step``."""
        return contextlib.nullcontext()

    def loss(self, step: Any, loss: torch.Tensor) -> None:
        """Called with each micro-batch's loss after its forward."""


class PhaseMeter(Meter):
    """A :class:`Meter` from a ``phase(step, name)`` context function (e.g. ``PhasePeaks(...).phase``)."""

    def __init__(self, phase: Callable[[Any, str], contextlib.AbstractContextManager[Any]]) -> None:
        self._phase = phase

    def phase(self, step: Any, name: str) -> contextlib.AbstractContextManager[Any]:
        return self._phase(step, name)


class Meters(Meter):
    """Several meters at once: phases entered in the order given (the first is outermost), losses to each."""

    def __init__(self, *meters: Meter) -> None:
        self.meters = meters

    @contextlib.contextmanager
    def phase(self, step: Any, name: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for m in self.meters:
                stack.enter_context(m.phase(step, name))
            yield

    def loss(self, step: Any, loss: torch.Tensor) -> None:
        for m in self.meters:
            m.loss(step, loss)


def train_step(step: Step, loss_fn: Callable[[], torch.Tensor], *, meter: Meter | None = None, label: Any = "steady",
               optimizer_step: bool = True, zero_grad: bool = True) -> None:
    """One training step: ``step.grad_accum_steps`` micro-batches of forward (``loss_fn()`` under
    ``step.forward_context()``) and backward, then the optimizer step and ``zero_grad`` (:data:`STEP_PHASES`),
    each inside ``meter.phase(label, name)``.

    ``optimizer_step=False`` leaves the parameters unchanged (a FLOP count of forward + backward);
    ``zero_grad=False`` leaves the gradients (both False: a step with no optimizer, as
    :func:`memlab.tracing.tracer.trace` runs one). The loss is released inside the backward phase, as a training
    loop releases it: byte counts over the phases depend on that.
    """
    meter = meter if meter is not None else Meter()
    for micro in range(step.grad_accum_steps):
        tag = "" if micro == 0 else " (accumulating)"
        with meter.phase(label, "forward" + tag), step.forward_context():
            loss = loss_fn()
        meter.loss(label, loss)
        with meter.phase(label, "backward" + tag):
            step.backward(loss)
            del loss
    if optimizer_step:
        with meter.phase(label, "optimizer step"):
            step.step()
    if zero_grad:
        with meter.phase(label, "zero_grad"):
            step.zero_grad()


# -- token batches --------------------------------------------------------------------------------------------
def token_ids(vocab_size: int, batch: int, length: int, device: torch.device | str = "cpu",
              seed: int = 0) -> torch.Tensor:
    """A ``batch`` x ``length`` tensor of random token ids in ``[0, vocab_size)`` (int64), on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=gen).to(device)


def token_batch(vocab_size: int, batch: int, seq: int, device: torch.device | str = "cpu",
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, tgt)``: ``batch`` x ``seq`` inputs and their next-token targets (the same ids shifted by one), each
    in its own storage, as a data loader yields them."""
    data = token_ids(vocab_size, batch, seq + 1, device, seed)
    return data[:, :-1].clone(), data[:, 1:].clone()
