"""Real int8 and int4 weights on a CPU, and what serving does to a KV pool over time.

:func:`int8_linear_bytes` quantises a copy of a model with ``torch.ao.quantization.quantize_dynamic`` (int8
weights, per-tensor affine: one scale and one zero point per matrix; activations quantised on the fly) and counts
the int8 *elements* it packed (``int_repr``: one byte each), next to everything left in floating point. That is
an element-count check, not a measurement of fbgemm's packed storage, and its per-tensor scale is not the
estimator's per-row fp32 scale. The LM head of the reference GPT is ``F.linear`` on the (tied) embedding, not an
``nn.Linear``, so it stays in float, as :mod:`memlab.predict.estimate` assumes for embeddings and head.

:func:`int4_linear_bytes` packs every ``nn.Linear`` weight with torch's own CPU int4 kernels
(``aten._convert_weight_to_int4pack_for_cpu``, ``aten._weight_int4pack_mm_for_cpu``, the ones torchao's
``Int4CPULayout`` uses): 4-bit asymmetric groups along the input dimension, a bf16 scale and a bf16 zero per
group and output row. It returns the packed tensors' real storage and the matmul's error against fp32.

:func:`serving_occupancy` replays requests growing token by token in a KV pool and returns the time-averaged
share of reserved KV slots that hold a token: the vLLM paper's measure [kwon2023], not the at-completion share.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from memlab.measure.accounting import unique_storage_bytes
from memlab.model.gpt import MoEMLP


def int8_linear_bytes(model: nn.Module) -> dict[str, Any]:
    """Quantise a copy of ``model``'s ``nn.Linear`` layers to int8 and count bytes.

    Returns the quantised model (``model``) and ``int8_weight_bytes`` (packed int8 matrices),
    ``float_bias_bytes`` (their biases, kept fp32), ``float_param_bytes`` (parameters left unquantised),
    ``quantized_layers`` and ``float_bytes_before`` (all parameters before quantisation).
    """
    before = unique_storage_bytes(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice (torchao is its successor)
        qmodel = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)
    weight = bias = layers = 0
    for module in qmodel.modules():
        packed = getattr(module, "_packed_params", None)
        if packed is None or not hasattr(packed, "_weight_bias"):
            continue
        w, b = packed._weight_bias()
        weight += w.int_repr().numel() * w.int_repr().element_size()
        bias += 0 if b is None else b.numel() * b.element_size()
        layers += 1
    return {"model": qmodel, "int8_weight_bytes": weight, "float_bias_bytes": bias,
            "float_param_bytes": unique_storage_bytes(qmodel.parameters()), "quantized_layers": layers,
            "float_bytes_before": before}


def expert_load(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Tokens routed to each expert of each MoE layer for a batch ``idx``: (n_layers, n_experts) counts.

    Runs the model once without gradients, recording the router's choices in every :class:`MoEMLP`.
    """
    counts: list[torch.Tensor] = []

    def hook(module: MoEMLP, args: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        flat = args[0].reshape(-1, args[0].shape[-1])
        chosen = torch.topk(module.router(flat), module.top_k, dim=-1).indices
        counts.append(torch.bincount(chosen.flatten(), minlength=len(module.experts)))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, MoEMLP)]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(counts) if counts else torch.zeros(0, 0, dtype=torch.long)



INT4_CPU_GROUPS = (32, 64, 128, 256)
"""Group sizes torch's CPU int4 matmul accepts (``_weight_int4pack_mm_for_cpu``'s qGroupSize)."""


def int4_linear_bytes(model: nn.Module, group_size: int = 128, seed: int = 0) -> dict[str, Any]:
    """Pack every ``nn.Linear`` weight of ``model`` to int4 with torch's CPU kernels and count the real bytes.

    Each weight (out × in) is quantised in groups of ``group_size`` input columns (the largest of
    :data:`INT4_CPU_GROUPS` not above ``group_size`` that divides ``in``): q = round((w − min) / scale) in 0..15,
    scale = (max − min) / 15, and torch's layout stores ``zero = min + 8·scale`` so that w ≈ (q − 8)·scale + zero.
    Returns ``packed_bytes`` (uint8 storage of the packed weights), ``scale_zero_bytes`` (the bf16
    ``[in / group, out, 2]`` tensors), ``elements`` (weights quantised), ``layers`` (per layer: out, in, the group
    size used), ``float_bytes`` (the same weights in fp32) and ``max_rel_error`` (the largest ‖y_int4 − y_fp32‖∞ /
    ‖y_fp32‖∞ of one bf16 matmul per layer on random inputs; quantisation error, not a kernel bug).
    """
    if group_size not in INT4_CPU_GROUPS:
        raise ValueError(f"group_size must be one of {INT4_CPU_GROUPS}, got {group_size!r}")
    gen = torch.Generator().manual_seed(seed)
    packed_bytes = scale_bytes = elements = float_bytes = 0
    layers: list[tuple[int, int, int]] = []
    worst = 0.0
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        w = module.weight.detach().float()
        n, k = w.shape
        g = max((c for c in INT4_CPU_GROUPS if c <= group_size and k % c == 0), default=None)
        if g is None:
            raise ValueError(f"an nn.Linear with {k} input features has no int4 CPU group size in {INT4_CPU_GROUPS}")
        blocks = w.reshape(n, k // g, g)
        lo, hi = blocks.amin(-1), blocks.amax(-1)
        scale = ((hi - lo) / 15).clamp(min=1e-8)
        q = ((blocks - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).reshape(n, k)
        zero = lo + 8 * scale
        sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [k/g, n, 2]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        x = torch.randn(4, k, generator=gen)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, g, sz).float()
        ref = x @ w.T
        worst = max(worst, float((y - ref).abs().max() / ref.abs().max().clamp(min=1e-12)))
        packed_bytes += packed.numel() * packed.element_size()
        scale_bytes += sz.numel() * sz.element_size()
        elements += n * k
        float_bytes += n * k * 4
        layers.append((n, k, g))
    return {"packed_bytes": packed_bytes, "scale_zero_bytes": scale_bytes, "elements": elements,
            "layers": tuple(layers), "float_bytes": float_bytes, "max_rel_error": worst}


def serving_occupancy(prompt: Any, output: Any, policy: str, *, max_len: int = 2048, block_tokens: int = 16) -> float:
    """Time-averaged share of reserved KV slots that hold a token while requests decode, in [0, 1].

    Request i holds ``prompt[i] + t`` tokens at its decode step t = 1 .. ``output[i]`` (one step per generated
    token, every request in flight for its whole life, as under continuous batching). Contiguous policies
    reserve at admission: ``max`` reserves ``max_len``, ``pow2`` the final length rounded up to a power of two,
    ``oracle`` the exact final length; ``paged`` holds whole blocks of ``block_tokens`` of what is present now.
    The share is Σ tokens present / Σ slots reserved over all requests and steps. Not modelled: queueing,
    preemption and the external fragmentation between contiguous slots, which lower the paper's figures further.
    """
    from memlab.predict.paging import reserved_tokens

    p, o = np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)
    if p.shape != o.shape or p.size == 0 or (o < 1).any() or (p < 0).any():
        raise ValueError("prompt and output must be equal-length arrays, prompts >= 0 and outputs >= 1 tokens")
    present = (o * p + o * (o + 1) // 2).sum()  # Σ_t (p + t) for t = 1..o
    if policy == "paged":
        reserved = sum(int(reserved_tokens(pi + np.arange(1, oi + 1), "paged", max_len=max_len,
                                           block_tokens=block_tokens).sum()) for pi, oi in zip(p, o, strict=True))
    else:
        reserved = int((reserved_tokens(p + o, policy, max_len=max_len, block_tokens=block_tokens) * o).sum())
    return float(present / reserved)


def experts_idle_share(n_experts: int, top_k: int, tokens: int) -> float:
    """Expected share of a layer's routed experts that receive no token in a step of ``tokens`` tokens, for
    uniform, independent top-``top_k`` routing: ((n − k) / n) ** tokens (exact for top-1; for top-k > 1 a token's
    k picks are distinct, which this per-expert probability already accounts for)."""
    if not (1 <= top_k <= n_experts) or tokens < 0:
        raise ValueError(f"need 1 <= top_k <= n_experts and tokens >= 0, got {n_experts}, {top_k}, {tokens}")
    return ((n_experts - top_k) / n_experts) ** tokens
