"""Optimizers the runner trains with, by the names :class:`memlab.predict.spec.setup.Setup` uses.

Everything is ``torch.optim`` except ``adam-8bit``: :class:`Adam8bit`, a small blockwise 8-bit Adam with the
*memory layout* of bitsandbytes 0.50's ``AdamW8bit`` (``Optimizer2State``; Dettmers et al. 2022, "8-bit Optimizers
via Block-wise Quantization"): tensors with at least :data:`memlab.predict.memory.states.ADAM_8BIT_MIN_SIZE`
elements keep two 8-bit state tensors plus one fp32 absmax per
:data:`memlab.predict.memory.states.ADAM_8BIT_BLOCK` (256) elements per state, and reference the optimizer's
two shared 256-entry fp32 code maps; smaller tensors keep fp32 states. ``tests/model/test_optimizers.py`` checks its
state bytes equal the real ``bnb.optim.AdamW8bit``'s on CPU, to the byte, on generated shapes.

Why not the real library: bnb 0.50's step runs on CPU but not under FakeTensorMode (its blockwise kernels read
values: ``aten._local_scalar_dense``), so :mod:`memlab.tracing` could not trace it. Its quantisation is a per-block
power code (bitsandbytes uses a dynamic tree code; the maps here hold this code's 256 values, and decoding computes
them arithmetically rather than by an int64-indexed lookup); the bytes are the same, the numerics are a
simplification and are not what the course measures.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from memlab.errors import SetupError
from memlab.predict.memory.states import ADAM_8BIT_BLOCK, ADAM_8BIT_MIN_SIZE
from memlab.predict.spec.setup import OPTIMIZERS, resolve_optimizer_impl


class Adam8bit(torch.optim.Optimizer):
    """AdamW with blockwise 8-bit moments (memory layout of bitsandbytes' 8-bit Adam; see module docstring)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @staticmethod
    def _blocks(flat: torch.Tensor) -> torch.Tensor:
        """``flat`` (n,) as float blocks of ADAM_8BIT_BLOCK, zero-padded at the end (a transient)."""
        pad = (-flat.numel()) % ADAM_8BIT_BLOCK
        flat = flat.float()
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad)])
        return flat.view(-1, ADAM_8BIT_BLOCK)

    # Codes are a power of the block-normalised value (square root for the signed first moment, fourth root
    # for the second), so small values keep resolution, a coarse stand-in for bitsandbytes' dynamic code.
    def _decode(self, codes: torch.Tensor, absmax: torch.Tensor, signed: bool) -> torch.Tensor:
        scale, power = (127.0, 2) if signed else (255.0, 4)
        c = self._blocks(codes) / scale
        vals = c.sign() * c.abs() ** power * absmax[:, None]
        return vals.reshape(-1)[: codes.numel()]

    def _encode(self, value: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, signed: bool) -> None:
        blocks = self._blocks(value)
        absmax.copy_(blocks.abs().amax(dim=1).clamp_min(1e-30))
        scale, power = (127.0, 2) if signed else (255.0, 4)
        x = blocks / absmax[:, None]
        q = torch.round(x.sign() * x.abs() ** (1.0 / power) * scale).reshape(-1)[: codes.numel()]
        codes.copy_(q.clamp(-127, 127) if signed else q.clamp(0, 255))

    def _qmaps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The two 256-entry fp32 code maps (signed, unsigned), one pair per device shared by every 8-bit tensor,
        as bitsandbytes' ``name2qmap`` (``Optimizer8bit.fill_qmap``)."""
        maps = self.__dict__.setdefault("_qmap_by_device", {})
        if device not in maps:
            i = torch.arange(256, dtype=torch.float32, device=device)
            c = ((i - 128) / 127).clamp(-1, 1)
            maps[device] = (c.sign() * c.abs() ** 2, (i / 255) ** 4)
        return maps[device]

    @torch.no_grad()
    def step(self, closure: object = None) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                n = p.numel()
                small = n < ADAM_8BIT_MIN_SIZE
                if not state:
                    state["step"] = 0  # a Python int, as bitsandbytes keeps it
                    kw = {"device": p.device}
                    if small:
                        state["exp_avg"] = torch.zeros(n, dtype=torch.float32, **kw)
                        state["exp_avg_sq"] = torch.zeros(n, dtype=torch.float32, **kw)
                    else:
                        nblocks = (n + ADAM_8BIT_BLOCK - 1) // ADAM_8BIT_BLOCK
                        state["exp_avg"] = torch.zeros(n, dtype=torch.int8, **kw)
                        state["exp_avg_sq"] = torch.zeros(n, dtype=torch.uint8, **kw)
                        state["absmax1"] = torch.zeros(nblocks, dtype=torch.float32, **kw)
                        state["absmax2"] = torch.zeros(nblocks, dtype=torch.float32, **kw)
                        state["qmap1"], state["qmap2"] = self._qmaps(p.device)
                state["step"] += 1
                g = p.grad.reshape(-1).float()
                if small:
                    m, v = state["exp_avg"], state["exp_avg_sq"]
                else:
                    m = self._decode(state["exp_avg"], state["absmax1"], True)
                    v = self._decode(state["exp_avg_sq"], state["absmax2"], False)
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                t = state["step"]
                update = (m / (1 - beta1**t)) / (v / (1 - beta2**t)).sqrt_().add_(group["eps"])
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update.view_as(p).to(p.dtype), alpha=-group["lr"])
                if not small:
                    self._encode(m, state["exp_avg"], state["absmax1"], True)
                    self._encode(v, state["exp_avg_sq"], state["absmax2"], False)


def build_optimizer(name: str, params: Iterable[torch.Tensor], lr: float = 1e-4,
                    impl: str = "for-loop") -> torch.optim.Optimizer:
    """The optimizer called ``name`` (one of :data:`memlab.predict.spec.setup.OPTIMIZERS`) over ``params``.

    ``impl`` (``for-loop``, ``foreach``, ``fused``, or ``auto``: torch's own choice for the parameters' device) is
    passed to torch.optim explicitly, because it changes the step's transient memory (the states are the same):
    the for-loop holds one tensor's temporaries at a time, foreach one temporary per parameter at once, fused none.
    """
    params = list(params)
    device_type = params[0].device.type if params else "cpu"
    impl = resolve_optimizer_impl(name, impl, device_type)
    kw = {"foreach": impl == "foreach"} | ({"fused": True} if impl == "fused" else {})
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, **kw)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, **kw)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, **kw)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, **kw)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr, foreach=impl == "foreach")
    if name == "adam-8bit":
        return Adam8bit(params, lr=lr)
    raise SetupError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
