"""Naming what the reference GPT saves for backward: :func:`saved_tensor_category`.

:class:`memlab.measure.accounting.SavedTensorRecorder` calls it on every tensor autograd saves, with the stack of
modules running at that moment; the categories are :data:`memlab.predict.memory.activations.CATEGORIES`, so a measured
step's saved bytes line up with the estimator's terms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from memlab.model.gpt import MLP, Attention, AttentionCore, Block, Norm, ScoreSoftmax

if TYPE_CHECKING:
    from torch.autograd.graph import Node

# Nodes walked through to find where a saved tensor came from: views, casts and (for dropout, which is a
# multiply by noise off CUDA) multiplies, following their first input.
_PASS_THROUGH = ("View", "Reshape", "UnsafeView", "Transpose", "TBackward", "Permute", "Expand", "Alias", "ToCopy",
                 "Mul")


def _origin(node: Node | None, hops: int = 8) -> list[str]:
    """Names of ``node`` and its first inputs through view-like ops and casts (most recent first)."""
    names: list[str] = []
    while node is not None and hops > 0:
        name = node.name()
        names.append(name)
        if not name.startswith(_PASS_THROUGH) or not node.next_functions:
            break
        node = node.next_functions[0][0]
        hops -= 1
    if node is not None and node.name() == "torch::autograd::AccumulateGrad":
        names.append("AccumulateGrad")
    return names


def saved_tensor_category(t: torch.Tensor, scope: tuple[nn.Module, ...]) -> str:
    """Category of a tensor saved for backward by :class:`memlab.model.gpt.GPT`, in
    :data:`memlab.predict.memory.activations.CATEGORIES`.

    ``scope`` is the stack of modules running when it was saved (outermost first), as recorded by
    :class:`memlab.measure.accounting.SavedTensorRecorder`.
    """
    chain = _origin(t.grad_fn)
    if "AccumulateGrad" in chain and any(n.startswith("ToCopy") for n in chain):
        return "autocast weight copies"
    if t.dtype == torch.int64:
        return "token ids"
    for module in reversed(scope):
        if isinstance(module, Norm):
            return "norms"
        if isinstance(module, ScoreSoftmax):
            return "attention scores"
        if isinstance(module, AttentionCore):
            # The probabilities, their 16-bit copy or dropped version, and dropout masks (a bool mask, or a
            # noise tensor shaped like the probabilities; the fused kernels' 3-D log-sum-exp has no grad_fn too).
            scores = t.dtype == torch.bool or (t.grad_fn is None and t.dim() >= 4)
            scores = scores or any("Softmax" in n or "Dropout" in n for n in chain)
            return "attention scores" if scores else "attention"
        if isinstance(module, Attention):
            return "attention"
        if isinstance(module, MLP):
            return "mlp"
        if isinstance(module, Block):
            return "block inputs (recompute)"
    return "head & loss"
