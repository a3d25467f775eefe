"""Expert parallelism (EP) for a mixture of experts, per rank: the experts a rank holds, the tokens its experts
receive, the all-to-all buffers, and the bytes that makes (``Setup.ep``, ``Setup.ep_routing``). Bytes; no torch.

Expert parallelism places each MoE layer's ``n_experts`` experts on ``ep`` ranks, ``n_experts / ep`` each; a token
is sent to the rank of each expert its router chose by an all-to-all (*dispatch*), the experts' outputs come back
by a second all-to-all (*combine*), two in each layer's forward and two (their gradients) in its backward
[lepikhin2020, Sec. 2.2-3.1; rajbhandari2022, Sec. 5; megatron-moe: ``MoEAlltoAllTokenDispatcher``]. Term by term:

- ranks: the ``ep`` ranks are drawn from the ``world_size`` data-parallel ranks, as in DeepSpeed-MoE (expert
  parallelism "combined with" data parallelism: the expert-data-parallel group of ``world_size / ep`` ranks that
  hold the same experts [rajbhandari2022, Sec. 5]) and Megatron-Core (``--expert-model-parallel-size`` divides the
  data-parallel ranks [megatron-moe]); torchtitan's ``ep`` borrows its ranks from dp_shard x cp the same way.
  So ``world_size % ep == 0``, ``n_experts % ep == 0``, and no rank is added.
- model states: the dense parameters (attention, norms, embeddings, router, shared experts) on every rank, the
  routed experts ``1 / ep`` of them; ZeRO shards the dense states over the ``world_size`` data-parallel ranks and
  the experts' over the ``world_size / ep`` ranks that hold the same experts [rajbhandari2022, Sec. 5]; tensor
  parallelism splits every expert's d_ff as a dense MLP's (Megatron's expert tensor parallelism equal to tp
  [megatron-moe]). The states of a count of parameters are the estimator's own
  (:func:`memlab.predict.estimate.estimate` on a bare count), as :mod:`memlab.predict.parallel.pipeline` reuses them.
- tokens received: memlab's reference router is dropless (top-k token choice with no capacity, no dropping:
  :class:`memlab.model.gpt.MoEMLP`), so a rank's experts receive what the routers send: ``balanced`` (every expert
  the same share: ``t k`` (token, expert) pairs per rank, t tokens per rank, k = top_k) or ``worst`` (every token
  of every ep rank chooses ``min(k, n_experts / ep)`` of this rank's experts: ``ep t min(k, E / ep)`` pairs, the
  dropless upper bound). A capacity factor C caps an expert at ``C t k / E`` pairs [fedus2021, Sec. 2.2;
  lepikhin2020, Sec. 2.2] (dropping the rest): with C the worst case becomes ``C t k`` per rank
  (:func:`capacity_pairs`), which a router with a drop policy would need; the reference router has none.
- activations: the estimator's rows (:func:`memlab.predict.memory.activations.term_rows`) with the routed MLP's rows
  replaced by the expert-parallel layer's (:func:`ep_layer_rows`, as :mod:`memlab.tracing.experts` runs it, checked
  against its trace): the router's fp32 softmax, two pair indices, the gate per pair, the received pairs (the
  experts' input), the experts' d_ff-wide tensors per received pair, the combined pairs; shared experts are dense
  MLPs on every token.
- all-to-all buffers: at a dispatch a rank holds its send buffer (``t k`` pairs x h) and its receive buffer
  (received pairs x h); at a combine the reverse; counted as a transient of one layer (one moment).
- peak: the larger of two moments. The end of forward as :mod:`memlab.predict.parallel.pipeline` takes it, with every
  gradient already there (a bound): states + saved activations + the model's buffers + the largest transient of one
  layer (its backward temporaries, :func:`memlab.predict.memory.phases.layer_terms`, or the all-to-all buffers; under
  ZeRO-3 one gathered block; under full recompute one block's recomputed tensors). And the optimizer step: the
  estimator's step peak for the dense and for the expert parameters, each over its ZeRO group, summed (a bound).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from memlab.errors import SetupError
from memlab.predict.memory.activations import FP32, INT64, TermRow, bytes_by_category, shared_widths, term_rows
from memlab.predict.memory.breakdown import StateParts, model_buffer_bytes, rank_breakdown
from memlab.predict.memory.phases import layer_terms
from memlab.predict.memory.sharding import check_tp, tp_shard_shape
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

ROUTINGS = ("balanced", "worst")
"""Routing cases modelled for a dropless router: every expert the same share, or all tokens on one rank's experts."""


def check_ep(config: TransformerConfig, setup: Setup) -> None:
    """One :class:`SetupError` line for an expert-parallel layout this module does not model on ``config``."""
    if not isinstance(config, TransformerConfig):
        raise SetupError("expert parallelism places experts on ranks: give a model config, got "
                         f"{type(config).__name__}")
    if not config.is_moe:
        raise SetupError(f"ep={setup.ep} splits a mixture of experts' experts over ranks: {config.name} has none "
                         "(n_experts=1): set ep=1")
    if config.n_experts % setup.ep:
        raise SetupError(f"ep={setup.ep} must divide n_experts={config.n_experts}: the experts are split evenly over "
                         "the expert-parallel ranks")
    if setup.policy.autocast:
        raise SetupError(f"ep with precision={setup.precision!r} (autocast) is not modelled "
                         f"(memlab.predict.parallel.experts): "
                         "use fp32 or a 16-bit storage policy such as bf16")
    if setup.tp > 1:
        check_tp(config, setup.tp)


def received_pairs(tokens: int, top_k: int, n_experts: int, ep: int, routing: str = "balanced") -> int:
    """(token, expert) pairs one expert-parallel rank's experts receive per MoE layer when each of the ``ep`` ranks
    routes ``tokens`` tokens to ``top_k`` distinct experts of ``n_experts`` with a dropless router: ``balanced``
    ``tokens x top_k`` (each expert the same share); ``worst`` ``ep x tokens x min(top_k, n_experts / ep)`` (every
    token picks as many of this rank's experts as it can) [lepikhin2020, Sec. 2.2; fedus2021, Sec. 2.2]."""
    for name, v in (("tokens", tokens), ("top_k", top_k), ("n_experts", n_experts), ("ep", ep)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SetupError(f"{name} must be a positive integer, got {v!r}")
    if n_experts % ep or top_k > n_experts:
        raise SetupError(f"ep={ep} must divide n_experts={n_experts} and top_k={top_k} be at most n_experts")
    if routing not in ROUTINGS:
        raise SetupError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if routing == "balanced":
        return tokens * top_k
    return ep * tokens * min(top_k, n_experts // ep)


def capacity_pairs(tokens: int, top_k: int, n_experts: int, ep: int, capacity_factor: float) -> int:
    """Most (token, expert) pairs one rank's ``n_experts / ep`` experts take with a capacity factor: each expert
    ``ceil(C x ep x tokens x top_k / n_experts)`` of the pairs its ep ranks send (Switch's expert capacity, tokens
    per batch / experts x C [fedus2021, Sec. 2.2]; GShard's [lepikhin2020, Sec. 2.2]): ``~ C t k`` per rank. Not
    used by memlab's dropless reference router; the bound a router with a drop policy would have."""
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, int | float) or capacity_factor <= 0:
        raise SetupError(f"capacity_factor must be a positive number, got {capacity_factor!r}")
    received_pairs(tokens, top_k, n_experts, ep)  # checks the integers
    per_expert = math.ceil(capacity_factor * ep * tokens * top_k / n_experts)
    return per_expert * (n_experts // ep)


def ep_layer_rows(config: TransformerConfig, setup: Setup, sent: int, received: int, width: float) -> list[TermRow]:
    """The routed MLP's saved tensors in the expert-parallel layer (:mod:`memlab.tracing.experts`), all MoE layers:
    ``(name, category, elements, bytes per element, tp-sharded)`` rows; ``sent`` pairs per layer leave the rank
    (t x top_k), ``received`` reach its experts; ``width``: the model dtype's bytes. The router's softmax saves its
    fp32 output (t x n_experts); the dispatch's gather and the combine's scatter-add save the pairs' token index, the
    gates' gather its index (int64 each); the combine's product saves the gate per pair and the combined pairs; each
    local expert's first projection saves its slice of the received pairs, its other tensors are a dense MLP's d_ff
    wide ones per pair (``impl.mlp_saved_tensors``); shared experts run every token as a dense MLP [dai2024]."""
    L, h, f, E = config.n_layers, config.d_model, config.ffn, config.n_experts
    t = setup.batch * setup.seq
    n_f = config.impl.mlp_saved_tensors(config.mlp)
    rows: list[TermRow] = [
        ("EP router softmax, fp32", "mlp", L * t * E, FP32, False),
        ("EP pair token index and gate index (int64)", "mlp", 2 * L * sent, INT64, False),
        ("EP gate per pair", "mlp", L * sent, width, False),
        ("EP received pairs (dispatch all-to-all output, the experts' input)", "mlp", L * received * h, width, False),
        (f"EP expert MLP tensors (d_ff wide, {n_f} per received pair)", "mlp", n_f * L * received * f, width, True),
        ("EP combined pairs (combine all-to-all output)", "mlp", L * sent * h, width, False),
        ("EP gated pairs (the scatter-add's source: index_add's backward keeps it)", "mlp", L * sent * h, width,
         False),
    ]
    if config.n_shared_experts:
        rows.append((f"shared expert MLP tensors (d_ff wide, {n_f} per token each)", "mlp",
                     config.n_shared_experts * n_f * L * t * f, width, True))
    return rows


def _routed_row(row: TermRow) -> bool:
    """Whether an estimator row is the routed MLP's (replaced under ep): the dense-MLP-per-token row of the
    reference MoE, or a grouped MoE's ``MoE ...`` rows."""
    return row[1] == "mlp" and (row[0].startswith("MoE ") or (row[0].startswith("MLP ") and "d_ff wide" in row[0]))


def expert_param_elements(config: TransformerConfig, setup: Setup) -> tuple[int, int]:
    """(dense, routed-expert) parameter elements on one expert-parallel, tensor-parallel rank: every parameter but
    the routed experts' (``mlp.experts.*``, or a grouped family's 3-D expert tensors) whole after tp, and
    ``1 / ep`` of the routed experts' after tp."""
    dense = expert = 0
    for name, shape, _ in config.param_shapes():
        n = math.prod(tp_shard_shape(name, shape, config, setup.tp))
        if ".experts." in name:  # mlp.experts.<e>.* or a grouped family's mlp.experts.gate_up / .down
            expert += n
        else:
            dense += n
    return dense, expert // setup.ep


@dataclass(frozen=True)
class ExpertReport:
    """Bytes one expert-parallel rank holds in a training step (every ep rank alike under ``balanced``; the worst
    rank under ``worst``). Bytes, elements and pairs as named."""

    ep: int
    routing: str
    local_experts: int
    """Routed experts per MoE layer on the rank (n_experts / ep)."""
    dense_params: int
    """Parameter elements besides the routed experts on the rank (after tp)."""
    expert_params: int
    """Routed-expert parameter elements on the rank (after tp and ep)."""
    states_bytes: int
    """Parameters + gradients + optimizer states: dense ones under ZeRO over world_size, experts' over world_size/ep."""
    sent_pairs: int
    """(token, expert) pairs the rank dispatches per MoE layer (t x top_k)."""
    received_pairs: int
    """(token, expert) pairs its experts receive per MoE layer."""
    activations_bytes: int
    """Saved tensors of the step (the estimator's rows, the routed MLP's replaced by the expert-parallel layer's)."""
    routed_activations_bytes: int
    """Of those, the expert-parallel layers' rows (:func:`ep_layer_rows`)."""
    all_to_all_bytes: int
    """One layer's all-to-all moment: the send and the receive buffer of a dispatch (or a combine)."""
    transient_bytes: int
    """The larger of one block's backward temporaries and the all-to-all moment."""
    buffers_bytes: int
    """The model's buffers (rotary tables)."""
    peak_bytes: int
    sent_bytes: float
    """All-to-all bytes the rank sends per step (:func:`memlab.predict.parallel.communication.ep_sent_bytes`)."""
    assumptions: tuple[str, ...] = ()
    states: StateParts = field(default_factory=lambda: StateParts(0, 0, 0))
    """``states_bytes`` split into parameters, gradients and optimizer states."""
    peak_phase: str = "backward"
    """The moment of the peak: ``backward`` (states, activations, a layer's transient) or ``optimizer step``."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a DataFrame row)."""
        return asdict(self)


def _states(elements: int, setup: Setup, world_size: int) -> tuple[StateParts, int]:
    """(model-state bytes, the optimizer step's peak) of ``elements`` parameters under ZeRO over ``world_size``
    ranks: the estimator's own for a bare count (the step's peak: the states and the optimizer's temporaries, e.g.
    the fp32 gradient copies a master-weight policy makes)."""
    if elements == 0:
        return StateParts(0, 0, 0), 0
    bd = rank_breakdown(elements, setup.with_(tp=1, sp=False, ep=1, world_size=world_size))
    return StateParts.of(bd), max(r.peak_bytes for r in bd.phases if r.phase == "optimizer step")


def expert_estimate(config: TransformerConfig, setup: Setup, *, device_type: str = "cuda") -> ExpertReport:
    """Per-rank bytes of the mixture of experts ``config`` trained under ``setup``'s expert parallelism (``ep``,
    ``ep_routing``), composed with its tp/sp, ZeRO over ``world_size``, precision and recompute (module docstring:
    every term and its source). ``ep=1`` gives the same terms on one rank (all experts local)."""
    from memlab.predict.parallel.communication import ep_sent_bytes

    if not isinstance(setup, Setup):
        raise SetupError(f"setup must be a memlab.predict.spec.setup.Setup, got {type(setup).__name__}")
    if setup.mode != "train":
        raise SetupError("expert_estimate models a training step: set mode='train'")
    if device_type not in ("cuda", "cpu"):
        raise SetupError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    check_ep(config, setup)
    config.check_seq(setup.seq)
    ep, k, E = setup.ep, config.top_k, config.n_experts
    t = setup.batch * setup.seq
    sent = t * k
    got = received_pairs(t, k, E, ep, setup.ep_routing)
    w = shared_widths(setup.policy.name, device_type)
    one = setup.with_(ep=1)
    rows = [r for r in term_rows(config, one, device_type=device_type) if not _routed_row(r)]
    routed = ep_layer_rows(config, one, sent, got, w["compute"]) if setup.recompute != "full" else []
    acts = sum(bytes_by_category(rows + routed, setup.tp, setup.sp).values())
    routed_bytes = sum(bytes_by_category(routed, setup.tp, setup.sp).values()) if routed else 0
    dense, expert = expert_param_elements(config, setup)
    (dense_states, dense_step), (expert_states, expert_step) = (_states(dense, setup, setup.world_size),
                                                                _states(expert, setup, setup.world_size // ep))
    parts = dense_states + expert_states
    states = parts.total
    ids = sum(bytes_by_category([r for r in rows if r[1] == "token ids"], setup.tp, setup.sp).values())
    a2a = (sent + got) * config.d_model * w["compute"]
    temp = layer_terms(config, one, device_type)["temp"]
    gathered = 0.0
    if setup.zero_stage == 3:  # one block gathered at a time (FSDP2 / ZeRO-3), each part over its own group
        block = [(n, math.prod(tp_shard_shape(n, sh, config, setup.tp))) for n, sh, _ in config.param_shapes()
                 if n.startswith("blocks.0.")]
        gathered = setup.policy.param_bytes * (
            sum(e for n, e in block if ".experts." not in n) * (setup.world_size > 1)
            + sum(e for n, e in block if ".experts." in n) // ep * (setup.world_size // ep > 1))
    if setup.recompute == "full":  # a block's backward recomputes its saved tensors, its routed ones included
        temp += layer_terms(config, one, device_type)["layer"] + sum(
            bytes_by_category(ep_layer_rows(config, one, sent, got, w["compute"]), setup.tp, setup.sp).values()
        ) / config.n_layers
    transient = max(temp, a2a) + gathered
    buffers = model_buffer_bytes(config)
    step_moment = dense_step + expert_step + buffers + ids
    comm = ep_sent_bytes(t, config.d_model, config.n_layers, k, ep, int(w["compute"]), setup.ep_routing, E)
    notes = (
        f"expert parallel over ep={ep} ranks drawn from world_size={setup.world_size} data-parallel ranks: "
        f"{E // ep} of {E} experts per layer on each [rajbhandari2022; megatron-moe]",
        f"routing: {setup.ep_routing} ({got:,} (token, expert) pairs received per layer"
        f"{'' if setup.ep_routing == 'balanced' else f', {got / sent:.2f}x the balanced {sent:,}'}); the reference "
        "router is dropless (no capacity factor), so the worst case is every ep rank's tokens on this rank's "
        "experts",
        f"ZeRO-{setup.zero_stage}: dense states over {setup.world_size} rank(s), the experts' over "
        f"{setup.world_size // ep} (the ranks holding the same experts)",
        "routed MLP as memlab.tracing.experts runs it (dispatch by all_to_all_single, each local expert on its "
        "received pairs, combine by all_to_all_single, gates applied after the combine); the model's own MoE kernel "
        "(a grouped family's) is replaced by it",
        "peak: the larger of two moments: states + saved activations + the model's buffers + one layer's largest "
        "transient (its backward temporaries or an all-to-all's send and receive buffers"
        + (", a gathered block" if setup.zero_stage == 3 else "")
        + (", a block's recomputed tensors (its dense-MLP rows counted too: a bound)" if setup.recompute == "full"
           else "")
        + "), every gradient counted beside every activation (a bound); and the optimizer step (the estimator's "
        "states and optimizer temporaries of the dense and the expert parameters, each over its ZeRO group, "
        "summed: a bound)",
        f"all-to-all: {comm / 2**30:.3f} GiB sent per step (4 per MoE layer: dispatch and combine, forward and "
        "backward)" + ("; full recompute repeats the forward's two, not counted" if setup.recompute == "full" else ""),
        *((f"tp={setup.tp}: every tp rank routes the same tokens and holds d_ff / tp of each local expert (expert "
           "tensor parallelism equal to tp [megatron-moe]); the pairs' h-wide tensors and the all-to-alls are "
           "counted whole on each tp rank" + (", divided by tp under sp as every sequence-split row is"
                                              if setup.sp else ""),) if setup.tp > 1 else ()),
    )
    return ExpertReport(ep=ep, routing=setup.ep_routing, local_experts=E // ep, dense_params=dense,
                        expert_params=expert, states_bytes=int(states), sent_pairs=sent, received_pairs=got,
                        activations_bytes=math.ceil(acts), routed_activations_bytes=math.ceil(routed_bytes),
                        all_to_all_bytes=math.ceil(a2a), transient_bytes=math.ceil(transient),
                        buffers_bytes=buffers,
                        peak_bytes=math.ceil(max(states + acts + buffers + transient, step_moment)),
                        peak_phase="backward" if states + acts + buffers + transient >= step_moment
                        else "optimizer step",
                        sent_bytes=comm, assumptions=notes, states=parts)


def ep_layouts(config: TransformerConfig, setup: Setup, eps: tuple[int, ...] = (1, 2, 4, 8), *,
               device_type: str = "cuda") -> Any:
    """One DataFrame row per ep degree (``setup`` with ``ep`` and ``world_size = max(world_size, ep)``): states,
    activations, all-to-all moment, peak and all-to-all bytes sent per step, under both routings."""
    import pandas as pd

    out = []
    for ep in eps:
        for routing in ROUTINGS:
            s = setup.with_(ep=ep, world_size=max(setup.world_size, ep), ep_routing=routing)
            r = expert_estimate(config, s, device_type=device_type)
            out.append({"ep": ep, "routing": routing, "world_size": s.world_size, "local_experts": r.local_experts,
                        "states_bytes": r.states_bytes, "activations_bytes": r.activations_bytes,
                        "all_to_all_bytes": r.all_to_all_bytes, "peak_bytes": r.peak_bytes,
                        "sent_bytes": r.sent_bytes})
    return pd.DataFrame(out)
