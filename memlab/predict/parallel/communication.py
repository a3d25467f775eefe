"""Bytes a data-parallel training step moves per rank, by ZeRO stage [rajbhandari2019]. Bytes; no torch.

Convention (the ZeRO paper's, Sec. 7): the *volume* of a collective on one rank is the size of the buffer it
reduces or gathers, whatever the algorithm. An all-reduce is a reduce-scatter followed by an all-gather, so it
moves 2x its buffer; a reduce-scatter moves its (full) input, an all-gather its (full) output, a broadcast its
buffer. With Psi the bytes of one copy of the gradients (or parameters):

- DDP and ZeRO-1/2: all-reduce (or reduce-scatter + all-gather) of the gradients, 2 Psi per rank per step;
- ZeRO-3 / FSDP FULL_SHARD: all-gather of the parameters in forward and again in backward, reduce-scatter of the
  gradients, 3 Psi (1.5x data parallelism).

A ring implementation puts (N-1)/N of that volume on each rank's link (:func:`ring_wire_bytes`): the factor
that makes the volume independent of N.
"""

from __future__ import annotations

from memlab.errors import SetupError

COLLECTIVE_FACTOR = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}
"""Volume / buffer bytes of each collective (ZeRO's accounting: all-reduce = reduce-scatter + all-gather)."""


def collective_volume_bytes(op: str, buffer_bytes: int) -> int:
    """Volume one rank moves for one collective over a buffer of ``buffer_bytes`` (the full, unsharded size)."""
    if op not in COLLECTIVE_FACTOR:
        raise SetupError(f"unknown collective {op!r}: use one of {', '.join(COLLECTIVE_FACTOR)}")
    return COLLECTIVE_FACTOR[op] * int(buffer_bytes)


def zero_comm_bytes(param_bytes: int, stage: int, *, regather_in_backward: bool = True) -> dict[str, int]:
    """Predicted volume per rank per step by collective, for ZeRO ``stage`` 0-3 [rajbhandari2019, Sec. 7].

    ``param_bytes`` is Psi, one full copy of the parameters in the communicated dtype. Stages 0-2 move 2 Psi
    (reduce-scatter + all-gather, or one all-reduce); stage 3 adds the second all-gather of backward (3 Psi),
    which FSDP2 skips for modules kept unsharded after forward (``regather_in_backward=False``: 2 Psi, the
    ZeRO-2-like ``reshard_after_forward=False``).
    """
    if stage not in (0, 1, 2, 3):
        raise SetupError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    if not isinstance(param_bytes, int) or param_bytes < 0:
        raise SetupError(f"param_bytes must be a non-negative integer, got {param_bytes!r}")
    if stage < 3:
        return {"all_reduce": 2 * param_bytes} if stage == 0 else {"reduce_scatter": param_bytes,
                                                                   "all_gather": param_bytes}
    gathers = 2 if regather_in_backward else 1
    return {"all_gather": gathers * param_bytes, "reduce_scatter": param_bytes}


def ring_wire_bytes(volume_bytes: int | float, world_size: int) -> float:
    """Bytes each rank sends on its link for a ring collective of this volume: volume x (N-1)/N [thakur2005]."""
    if not isinstance(world_size, int) or world_size < 1:
        raise SetupError(f"world_size must be a positive integer, got {world_size!r}")
    return volume_bytes * (world_size - 1) / world_size


def tp_allreduce_buffer_bytes(tokens: int, d_model: int, n_layers: int, value_bytes: int = 2, *,
                              column_modules: int = 2) -> int:
    """Buffer bytes one tensor-parallel rank hands to all-reduces per micro-batch's forward and backward.

    Each row-parallel module (attention's output projection, the MLP's down projection) all-reduces its (tokens,
    d_model) output in the forward; each column-parallel module all-reduces the gradient of its replicated input
    in the backward (the conjugate ``f`` operator) [shoeybi2019, Sec. 3]. Megatron fuses q, k and v into one
    column-parallel linear and the gate and up projections into another (``column_modules=2``: four all-reduces a
    block); torch's ``parallelize_module`` over separate q, k, v, gate and up modules reduces each input gradient
    on its own (``column_modules=5``, or 4 for a GELU MLP: six or seven a block). Buffer bytes, not wire bytes
    (:func:`ring_wire_bytes`)."""
    for name, v in (("tokens", tokens), ("d_model", d_model), ("n_layers", n_layers), ("value_bytes", value_bytes),
                    ("column_modules", column_modules)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SetupError(f"{name} must be a positive integer, got {v!r}")
    return n_layers * (2 + column_modules) * tokens * d_model * value_bytes


def tp_sent_bytes(tokens: int, d_model: int, n_layers: int, tp: int, value_bytes: int = 2) -> float:
    """Bytes one tensor-parallel rank sends per micro-batch's forward and backward through ``n_layers`` blocks.

    Megatron's column/row split puts two all-reduces of the (tokens, d_model) block output in each block's forward
    (after attention, after the MLP) and two in its backward (the conjugate ``f`` operators) [shoeybi2019, Sec. 3];
    a ring all-reduce sends 2(t-1)/t of its buffer on each rank [thakur2005]. Sequence parallelism replaces each
    all-reduce by a reduce-scatter and an all-gather of the same total (the same bytes) [korthikanti2022, Sec.
    4.2.2]. Blocks only (a vocab-parallel embedding and loss add their own, not counted); a full recompute repeats
    the forward's two, not counted. ``value_bytes``: the communicated dtype (2 for bf16)."""
    for name, v in (("tokens", tokens), ("d_model", d_model), ("n_layers", n_layers), ("tp", tp),
                    ("value_bytes", value_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SetupError(f"{name} must be a positive integer, got {v!r}")
    buffer = tokens * d_model * value_bytes
    return n_layers * 4 * ring_wire_bytes(collective_volume_bytes("all_reduce", buffer), tp)


def pp_sent_bytes(boundary_bytes: int | float, micro_batches: int, pp: int, rank: int) -> float:
    """Bytes pipeline rank ``rank`` of ``pp`` sends per step: each micro-batch's stage output forward (every rank but
    the last) and its input gradient backward (every rank but the first), ``boundary_bytes`` each (the (b, s, h)
    tensor between two stages) [narayanan2021, Sec. 2.2]; point to point, so the volume is what goes on the link."""
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 2:
        raise SetupError(f"pp must be an integer >= 2, got {pp!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < pp:
        raise SetupError(f"rank must be an int in [0, {pp}), got {rank!r}")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise SetupError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    directions = (rank < pp - 1) + (rank > 0)
    return directions * micro_batches * boundary_bytes


def cp_sent_bytes(kv_chunk_bytes: int | float, n_layers: int, cp: int) -> float:
    """Bytes one context-parallel rank sends per micro-batch in ring attention [liu2023]: in each layer's forward
    the K/V chunks (``kv_chunk_bytes``: K and V of one rank's ``seq / cp`` tokens) go cp - 1 steps round the ring;
    in its backward the K/V chunks go round again with their gradients (2 (cp - 1) chunk sends). Ring attention's
    implementations differ (Megatron-LM's all-gathers K/V instead; some keep the forward's chunks): this is the
    ring of the paper, an assumption to name. The weight gradients' all-reduce over the cp ranks is not in it
    (:func:`zero_comm_bytes`)."""
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise SetupError(f"cp must be a positive integer, got {cp!r}")
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise SetupError(f"n_layers must be a positive integer, got {n_layers!r}")
    return n_layers * 3 * (cp - 1) * kv_chunk_bytes


def ep_sent_bytes(tokens: int, d_model: int, n_layers: int, top_k: int, ep: int, value_bytes: int = 2,
                  routing: str = "balanced", n_experts: int | None = None) -> float:
    """Bytes one expert-parallel rank sends per micro-batch's forward and backward through ``n_layers`` MoE layers.

    Each layer's forward runs two all-to-alls (dispatch the rank's ``tokens x top_k`` (token, expert) pairs of
    ``d_model`` values to their experts' ranks; combine: send the outputs of the pairs its experts received back),
    its backward two more with their gradients [lepikhin2020, Sec. 3.1; rajbhandari2022, Sec. 5]; a pair whose
    expert is on the rank itself stays. ``balanced`` routing (each expert the same share): (ep - 1)/ep of the
    ``t k`` pairs leave in each of the four, ``4 t k (ep - 1)/ep`` pairs a layer. ``worst`` (the rank
    :func:`memlab.predict.parallel.experts.received_pairs` calls worst: every token of every rank picks ``m = min(top_k,
    n_experts / ep)`` of this rank's experts; needs ``n_experts``): its dispatch sends the ``t (k - m)`` pairs not
    local, its combine the ``(ep - 1) t m`` received from others, twice (forward, backward). A full recompute
    repeats the forward's two, not counted. ``value_bytes``: the communicated dtype (2 for bf16)."""
    for name, v in (("tokens", tokens), ("d_model", d_model), ("n_layers", n_layers), ("top_k", top_k), ("ep", ep),
                    ("value_bytes", value_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SetupError(f"{name} must be a positive integer, got {v!r}")
    pair = d_model * value_bytes
    if routing == "balanced":
        return n_layers * 4 * tokens * top_k * pair * (ep - 1) / ep
    if routing != "worst":
        raise SetupError(f"routing must be 'balanced' or 'worst', got {routing!r}")
    if isinstance(n_experts, bool) or not isinstance(n_experts, int) or n_experts < top_k or n_experts % ep:
        raise SetupError(f"worst-case routing needs n_experts (a multiple of ep={ep}, at least top_k={top_k}), got "
                         f"{n_experts!r}")
    m = min(top_k, n_experts // ep)
    return n_layers * 2 * tokens * (top_k - m + (ep - 1) * m) * pair


def comm_time_floor_s(volume_bytes: float, *, gpus_per_node: int, nodes: int, nic_bytes_per_s: float,
                      nvlink_bytes_per_s: float | None = None) -> dict[str, float]:
    """Lower bound on the time of a data-parallel collective's ``volume_bytes`` (ZeRO's convention, per rank) on
    ``nodes`` nodes of ``gpus_per_node`` GPUs, each GPU with its own NIC, seconds: full link rates, no latency.

    NCCL runs collectives hierarchically (one ring or tree per NIC, so each GPU's NIC carries the cross-node part of
    a 1/G slice of the buffer): inside a node each GPU moves (G-1)/G of the volume over NVLink, and across nodes each
    NIC carries (M-1)/M of the volume / G [thakur2005]. The two stages pipeline, so the floor is the larger one. With
    one GPU per node (G = 1) every byte of the ring crosses the GPU's own NIC: (M-1)/M of the volume over it. Checked
    against nccl-tests on 2 nodes x 8 H100 with 8 x 200 Gb/s NICs: an 8 GiB all-reduce took 47.5 ms, above this
    floor's 42.9 ms [nccl-tests-a3mega]; sending every ring byte over the GPU's own 25 GB/s NIC (the G = 1 bound
    applied to 16 GPUs) would claim at least 644 ms.

    Returns ``inside the node`` (0 when G = 1 or no NVLink rate is given), ``across nodes`` and ``floor`` (the
    larger).
    """
    for name, v in (("gpus_per_node", gpus_per_node), ("nodes", nodes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SetupError(f"{name} must be a positive integer, got {v!r}")
    if nic_bytes_per_s <= 0 or (nvlink_bytes_per_s is not None and nvlink_bytes_per_s <= 0):
        raise SetupError("link rates must be positive bytes per second")
    g, m = gpus_per_node, nodes
    across = volume_bytes * (m - 1) / m / g / nic_bytes_per_s
    inside = volume_bytes * (g - 1) / g / nvlink_bytes_per_s if nvlink_bytes_per_s and g > 1 else 0.0
    return {"inside the node": inside, "across nodes": across, "floor": max(inside, across)}
