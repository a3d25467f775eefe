"""Optimizer state bytes per tensor: Adam/AdamW moments, SGD momentum, blockwise 8-bit Adam, Adafactor, step counters.

One function per formula, each with its source. Bytes throughout; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from memlab.errors import SetupError
from memlab.predict.spec.precision import PrecisionPolicy

ADAM_8BIT_BLOCK = 256
"""bitsandbytes blockwise 8-bit optimizer block size: one fp32 absmax per 256 elements per state
(bitsandbytes 0.50.2, ``bitsandbytes/optim/optimizer.py``, ``Optimizer2State.init_state``, l. 524-529:
``blocksize = 256``, ``absmax1``/``absmax2`` of ``ceil(n / 256)`` fp32)."""
ADAM_8BIT_MIN_SIZE = 4096
"""bitsandbytes ``min_8bit_size`` (default 4096, ``Optimizer2State.__init__`` l. 414 and ``AdamW8bit``): tensors with
fewer elements keep two fp32 states (``init_state`` l. 502-510)."""
ADAM_8BIT_QMAP_BYTES = 2 * 256 * 4
"""The two 256-entry fp32 quantisation maps (``dynamic`` signed for the first moment, ``udynamic`` unsigned for the
second; ``Optimizer8bit.fill_qmap``, l. 157-159, ``F.create_dynamic_map``). Every 8-bit tensor's state holds
``qmap1``/``qmap2`` (``init_state`` l. 513-522), but they are the optimizer's ``name2qmap`` tensors, moved once to
the parameter's device and shared: 2,048 B once per optimizer per device, counted once by storage."""


def optimizer_state_dtype_bytes(policy: PrecisionPolicy) -> int:
    """Bytes per element of optimizer moments.

    torch.optim creates states with ``zeros_like(param)`` (param dtype), so pure ``bf16`` keeps 2-byte moments
    and ``fp32``/``amp-*`` 4-byte ones; mixed-precision wrappers (Megatron-LM, DeepSpeed; Micikevicius et al. 2018)
    step on the fp32 master copy, so their moments are fp32.
    """
    return policy.master_bytes or policy.param_bytes


def adam_moment_bytes(n_elements: int, state_bytes: int) -> int:
    """exp_avg + exp_avg_sq: 2 x ``state_bytes`` per element (Kingma & Ba 2015; torch.optim.Adam/AdamW)."""
    return 2 * state_bytes * n_elements


def sgd_moment_bytes(n_elements: int, state_bytes: int, momentum: bool) -> int:
    """Plain SGD keeps nothing; with momentum one buffer per element (torch.optim.SGD ``momentum_buffer``)."""
    return state_bytes * n_elements if momentum else 0


def adam8bit_tensor_bytes(numel: int) -> int:
    """8-bit blockwise Adam state of one tensor (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization").

    As bitsandbytes ``Optimizer2State.init_state`` (0.50.2) allocates it: tensors with fewer than 4096 elements keep
    two fp32 states (8 B/element); larger ones two uint8 states plus one fp32 absmax per 256-element block per state.
    The step counter is a Python int there (no tensor); the two quantisation maps the 8-bit tensors share are
    :data:`ADAM_8BIT_QMAP_BYTES`, once per optimizer (:func:`adam8bit_bytes` adds them).
    """
    if numel < ADAM_8BIT_MIN_SIZE:
        return 8 * numel
    return 2 * numel + 2 * 4 * math.ceil(numel / ADAM_8BIT_BLOCK)


def adam8bit_bytes(numels: Iterable[int]) -> int:
    """All state of bitsandbytes' ``AdamW8bit`` (0.50) over tensors of ``numels`` elements, bytes, on one device.

    :func:`adam8bit_tensor_bytes` per tensor, plus :data:`ADAM_8BIT_QMAP_BYTES` once when any tensor is large
    enough to be kept in 8 bits. Measured to the byte against ``bnb.optim.AdamW8bit`` on CPU
    (``tests/model/test_optimizers.py``).
    """
    sizes = list(numels)
    shared = ADAM_8BIT_QMAP_BYTES if any(n >= ADAM_8BIT_MIN_SIZE for n in sizes) else 0
    return sum(adam8bit_tensor_bytes(n) for n in sizes) + shared


def adafactor_tensor_elements(shape: tuple[int, ...]) -> int:
    """Adafactor second-moment elements of one tensor (Shazeer & Stern 2018, Sec. 3; torch.optim.Adafactor).

    A tensor of shape (..., r, c) keeps a row factor (..., r) and a column factor (..., c): r + c per matrix;
    a vector keeps its full n-element variance. No first moment (beta1 = None, the paper's default).
    """
    if len(shape) >= 2:
        return math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    return math.prod(shape)


def step_counter_bytes(n_tensors: int, optimizer: str) -> int:
    """Per-tensor ``step`` counters: one fp32 scalar (4 B) per parameter tensor for Adam/AdamW/Adafactor.

    torch.optim.Adam keeps ``state['step']`` as a 0-dim float32 tensor, on the CPU unless ``fused`` or
    ``capturable`` (torch/optim/adam.py, "special device hosting for step"); Adafactor always on the CPU.
    SGD keeps none; bitsandbytes keeps a Python int.
    """
    return 4 * n_tensors if optimizer in ("adam", "adamw", "adafactor") else 0


PAGED_OPTIMIZERS = ("paged-adamw", "paged-adam-8bit")
"""bitsandbytes' paged optimizers by memlab's names: ``PagedAdamW32bit`` (``PagedAdamW``; transformers'
``optim="paged_adamw_32bit"``) and ``PagedAdamW8bit`` (``"paged_adamw_8bit"``), each ``Optimizer2State`` with
``is_paged=True`` (bitsandbytes 0.50.2 ``optim/adamw.py``, l. 179-350)."""
PAGED_MIN_ELEMENTS = 100_000
"""A state buffer is paged only for a parameter of at least 1e5 elements: ``Optimizer8bit.get_state_buffer``
(bitsandbytes 0.50.2 ``optim/optimizer.py`` l. 383, ``if not self.is_paged or p.numel() < 1e5``: a plain
``torch.zeros_like``; else ``F.get_paged``). Only ``state1``/``state2`` go through it (``init_state`` l. 509-521);
the 8-bit ``absmax1``/``absmax2`` and the shared maps are plain ``torch.zeros`` on the device (l. 511-529)."""


def paged_tensor_bytes(numel: int, optimizer: str) -> tuple[int, int]:
    """(bytes in torch's allocator, bytes in CUDA managed memory) of one tensor's state under a paged optimizer.

    ``paged-adamw``: two fp32 states whatever the parameter's dtype (``get_state_buffer(p, dtype=torch.float32)``,
    ``init_state`` l. 509-510), 8 B/element. ``paged-adam-8bit``: :func:`adam8bit_tensor_bytes` (fp32 states below
    4096 elements, else two uint8 states and fp32 absmax per 256). The two states are paged when the tensor has at
    least :data:`PAGED_MIN_ELEMENTS` elements; absmax never is. The step counter is a Python int (no bytes).
    """
    if optimizer not in PAGED_OPTIMIZERS:
        raise SetupError(f"{optimizer!r} is not a paged optimizer: use one of {', '.join(PAGED_OPTIMIZERS)}")
    total = 8 * numel if optimizer == "paged-adamw" else adam8bit_tensor_bytes(numel)
    if numel < PAGED_MIN_ELEMENTS:
        return total, 0
    states = 8 * numel if optimizer == "paged-adamw" else 2 * numel
    return total - states, states


def paged_optimizer_bytes(numels: Iterable[int], optimizer: str) -> tuple[int, int]:
    """(allocator bytes, managed bytes) of a paged optimizer's state over tensors of ``numels`` elements on one
    device: :func:`paged_tensor_bytes` per tensor, plus for ``paged-adam-8bit`` the shared quantisation maps
    (:data:`ADAM_8BIT_QMAP_BYTES`, in the allocator) once when any tensor is kept in 8 bits. Their sum is the
    unpaged twin's state (bitsandbytes' ``AdamW32bit`` / ``AdamW8bit``; on a CPU, where bitsandbytes does not page,
    ``get_state_buffer`` l. 375-382, all of it is plain memory)."""
    sizes = list(numels)
    device = paged = 0
    for n in sizes:
        d, p = paged_tensor_bytes(n, optimizer)
        device, paged = device + d, paged + p
    if optimizer == "paged-adam-8bit" and any(n >= ADAM_8BIT_MIN_SIZE for n in sizes):
        device += ADAM_8BIT_QMAP_BYTES
    return device, paged
