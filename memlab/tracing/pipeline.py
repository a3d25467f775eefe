"""Pipeline parallelism traced on one CPU: torch.distributed.pipelining's own schedules on a fake process group.

:func:`run_stage_step` builds the reference GPT's stage ``rank`` of ``setup.pp`` (its blocks by
:func:`memlab.predict.parallel.pipeline.virtual_stage_layers`; the embeddings on the first stage, the final norm, an LM
head of its own and the loss on the last, as Megatron-LM places them) as a ``PipelineStage`` with static shapes, runs
one
training step of ``Schedule1F1B``, ``ScheduleGPipe`` or ``ScheduleInterleaved1F1B`` over ``setup.micro_batches``
micro-batches on a fake group
(:func:`memlab.tracing.fake_dist.fake_process_group`: sends and receives return at once, nothing arrives), and counts
every live storage with the counter it is given (:func:`memlab.studies.pipeline.trace_stage` gives
:class:`memlab.measure.live_bytes.LiveBytes`; real tensors: keep the shapes small).

Found when this was built (torch 2.13): a schedule runs backward only when it has a ``loss_fn`` (every stage, not
only the last); the stages' warm-up vote on static shapes travels over the group, and a fake group delivers zeros
(a "dynamic" vote that then waits for shape metadata no peer sends), so the vote's result is given here: every shape
is static (the stage is built with ``input_args``, ``output_args`` and ``output_grads``). The interleaved schedule
runs ``pp_chunks`` stages on each rank (virtual stages ``rank, rank + pp, ...``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memlab.errors import SetupError
from memlab.predict.parallel.pipeline import virtual_stage_layers
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup


class StageModule(nn.Module):
    """Blocks ``layers`` of a reference GPT; the first stage embeds token ids, the last returns logits."""

    def __init__(self, gpt: nn.Module, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.tok_emb = gpt.tok_emb if first else None
        self.pos_emb = gpt.pos_emb if first else None
        self.rotary = gpt.rotary
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in layers)
        self.norm_f = gpt.norm_f if last else None
        cfg = gpt.config
        # the last stage's own LM head (a tied model's second copy, as Megatron-LM keeps it)
        self.head = (gpt.head if gpt.head is not None else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)) \
            if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            s = x.shape[1]
            x = self.tok_emb(x)
            if self.pos_emb is not None:
                x = x + self.pos_emb(torch.arange(s, device=x.device))
        for block in self.blocks:
            x = block(x, self.rotary)
        if self.last:
            x = self.head(self.norm_f(x))
        return x


def run_stage_step(config: TransformerConfig, setup: Setup, rank: int,
                   meter: Callable[[nn.Module], contextlib.AbstractContextManager[Any]]) -> Any:
    """Run one training step of pipeline rank ``rank`` under ``setup`` (``pp``, ``pp_schedule`` 1f1b or gpipe,
    ``micro_batches``; ``batch`` is the micro-batch) on a fake process group, inside ``meter(stage_module)`` (a
    counter such as :class:`memlab.measure.live_bytes.LiveBytes`, entered after the stage is built); returns what
    the context manager yields. fp32, real tensors (keep the shapes small), no optimizer step. Under torchrun (a
    process group initialised, ``pp`` ranks) the stage runs over that group instead: real sends and receives."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    from memlab.model.gpt import GPT
    from memlab.model.loss import logits_loss
    from memlab.predict.parallel.pipeline import check_parallel, rank_virtual_stages
    from memlab.tracing.fake_dist import fake_process_group

    p, m, v = setup.pp, setup.micro_batches, setup.pp_chunks
    if p < 2 or setup.precision != "fp32" or setup.tp > 1 or setup.cp > 1 or setup.world_size > 1:
        raise SetupError("a pipeline stage is run for pp > 1, fp32, without tp, cp or data parallelism")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < p:
        raise SetupError(f"rank must be an int in [0, {p}), got {rank!r}")
    if setup.pp_schedule == "1f1b" and m < p:
        raise SetupError(f"torch's Schedule1F1B needs micro_batches >= pp ({m} < {p})")
    check_parallel(config, setup)
    layers = virtual_stage_layers(config.n_layers, p, v)
    b, s, h = setup.batch, setup.seq, config.d_model
    n = p * v
    import torch.distributed as dist

    real = dist.is_initialized()  # under torchrun: this rank's own group (gloo), else a fake one
    if real and (dist.get_world_size() != p or dist.get_rank() != rank):
        raise SetupError(f"the process group has {dist.get_world_size()} ranks and this is rank {dist.get_rank()}: "
                         f"run pp={p} ranks and pass this rank")
    with contextlib.nullcontext() if real else fake_process_group(p, rank):
        torch.manual_seed(0)
        gpt = GPT(config, attention=setup.attention, recompute=setup.recompute)
        modules, stages = nn.ModuleList(), []
        for j in rank_virtual_stages(p, v, rank):
            first, last = j == 0, j == n - 1
            module = StageModule(gpt, layers[j], first, last)
            x_in = torch.zeros(b, s, dtype=torch.long) if first else torch.zeros(b, s, h)
            out = torch.zeros(b, s, config.vocab_size) if last else torch.zeros(b, s, h)
            stage = PipelineStage(module, j, n, torch.device("cpu"), input_args=(x_in,), output_args=(out,),
                                  output_grads=(None if last else torch.zeros(b, s, h),),
                                  input_grads=(None if first else torch.zeros(b, s, h),))
            if not real:  # a fake group delivers nothing: the warm-up vote's result (every shape static) is given
                stage._warmup_backward_result = lambda received_result=None: torch.ones(1, dtype=torch.int32)
                stage._warmup_forward_vote = lambda has_backward, received_acc=None: torch.ones(1, dtype=torch.int32)
            modules.append(module)
            stages.append(stage)
        del gpt
        # a loss_fn switches backward on for every stage; only the last virtual stage calls it
        if setup.pp_schedule == "interleaved":
            sched: Any = ScheduleInterleaved1F1B(stages, m, loss_fn=logits_loss)
        else:
            sched = (Schedule1F1B if setup.pp_schedule == "1f1b" else ScheduleGPipe)(stages[0], m,
                                                                                      loss_fn=logits_loss)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, config.vocab_size, (b * m, s), generator=gen)
        holds_last = (n - 1) in rank_virtual_stages(p, v, rank)
        with meter(modules) as counted:
            if rank == 0:
                sched.step(ids, target=ids if holds_last else None)
            else:
                sched.step(target=ids if holds_last else None)
        return counted
