"""Precision policies: how a run stores weights, gradients and master copies, and in which dtype it computes.

Each policy is data (:data:`PRECISION_POLICIES`) with its bytes per parameter and the source that uses it. The torch
wiring that carries a policy out (autocast, GradScaler, fp32 master weights) is :mod:`memlab.model.step`.
This module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.errors import unknown_name

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "tf32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}
"""Storage bytes per element of each dtype name memlab uses."""


@dataclass(frozen=True)
class PrecisionPolicy:
    """How a training run stores weights and gradients and in which dtype it computes.

    Bytes are per parameter. ``param_bytes`` and ``grad_bytes`` are the model's own weights and gradients;
    ``master_bytes`` an fp32 master copy kept by the optimizer wrapper; ``grad_accum_bytes`` an extra fp32
    gradient buffer (Megatron's "main grads"). Optimizer moments are counted by the optimizer, not here.
    """

    name: str
    param_bytes: int
    grad_bytes: int
    master_bytes: int
    grad_accum_bytes: int
    compute_dtype: str
    autocast: bool
    grad_scaler: bool
    source: str
    fsdp_param_dtype: str | None = None
    """FSDP2 ``MixedPrecisionPolicy.param_dtype``: the dtype parameters are gathered and computed in (None: the
    stored dtype); see :func:`fsdp_mixed_policy`."""
    fsdp_reduce_dtype: str | None = None
    """FSDP2 ``MixedPrecisionPolicy.reduce_dtype``: the dtype gradients are reduce-scattered in (None: the gathered
    dtype)."""

    @property
    def fsdp_mixed(self) -> bool:
        """True for an FSDP2 ``MixedPrecisionPolicy`` (parameters gathered in another dtype than stored)."""
        return self.fsdp_param_dtype is not None

    @property
    def model_state_bytes(self) -> int:
        """Weights + gradients + master + accumulation buffer, bytes/param (optimizer moments excluded)."""
        return self.param_bytes + self.grad_bytes + self.master_bytes + self.grad_accum_bytes


PRECISION_POLICIES: dict[str, PrecisionPolicy] = {
    p.name: p
    for p in (
        PrecisionPolicy("fp32", 4, 4, 0, 0, "fp32", False, False, "plain fp32 training"),
        PrecisionPolicy(
            "amp-bf16",
            4,
            4,
            0,
            0,
            "bf16",
            True,
            False,
            "PyTorch automatic mixed precision (torch.autocast, bf16): fp32 weights and grads, 16-bit copies of "
            "matmul weights made per forward (docs.pytorch.org/docs/stable/amp.html)",
        ),
        PrecisionPolicy(
            "amp-fp16",
            4,
            4,
            0,
            0,
            "fp16",
            True,
            True,
            "PyTorch automatic mixed precision (torch.autocast, fp16) with torch.amp.GradScaler",
        ),
        PrecisionPolicy(
            "mixed-bf16",
            2,
            2,
            4,
            0,
            "bf16",
            False,
            False,
            "16-bit weights and grads plus an fp32 master copy: the 2+2+12 = 16 B/param of Rajbhandari et al. "
            "2019 (ZeRO), Section 3.1, with Adam",
        ),
        PrecisionPolicy(
            "mixed-fp16",
            2,
            2,
            4,
            0,
            "fp16",
            False,
            True,
            "as mixed-bf16 with fp16 and loss scaling (Micikevicius et al. 2018, 'Mixed Precision Training')",
        ),
        PrecisionPolicy(
            "mixed-bf16-fp32-grads",
            2,
            4,
            4,
            0,
            "bf16",
            False,
            False,
            "bf16 weights, fp32 gradients, fp32 master: 18 B/param with Adam (Megatron-LM docs, "
            "'Distributed Optimizer', bytes-per-parameter table)",
        ),
        PrecisionPolicy(
            "mixed-fp16-fp32-accum",
            2,
            2,
            4,
            4,
            "fp16",
            False,
            True,
            "fp16 weights and grads plus fp32 main grads for accumulation and fp32 master: 20 B/param with Adam "
            "(Megatron-LM docs, 'Distributed Optimizer', bytes-per-parameter table)",
        ),
        PrecisionPolicy("bf16", 2, 2, 0, 0, "bf16", False, False, "pure bf16: weights, grads and states in bf16"),
    )
}


_FSDP_MIXED: dict[str, PrecisionPolicy] = {}
"""The :func:`fsdp_mixed_policy` policies made so far, by name (:func:`precision_policy` finds them too)."""


def fsdp_mixed_policy(param_dtype: str, reduce_dtype: str) -> PrecisionPolicy:
    """fp32 training under FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` and no autocast: fp32 shards,
    gradients and optimizer states, parameters gathered and computed in ``param_dtype``, gradients reduce-scattered
    in ``reduce_dtype`` (PyTorch docs, ``torch.distributed.fsdp.MixedPrecisionPolicy``; torchtitan's default:
    bf16 / fp32). Named ``fsdp-<param>`` (``-reduce-<reduce>`` unless fp32)."""
    name = f"fsdp-{param_dtype}" + ("" if reduce_dtype == "fp32" else f"-reduce-{reduce_dtype}")
    policy = _FSDP_MIXED.get(name)
    if policy is None:
        policy = PrecisionPolicy(name, 4, 4, 0, 0, param_dtype, False, False,
                                 f"FSDP2 MixedPrecisionPolicy(param_dtype={param_dtype}, reduce_dtype={reduce_dtype}) "
                                 "over fp32 shards, no autocast", fsdp_param_dtype=param_dtype,
                                 fsdp_reduce_dtype=reduce_dtype)
        _FSDP_MIXED[name] = policy
    return policy


def precision_policy(name: str) -> PrecisionPolicy:
    """Look up a precision policy by name (an FSDP2 one made by :func:`fsdp_mixed_policy` too); unknown names get
    the closest known ones."""
    policy = PRECISION_POLICIES.get(name) if isinstance(name, str) else None
    if policy is not None:  # the exact name (every Setup's, per estimate): no normalising
        return policy
    if isinstance(name, str) and name in _FSDP_MIXED:
        return _FSDP_MIXED[name]
    if not isinstance(name, str):
        raise unknown_name("precision policy", repr(name), list(PRECISION_POLICIES))
    key = name.strip().lower()
    if key not in PRECISION_POLICIES:
        raise unknown_name("precision policy", name, list(PRECISION_POLICIES))
    return PRECISION_POLICIES[key]
