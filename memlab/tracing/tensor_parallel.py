"""Megatron tensor parallelism with DTensor on a fake process group, traced on one CPU (issue 19).

:func:`tensor_parallel` applies ``torch.distributed.tensor.parallel.parallelize_module`` to the reference GPT's
blocks from one table (:data:`TP_PLAN`, picotron-style: module, style): q, k, v, gate and up column-parallel, o and
down row-parallel [shoeybi2019]; each rank's attention then holds ``n_heads / tp`` heads (the modules' head counts
are set to the local ones, as torchtitan's model reads them from the local shapes). The embeddings and the LM head
stay replicated here (memlab's estimate counts them vocab-parallel, as Megatron-LM shards them): that difference is
a named term, :func:`replicated_terms`. Sequence parallelism is not traced (its norms' DTensor layouts are not
wired into the reference GPT). :func:`trace_gpt_tp` traces rank 0 of ``setup.tp`` ranks.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from memlab.errors import SetupError
from memlab.predict.models import TransformerConfig
from memlab.predict.setup import Setup

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
        attn = block.attn
        attn.n_heads //= tp
        attn.n_kv_heads //= tp
        attn.core.n_kv_heads //= tp
    return model


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


def explained(config: TransformerConfig, setup: Setup, step: str, phase: str) -> int | None:
    """The named terms' sum at the peak of ``phase`` (forward: parameters + the logits and log-softmax;
    backward: + the logits' gradient; the steady step adds Adam's two moments of the replicated parameters);
    None for the optimizer step and zero_grad, which are not explained term by term (benchmark shows them)."""
    terms = replicated_terms(config, setup)
    p, logits = terms["replicated embedding/head parameters"], terms["full-vocabulary logits-sized tensor"]
    moments = 2 * p if step == "steady" and setup.optimizer in ("adam", "adamw") else 0
    if phase == "forward":
        return p + moments + 2 * logits
    if phase == "backward":
        return p + moments + 3 * logits
    return None


def trace_gpt_tp(config: TransformerConfig, setup: Setup, *, device_type: str = "cpu") -> Any:
    """Trace rank 0 of the reference GPT under DTensor tensor parallelism over a fake ``setup.tp``-rank group
    (fake tensors; :func:`memlab.tracing.tracer.trace_step`)."""
    from memlab.predict.sharding import check_tp
    from memlab.tracing.fake_dist import fake_process_group
    from memlab.tracing.gpt import gpt_step_parts
    from memlab.tracing.tracer import trace_step

    if setup.tp < 2 or setup.sp or setup.world_size > 1 or setup.pp > 1 or setup.cp > 1:
        raise SetupError("trace_gpt_tp traces tensor parallelism alone: tp > 1, no sp, world_size 1, pp 1, cp 1")
    check_tp(config, setup.tp)
    with fake_process_group(setup.tp) as mesh:
        parts = gpt_step_parts(config, setup.with_(tp=1), device_type=device_type)
        notes = parts.pop("notes")
        build = parts["model_fn"]
        parts["model_fn"] = lambda: tensor_parallel(build(), mesh, setup.tp)
        return trace_step(**parts, fake=True, name=config.name, setup=setup.to_dict(),
                          notes=(*notes, f"DTensor tensor parallelism over a fake {setup.tp}-rank group: rank 0"))
