"""Which attention kernel a step runs when the user names none: the library's choice, resolved as the libraries do.

transformers builds a model with ``attn_implementation="sdpa"`` when its class supports SDPA (``_supports_sdpa``),
``"eager"`` otherwise (modeling_utils.py ``_check_and_adjust_attn_implementation``; Gemma 2 sets
``_supports_sdpa = False`` for its soft-capped scores). Its SDPA call passes ``is_causal=True`` and no mask unless the
batch has padding, the family always builds its mask (Falcon) or a sliding window is reached
(integrations/sdpa_attention.py ``sdpa_attention_forward``; masking_utils.py ``_ignore_causal_mask_sdpa``), and the
attention dropout in training. torch then dispatches ``F.scaled_dot_product_attention`` to the first backend whose
conditions hold [pytorch-sdp]:

- **CPU** (aten/src/ATen/native/transformers/sdp_utils_cpp.cpp ``select_sdp_backend_cpp``): the flash kernel unless
  dropout > 0, then math. Checked against ``torch._fused_sdp_choice`` itself (tests/predict/spec/test_kernels.py).
- **CUDA** (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, ``select_sdp_backend`` and the ``can_use_*``
  filters, read at commit 001f694a): the order is flash, memory-efficient, math, cuDNN. Flash: fp16/bf16, no explicit
  mask, q/k/v head dims equal and <= 256, sm80 to sm121, and on sm86/89/120/121 in training a head dim <= 192 or,
  without dropout, > 224. Memory-efficient: sm50 to sm121, fp32/fp16 (and bf16 from sm80), masks allowed, the head dim
  a multiple of the GEMM alignment (sm80+: 8 in 16 bits, 4 in fp32; sm70-75: 8 in fp16, 1 in fp32). cuDNN: sm80 to
  sm121, fp16/bf16, head dim a multiple of 8 and <= 128, dropout a multiple of 1/16; torch puts it FIRST on sm90 and
  sm100 when the runtime cuDNN is newer than 9.15.0 (``check_prefer_cudnn_attention``), which depends on the wheel:
  there memlab names flash and says so (both fused kernels keep the same bytes in memlab's model).

Pure functions, no torch. Compute capabilities are NVIDIA's (developer.nvidia.com/cuda-gpus).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memlab.errors import SetupError

COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "v100-sxm2-32gb": (7, 0), "v100-sxm2-16gb": (7, 0), "t4": (7, 5),
    "a100-40gb-sxm": (8, 0), "a100-80gb-sxm": (8, 0), "a100-40gb-pcie": (8, 0), "a100-80gb-pcie": (8, 0),
    "a10g": (8, 6), "rtx-3090": (8, 6), "l4": (8, 9), "l40s": (8, 9), "rtx-4090": (8, 9),
    "h100-sxm": (9, 0), "h100-pcie": (9, 0), "h100-nvl": (9, 0), "h200-sxm": (9, 0), "h200-nvl": (9, 0),
    "h20": (9, 0), "gh200-96gb": (9, 0), "b200": (10, 0), "gb200": (10, 0),
}
"""CUDA compute capability of each NVIDIA row of :data:`memlab.predict.hardware.table.GPUS` (NVIDIA, "CUDA GPUs -
Compute Capability", developer.nvidia.com/cuda-gpus): what torch's SDPA dispatch reads (``cudaDeviceProp.major``,
``minor``)."""

DEFAULT_CAPABILITY = (9, 0)
"""The card assumed when no ``--gpu`` is named: an sm90 data-centre GPU (H100/H200), where the kernels are those of
any sm80+ card but for the cuDNN preference."""


@dataclass(frozen=True)
class KernelChoice:
    """The attention a step runs: transformers' ``implementation`` (``sdpa`` or ``eager``), the ``kernel`` memlab's
    :class:`~memlab.predict.spec.setup.Setup` names it by, and why, in one line."""

    implementation: str
    kernel: str
    reason: str


def capability_of(gpu: str | None) -> tuple[int, int] | None:
    """The compute capability of a table GPU key (None for a card without one: AMD, TPU, unknown)."""
    return None if gpu is None else COMPUTE_CAPABILITY.get(gpu)


def cpu_sdpa_kernel(*, dropout: float) -> tuple[str, str]:
    """(kernel, why) of torch's CPU dispatch: flash, or math with dropout (the CPU flash kernel has none)."""
    if dropout > 0:
        return "math", f"the CPU flash kernel takes no dropout (p={dropout:g}): math"
    return "flash", "torch's CPU flash kernel (sdp_utils_cpp.cpp select_sdp_backend_cpp)"


def _flash_ok(cc: tuple[int, int], dtype: str, head_dim: int, mask: bool, dropout: float, train: bool) -> str | None:
    """Why CUDA flash attention cannot run, or None (sdp_utils.cpp ``can_use_flash_attention``)."""
    if mask:
        return "an explicit mask"
    if dtype not in ("fp16", "bf16"):
        return f"{dtype} (flash takes fp16/bf16)"
    if not (8, 0) <= cc <= (12, 1):
        return f"sm{cc[0]}{cc[1]} (flash needs sm80-sm121)"
    if head_dim > 256:
        return f"head dim {head_dim} > 256"
    if train and (cc in ((8, 6), (8, 7), (8, 8), (8, 9)) or cc[0] == 12) and not (
            head_dim <= 192 or (dropout == 0 and head_dim > 224)):
        return f"training with head dim {head_dim} on sm{cc[0]}{cc[1]}"
    return None


def _efficient_ok(cc: tuple[int, int], dtype: str, head_dim: int) -> str | None:
    """Why CUDA memory-efficient attention cannot run, or None (``can_use_mem_efficient_attention``)."""
    if not (5, 0) <= cc <= (12, 1):
        return f"sm{cc[0]}{cc[1]}"
    if dtype == "bf16" and cc < (8, 0):
        return "bf16 below sm80"
    half = dtype in ("fp16", "bf16")
    tensor_cores = cc[0] >= 8 or (cc[0] >= 7 and half)
    align = max(4 if cc[0] >= 8 else 1, (8 if half else 4) if tensor_cores else 1)
    if head_dim % align:
        return f"head dim {head_dim} not a multiple of {align}"
    return None


def cuda_sdpa_kernel(*, cc: tuple[int, int] | None, dtype: str, head_dim: int, mask: bool, dropout: float,
                     train: bool = True) -> tuple[str, str]:
    """(kernel, why) of torch's CUDA dispatch for these inputs (module docstring). ``cc`` None: an sm90 card
    (:data:`DEFAULT_CAPABILITY`); ``dtype``: q/k/v's (fp32, fp16, bf16); ``mask``: an explicit attn_mask."""
    card = cc or DEFAULT_CAPABILITY
    why_not = _flash_ok(card, dtype, head_dim, mask, dropout, train)
    if why_not is None:
        cudnn = " (cuDNN's kernel first where the wheel's cuDNN is newer than 9.15: the same bytes)" \
            if card[0] in (9, 10) and head_dim <= 128 and head_dim % 8 == 0 else ""
        return "flash", f"flash on sm{card[0]}{card[1]}{cudnn}"
    why_eff = _efficient_ok(card, dtype, head_dim)
    if why_eff is None:
        return "efficient", f"memory-efficient: flash cannot take {why_not}"
    return "math", f"math: flash cannot take {why_not}, memory-efficient not {why_eff}"


def sdpa_kernel(*, device_type: str, dtype: str, head_dim: int, mask: bool, dropout: float, train: bool = True,
                gpu: str | None = None) -> tuple[str, str]:
    """(kernel, why) of torch's SDPA dispatch on ``device_type`` (:func:`cpu_sdpa_kernel` or
    :func:`cuda_sdpa_kernel` for ``gpu``'s compute capability, an sm90 card when None): the one branch every caller
    (the estimate's ``auto``, the trace's, :func:`memlab.predict.families.reader.hf_attention`) goes through."""
    if device_type == "cpu":
        return cpu_sdpa_kernel(dropout=dropout)
    if device_type == "cuda":
        return cuda_sdpa_kernel(cc=capability_of(gpu), dtype=dtype, head_dim=head_dim, mask=mask, dropout=dropout,
                                train=train)
    raise SetupError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")


def library_attention(config: Any, setup: Any, *, device_type: str, gpu: str | None = None) -> KernelChoice:
    """What transformers and torch run for ``config`` (a TransformerConfig, or the reference GPT's) under ``setup``
    on ``device_type`` (``gpu``: a table key, for its compute capability). memlab's reference GPT computes attention
    eagerly unless told otherwise, so its default is eager; so is a bare parameter count's."""
    impl = getattr(config, "impl", None)
    if impl is None or impl.family == "reference":
        return KernelChoice("eager", "eager", "memlab's reference GPT computes attention eagerly by default")
    if not impl.supports_sdpa:
        return KernelChoice("eager", "eager", f"transformers builds {impl.family} with eager attention (its class "
                                              "does not support SDPA)")
    train = setup.mode == "train"
    dtype = setup.policy.compute_dtype if train else _inference_dtype(setup)
    dropout = impl.attention_dropout_or(config.dropout) if train else 0.0
    window = impl.sliding_window is not None and setup.seq >= impl.sliding_window
    mask = setup.attention_mask == "padded" or impl.sdpa_keeps_mask or window
    kernel, why = sdpa_kernel(device_type=device_type, dtype=dtype, head_dim=config.head_dim, mask=mask,
                              dropout=dropout, train=train, gpu=gpu)
    inputs = f"{dtype}, head dim {config.head_dim}, " + ("an explicit mask" if mask else "is_causal, no mask") \
        + (f", dropout {dropout:g}" if dropout else "")
    return KernelChoice("sdpa", kernel, f"transformers' default sdpa ({inputs}) -> {why}")


def _inference_dtype(setup: Any) -> str:
    """The compute dtype of inference weights (quantised weights compute in bf16)."""
    return {"fp32": "fp32", "fp16": "fp16"}.get(setup.inference_weights, "bf16")


def resolved(config: Any, setup: Any, *, device_type: str, gpu: str | None = None) -> tuple[Any, str | None]:
    """``setup`` with ``attention='auto'`` replaced by :func:`library_attention`'s kernel, and the reason (None when
    the setup names its kernel)."""
    if setup.attention != "auto":
        return setup, None
    choice = library_attention(config, setup, device_type=device_type, gpu=gpu)
    return setup.with_(attention=choice.kernel), f"attention {choice.kernel}: {choice.reason}"
