"""The experiment setup shared by the estimator and the runner.

One :class:`Setup` (batch, sequence, precision policy, optimizer, recompute, attention, sharding) drives both
``memlab.predict.estimate`` (the prediction) and ``memlab.run.runner`` (the measurement), so every predicted number
has a measured twin. Precision policies live in :mod:`memlab.predict.precision`. This module imports no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

from memlab.errors import SetupError, unknown_name
from memlab.predict.precision import PrecisionPolicy, precision_policy

Mode = Literal["train", "inference"]
Recompute = Literal["none", "selective", "full"]
Attention = Literal["eager", "math", "flash", "efficient", "cudnn"]

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adam-8bit", "adafactor")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("eager", "math", "flash", "efficient", "cudnn")
MODES = ("train", "inference")
INFERENCE_WEIGHTS = ("fp32", "fp16", "bf16", "int8", "int4")
KV_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8")
OPTIMIZER_IMPLS = ("auto", "for-loop", "foreach", "fused")
FUSED_OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum")
"""Optimizers torch.optim implements fused (one kernel, no step-sized temporaries)."""
FOREACH_OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "adafactor")
"""Optimizers torch.optim implements with multi-tensor ``_foreach_*`` ops."""


def resolve_optimizer_impl(optimizer: str, impl: str, device_type: str = "cuda") -> str:
    """The implementation a run uses: ``auto`` is what torch.optim picks by itself.

    torch.optim defaults to ``foreach`` when every parameter is on a CUDA device and to the for-loop otherwise;
    it never picks ``fused`` by default (torch/optim/optimizer.py, ``_default_to_fused_or_foreach``). Optimizers
    without a foreach/fused version (memlab's 8-bit Adam) always run the for-loop.
    """
    if impl == "auto":
        impl = "foreach" if device_type == "cuda" else "for-loop"
    if impl == "foreach" and optimizer not in FOREACH_OPTIMIZERS:
        return "for-loop"
    if impl == "fused" and optimizer not in FUSED_OPTIMIZERS:
        raise SetupError(f"optimizer_impl='fused' exists for {', '.join(FUSED_OPTIMIZERS)}, not {optimizer!r}: "
                         "use for-loop or foreach")
    return impl


@dataclass(frozen=True, kw_only=True)
class Setup:
    """Everything about a run that is not the model: shapes, precision, optimizer, memory policies, sharding.

    ``batch`` is the micro-batch per data-parallel rank; ``seq`` the sequence length in tokens. ``attention``
    names the kernel: ``eager`` materialises softmax(QK^T) (O(s^2) memory), ``math`` is PyTorch SDPA's math
    backend (also O(s^2)), ``flash``/``efficient``/``cudnn`` are fused SDPA kernels that keep no s x s matrix.
    ``zero_stage`` 0-3 shards optimizer states (1), gradients (2) and parameters (3) over ``world_size``
    data-parallel ranks; FSDP FULL_SHARD is stage 3 and SHARD_GRAD_OP stage 2. ``tp`` is the tensor-parallel
    degree and ``sp`` turns on sequence parallelism (Korthikanti et al. 2022).
    """

    batch: int = 1
    seq: int = 1024
    mode: Mode = "train"
    precision: str = "fp32"
    optimizer: str = "adamw"
    recompute: Recompute = "none"
    attention: Attention = "eager"
    zero_stage: int = 0
    world_size: int = 1
    tp: int = 1
    sp: bool = False
    inference_weights: str = "bf16"
    """Weight dtype when ``mode == 'inference'``."""
    kv_cache_dtype: str = "bf16"
    """KV-cache element type when ``mode == 'inference'``."""
    optimizer_impl: str = "auto"
    """Optimizer implementation: for-loop (one tensor at a time), foreach (multi-tensor: a step-sized temporary),
    fused (one kernel, no temporary) or auto (what torch picks: foreach on CUDA, for-loop on CPU)."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; gradients persist (and accumulate) across the micro-steps."""
    zero_grad_to_none: bool = True
    """zero_grad(set_to_none=True), torch's default, frees gradients; False keeps them, zero-filled, between steps."""

    def __post_init__(self) -> None:
        for fname in ("batch", "seq", "world_size", "tp", "grad_accum_steps"):
            value = getattr(self, fname)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SetupError(f"{fname} must be a positive integer, got {value!r}")
        if self.mode not in MODES:
            raise SetupError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        precision_policy(self.precision)
        if self.optimizer not in OPTIMIZERS:
            raise unknown_name("optimizer", self.optimizer, list(OPTIMIZERS))
        if self.recompute not in RECOMPUTE:
            raise SetupError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.attention not in ATTENTION:
            raise SetupError(f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise SetupError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.sp and self.tp == 1:
            raise SetupError("sequence parallelism (sp) needs tensor parallelism: set tp > 1 or drop sp")
        if self.inference_weights not in INFERENCE_WEIGHTS:
            raise SetupError(f"inference_weights must be one of {', '.join(INFERENCE_WEIGHTS)}")
        if self.kv_cache_dtype not in KV_DTYPES:
            raise SetupError(f"kv_cache_dtype must be one of {', '.join(KV_DTYPES)}")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise SetupError(f"optimizer_impl must be one of {', '.join(OPTIMIZER_IMPLS)}, got {self.optimizer_impl!r}")
        resolve_optimizer_impl(self.optimizer, self.optimizer_impl)

    @property
    def policy(self) -> PrecisionPolicy:
        """The :class:`PrecisionPolicy` named by ``precision``."""
        return precision_policy(self.precision)

    @property
    def fused_attention(self) -> bool:
        """True for kernels that never materialise the s x s score matrix."""
        return self.attention in ("flash", "efficient", "cudnn")

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch on one rank: batch * seq."""
        return self.batch * self.seq

    def to_dict(self) -> dict[str, object]:
        """Plain dict of the fields (for JSON lines and DataFrames)."""
        return asdict(self)

    def with_(self, **changes: object) -> Setup:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

