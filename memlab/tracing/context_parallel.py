"""Context parallelism traced on one CPU: ring attention written here on torch.distributed point-to-point ops, over a
fake process group, inside the reference GPT (issue 19).

Why not torch's own: ``torch.distributed.tensor.experimental.context_parallel`` (torch 2.13) dispatches only the
CUDA SDPA ops (``_scaled_dot_product_flash_attention``, ``_efficient_attention``, ``_cudnn_attention``); on CPU the
fused kernel is ``aten._scaled_dot_product_flash_attention_for_cpu``, and under ``context_parallel`` it raises
``NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
strategy registered.`` (real and fake tensors alike); the math backend fails on the causal mask (``aten.add.Tensor
got mixed torch.Tensor and DTensor``), and the efficient kernel has no CPU backend (``No viable backend for
scaled_dot_product_attention was found``). Fake CUDA tensors abort in autograd on a CPU-only torch
(:mod:`memlab.tracing.tracer`), so torch's CP cannot be traced here (:data:`TORCH_CP_ERRORS`, re-checked by
tests/studies/test_parallel_traces.py).

What is traced instead (:class:`RingAttentionCore`, the variant memlab's estimator models [liu2023]): each of ``cp``
ranks holds ``seq / cp`` consecutive tokens (no load balancing: rank ``r`` attends to chunks ``0..r``, the causal
mask inside its own). Forward, step ``i`` of ``cp``: the rank starts receiving the next K/V chunk from rank ``r - 1``
(``batch_isend_irecv``, sending its current one to ``r + 1``) and attends its queries to the current chunk with the
CPU flash kernel, merging the partial outputs by their log-sum-exp; it saves only its own q, k, v, the merged output
and log-sum-exp (what a fused kernel saves for its ``seq / cp`` tokens). Backward: K/V travel the ring again with
their gradients' accumulators (dK, dV of a chunk pass from rank to rank, each adding its share, and arrive home
after ``cp`` hops). The bytes these buffers add are :func:`memlab.studies.parallel_traces.ring_terms`.
:func:`trace_gpt_cp` traces rank ``r`` of the reference GPT's training step (fake tensors): every rank's tokens use
positions ``0 .. seq/cp - 1`` (a real run offsets them by ``r seq / cp``; bytes do not depend on the values).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from memlab.errors import SetupError
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

TORCH_CP_ERRORS = {
    "default (flash for CPU)": "Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a "
                               "sharding strategy registered.",
    "MATH": "aten.add.Tensor got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor before "
            "calling distributed operators!",
    "EFFICIENT_ATTENTION": "No viable backend for scaled_dot_product_attention was found.",
}
"""The errors torch 2.13's ``context_parallel`` raises on CPU, by SDPA backend (real and fake tensors alike),
re-checked by tests/studies/test_parallel_traces.py."""


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out, lse


def _exchange(send: tuple[torch.Tensor, ...], group: Any, rank: int, cp: int) -> tuple[list[Any], tuple]:
    """Send ``send`` to rank ``r + 1`` and receive as many tensors like them from ``r - 1``; (works, received)."""
    import torch.distributed as dist

    recv = tuple(torch.empty_like(t) for t in send)
    nxt, prev = dist.get_global_rank(group, (rank + 1) % cp), dist.get_global_rank(group, (rank - 1) % cp)
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in send] + \
        [dist.P2POp(dist.irecv, t, prev, group) for t in recv]
    return dist.batch_isend_irecv(ops), recv


class _RingAttention(torch.autograd.Function):
    """Causal ring attention over ``cp`` ranks: q (b, a, s/cp, d), k and v (b, kv, s/cp, d) of this rank's chunk."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, rank: int,
                cp: int) -> torch.Tensor:
        out: torch.Tensor | None = None
        lse: torch.Tensor | None = None
        cur = (k, v)
        for i in range(cp):
            j = (rank - i) % cp  # the chunk held at step i
            works, nxt = _exchange(cur, group, rank, cp) if i < cp - 1 else ([], ())
            if j <= rank:  # causal: later chunks are masked out entirely
                o, m = _flash(q, *cur, causal=j == rank)
                if out is None or lse is None:
                    out, lse = o.float(), m
                else:
                    new = torch.logaddexp(lse, m)
                    out = out * (lse - new).exp().unsqueeze(-1) + o.float() * (m - new).exp().unsqueeze(-1)
                    lse = new
                del o, m
            for w in works:
                w.wait()
            if nxt:
                cur = nxt  # type: ignore[assignment]
        del cur
        assert out is not None and lse is not None  # step 0 is the rank's own chunk
        result = out.to(q.dtype)
        del out
        ctx.save_for_backward(q, k, v, result, lse)
        ctx.ring = (group, rank, cp)
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        group, rank, cp = ctx.ring
        grad = grad.contiguous()
        dq = torch.zeros_like(q)
        cur = (k, v)
        acc = (torch.zeros_like(k), torch.zeros_like(v))  # the gradients of the chunk held, travelling with it
        for i in range(cp):
            j = (rank - i) % cp
            works, nxt = _exchange(cur, group, rank, cp) if i < cp - 1 else ([], ())
            if j <= rank:
                gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    grad, q, *cur, out, lse, 0.0, j == rank)
                dq.add_(gq)
                acc[0].add_(gk)
                acc[1].add_(gv)
                del gq, gk, gv
            for w in works:
                w.wait()
            moved, acc = _exchange(acc, group, rank, cp)  # pass this chunk's gradients on; take the next one's
            for w in moved:
                w.wait()
            if nxt:
                cur = nxt  # type: ignore[assignment]
        return dq, acc[0], acc[1], None, None, None


class RingAttentionCore(nn.Module):
    """The reference GPT's attention core (:class:`memlab.model.gpt.AttentionCore`'s call: q (b, s, a, d), k and v
    (b, s, kv, d) to (b, s, a d)) as causal ring attention over ``cp`` ranks of ``group``, this being ``rank``."""

    def __init__(self, group: Any, rank: int, cp: int) -> None:
        super().__init__()
        self.group, self.rank, self.cp = group, rank, cp

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Ring attention of this rank's ``s = seq / cp`` queries over the whole sequence's keys and values."""
        b, s, a, d = q.shape
        out = _RingAttention.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.group, self.rank,
                                   self.cp)
        return out.transpose(1, 2).reshape(b, s, a * d)


def context_parallel(model: nn.Module, group: Any, rank: int, cp: int) -> nn.Module:
    """Replace every block's attention core of the reference GPT ``model`` by :class:`RingAttentionCore`."""
    for block in model.blocks:  # type: ignore[union-attr]
        block.attn.core = RingAttentionCore(group, rank, cp)
    return model


def trace_gpt_cp(config: TransformerConfig, setup: Setup, *, rank: int = 0, device_type: str) -> Any:
    """Trace rank ``rank`` of the reference GPT's training step under ring-attention context parallelism over a fake
    ``setup.cp``-rank group (fake tensors; :func:`memlab.tracing.tracer.trace_step`): ``setup.batch`` sequences of
    ``setup.seq / setup.cp`` tokens on the rank, the CPU flash kernel (``attention='flash'``)."""
    import torch.distributed as dist

    from memlab.predict.parallel.pipeline import check_parallel
    from memlab.tracing.fake_dist import fake_process_group
    from memlab.tracing.gpt import gpt_step_parts
    from memlab.tracing.tracer import trace_step

    if setup.cp < 2 or setup.tp > 1 or setup.pp > 1 or setup.world_size > 1:
        raise SetupError("trace_gpt_cp traces context parallelism alone: cp > 1, tp 1, pp 1, world_size 1")
    if setup.attention != "flash" or setup.recompute == "full" or config.dropout > 0 or setup.precision != "fp32":
        raise SetupError("the traced ring attention runs the CPU flash kernel in fp32: attention='flash', "
                         "precision='fp32', no dropout, recompute none or selective")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < setup.cp:
        raise SetupError(f"rank must be an int in [0, {setup.cp}), got {rank!r}")
    check_parallel(config, setup)
    local = setup.with_(seq=setup.seq // setup.cp, cp=1)
    with fake_process_group(setup.cp, rank):
        parts = gpt_step_parts(config, local, device_type=device_type)
        notes = parts.pop("notes")
        build, group = parts["model_fn"], dist.group.WORLD
        parts["model_fn"] = lambda: context_parallel(build(), group, rank, setup.cp)
        return trace_step(**parts, fake=True, name=config.name, setup=setup.to_dict(),
                          notes=(*notes, f"ring attention (written here, point-to-point K/V) over a fake "
                                 f"{setup.cp}-rank group: rank {rank}, {local.seq} of {setup.seq} tokens"))
