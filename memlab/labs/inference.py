"""Real int8 weights on a CPU: torch's built-in dynamic quantisation of ``nn.Linear``, measured byte for byte.

:func:`int8_linear_bytes` quantises a copy of a model with ``torch.ao.quantization.quantize_dynamic`` (int8
weights, per-tensor affine: one scale and one zero point per matrix; activations quantised on the fly) and counts
the int8 weight storage it packed, next to everything left in floating point. The LM head of the reference GPT
is ``F.linear`` on the (tied) embedding, not an ``nn.Linear``, so it stays in float, as
:mod:`memlab.predict.estimate` assumes for embeddings and head. This is the "measured" twin of the estimator's
int8 weights; int4 (AWQ/GPTQ kernels) has no CPU implementation in torch and stays predicted.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

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

