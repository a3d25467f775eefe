"""The attention kernel memlab assumes when none is named is the one the libraries run: transformers' default
implementation per family (checked against transformers itself), torch's CPU dispatch (checked against
``torch._fused_sdp_choice``) and its CUDA dispatch (checked against the conditions of sdp_utils.cpp, case by case)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlab.predict.families.reader import from_hf
from memlab.predict.hardware.table import GPUS
from memlab.predict.spec.kernels import (
    COMPUTE_CAPABILITY,
    cpu_sdpa_kernel,
    cuda_sdpa_kernel,
    library_attention,
    resolved,
)
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

TINY = Path(__file__).resolve().parents[3] / "memlab" / "predict" / "families" / "configs" / "tiny"
_TORCH_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("head_dim", [64, 96, 320])
def test_cpu_dispatch_is_torchs(dtype: str, mask: bool, dropout: float, kv_heads: int, head_dim: int) -> None:
    import torch

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    q = torch.randn(2, 8, 16, head_dim, dtype=dt, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, 16, head_dim, dtype=dt) for _ in range(2))
    m = torch.ones(16, 16, dtype=torch.bool).tril() if mask else None
    chosen = torch._fused_sdp_choice(q, k, v, m, dropout, not mask, scale=None, enable_gqa=kv_heads != 8)
    assert cpu_sdpa_kernel(dropout=dropout)[0] == _TORCH_NAMES[chosen]


CUDA_CASES = [
    # (cc, dtype, head_dim, mask, dropout, train) -> kernel; each from a filter of sdp_utils.cpp
    ((9, 0), "bf16", 128, False, 0.0, True, "flash"),  # every flash condition holds
    ((8, 0), "fp16", 64, False, 0.1, True, "flash"),  # flash takes dropout
    ((9, 0), "fp32", 128, False, 0.0, True, "efficient"),  # check_dtypes_flash_attention: fp16/bf16 only
    ((9, 0), "bf16", 128, True, 0.0, True, "efficient"),  # check_for_attn_mask
    ((7, 5), "fp16", 64, False, 0.0, True, "efficient"),  # check_flash_attention_hardware_support: sm80+
    ((7, 5), "bf16", 64, False, 0.0, True, "math"),  # efficient: bf16 only from sm80; cuDNN sm80+
    ((7, 0), "fp32", 80, False, 0.0, True, "efficient"),  # sm70 fp32: alignment 1
    ((9, 0), "bf16", 320, False, 0.0, True, "efficient"),  # flash: head dim <= 256; efficient: 320 % 8 == 0
    ((9, 0), "bf16", 260, False, 0.0, True, "math"),  # 260 % 8 != 0
    ((9, 0), "fp32", 66, False, 0.0, True, "math"),  # sm80+ fp32 alignment 4
    ((8, 9), "bf16", 200, False, 0.0, True, "efficient"),  # sm86-89 training head dim in (192, 224]
    ((8, 9), "bf16", 200, False, 0.0, False, "flash"),  # ... inference is fine
    ((8, 9), "bf16", 256, False, 0.0, True, "flash"),  # > 224 without dropout
    ((8, 9), "bf16", 256, False, 0.1, True, "efficient"),  # > 224 with dropout
    ((12, 0), "bf16", 200, False, 0.0, True, "efficient"),  # sm120 as sm86-89
]


@pytest.mark.parametrize("cc,dtype,head_dim,mask,dropout,train,kernel", CUDA_CASES)
def test_cuda_dispatch_follows_torchs_conditions(cc: tuple[int, int], dtype: str, head_dim: int, mask: bool,
                                                 dropout: float, train: bool, kernel: str) -> None:
    assert cuda_sdpa_kernel(cc=cc, dtype=dtype, head_dim=head_dim, mask=mask, dropout=dropout, train=train)[0] \
        == kernel


def test_every_nvidia_card_has_its_compute_capability() -> None:
    nvidia = {k for k, a in GPUS.items() if a.vendor.lower().startswith("nvidia")}
    assert nvidia == set(COMPUTE_CAPABILITY)


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(p.stem for p in TINY.glob("*.json")))
def test_the_default_implementation_is_transformers(name: str) -> None:
    """transformers' own choice when the caller names none, for every family memlab models."""
    from memlab.model.hf import hf_config, import_transformers

    tf = import_transformers()
    model = tf.AutoModelForCausalLM.from_config(hf_config(str(TINY / f"{name}.json")))
    config = from_hf(TINY / f"{name}.json")
    choice = library_attention(config, Setup(precision="bf16", seq=8), device_type="cuda")
    assert choice.implementation == model.config._attn_implementation


def test_the_library_default_on_a_llama() -> None:
    """bf16 Llama on an H100: flash; fp32: memory-efficient; a padded batch: memory-efficient; on a T4 in fp16:
    memory-efficient; on CPU: flash; and the resolved setup says why."""
    llama = from_hf(json.loads((TINY / "llama.json").read_text()))
    bf16 = Setup(precision="bf16", seq=64, attention="auto")
    assert library_attention(llama, bf16, device_type="cuda", gpu="h100-sxm").kernel == "flash"
    assert library_attention(llama, bf16.with_(precision="fp32"), device_type="cuda").kernel == "efficient"
    padded = bf16.with_(attention_mask="padded", pad_fraction=0.25)
    assert library_attention(llama, padded, device_type="cuda").kernel == "efficient"
    t4 = library_attention(llama, bf16.with_(precision="amp-fp16"), device_type="cuda", gpu="t4")
    assert t4.kernel == "efficient"
    assert library_attention(llama, bf16, device_type="cpu").kernel == "flash"
    setup, why = resolved(llama, bf16, device_type="cuda")
    assert setup.attention == "flash" and why.startswith("attention flash: transformers' default sdpa")
    assert resolved(llama, bf16.with_(attention="eager"), device_type="cuda") == (bf16.with_(attention="eager"), None)


def test_the_reference_gpt_and_gemma2_default_to_eager() -> None:
    assert library_attention(preset("gpt2-small"), Setup(), device_type="cuda").kernel == "eager"
    gemma2 = from_hf(TINY / "gemma2.json")
    assert library_attention(gemma2, Setup(precision="bf16", seq=8), device_type="cuda").implementation == "eager"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 200, 256])
def test_cuda_dispatch_is_torchs_on_this_gpu(dtype: str, mask: bool, head_dim: int) -> None:
    """On a lent GPU (scripts/gpu_session.sh runs the gpu-marked tests first): torch's own CUDA choice for these
    inputs is memlab's prediction for this card's compute capability, but where torch prefers cuDNN (sm90/sm100
    with a runtime cuDNN newer than 9.15: sdp_utils.cpp check_prefer_cudnn_attention), which memlab names as flash
    with the same bytes."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: this checks torch's SDPA dispatch on the device")
    cc = torch.cuda.get_device_capability()
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    if dtype == "bf16" and cc < (8, 0):
        pytest.skip("bf16 below sm80")
    q = torch.randn(2, 8, 128, head_dim, dtype=dt, device="cuda", requires_grad=True)
    k, v = (torch.randn(2, 8, 128, head_dim, dtype=dt, device="cuda") for _ in range(2))
    m = torch.ones(128, 128, dtype=torch.bool, device="cuda").tril() if mask else None
    chosen = _TORCH_NAMES[torch._fused_sdp_choice(q, k, v, m, 0.0, not mask, scale=None, enable_gqa=False)]
    predicted = cuda_sdpa_kernel(cc=cc, dtype=dtype, head_dim=head_dim, mask=mask, dropout=0.0)[0]
    assert chosen == predicted or (chosen == "cudnn" and predicted == "flash"), (cc, chosen, predicted)
