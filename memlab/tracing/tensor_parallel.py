"""Megatron tensor parallelism with DTensor on a fake process group, traced on one CPU (issue 19).

:func:`tensor_parallel` applies ``torch.distributed.tensor.parallel.parallelize_module`` to the reference GPT's
blocks from one table (:data:`TP_PLAN`, picotron-style: module, style): q, k, v, gate and up column-parallel, o and
down row-parallel [shoeybi2019]; each rank's attention then holds ``n_heads / tp`` heads (the modules' head counts
are set to the local ones, as torchtitan's model reads them from the local shapes). The embeddings and the LM head
stay replicated here (memlab's estimate counts them vocab-parallel, as Megatron-LM shards them): that difference is
a named term, :func:`replicated_terms`. :func:`trace_gpt_tp` traces rank 0 (or any rank) of ``setup.tp`` ranks.

Sequence parallelism (``setup.sp``, :func:`sequence_parallel`) follows torch's TP tutorial and torchtitan's
``parallelize_llama``: the residual stream between blocks is each rank's ``seq / tp`` tokens (a plain local tensor);
the norms are ``SequenceParallel`` (they run on the local tokens), attention and MLP all-gather their input
(``PrepareModuleInput``: Shard(1) to Replicate), and the row-parallel o and down reduce-scatter to Shard(1)
[korthikanti2022, Sec. 4.2.2]. The embeddings stay replicated (as in the TP plan): block 0 takes its rank's chunk
of the embedded sequence; the final norm runs sequence-split and its output is all-gathered for the replicated
head. What that differs by from memlab's estimate (which counts Megatron-LM's SP) is the named term
:func:`sequence_parallel_terms`: DTensor's column-parallel linears save their all-gathered input, Megatron-LM saves
the sequence shard and all-gathers it again in backward.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from memlab.errors import SetupError
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

TP_PLAN = (("attn.q", "colwise"), ("attn.k", "colwise"), ("attn.v", "colwise"), ("attn.o", "rowwise"),
           ("mlp.gate", "colwise"), ("mlp.up", "colwise"), ("mlp.down", "rowwise"))
"""(module inside a block, Megatron style) [shoeybi2019]; a module a block lacks (gate in a GELU MLP) is skipped."""


def tensor_parallel(model: nn.Module, mesh: Any, tp: int) -> nn.Module:
    """Shard every block of the reference GPT ``model`` over ``mesh`` (``tp`` ranks) by :data:`TP_PLAN`."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for block in model.blocks:  # type: ignore[union-attr]
        plan = {name: styles[style]() for name, style in TP_PLAN if _has(block, name)}
        parallelize_module(block, mesh, plan)
        _local_heads(block.attn, tp)
    return model


def sequence_parallel(model: nn.Module, mesh: Any, tp: int) -> nn.Module:
    """Shard the reference GPT ``model`` over ``mesh`` (``tp`` ranks) by :data:`TP_PLAN` with sequence parallelism
    (module docstring): the norms SequenceParallel, attention and MLP inputs all-gathered, o and down reduce-scattered
    to the sequence shard, block 0's input split, the final norm's output all-gathered."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    styles = {"colwise": ColwiseParallel, "rowwise": lambda: RowwiseParallel(output_layouts=Shard(1))}
    # a block is called (x, rotary, kv) and attention (x, rotary, kv); the MLP (x)
    seq, whole = (Shard(1), None, None), (Replicate(), None, None)
    for block in model.blocks:  # type: ignore[union-attr]
        plan: dict[str, Any] = {name: styles[style]() for name, style in TP_PLAN if _has(block, name)}
        plan.update({"norm1": SequenceParallel(), "norm2": SequenceParallel(),
                     "attn": PrepareModuleInput(input_layouts=seq, desired_input_layouts=whole),
                     "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))})
        parallelize_module(block, mesh, plan)
        _local_heads(block.attn, tp)
    parallelize_module(model.blocks[0], mesh, PrepareModuleInput(  # type: ignore[index]
        input_layouts=whole, desired_input_layouts=seq, use_local_output=True))
    parallelize_module(model.norm_f, mesh, SequenceParallel())  # type: ignore[arg-type]
    parallelize_module(model.norm_f, mesh, PrepareModuleOutput(  # type: ignore[arg-type]
        output_layouts=Shard(1), desired_output_layouts=Replicate()))
    return model


def _local_heads(attn: nn.Module, tp: int) -> None:
    attn.n_heads //= tp
    attn.n_kv_heads //= tp
    attn.core.n_kv_heads //= tp


def tensor_parallel_gpt(config: TransformerConfig, mesh: Any, tp: int, **gpt_options: Any) -> nn.Module:
    """The reference GPT (``memlab.model.gpt.GPT(config, **gpt_options)``) with its blocks sharded by
    :func:`tensor_parallel` over ``mesh``."""
    from memlab.model.gpt import GPT

    return tensor_parallel(GPT(config, **gpt_options), mesh, tp)


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def replicated_terms(config: TransformerConfig, setup: Setup) -> dict[str, int]:
    """Bytes rank 0 holds in the traced plan beyond memlab's vocab-parallel estimate, by named term: the token
    embedding (and an untied head) whole, ``(1 - 1/tp)`` of their elements more, as parameters (and again as Adam's
    two moments in the steady step); the logits and their fp32 log-softmax over the whole vocabulary (no loss
    parallel), ``(1 - 1/tp) t V 4`` bytes each; in backward one more such tensor (the logits' gradient)."""
    tp = setup.tp
    rows = config.vocab_size * (1 if config.tied_embeddings else 2)
    extra = rows * config.d_model - rows * config.d_model // tp
    t = setup.batch * setup.seq
    return {"replicated embedding/head parameters": extra * setup.policy.param_bytes,
            "full-vocabulary logits-sized tensor": t * config.vocab_size * 4 - t * config.vocab_size * 4 // tp}


SP_GATHERED = ("q/k/v projection input", "MLP input", "LM-head input")
"""The estimator's rows (:func:`memlab.predict.memory.activations.term_rows`) that DTensor's sequence-parallel plan
saves all-gathered (whole sequence) where Megatron-LM saves the sequence shard [korthikanti2022, Sec. 4.2.2]."""


def sequence_parallel_terms(config: TransformerConfig, setup: Setup, *, device_type: str) -> dict[str, int]:
    """Bytes rank ``r`` of the traced sequence-parallel plan saves beyond memlab's estimate (Megatron-LM's SP), by
    :data:`SP_GATHERED` row: each row's whole bytes less its ``1/tp`` share, ``(1 - 1/tp)`` of the row (the
    q/k/v and MLP inputs of every block, the LM head's input). Empty without ``setup.sp``."""
    from memlab.predict.memory.activations import term_rows

    if not setup.sp:
        return {}
    out: dict[str, int] = {}
    for row in term_rows(config, setup, device_type=device_type):
        if row[0] in SP_GATHERED:
            whole = row[2] * row[3]
            out[f"all-gathered {row[0]}"] = int(whole - whole / setup.tp)
    return out


def explained(config: TransformerConfig, setup: Setup, step: str, phase: str, *, device_type: str) -> int | None:
    """The named terms' sum at the peak of ``phase`` (forward: parameters + the logits and log-softmax;
    backward: + the logits' gradient; the steady step adds Adam's two moments of the replicated parameters; under
    sp both add :func:`sequence_parallel_terms`); None for the optimizer step and zero_grad, which are not
    explained term by term (benchmark shows them)."""
    terms = replicated_terms(config, setup)
    p, logits = terms["replicated embedding/head parameters"], terms["full-vocabulary logits-sized tensor"]
    moments = 2 * p if step == "steady" and setup.optimizer in ("adam", "adamw") else 0
    gathered = sum(sequence_parallel_terms(config, setup, device_type=device_type).values())
    if phase == "forward":
        return p + moments + 2 * logits + gathered
    if phase == "backward":
        return p + moments + 3 * logits + gathered
    return None


def trace_gpt_tp(config: TransformerConfig, setup: Setup, *, rank: int = 0, device_type: str) -> Any:
    """Trace rank ``rank`` of the reference GPT under DTensor tensor parallelism (with ``setup.sp``: sequence
    parallelism, :func:`sequence_parallel`) over a fake ``setup.tp``-rank group (fake tensors;
    :func:`memlab.tracing.tracer.trace_step`)."""
    from memlab.predict.memory.sharding import check_tp
    from memlab.tracing.fake_dist import fake_process_group
    from memlab.tracing.gpt import gpt_step_parts
    from memlab.tracing.tracer import trace_step

    if setup.tp < 2 or setup.world_size > 1 or setup.pp > 1 or setup.cp > 1:
        raise SetupError("trace_gpt_tp traces tensor (and sequence) parallelism alone: tp > 1, world_size 1, pp 1, "
                         "cp 1")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < setup.tp:
        raise SetupError(f"rank must be an int in [0, {setup.tp}), got {rank!r}")
    if setup.sp and (config.impl.parallel_block or config.dropout > 0 or config.is_moe):
        raise SetupError("the sequence-parallel plan is written for sequential blocks without dropout, dense MLPs")
    check_tp(config, setup.tp)
    shard = sequence_parallel if setup.sp else tensor_parallel
    kind = "tensor and sequence" if setup.sp else "tensor"
    with fake_process_group(setup.tp, rank) as mesh:
        parts = gpt_step_parts(config, setup.with_(tp=1, sp=False), device_type=device_type)
        notes = parts.pop("notes")
        build = parts["model_fn"]
        parts["model_fn"] = lambda: shard(build(), mesh, setup.tp)
        return trace_step(**parts, fake=True, name=config.name, setup=setup.to_dict(),
                          notes=(*notes, f"DTensor {kind} parallelism over a fake {setup.tp}-rank group: rank {rank}"))
