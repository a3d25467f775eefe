"""TP, TP+SP and CP traced on fake process groups, rank by rank, against the estimator (issue 19).

Each row is one rank and one phase of one layout: the traced peak (fake tensors, :mod:`memlab.tracing.tracer`), the
estimator's (:func:`memlab.predict.estimate.estimate`), what the trace and the estimator already differ by on one
rank (``one_rank``: the same setup without the parallelism, for context), the named terms of the traced implementation
that memlab's estimate does not count (``named``), and ``left``: what no term explains (0 on every ``exact`` row
tests/studies/test_parallel_traces.py checks, at most 0 on a ``bound`` row).

- TP (:func:`memlab.tracing.tensor_parallel.trace_gpt_tp`): named, the plan's replicated embedding/head and
  full-vocabulary logits (:func:`memlab.tracing.tensor_parallel.replicated_terms`).
- TP + SP: also DTensor's all-gathered linear inputs (:func:`memlab.tracing.tensor_parallel.sequence_parallel_terms`;
  memlab's estimate counts Megatron-LM's SP, which saves the sequence shard [korthikanti2022, Sec. 4.2.2]).
- CP (:func:`memlab.tracing.context_parallel.trace_gpt_cp`, ring attention written here): the phase peaks are the
  one-rank trace's at ``seq / cp`` tokens, so the estimate there (the estimator's per-token split) with only its
  one-rank residual named (0 but on trace-llama's backward at 64 tokens), the ring's buffers living
  inside attention below the phase peaks on these shapes; inside one attention core the forward holds the
  estimator's K/V chunks (:func:`memlab.predict.parallel.pipeline.ring_kv_chunks`) plus the log-sum-exp merge's fp32
  temporaries (exact), the backward at most the terms of :func:`ring_terms` (a bound: ``TracedRow.kind``).

PP (torch's schedules) is :func:`memlab.studies.pipeline.trace_stage`. Units: bytes. CPU traces, fp32 for CP:
not GPU evidence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from memlab.errors import SetupError
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup

TRACE_LLAMA = TransformerConfig(name="trace-llama", d_model=96, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256,
                                max_seq=128, mlp="swiglu", positions="rotary", norm="rmsnorm", bias=False,
                                tied_embeddings=False)
"""The second shape (SwiGLU, RoPE, RMSNorm, GQA, untied head), as benchmarks/tensor_parallel_trace.py traces."""


def trace_shapes() -> tuple[TransformerConfig, TransformerConfig]:
    """The two shapes traced: tiny-gpt (GELU, LayerNorm, learned positions, tied) and :data:`TRACE_LLAMA`."""
    return preset("tiny-gpt"), TRACE_LLAMA


@dataclass(frozen=True)
class TracedRow:
    """One rank, one phase of a traced layout next to the estimator, bytes."""

    layout: str
    rank: int
    phase: str
    """``step phase`` (e.g. ``steady forward``) or, for CP, ``attention forward`` / ``attention backward`` (the
    bytes one attention core adds to the one-rank trace's)."""
    traced: int
    predicted: int
    one_rank: int | None
    """Trace minus estimate of the same setup on one rank (without the parallelism), shown for context: it is not
    additive (trace-llama's one-rank backward at 64 tokens is 82,048 bytes above its estimate, and its TP + SP
    trace is not), so it is subtracted only where the trace is the one-rank trace (CP's phase peaks, as a named
    term); None where it was not traced."""
    named: dict[str, int] = field(default_factory=dict)
    left: int = 0
    """traced - predicted - sum(named)."""
    kind: str = "exact"
    """``exact`` (``left`` should be 0) or ``bound`` (``left`` should be <= 0: CP's attention backward, whose traced
    peak moment need not be the one-rank kernel's; exact at ``seq / cp = 32`` on both shapes, 16,384 bytes under
    the bound on tiny-gpt at ``seq / cp = 16``)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a DataFrame row), the named terms joined into one text column."""
        d = asdict(self)
        d["named"] = "; ".join(f"{k} {v:,}" for k, v in self.named.items()) or "-"
        d["named_bytes"] = sum(self.named.values())
        return d


def _row(layout: str, rank: int, phase: str, traced: int, predicted: int, one: int | None,
         named: dict[str, int], kind: str = "exact") -> TracedRow:
    return TracedRow(layout, rank, phase, traced, predicted, one, named, traced - predicted - sum(named.values()),
                     kind)


def _phases(rows: Any) -> dict[tuple[str, str], int]:
    return {(r.step, r.phase): r.peak_bytes for r in rows}


TRACED_PHASES = (("first", "forward"), ("steady", "forward"), ("steady", "backward"))
"""The phases the rows show. The first backward is left out: on fake tensors it can count a few KB of DTensor's
first sharding propagation, depending on what ran before in the process (seen: 8,320 bytes on trace-llama rank 0
under SP after other traces, 0 when run alone); the optimizer step and zero_grad are not explained term by term."""


def tp_rows(config: TransformerConfig, setup: Setup, ranks: tuple[int, ...] = (0,), *,
            one_rank: bool = True) -> list[TracedRow]:
    """Rows for DTensor TP (``setup.sp``: TP + SP) of ``config`` over ``setup.tp`` fake ranks, ranks ``ranks``;
    ``one_rank=False`` skips the one-rank trace (its column is then None)."""
    from memlab.predict.estimate import estimate
    from memlab.tracing.gpt import trace_gpt
    from memlab.tracing.tensor_parallel import explained, replicated_terms, sequence_parallel_terms, trace_gpt_tp

    one = setup.with_(tp=1, sp=False)
    t1 = _phases(trace_gpt(config, one, device_type="cpu").phases) if one_rank else None
    e1 = _phases(estimate(config, one, device_type="cpu").phases)
    est = _phases(estimate(config, setup, device_type="cpu").phases)
    rep = replicated_terms(config, setup)
    moments = setup.optimizer in ("adam", "adamw")
    layout = f"TP {setup.tp}" + (" + SP" if setup.sp else "")
    out = []
    for r in ranks:
        tr = _phases(trace_gpt_tp(config, setup, rank=r, device_type="cpu").phases)
        for key in TRACED_PHASES:
            total = explained(config, setup, *key, device_type="cpu")
            assert total is not None  # forward and backward are explained
            p, logits = rep["replicated embedding/head parameters"], rep["full-vocabulary logits-sized tensor"]
            named = {"replicated embedding/head parameters": p,
                     "replicated parameters' Adam moments": 2 * p if key[0] == "steady" and moments else 0,
                     "full-vocabulary logits + log-softmax (+ gradient in backward)":
                         (2 if key[1] == "forward" else 3) * logits,
                     **sequence_parallel_terms(config, setup, device_type="cpu")}
            named = {k: v for k, v in named.items() if v}
            assert sum(named.values()) == total  # the same terms explained() sums
            out.append(_row(layout, r, " ".join(key), tr[key], est[key], None if t1 is None else t1[key] - e1[key],
                            named))
    return out


def ring_terms(config: TransformerConfig, setup: Setup, rank: int) -> dict[str, dict[str, int]]:
    """Bytes one attention core of the traced ring (:mod:`memlab.tracing.context_parallel`, fp32) adds on rank
    ``rank`` of ``setup.cp`` to the one-rank flash kernel's peak at ``seq / cp`` tokens, by phase and term.

    With ``C`` one K (or V) chunk, ``b (s/cp) kv_dim x 4``, ``O`` a q-sized tensor ``b (s/cp) q_dim x 4`` and ``L`` a
    log-sum-exp ``b a (s/cp) x 4``: forward, the received K/V chunks, ``2 C`` per chunk of
    :func:`memlab.predict.parallel.pipeline.ring_kv_chunks` (the estimator's term), and on ranks > 0 (which merge
    partial outputs) ``4 O + 2 L``: the partial output and log-sum-exp of the new chunk, the merged log-sum-exp, two
    rescaled outputs and their sum. Backward, the largest over the ring's ``cp`` steps ``i`` (chunk ``j = (r - i)
    mod cp``; ``n = [i < cp - 1]`` a next chunk arriving, ``c = [i > 0]`` a received one held) of ``(1 + n + c)``
    K/V-pair-sized buffers (the dK/dV accumulator travelling with its chunk, the received and arriving K/V) plus
    the dq accumulator ``O`` and, while chunk ``j <= r``'s backward runs, the output gradient's contiguous copy
    ``O`` (the passing of the accumulators after it holds the arriving accumulator instead of the kernel's
    gradients: the same count). The backward count is the ring's moments against the kernel's outputs: a bound
    (exact at ``seq / cp = 32`` on both shapes of :func:`trace_shapes`, below it at 16 tokens per rank)."""
    from memlab.predict.parallel.pipeline import ring_kv_chunks

    if setup.precision != "fp32":
        raise SetupError("the traced ring's terms are written for fp32 (a 16-bit ring casts its partial outputs)")
    cp, b, s = setup.cp, setup.batch, setup.seq // setup.cp
    if not 0 <= rank < cp:
        raise SetupError(f"rank must be in [0, {cp}), got {rank}")
    c_ = b * s * config.kv_dim * 4
    o_ = b * s * config.q_dim * 4
    l_ = b * config.n_heads * s * 4
    forward = {"received K/V chunks (estimator)": ring_kv_chunks(cp) * 2 * c_}
    if rank > 0:
        forward["log-sum-exp merge: partial output, rescaled outputs, log-sum-exps (fp32)"] = 4 * o_ + 2 * l_
    best: tuple[int, dict[str, int]] = (-1, {})
    for i in range(cp):
        j = (rank - i) % cp
        pairs = 1 + (i < cp - 1) + (i > 0)
        terms = {"dq accumulator": o_, "output gradient's contiguous copy": o_ if j <= rank else 0,
                 "K/V-pair buffers: travelling dK/dV, received and arriving K/V": pairs * 2 * c_}
        if (total := sum(terms.values())) > best[0]:
            best = (total, terms)
    return {"forward": forward, "backward": {k: v for k, v in best[1].items() if v}}


def _core_peaks(trace: Any) -> tuple[int, int]:
    """(forward, backward) peaks of block 0's attention core in a trace's module rows."""
    row = next(m for m in trace.modules if m["module"].endswith("blocks.0.attn.core"))
    return row["peak_forward_bytes"], row["peak_backward_bytes"]


def cp_rows(config: TransformerConfig, setup: Setup, ranks: tuple[int, ...] = (0, 1)) -> list[TracedRow]:
    """Rows for ring-attention CP of ``config`` over ``setup.cp`` fake ranks: per rank the phase peaks against
    the estimate at ``seq / cp`` tokens, and block 0's attention core against the estimator's K/V chunks plus
    :func:`ring_terms`."""
    from memlab.predict.estimate import estimate
    from memlab.predict.parallel.pipeline import ring_kv_chunks
    from memlab.tracing.context_parallel import trace_gpt_cp
    from memlab.tracing.gpt import trace_gpt

    local = setup.with_(seq=setup.seq // setup.cp, cp=1)
    base = trace_gpt(config, local, device_type="cpu")
    t1, e1 = _phases(base.phases), _phases(estimate(config, local, device_type="cpu").phases)
    f1, b1 = _core_peaks(base)
    kv = ring_kv_chunks(setup.cp) * 2 * setup.batch * local.seq * config.kv_dim * 4
    layout, out = f"CP {setup.cp}", []
    for r in ranks:
        tr = trace_gpt_cp(config, setup, rank=r, device_type="cpu")
        tp_ = _phases(tr.phases)
        for key in TRACED_PHASES:
            one = t1[key] - e1[key]
            named = {f"the estimator's one-rank residual at {local.seq} tokens": one} if one else {}
            out.append(_row(layout, r, " ".join(key), tp_[key], e1[key], one, named))
        f, b = _core_peaks(tr)
        terms = ring_terms(config, setup, r)
        fwd = {k: v for k, v in terms["forward"].items() if "estimator" not in k}
        out.append(_row(layout, r, "attention forward", f - f1, kv, 0, fwd))
        out.append(_row(layout, r, "attention backward", b - b1, kv, 0,
                        {"ring backward buffers beyond the estimator's K/V chunks":
                         sum(terms["backward"].values()) - kv}, kind="bound"))
    return out


def traced_parallel_rows(config: TransformerConfig, *, tp: int = 2, cp: int = 2, ranks: tuple[int, ...] = (0, 1),
                         sp_ranks: tuple[int, ...] | None = None, batch: int = 2, seq: int = 64) -> Any:
    """One DataFrame: TP (rank 0), TP + SP (``sp_ranks``, default ``ranks``) and CP (``ranks``) of ``config``,
    AdamW (TP) and fp32 SGD with flash attention (CP), ``batch`` x ``seq`` tokens; columns of :class:`TracedRow`
    (``named`` as text, ``named_bytes``). The TP rows skip the one-rank trace (``one_rank`` None; CP needs it)."""
    import pandas as pd

    base = Setup(batch=batch, seq=seq, optimizer="adamw")
    rows = tp_rows(config, base.with_(tp=tp), (0,), one_rank=False) + \
        tp_rows(config, base.with_(tp=tp, sp=True), ranks if sp_ranks is None else sp_ranks, one_rank=False)
    rows += cp_rows(config, Setup(batch=batch, seq=seq, optimizer="sgd", attention="flash", cp=cp), ranks)
    return pd.DataFrame([r.to_dict() for r in rows])
