"""Pipeline (PP) and context (CP) parallelism, per rank: which layers a rank holds, how many micro-batches' saved
tensors it keeps at once, the buffers the schedule adds, and the bytes that makes.

Tensor and sequence parallelism (``Setup.tp``, ``Setup.sp``) and ZeRO/FSDP (``zero_stage`` over ``world_size``) are
the estimator's own (:func:`memlab.predict.estimate.estimate`); this module composes them with ``Setup.pp``,
``pp_schedule``, ``pp_chunks``, ``micro_batches`` and ``cp``. Sources, term by term:

- layers per stage: ``p * v`` virtual stages (``v = pp_chunks``, 1 unless interleaved) of consecutive blocks, virtual
  stage ``j`` on rank ``j % p`` [narayanan2021, Sec. 2.2.2]; uneven splits give the first virtual stages one block
  more (stated in :func:`virtual_stage_layers`); the embeddings live on virtual stage 0, the final norm, LM head and
  loss on the last one; a tied LM head is a second copy there (Megatron-LM keeps the word embeddings on the first
  and last stages and all-reduces their gradients [shoeybi2019]).
- micro-batches in flight (saved for backward at once) on rank ``r``: GPipe all ``m``; 1F1B ``min(p - r, m)``
  [narayanan2021, Sec. 2.2.1; torch ``Schedule1F1B``: ``warmup_chunks = min(n_microbatches, num_stages -
  stage_index)``]; interleaved 1F1B ``min((v - 1) * k + 2 (p - 1 - r) + 1, m v)`` model-chunk micro-batches with
  ``k = m // max(1, m // p)`` micro-batches per round (torch ``ScheduleInterleaved1F1B``, ``_get_warmup_ops``: the
  warmup forwards plus the steady state's first forward; with ``m % p == 0`` it is Megatron's ``(p - r - 1) * 2 +
  (v - 1) * p`` warmup + 1). On rank 0 that is ``p v + p - 1`` chunk-micro-batches of ``L / (p v)`` layers:
  ``p (1 + (p - 1)/(p v))`` micro-batches of a stage's ``L / p`` layers, Korthikanti et al.'s interleaving factor
  [korthikanti2022, Sec. 4.2.3].
- pipeline buffers (torch ``PipelineStage``, torch/distributed/pipelining/stage.py ``_prepare_forward_infra`` and
  ``_create_grad_recv_info``: one receive buffer per micro-batch, made at the stage's first step and kept): every
  virtual stage but the first holds ``m`` activation receive buffers of the stage input (b, s, h), every one but the
  last ``m`` gradient receive buffers of its output; a received input IS the first block's saved input (counted once
  here, as a buffer); the stage keeps each in-flight micro-batch's output for its backward (``fwd_cache``).
- context parallelism: each of ``cp`` ranks holds ``seq / cp`` tokens of every sequence, so every per-token saved
  tensor shrinks by ``cp``; ring attention [liu2023] passes K/V chunks around the ring: besides its own chunk (saved
  for backward, counted as activations) a rank holds the received chunk it attends to and the next one arriving,
  ``2 x 2 x b (s/cp) kv_dim`` elements (one chunk, ``2 x b (s/cp) kv_dim``, at cp = 2: :func:`ring_kv_chunks`),
  while a layer's attention runs (a transient, not saved); checked against a traced ring
  (:mod:`memlab.tracing.context_parallel`). Needs a fused attention kernel (no s x s scores). The CP ranks join
  the data-parallel ranks in ZeRO's group (torchtitan and Megatron-LM shard and reduce weights over dp x cp).

Model states per rank are the estimator's own for a bare parameter count (every parameter alike: per-tensor step
counters are left out, a few bytes per tensor). The peak named here is the moment a rank holds the most saved
tensors, the end of its last warmup forward, plus one block's backward temporaries
(:func:`memlab.predict.memory.phases.layer_terms`). Units: bytes. No torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from memlab.errors import SetupError
from memlab.predict.memory.activations import row_divisor, shared_widths, term_rows
from memlab.predict.memory.breakdown import StateParts, model_buffer_bytes, rank_breakdown
from memlab.predict.memory.phases import layer_terms
from memlab.predict.memory.rows import RowName
from memlab.predict.memory.sharding import check_tp, tp_shard_shape
from memlab.predict.parallel.efficiency import pipeline_bubble_fraction
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

FP32_LOSS = 4
"""Bytes of one micro-batch's loss (an fp32 scalar)."""
PP_SCHEDULES = ("1f1b", "gpipe", "interleaved")
"""Pipeline schedules modelled: 1F1B (PipeDream-Flush), GPipe (all forwards, then all backwards), interleaved 1F1B."""


def virtual_stage_layers(n_layers: int, pp: int, chunks: int = 1) -> tuple[range, ...]:
    """The blocks of each of ``pp * chunks`` virtual stages, in model order: consecutive ranges, the first
    ``n_layers % (pp * chunks)`` one block longer (an uneven split, as torchtitan's even split leaves it)."""
    n = pp * chunks
    if n_layers < n:
        raise SetupError(f"pp={pp} x pp_chunks={chunks} = {n} virtual stages need at least {n} blocks, the model has "
                         f"{n_layers}: lower pp or pp_chunks")
    base, extra = divmod(n_layers, n)
    out, start = [], 0
    for j in range(n):
        size = base + (j < extra)
        out.append(range(start, start + size))
        start += size
    return tuple(out)


def rank_virtual_stages(pp: int, chunks: int, rank: int) -> tuple[int, ...]:
    """The virtual stages rank ``rank`` holds: ``rank, rank + pp, ...`` (``chunks`` of them) [narayanan2021]."""
    return tuple(rank + j * pp for j in range(chunks))


def in_flight(schedule: str, pp: int, micro_batches: int, rank: int, chunks: int = 1) -> tuple[int, ...]:
    """Micro-batches whose saved tensors rank ``rank`` holds at once at its peak, per local virtual stage (one entry
    per chunk, model order): GPipe ``m``; 1F1B ``min(p - rank, m)``; interleaved: the first ``warmup + 1``
    forwards, ``warmup = min((v - 1) k + 2 (p - 1 - rank), m v)``, spread over the chunks in torch's order (forward
    op ``i`` runs chunk ``(i // k) % v``, ``k`` micro-batches per round). See the module docstring for sources."""
    p, m, v = pp, micro_batches, chunks
    if schedule == "gpipe":
        return (m,) * v
    if schedule == "1f1b":
        return (min(p - rank, m),) * v
    k = m // max(1, m // p)
    ops = min(min((v - 1) * k + 2 * (p - 1 - rank), m * v) + 1, m * v)
    counts = [0] * v
    for i in range(ops):
        counts[(i // k) % v] += 1
    return tuple(counts)


def interleaving_factor(pp: int, chunks: int) -> float:
    """Korthikanti et al. 2022, Sec. 4.2.3: under the interleaved schedule the first stage holds ``p (1 + (p - 1) /
    (p v))`` micro-batches' worth of a stage's activations; this returns ``1 + (p - 1)/(p v)`` [korthikanti2022]."""
    return 1 + (pp - 1) / (pp * chunks)


def ring_kv_chunks(cp: int) -> int:
    """K/V chunks (each a K and a V of ``seq / cp`` tokens) a ring-attention rank holds beyond its own during a
    layer's forward attention: the received one it attends to and the next one arriving, 2; at ``cp = 2`` the one
    received chunk (nothing more arrives); 0 without cp. Traced: :mod:`memlab.tracing.context_parallel`."""
    return min(2, cp - 1) if cp > 1 else 0


def check_parallel(config: TransformerConfig, setup: Setup) -> None:
    """One :class:`SetupError` line for a pp/cp layout this module does not model on ``config``."""
    if setup.pp_schedule == "interleaved" and config.n_layers % (setup.pp * setup.pp_chunks):
        raise SetupError(f"the interleaved schedule is modelled with equal chunks: n_layers={config.n_layers} must be "
                         f"a multiple of pp x pp_chunks = {setup.pp * setup.pp_chunks}")
    virtual_stage_layers(config.n_layers, setup.pp, setup.pp_chunks)
    if setup.seq % setup.cp:
        raise SetupError(f"cp={setup.cp} must divide seq={setup.seq}: each context-parallel rank holds seq / cp tokens")
    if setup.tp > 1:
        check_tp(config, setup.tp)
    if config.is_moe:
        raise SetupError("pipeline or context parallelism of a mixture of experts is not modelled: use a dense "
                         "model, or expert parallelism alone (Setup.ep, memlab.predict.parallel.experts)")


# -- activations per micro-batch, split by where they live --------------------------------------------------
def _bytes(row: tuple, tp: int, sp: bool) -> float:
    return row[2] * row[3] / row_divisor(row, tp, sp)


@dataclass(frozen=True)
class MicroBatchBytes:
    """Bytes one micro-batch saves on one rank (after tp/sp and cp), by where they live."""

    per_layer: float
    """One block's saved tensors."""
    per_stage: float
    """Saved once per stage's forward whatever its blocks (e.g. per-forward rotary tables)."""
    embeddings: float
    """Virtual stage 0: token/position ids and what the embedding keeps."""
    head: float
    """The last virtual stage: the target ids, final norm, LM head and loss."""
    boundary: float
    """The tensor between two stages, (b, s/cp, h) in the residual dtype (sequence-split by tp under sp)."""
    ids: float = 0.0
    """One micro-batch's token ids (int64): the schedule's chunk of the input, what the embedding saves."""
    targets: float = 0.0
    """One micro-batch's target ids as the loss saves them: the schedule's chunk of the targets."""
    logits: float = 0.0
    """One micro-batch's logits, the last stage's output (compute dtype, vocab-split by tp)."""
    loss_backward: float = 0.0
    """The loss's backward on the last stage: the gradients of the fp32 log-probabilities and of the logits
    (2 x t V 4 bytes, vocab-split by tp) and the input gradient it sends."""


def micro_batch_bytes(config: TransformerConfig, setup: Setup, device_type: str = "cuda") -> MicroBatchBytes:
    """:class:`MicroBatchBytes` from the estimator's own rows (:func:`memlab.predict.memory.activations.term_rows`) for
    a micro-batch of ``setup.batch`` sequences of ``seq / cp`` tokens: a block row is per layer when it doubles from
    one to two blocks, per stage otherwise (embedding rows excepted, which live on the first stage)."""
    local = _local(setup)
    tp, sp = local.tp, local.sp
    one, two = config.with_(n_layers=1), config.with_(n_layers=2)
    b1 = term_rows(one, local, device_type=device_type, model_level=False)
    b2 = term_rows(two, local, device_type=device_type, model_level=False)
    if [r[0] for r in b1] != [r[0] for r in b2]:  # pragma: no cover - the listing does not depend on n_layers
        raise SetupError("internal: the block rows differ between one and two blocks")
    per_layer = per_stage = emb = 0.0
    for r1, r2 in zip(b1, b2, strict=True):
        x1, x2 = _bytes(r1, tp, sp), _bytes(r2, tp, sp)
        per_layer += x2 - x1
        if r1[1] == "embeddings":
            emb += 2 * x1 - x2
        else:
            per_stage += 2 * x1 - x2
    block_names = {r[0] for r in b1}
    head = 0.0
    for row in term_rows(one, local, device_type=device_type):
        if row[0] in block_names:
            continue
        if row[0] in (RowName.INPUT_IDS, RowName.POSITION_IDS):
            emb += _bytes(row, tp, sp)
        else:
            head += _bytes(row, tp, sp)
    w = shared_widths(local.policy.name, device_type)
    t = local.batch * local.seq
    boundary = t * config.d_model * w["residual"] / (tp if sp else 1)
    V = config.vocab_size
    return MicroBatchBytes(per_layer, per_stage, emb, head, boundary, ids=8 * t, targets=8 * t,
                           logits=t * V * w["compute"] / tp, loss_backward=2 * t * V * 4 / tp + boundary)


def _local(setup: Setup) -> Setup:
    """The setup one pipeline stage's micro-batch runs: seq / cp tokens, no pp/cp fields."""
    return setup.with_(seq=setup.seq // setup.cp, pp=1, pp_schedule="1f1b", pp_chunks=1, micro_batches=1, cp=1)


# -- per rank ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankRow:
    """One pipeline rank (any tp/cp/dp rank of it: they hold the same bytes), bytes."""

    rank: int
    holds: str
    """Which blocks (and embeddings / head) the rank holds."""
    params: int
    """Parameter elements on the rank (after tp)."""
    states_bytes: int
    """Parameters + gradients + optimizer states (after ZeRO over world_size x cp)."""
    in_flight: tuple[int, ...]
    """Micro-batches whose saved tensors it holds at its peak, per local virtual stage."""
    activations_bytes: int
    """Saved tensors of the in-flight micro-batches (received inputs excluded: they are buffers)."""
    buffers_bytes: int
    """Pipeline receive buffers (activations and gradients, one per micro-batch), the kept stage outputs, the input
    and target chunks, the micro-batches' losses, the model's buffers (rotary tables)."""
    transient_bytes: int
    """One block's backward temporaries (the last stage: the loss's backward if larger), ring attention's K/V
    chunks under cp, a ZeRO-3 gathered block."""
    peak_bytes: int
    end_bytes: int = 0
    """Held after the step: the states and the schedule's kept buffers (receive buffers, the input and target
    chunks, the last stage's outputs)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a DataFrame row)."""
        return asdict(self)


@dataclass(frozen=True)
class ParallelReport:
    """Per-rank bytes of a pp/cp layout; ``worst`` decides whether it fits."""

    rows: tuple[RankRow, ...]
    bubble_fraction: float
    """Idle fraction of the step [narayanan2021]
    (:func:`memlab.predict.parallel.efficiency.pipeline_bubble_fraction`)."""
    assumptions: tuple[str, ...]

    @property
    def worst(self) -> RankRow:
        """The rank with the largest peak (the first such)."""
        return max(self.rows, key=lambda r: r.peak_bytes)

    @property
    def peak_bytes(self) -> int:
        """The worst rank's peak: what must fit."""
        return self.worst.peak_bytes

    def to_frame(self) -> Any:
        """pandas DataFrame, one row per pipeline rank."""
        import pandas as pd

        return pd.DataFrame([r.to_dict() for r in self.rows])


def _stage_elements(config: TransformerConfig, setup: Setup, stages: tuple[int, ...], layers: tuple[range, ...]
                    ) -> int:
    """Parameter elements on one tp rank of the virtual stages ``stages``."""
    last = len(layers) - 1
    blocks = {i for j in stages for i in layers[j]}
    n = 0
    for name, shape, comp in config.param_shapes():
        if name.startswith("blocks."):
            on = int(name.split(".")[1]) in blocks
        elif comp in ("embeddings", "positions"):
            on = 0 in stages
        else:  # final norm, LM head
            on = last in stages
        if on:
            n += math.prod(tp_shard_shape(name, shape, config, setup.tp))
    if config.tied_embeddings and last in stages and (0 not in stages):  # the last stage's own head copy
        n += math.prod(tp_shard_shape("head.weight", (config.vocab_size, config.d_model), config, setup.tp))
    return n


def state_parts(elements: int, setup: Setup) -> StateParts:
    """Model-state bytes of ``elements`` parameters on one rank, split: the estimator's bare-count states
    (:func:`~memlab.predict.memory.breakdown.rank_breakdown`) under ZeRO over ``world_size x cp`` data-parallel
    ranks."""
    flat = _local(setup).with_(tp=1, sp=False, world_size=setup.world_size * setup.cp)
    return StateParts.of(rank_breakdown(elements, flat))


def _states(elements: int, setup: Setup) -> int:
    return state_parts(elements, setup).total


def parallel_estimate(config: TransformerConfig, setup: Setup, *, device_type: str = "cuda") -> ParallelReport:
    """Per-rank bytes of ``config`` trained under ``setup``'s pipeline (``pp``, ``pp_schedule``, ``pp_chunks``,
    ``micro_batches``) and context (``cp``) parallelism, composed with its tp/sp, ZeRO, precision and recompute.

    One :class:`RankRow` per pipeline rank; ``setup.batch`` is the micro-batch. See the module docstring for every
    term and its source."""
    if not isinstance(config, TransformerConfig):
        raise SetupError(f"parallel_estimate needs a TransformerConfig (layers are placed on stages), got "
                         f"{type(config).__name__}")
    if not isinstance(setup, Setup):
        raise SetupError(f"setup must be a memlab.predict.spec.setup.Setup, got {type(setup).__name__}")
    if setup.mode != "train":
        raise SetupError("parallel_estimate models a training step: set mode='train'")
    check_parallel(config, setup)
    p, v, m = setup.pp, setup.pp_chunks, setup.micro_batches
    layers = virtual_stage_layers(config.n_layers, p, v)
    last = len(layers) - 1
    mb = micro_batch_bytes(config, setup, device_type)
    local = _local(setup)
    lt = layer_terms(config, local, device_type)
    kv = 0.0
    if setup.cp > 1:
        w = shared_widths(local.policy.name, device_type)
        kv = ring_kv_chunks(setup.cp) * 2 * local.batch * local.seq * config.kv_dim * w["compute"] \
            / min(setup.tp, config.n_kv_heads)
    buffers = model_buffer_bytes(config)
    rows = []
    for r in range(p):
        stages = rank_virtual_stages(p, v, r)
        counts = in_flight(setup.pp_schedule, p, m, r, v)
        acts = bufs = kept = 0.0
        for j, n in zip(stages, counts, strict=True):
            saved = len(layers[j]) * mb.per_layer + mb.per_stage + (mb.embeddings if j == 0 else 0) + \
                (mb.head if j == last else 0)
            if p > 1:  # the schedule's buffers (torch.distributed.pipelining): module docstring
                # a received input, the first stage's id chunk and the last's target chunk are what the first block,
                # the embedding and the loss save: counted once, as the schedule's buffers
                saved -= (mb.ids if j == 0 else mb.boundary) + (mb.targets if j == last else 0)
                kept += m * ((mb.boundary if j > 0 else mb.ids) + (mb.boundary if j < last else 0))
                kept += m * (mb.targets + mb.logits) if j == last else 0  # step(return_outputs=True), the default
                bufs += n * mb.boundary if j < last else 0  # the in-flight stage outputs (fwd_cache)
                bufs += m * FP32_LOSS if j == last else 0  # each micro-batch's loss, held until the step ends
            acts += n * saved
        kept += buffers  # the model's buffers (the reference GPT's rotary tables), on every stage
        bufs += kept
        elements = _stage_elements(config, setup, stages, layers)
        gathered = 0.0
        if setup.zero_stage == 3 and setup.world_size * setup.cp > 1:
            block = sum(math.prod(tp_shard_shape(n_, s_, config, setup.tp)) for n_, s_, _ in config.param_shapes()
                        if n_.startswith("blocks.0."))
            gathered = block * setup.policy.param_bytes
        states = _states(elements, setup)
        transient = max(lt["temp"], mb.loss_backward if last in stages and p > 1 else 0) + kv + gathered
        held = states + acts + bufs
        names = [f"blocks {layers[j].start}-{layers[j].stop - 1}" if len(layers[j]) > 1 else f"block {layers[j].start}"
                 for j in stages]
        if 0 in stages:
            names.insert(0, "embeddings")
        if last in stages:
            names.append("head + loss")
        rows.append(RankRow(rank=r, holds=", ".join(names), params=elements, states_bytes=int(states),
                            in_flight=counts, activations_bytes=math.ceil(acts), buffers_bytes=math.ceil(bufs),
                            transient_bytes=math.ceil(transient), peak_bytes=math.ceil(held + transient),
                            end_bytes=math.ceil(states + kept)))
    bubble = pipeline_bubble_fraction(p, m, v) if p > 1 else 0.0
    notes = (
        f"{setup.pp_schedule} schedule over pp={p} ranks ({v} chunk(s) each), m={m} micro-batches of "
        f"{setup.batch} x {local.seq} tokens [narayanan2021]",
        "pipeline buffers: torch.distributed.pipelining's PipelineStage keeps one receive buffer per micro-batch "
        "(activations and gradients), each in-flight stage output, the input and target chunks and, on the last "
        "stage, every micro-batch's logits (step(return_outputs=True), its default); Megatron-LM sends without "
        "per-micro-batch buffers (fewer bytes there)",
        "model states: the estimator's bare-count states (per-tensor optimizer step counters left out)",
        "peak: the end of the last warmup forward plus one block's backward temporaries; the gradients of the "
        "in-flight stage outputs are not added",
        "peak checked against fake-group traces of torch's schedules with vocabularies of 512 tokens (a bound "
        "there); with GPT-2's 50,257-token vocabulary the first and last stages' traced peaks were 6-38 % above "
        "it (the embedding's and the head's gradients, allocated at their backward while micro-batches are still "
        "held, are not modelled yet): at a large vocabulary read those two stages' peaks as low by up to "
        "vocab x d_model x the gradient's bytes",
        *((f"context parallel over cp={setup.cp}: ring attention's K/V chunks (the received and the next, beyond "
           "the rank's own) held during a layer's attention [liu2023]; ZeRO shards over world_size x cp",)
          if setup.cp > 1 else ()),
        *(("ZeRO-3: one gathered block counted as a transient",) if setup.zero_stage == 3 else ()),
    )
    return ParallelReport(tuple(rows), bubble, notes)
