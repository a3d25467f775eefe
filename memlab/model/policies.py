"""Checkpointing policies as frameworks write them, for the reference GPT and transformers models.

- :func:`torchtitan_op_context`: torchtitan's per-op selective activation checkpointing
  (``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``): inside a checkpointed block, the
  outputs of the ops on :data:`TORCHTITAN_SAVE_LIST` are kept, except every second ``aten.mm`` (counted from the
  block's first), and everything else is recomputed in backward; written with PyTorch's policy-based selective
  checkpointing, ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` [pytorch-checkpoint]. Source:
  pytorch/torchtitan@9a8cb98 (2025-07-16) torchtitan/models/llama3/infra/parallelize.py, lines 230-240
  (``_save_list``) and 291-313 (``_custom_policy``: a fresh ``mm`` counter per checkpointed call, forward and
  recompute counted apart).

The counted ops are what reaches the dispatcher: ``nn.Linear`` on a 3-D input without a bias is ``aten.mm`` (after
a view), with a bias ``aten.addmm`` (``_flatten_nd_linear``, aten/src/ATen/native/Linear.cpp), which that list does
not name: a biased projection is recomputed. Eager attention's matmuls are ``aten.bmm``: recomputed too. SDPA's
CUDA flash and memory-efficient kernels are on the list; on CPU the flash kernel is
``_scaled_dot_product_flash_attention_for_cpu``, which is not.

Introduced for issue 34 (checkpointing as frameworks do it) and chapter 04.
"""

from __future__ import annotations

from typing import Any

import torch

TORCHTITAN_SAVE_LIST = (
    "aten.mm.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "aten.max.default",
)
"""torchtitan's ``_save_list`` at pytorch/torchtitan@9a8cb98, torchtitan/models/llama3/infra/parallelize.py lines
231-240, as ``namespace.op.overload`` names."""


def _op(name: str) -> Any:
    space, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, space), op), overload)


def torchtitan_op_context() -> tuple[Any, Any]:
    """The ``context_fn`` result for one checkpointed call under torchtitan's per-op policy (module docstring):
    pass ``context_fn=torchtitan_op_context`` to ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``.
    Each call gets its own counter of ``aten.mm`` calls, for the forward and the recompute apart, as torchtitan's
    ``selective_checkpointing_context_fn`` makes a fresh ``meta`` per call."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = {_op(name) for name in TORCHTITAN_SAVE_LIST}
    mm = torch.ops.aten.mm.default
    count = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            count[mode] += 1
        keep = func in save and not (func == mm and count[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
