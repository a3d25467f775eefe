"""Precision policies at run time: what dtype the model is built in, autocast, loss scaling, master weights.

:data:`memlab.predict.precision.PRECISION_POLICIES` says how many bytes each policy keeps per parameter; this module
makes a real training step keep exactly those bytes, so the accounting can check the estimator:

- ``fp32`` / ``amp-*``: fp32 model, a plain optimizer; ``amp-*`` runs the forward under ``torch.autocast``
  and ``amp-fp16`` scales the loss with ``torch.amp.GradScaler``.
- ``bf16``: the model and the optimizer states in bf16.
- ``mixed-*``: a 16-bit model plus :class:`MasterWeights`, which keeps fp32 master weights the optimizer steps
  on and copies them back into the model after each step (Micikevicius et al. 2018; Rajbhandari et al. 2019).
  ``mixed-bf16-fp32-grads`` accumulates every gradient into a persistent fp32 buffer as soon as backward
  produces it and frees the 16-bit one (Megatron-LM's main grads); ``mixed-fp16-fp32-accum`` keeps both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from memlab.device import torch_dtype
from memlab.predict.precision import PrecisionPolicy

if TYPE_CHECKING:
    from memlab.predict.models import TransformerConfig
    from memlab.predict.setup import Setup


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
    """The pieces of one training step under a precision policy: call :meth:`backward` and :meth:`step`."""

    policy: PrecisionPolicy
    device: torch.device
    optimizer: Any
    scaler: Any = None

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """autocast for ``amp-*``, nothing otherwise."""
        return autocast(self.policy, self.device)

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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free the gradients (``set_to_none=True``, PyTorch's default) or zero-fill them in place."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_holder(self) -> Any:
        """What :func:`memlab.measure.accounting.model_states` should read optimizer state from."""
        return self.optimizer


def training_step(
    model: nn.Module,
    policy: PrecisionPolicy,
    device: torch.device,
    make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
) -> TrainingStep:
    """Wire ``model`` (already built in :func:`model_dtype`) for training under ``policy``."""
    if policy.master_bytes:
        scale = 2.0**12 if policy.grad_scaler else None
        return TrainingStep(policy, device, MasterWeights(model, make_optimizer, policy, loss_scale=scale))
    optimizer = make_optimizer(_unique_params(model))
    scaler = torch.amp.GradScaler(device.type) if policy.grad_scaler else None
    return TrainingStep(policy, device, optimizer, scaler)


def build_training(config: TransformerConfig, setup: Setup, device: torch.device, *, seed: int = 0,
                   lr: float = 1e-4, optimizer_impl: str | None = None) -> tuple[nn.Module, TrainingStep]:
    """The reference GPT for ``setup`` (dtype from its precision policy, attention kernel, recompute), seeded with
    ``seed`` and in train mode, and its :class:`TrainingStep` with ``setup.optimizer`` run by ``optimizer_impl``
    (default ``setup.optimizer_impl``): how :func:`memlab.run.runner.run_step`, the live-bytes steps and the
    profiler build the step they measure."""
    from memlab.model.gpt import GPT
    from memlab.model.optimizers import build_optimizer

    torch.manual_seed(seed)
    model = GPT(config, attention=setup.attention, recompute=setup.recompute, device=device,
                dtype=model_dtype(setup.policy)).train()
    impl = setup.optimizer_impl if optimizer_impl is None else optimizer_impl
    return model, training_step(model, setup.policy, device, lambda ps: build_optimizer(setup.optimizer, ps, lr, impl))


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
