"""FSDP2 on the reference GPT, the one way memlab applies it: the trace (over a fake process group) and the gloo /
NCCL ranks both call :func:`shard_model`, and the estimator models the same plan (:mod:`memlab.predict.memory.fsdp`).

- ``units="blocks"``: ``fully_shard`` on every block, then on the root (which keeps the embedding, the final norm
  and the head);
- ``units="torchtitan"``: the embedding, every block, and ``[final norm, head]`` as units of their own, then the
  root (torchtitan v0.2.2 ``apply_fsdp``); a tied embedding stays in the root with the head (FSDP2 refuses a
  parameter in two groups);
- ``reshard_after_forward``: ZeRO-3 (``zero_stage=3``) for the embedding and the blocks, False under ZeRO-2; the
  final norm + head unit never (torchtitan's default: backward needs it at once); the root is left to FSDP2,
  which does not reshard it after forward, unless ``reshard_root`` (``Setup.fsdp_reshard_root``) asks for it;
- ``param_dtype`` / ``reduce_dtype``: ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` [pytorch-fsdp2]
  (``output_dtype`` left None); ``offload``: ``CPUOffloadPolicy(pin_memory)`` (the trace passes
  ``pin_memory=False``: fake tensors cannot pin; pinning changes the host allocator, not the bytes).

:func:`step_loss` computes the loss inside the root module's forward (``model(idx, targets)``) or outside it
(``logits_loss(model(idx), targets)``, as torchtitan's trainer does).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from memlab.device import torch_dtype
from memlab.errors import SetupError
from memlab.predict.memory.fsdp import FSDP_LOSS, FSDP_UNITS


def shard_model(model: nn.Module, *, zero_stage: int, units: str = "blocks", param_dtype: str = "none",
                reduce_dtype: str = "fp32", mesh: Any = None, offload: bool = False,
                reshard_root: bool = False, pin_memory: bool = True) -> nn.Module:
    """Apply FSDP2's ``fully_shard`` to ``model`` by the plan in the module docstring, its blocks found by
    :func:`blocks_of` (the reference GPT's, or a Hugging Face causal LM's decoder layers with ``units="blocks"``);
    returns ``model``."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if zero_stage not in (2, 3):
        raise SetupError(f"FSDP2 runs ZeRO stage 2 (reshard_after_forward=False) or 3 (True), got {zero_stage}")
    if units not in FSDP_UNITS:
        raise SetupError(f"fsdp_units must be one of {', '.join(FSDP_UNITS)}, got {units!r}")
    blocks = blocks_of(model)
    if is_hf(model) and units != "blocks":
        raise SetupError("the torchtitan wrapping plan is written for memlab's reference GPT: use "
                         "fsdp_units='blocks' for a Hugging Face model")
    kw: dict[str, Any] = {"mesh": mesh}
    if param_dtype != "none":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch_dtype(param_dtype),
                                               reduce_dtype=torch_dtype(reduce_dtype))
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=pin_memory)
    reshard = zero_stage == 3
    tied = getattr(model, "head", True) is None
    if units == "torchtitan" and not tied:
        embed = [m for m in (model.tok_emb, getattr(model, "pos_emb", None)) if m is not None]
        fully_shard(embed if len(embed) > 1 else embed[0], reshard_after_forward=reshard, **kw)
    for block in blocks:
        fully_shard(block, reshard_after_forward=reshard, **kw)
    if units == "torchtitan" and not tied:
        fully_shard([model.norm_f, model.head], reshard_after_forward=False, **kw)
    # the root: reshard_after_forward left to FSDP2 (not resharded after forward), or True when asked
    fully_shard(model, **({"reshard_after_forward": True} if reshard_root else {}), **kw)
    return model


def is_hf(model: nn.Module) -> bool:
    """Whether ``model`` is a transformers causal LM (a ``config`` with a ``model_type`` and an output embedding),
    not memlab's reference GPT; judged without importing transformers."""
    return hasattr(getattr(model, "config", None), "model_type") and hasattr(model, "get_output_embeddings")


def blocks_of(model: nn.Module) -> nn.ModuleList:
    """The list of blocks FSDP2 shards one by one: the reference GPT's ``model.blocks``; for a transformers causal
    LM the longest ``nn.ModuleList`` of its base model (the decoder layers: ``model.layers`` for Llama-like
    families, ``transformer.h`` for GPT-2, ``gpt_neox.layers``, ...), also inside peft's wrapper. :class:`SetupError`
    when there is none."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        return blocks
    if is_hf(model):
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's wrapper: its model
        base = getattr(inner, "base_model", inner)
        lists = [m for m in base.children() if isinstance(m, nn.ModuleList) and len(m)]
        if lists:
            return max(lists, key=len)
    raise SetupError(f"cannot find the blocks of {type(model).__name__} to shard (the reference GPT's model.blocks, "
                     "or a transformers causal LM's decoder layers: an nn.ModuleList of its base model)")


def step_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, where: str = "inside") -> torch.Tensor:
    """The training loss, computed ``inside`` the model's forward or ``outside`` it
    (:func:`memlab.model.loss.logits_loss` on the returned logits). A transformers causal LM (:func:`is_hf`) is
    called as memlab calls one everywhere, its loss inside (:func:`memlab.model.loss.hf_causal_lm_loss`,
    ``model(input_ids=idx, labels=idx).loss``: transformers shifts the labels itself, so ``targets`` is unused)."""
    from memlab.model.loss import hf_causal_lm_loss, logits_loss

    if where not in FSDP_LOSS:
        raise SetupError(f"fsdp_loss must be one of {', '.join(FSDP_LOSS)}, got {where!r}")
    if is_hf(getattr(model, "module", model)):  # DistributedDataParallel keeps the model as .module
        if where != "inside":
            raise SetupError("a Hugging Face model computes its loss inside its forward (labels=...): use "
                             "fsdp_loss='inside'")
        return hf_causal_lm_loss(model, idx, idx)
    if where == "inside":
        return model(idx, targets)
    return logits_loss(model(idx), targets)
