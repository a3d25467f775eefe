"""Expert parallelism traced on one CPU: the reference GPT's MoE layers with their experts split over ``ep`` ranks
of a fake process group, tokens dispatched and combined by ``all_to_all_single`` (issue 19).

:class:`ExpertParallelMoE` replaces each block's :class:`memlab.model.gpt.MoEMLP` on rank 0 of ``setup.ep``: the
same router and expert MLPs (:class:`memlab.model.gpt.MLP`), only ``n_experts / ep`` experts local. Its forward
[lepikhin2020, Sec. 3.1; megatron-moe ``MoEAlltoAllTokenDispatcher``]: router softmax (fp32); the (token, choice)
pairs sorted by expert and gathered (the dispatch's send buffer); ``all_to_all_single`` to the experts' ranks
(``torch.distributed._functional_collectives.all_to_all_single_autograd``, whose backward is the reverse
all-to-all); each local expert on the pairs it received from each rank; the outputs back by a second all-to-all
(combine); each pair scaled by its gate and added into its token's row.

Routing is FORCED balanced: pair ``p = i * top_k + j`` (token i, choice j) goes to expert ``p % n_experts`` (k
distinct experts per token, every expert ``t k / E`` pairs), because a fake tensor has no values to route by and
a data-dependent split has no static shape; the router still runs and its gates carry the gradient. So the trace
checks :func:`memlab.predict.parallel.experts.expert_estimate` under ``ep_routing='balanced'``; the worst case is the
formula's alone. Data parallelism is not run (no gradient all-reduce, ZeRO 0: every data-parallel rank holds the
same bytes); the fake group makes the all-to-alls return at once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from memlab.errors import SetupError
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup


class ExpertParallelMoE(nn.Module):
    """Rank ``rank``'s part of a MoE layer under expert parallelism over ``ep`` ranks of ``group`` (module
    docstring): ``router`` (all experts' scores), ``experts`` (the local ``n_experts / ep``), ``shared``."""

    def __init__(self, config: TransformerConfig, ep: int, group: Any, dtype: torch.dtype | None) -> None:
        from memlab.model.gpt import MLP

        super().__init__()
        if config.n_experts % ep:
            raise SetupError(f"ep={ep} must divide n_experts={config.n_experts}")
        self.n_experts, self.top_k, self.ep, self.group = config.n_experts, config.top_k, ep, group
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False, dtype=dtype)
        self.experts = nn.ModuleList(MLP(config, None, dtype) for _ in range(config.n_experts // ep))
        self.shared = nn.ModuleList(MLP(config, None, dtype) for _ in range(config.n_shared_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        b, s, h = x.shape
        t, k, E, ep = b * s, self.top_k, self.n_experts, self.ep
        pairs = t * k
        if pairs % E:
            raise SetupError(f"balanced routing needs batch x seq x top_k = {pairs} to be a multiple of n_experts={E}")
        flat = x.reshape(t, h)
        probs = self.router(flat).float().softmax(-1)
        order = torch.arange(pairs).reshape(pairs // E, E).t().reshape(-1)  # pairs sorted by expert p % E
        token = order // k
        gate = probs.reshape(-1).index_select(0, token * E + order % E).to(x.dtype)
        send = flat.index_select(0, token)  # the dispatch's send buffer: pairs grouped by destination rank
        splits = [pairs // ep] * ep
        recv = all_to_all_single_autograd(send, splits, splits, self.group)
        del send
        per = pairs // E  # pairs one expert gets from one rank
        outs = [expert(recv[(src * len(self.experts) + e) * per:(src * len(self.experts) + e + 1) * per])
                for src in range(ep) for e, expert in enumerate(self.experts)]
        back = all_to_all_single_autograd(torch.cat(outs), splits, splits, self.group)
        del outs
        out = torch.zeros_like(flat).index_add(0, token, back * gate[:, None])
        for expert in self.shared:
            out = out + expert(flat)
        return out.view(b, s, h)


def expert_parallel(model: nn.Module, config: TransformerConfig, ep: int, group: Any) -> nn.Module:
    """Replace every block's MLP of the reference GPT ``model`` by rank 0's :class:`ExpertParallelMoE`."""
    dtype = next(model.parameters()).dtype
    for block in model.blocks:  # type: ignore[union-attr]
        block.mlp = ExpertParallelMoE(config, ep, group, dtype)
    return model


def trace_gpt_ep(config: TransformerConfig, setup: Setup, *, device_type: str) -> Any:
    """Trace rank 0 of the reference GPT under expert parallelism over a fake ``setup.ep``-rank group (fake tensors,
    :func:`memlab.tracing.tracer.trace_step`), routing forced balanced (module docstring). ``setup.world_size`` is
    the data-parallel ranks the ep ranks come from (ZeRO 0 only: not run, it changes no rank's bytes)."""
    import torch.distributed as dist

    from memlab.predict.parallel.experts import check_ep
    from memlab.tracing.fake_dist import fake_process_group
    from memlab.tracing.gpt import gpt_step_parts
    from memlab.tracing.tracer import trace_step

    if not isinstance(config, TransformerConfig) or not isinstance(setup, Setup):
        raise SetupError("trace_gpt_ep needs a TransformerConfig and a Setup")
    if setup.ep < 2 or setup.zero_stage or setup.tp > 1 or setup.ep_routing != "balanced":
        raise SetupError("trace_gpt_ep traces expert parallelism alone: ep > 1, zero_stage 0, tp 1, balanced routing")
    check_ep(config, setup)
    with fake_process_group(setup.ep):
        parts = gpt_step_parts(config, setup.with_(ep=1, world_size=1), device_type=device_type)
        notes = parts.pop("notes")
        build = parts["model_fn"]
        parts["model_fn"] = lambda: expert_parallel(build(), config, setup.ep, dist.group.WORLD)
        return trace_step(**parts, fake=True, name=config.name, setup=setup.to_dict(),
                          notes=(*notes, f"expert parallelism over a fake {setup.ep}-rank group: rank 0, "
                                 f"{config.n_experts // setup.ep} local experts a layer, routing forced balanced"))
