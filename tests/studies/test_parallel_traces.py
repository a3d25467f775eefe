"""TP + SP and CP traced on fake process groups, rank by rank, against the estimator (memlab.studies.parallel_traces):
on two shapes every phase row is exact once the traced implementation's named terms are added, and each named term's
bytes equal a formula written here from the shapes alone. The estimator's sp rule (token ids and the loss's scalar
stay whole) and its ring K/V-chunk count are checked on generated setups."""

from __future__ import annotations

import random

import pytest

from memlab.predict.memory.activations import activation_bytes
from memlab.predict.parallel.pipeline import parallel_estimate, ring_kv_chunks
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup
from memlab.studies.parallel_traces import TRACE_LLAMA, cp_rows, ring_terms, tp_rows

TINY = preset("tiny-gpt")
RNG = random.Random(19)


def _gathered(config: TransformerConfig, setup: Setup) -> int:
    """DTensor SP saves every block's q/k/v and MLP inputs and the LM head's input whole (b, s, h fp32): the
    (1 - 1/tp) share memlab's Megatron-style estimate does not count."""
    whole = setup.batch * setup.seq * config.d_model * 4
    return (2 * config.n_layers + 1) * (whole - whole // setup.tp)


@pytest.mark.parametrize(("config", "ranks", "batch"), [(TINY, (1,), 2), (TRACE_LLAMA, (0,), RNG.choice((1, 3)))],
                         ids=["tiny-gpt", "trace-llama"])
def test_sequence_parallel_ranks_exact_with_named_terms(config: TransformerConfig, ranks: tuple[int, ...],
                                                        batch: int) -> None:
    """Every phase row: estimate + the TP plan's replicated terms + DTensor's all-gathered inputs = the trace."""
    setup = Setup(batch=batch, seq=64, optimizer="adamw", tp=2, sp=True)
    rows = tp_rows(config, setup, ranks, one_rank=False)  # benchmarks/parallel_traces.py: every rank, tp 2 and 4
    assert {r.rank for r in rows} == set(ranks)
    for r in rows:
        assert r.left == 0, r
        gathered = sum(v for k, v in r.named.items() if k.startswith("all-gathered"))
        assert gathered == _gathered(config, setup)


def test_sp_keeps_token_ids_and_loss_scalar_whole() -> None:
    """Under sp every tensor-parallel rank holds the whole ids and targets (generated setups)."""
    for _ in range(6):
        tp, b, s = RNG.choice((2, 4)), RNG.randint(1, 4), RNG.choice((32, 64, 96))
        cfg = RNG.choice((TINY, TRACE_LLAMA))
        setup = Setup(batch=b, seq=s, tp=tp)
        tp_only, sp = (activation_bytes(cfg, x, device_type="cpu") for x in (setup, setup.with_(sp=True)))
        assert sp["token ids"] == tp_only["token ids"] == 8 * b * s * 2 + (8 * s if cfg.positions == "learned" else 0)
        assert sp["norms"] * tp == tp_only["norms"]  # the norms' inputs are split by the sequence


@pytest.mark.parametrize(("config", "cp", "rank", "per_rank"), [(TINY, 2, 1, 16),
                                                                 (TRACE_LLAMA, 4, RNG.choice((1, 2, 3)), 32)],
                         ids=["tiny-gpt", "trace-llama"])
def test_context_parallel_rank_exact_with_named_terms(config: TransformerConfig, cp: int, rank: int,
                                                      per_rank: int) -> None:
    setup = Setup(batch=2, seq=per_rank * cp, optimizer="sgd", attention="flash", cp=cp)
    rows = {r.phase: r for r in cp_rows(config, setup, (rank,))}
    for r in rows.values():
        assert r.left == 0 if r.kind == "exact" else r.left <= 0, r
    for phase in ("first forward", "steady forward", "steady backward"):
        # the phase peaks are the one-rank trace's at seq / cp tokens: the estimate there and its one-rank residual
        assert sum(rows[phase].named.values()) == rows[phase].one_rank
    b, s = setup.batch, per_rank
    chunk, q_sized, lse = b * s * config.kv_dim * 4, b * s * config.q_dim * 4, b * config.n_heads * s * 4
    fwd = rows["attention forward"]
    # the estimator's K/V chunks: what parallel_estimate adds as a transient besides one block's temporaries
    assert fwd.predicted == min(2, cp - 1) * 2 * chunk
    assert sum(fwd.named.values()) == 4 * q_sized + 2 * lse  # rank > 0 merges partial outputs
    bwd = rows["attention backward"]
    assert bwd.kind == "bound" and bwd.traced <= 2 * q_sized + (3 if cp > 2 else 2) * 2 * chunk
    if per_rank == 32:  # the bound is met exactly there (benchmarks/parallel_traces.py: every rank, both shapes)
        assert bwd.left == 0


def test_ring_kv_chunks_and_terms_generated() -> None:
    assert [ring_kv_chunks(c) for c in (1, 2, 3, 8)] == [0, 1, 2, 2]
    for _ in range(5):
        cp, b = RNG.choice((2, 4, 8)), RNG.randint(1, 3)
        setup = Setup(batch=b, seq=16 * cp, attention="flash", cp=cp, optimizer="sgd")
        t0 = ring_terms(TRACE_LLAMA, setup, 0)
        assert sum(t0["forward"].values()) == ring_kv_chunks(cp) * 2 * b * 16 * TRACE_LLAMA.kv_dim * 4
        # the estimator's cp transient contains exactly those K/V chunks beyond one block's temporaries
        with_cp, plain = parallel_estimate(TRACE_LLAMA, setup).rows[0], parallel_estimate(
            TRACE_LLAMA, setup.with_(cp=1, seq=16)).rows[0]
        assert with_cp.transient_bytes - plain.transient_bytes == ring_kv_chunks(cp) * 2 * b * 16 * \
            TRACE_LLAMA.kv_dim * 4  # fp32


def test_torch_context_parallel_still_refuses_cpu_sdpa() -> None:
    """torch 2.13's context_parallel has no sharding rule for the CPU flash kernel (memlab.tracing.context_parallel
    says so and traces its own ring instead): if this starts passing, trace torch's CP."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel

    from memlab.tracing.context_parallel import TORCH_CP_ERRORS
    from memlab.tracing.fake_dist import fake_process_group

    with fake_process_group(2) as mesh:
        q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
        with pytest.raises(NotImplementedError) as err, context_parallel(mesh, buffers=[q, k, v],
                                                                         buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert TORCH_CP_ERRORS["default (flash for CPU)"] in str(err.value)
