"""Optimizers the runner trains with, by the names :class:`memlab.predict.spec.setup.Setup` uses.

Everything is ``torch.optim`` except ``adam-8bit``: :class:`Adam8bit`, a small blockwise 8-bit Adam with the
*memory layout* of bitsandbytes 0.50's ``AdamW8bit`` (``Optimizer2State``; Dettmers et al. 2022, "8-bit Optimizers
via Block-wise Quantization"): tensors with at least :data:`memlab.predict.memory.states.ADAM_8BIT_MIN_SIZE`
elements keep two 8-bit state tensors plus one fp32 absmax per
:data:`memlab.predict.memory.states.ADAM_8BIT_BLOCK` (256) elements per state, and reference the optimizer's
two shared 256-entry fp32 code maps; smaller tensors keep fp32 states. ``tests/model/test_optimizers.py`` checks its
state bytes equal the real ``bnb.optim.AdamW8bit``'s on CPU, to the byte, on generated shapes.

``paged-adamw`` and ``paged-adam-8bit`` stand in for bitsandbytes' ``PagedAdamW32bit`` and ``PagedAdamW8bit``
(:class:`PagedAdamW`, and :class:`Adam8bit` with ``paged=True``): the same state layout, and the states that
bitsandbytes pages (``state1``/``state2`` of a tensor of at least
:data:`memlab.predict.memory.states.PAGED_MIN_ELEMENTS` elements, ``get_state_buffer``) are allocated under
:func:`paged_allocation`, which a trace books apart from torch's allocator (:mod:`memlab.tracing.tracer`), as a CUDA
run's managed memory is. They are plain tensors here: on a CPU bitsandbytes does not page either (it warns and falls
back, ``get_state_buffer`` l. 375-382), so a real CPU run holds them beside everything else; a CUDA run of the
runner with these names runs the stand-ins too, whose paged states are then ordinary CUDA tensors in torch's
allocator (its measured peak is the estimate's ``peak_bytes + paged_bytes``, not bitsandbytes' managed memory).

Why not the real library: bnb 0.50's step runs on CPU but not under FakeTensorMode (its blockwise kernels read
values: ``aten._local_scalar_dense``), so :mod:`memlab.tracing` could not trace it. Its quantisation is a per-block
power code (bitsandbytes uses a dynamic tree code; the maps here hold this code's 256 values, and decoding computes
them arithmetically rather than by an int64-indexed lookup); the bytes are the same, the numerics are a
simplification and are not what the course measures.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

import torch

from memlab.errors import SetupError
from memlab.predict.memory.states import ADAM_8BIT_BLOCK, ADAM_8BIT_MIN_SIZE, PAGED_MIN_ELEMENTS
from memlab.predict.spec.setup import OPTIMIZERS, resolve_optimizer_impl

_PAGING: list[bool] = []
"""Non-empty while :func:`paged_allocation` is open (a stack: one entry per open ``with``)."""


@contextlib.contextmanager
def paged_allocation() -> Iterator[None]:
    """Tensors made inside are a paged optimizer's managed memory: :func:`paging` is True meanwhile, which the trace's
    tracker reads to book them apart from the allocator (bitsandbytes' ``F.get_paged``: ``cudaMallocManaged``)."""
    _PAGING.append(True)
    try:
        yield
    finally:
        _PAGING.pop()


def paging() -> bool:
    """True inside :func:`paged_allocation`."""
    return bool(_PAGING)


def state_buffer(p: torch.Tensor, dtype: torch.dtype, paged: bool) -> torch.Tensor:
    """A flat zero state of ``p``'s elements in ``dtype``, under :func:`paged_allocation` when ``paged`` and ``p``
    has at least ``PAGED_MIN_ELEMENTS`` elements (bitsandbytes ``get_state_buffer``, optim/optimizer.py l. 383)."""
    if paged and p.numel() >= PAGED_MIN_ELEMENTS:
        with paged_allocation():
            return torch.zeros(p.numel(), dtype=dtype, device=p.device)
    return torch.zeros(p.numel(), dtype=dtype, device=p.device)


class Adam8bit(torch.optim.Optimizer):
    """AdamW with blockwise 8-bit moments (memory layout of bitsandbytes' 8-bit Adam; see module docstring).

    Its step's temporaries are few and fixed, so the estimate counts them exactly
    (:func:`memlab.predict.memory.phases.optimizer_temporary_bytes`): every state is made before the loop (as
    torch.optim's ``_init_group`` makes them), and each tensor is stepped in a function of its own (nothing outlives
    it) with in-place ops: at most the two decoded moments padded to whole blocks, ``8 * ceil(n / 256) * 256`` bytes,
    beside the bias-corrected moment and ``denom``, ``8 n``, and a 16-bit gradient's fp32 copy, ``4 n``; a tensor
    kept in fp32 (under 4096 elements) only the last two."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        paged: bool = False,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.paged = paged
        """The two 8-bit states of a tensor of >= 1e5 elements made under :func:`paged_allocation`
        (bitsandbytes' ``PagedAdamW8bit``); the absmax and the maps never are."""

    # Codes are a power of the block-normalised value (square root for the signed first moment, fourth root
    # for the second), so small values keep resolution, a coarse stand-in for bitsandbytes' dynamic code.
    @staticmethod
    def _decode(codes: torch.Tensor, absmax: torch.Tensor, signed: bool) -> torch.Tensor:
        """The fp32 values of ``codes``, padded with zeros to whole blocks of ADAM_8BIT_BLOCK (one buffer of that
        size, and one more while it is made)."""
        scale, power = (127.0, 2) if signed else (255.0, 4)
        c = codes.new_zeros(absmax.numel() * ADAM_8BIT_BLOCK, dtype=torch.float32)
        c[: codes.numel()].copy_(codes)
        c.div_(scale)
        vals = c.abs().pow_(power)
        if signed:
            vals.copysign_(c)
        del c
        return vals.view(-1, ADAM_8BIT_BLOCK).mul_(absmax[:, None]).view(-1)

    @staticmethod
    def _encode(full: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, signed: bool) -> None:
        """Quantise the padded fp32 ``full`` (changed in place) into ``codes`` and ``absmax`` (one temporary of its
        size)."""
        scale, power = (127.0, 2) if signed else (255.0, 4)
        blocks = full.view(-1, ADAM_8BIT_BLOCK)
        absmax.copy_(blocks.abs().amax(dim=1).clamp_min_(1e-30))
        blocks.div_(absmax[:, None])
        q = blocks.abs().pow_(1.0 / power).mul_(scale)
        if signed:
            q.copysign_(blocks)
        q = q.round_().view(-1)[: codes.numel()]
        codes.copy_(q.clamp_(-127, 127) if signed else q.clamp_(0, 255))

    def _qmaps(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The two 256-entry fp32 code maps (signed, unsigned), one pair per device shared by every 8-bit tensor,
        as bitsandbytes' ``name2qmap`` (``Optimizer8bit.fill_qmap``)."""
        maps = self.__dict__.setdefault("_qmap_by_device", {})
        if device not in maps:
            i = torch.arange(256, dtype=torch.float32, device=device)
            c = ((i - 128) / 127).clamp(-1, 1)
            maps[device] = (c.sign() * c.abs() ** 2, (i / 255) ** 4)
        return maps[device]

    def _init_state(self, p: torch.Tensor) -> None:
        """``p``'s state, once: fp32 moments under ADAM_8BIT_MIN_SIZE elements, else 8-bit codes (paged from 1e5
        elements when ``paged``), an fp32 absmax per block per moment and the shared maps; a Python int step."""
        state = self.state[p]
        if state:
            return
        n = p.numel()
        state["step"] = 0  # a Python int, as bitsandbytes keeps it
        if n < ADAM_8BIT_MIN_SIZE:
            state["exp_avg"] = torch.zeros(n, dtype=torch.float32, device=p.device)
            state["exp_avg_sq"] = torch.zeros(n, dtype=torch.float32, device=p.device)
            return
        nblocks = (n + ADAM_8BIT_BLOCK - 1) // ADAM_8BIT_BLOCK
        state["exp_avg"] = state_buffer(p, torch.int8, self.paged)
        state["exp_avg_sq"] = state_buffer(p, torch.uint8, self.paged)
        state["absmax1"] = torch.zeros(nblocks, dtype=torch.float32, device=p.device)
        state["absmax2"] = torch.zeros(nblocks, dtype=torch.float32, device=p.device)
        state["qmap1"], state["qmap2"] = self._qmaps(p.device)

    def _update(self, p: torch.Tensor, group: dict) -> None:
        """One tensor's AdamW update (its temporaries die with this call)."""
        beta1, beta2 = group["betas"]
        state = self.state[p]
        n = p.numel()
        state["step"] += 1
        t = state["step"]
        g = p.grad.reshape(-1).float()  # a copy only of a 16-bit gradient
        small = "absmax1" not in state
        m_full = v_full = None
        if small:
            m, v = state["exp_avg"], state["exp_avg_sq"]
        else:
            m_full = self._decode(state["exp_avg"], state["absmax1"], True)
            v_full = self._decode(state["exp_avg_sq"], state["absmax2"], False)
            m, v = m_full[:n], v_full[:n]
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v / (1 - beta2**t)).sqrt_().add_(group["eps"])
        update = (m / (1 - beta1**t)).div_(denom)
        del denom
        if group["weight_decay"]:
            p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(update.view_as(p).to(p.dtype), alpha=-group["lr"])
        del update, g
        if m_full is not None and v_full is not None:
            self._encode(m_full, state["exp_avg"], state["absmax1"], True)
            self._encode(v_full, state["exp_avg_sq"], state["absmax2"], False)

    @torch.no_grad()
    def step(self, closure: object = None) -> None:
        for group in self.param_groups:
            stepped = [p for p in group["params"] if p.grad is not None]
            for p in stepped:  # every state first, as torch.optim's _init_group makes them
                self._init_state(p)
            for p in stepped:
                self._update(p, group)


class PagedAdamW(torch.optim.Optimizer):
    """bitsandbytes' ``PagedAdamW32bit`` as memlab runs it: two fp32 states per tensor (``get_state_buffer(p,
    dtype=torch.float32)``), paged for tensors of >= 1e5 elements (:func:`state_buffer`), a Python int step, and
    bitsandbytes' defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2). The update is torch.optim.AdamW's
    for-loop (``_single_tensor_adam``: the same ops in the same order, so the same temporaries: ``sqrt`` and the
    division of the tensor being stepped beside the previous tensor's ``denom``), on fp32 parameters only (a
    16-bit one raises SetupError: memlab.predict.coverage refuses it), every state made before the loop as torch's
    ``_init_group`` makes them (bitsandbytes makes each in its loop, and its CUDA kernel updates in place: no
    temporaries)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: object = None) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            stepped = [p for p in group["params"] if p.grad is not None]
            for param in stepped:  # every state first, as torch.optim's _init_group makes them
                self._init_state(param)
            for param in stepped:
                state = self.state[param]
                state["step"] += 1
                grad, exp_avg, exp_avg_sq, t = param.grad, state["exp_avg"], state["exp_avg_sq"], state["step"]
                param.mul_(1 - lr * wd)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step_size = lr / (1 - beta1**t)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                param.addcdiv_(exp_avg, denom, value=-step_size)

    def _init_state(self, param: torch.Tensor) -> None:
        """The two fp32 states of ``param`` (paged from 1e5 elements) and its step, once."""
        if param.dtype != torch.float32:
            raise SetupError(f"paged-adamw's stand-in steps fp32 parameters, got {param.dtype}: use an amp-* or "
                             "mixed-* precision (fp32 parameters), or paged-adam-8bit")
        state = self.state[param]
        if not state:
            state["step"] = 0  # a Python int, as bitsandbytes keeps it
            state["exp_avg"] = state_buffer(param, torch.float32, True).view_as(param)
            state["exp_avg_sq"] = state_buffer(param, torch.float32, True).view_as(param)


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
    if name in ("adam-8bit", "paged-adam-8bit"):
        return Adam8bit(params, lr=lr, paged=name == "paged-adam-8bit")
    if name == "paged-adamw":
        return PagedAdamW(params, lr=lr)
    raise SetupError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
