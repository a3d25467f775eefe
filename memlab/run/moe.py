"""A mixture-of-experts MLP for the reference GPT (``TransformerConfig.n_experts > 1``).

Top-k token-choice routing as in Mixtral [jiang2024, Sec. 2]: a bias-free router scores the
``n_experts`` experts per token, the top ``top_k`` are kept and their softmax-renormalised weights scale the
experts' outputs; ``n_shared_experts`` MLPs run on every token (DeepSeekMoE [dai2024]). Each expert is a
:class:`memlab.run.gpt.MLP`, so parameter names are ``mlp.router.weight``, ``mlp.experts.<e>.*`` and
``mlp.shared.<e>.*``, exactly :meth:`TransformerConfig.param_shapes`.

Memory and work part ways here: every expert's weights are resident (built, moved, sharded alike), while each
token is multiplied only by its top_k experts' weights (plus the shared ones). The loop gathers each expert's
tokens and runs the expert on those rows only, so FLOP counters see the active work. No capacity factor, no
token dropping, no load-balancing loss: this model exists to be measured, not trained well.
"""

from __future__ import annotations

import torch
from torch import nn

from memlab.predict.models import TransformerConfig
from memlab.run.gpt import MLP


class MoEMLP(nn.Module):
    """Router + routed experts + shared experts; forward maps (b, s, h) to (b, s, h)."""

    def __init__(self, config: TransformerConfig, device: torch.device | None, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.top_k = config.top_k
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False, device=device, dtype=dtype)
        self.experts = nn.ModuleList(MLP(config, device, dtype) for _ in range(config.n_experts))
        self.shared = nn.ModuleList(MLP(config, device, dtype) for _ in range(config.n_shared_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        weights, chosen = torch.topk(self.router(flat).float().softmax(-1), self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        for expert in self.shared:
            out = out + expert(flat)
        return out.view(b, s, h)


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

