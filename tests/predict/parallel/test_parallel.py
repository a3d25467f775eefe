"""memlab.predict.parallel.pipeline: pipeline and context parallelism per rank. The schedules' in-flight counts against
the papers' closed forms (Narayanan et al. 2021, Korthikanti et al. 2022 Sec. 4.2.3, Megatron-LM's 1F1B discount
min(1, m/p)) on generated (p, v, m); one rank without pp/cp equals the estimator; the refusals."""

from __future__ import annotations

import random

import pytest

from memlab.errors import SetupError
from memlab.predict.estimate import estimate
from memlab.predict.parallel.pipeline import (
    in_flight,
    interleaving_factor,
    micro_batch_bytes,
    parallel_estimate,
    virtual_stage_layers,
)
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup

TINY = preset("tiny-gpt")
DEEP = TransformerConfig(name="deep", d_model=64, n_layers=8, n_heads=4, vocab_size=128, max_seq=64)


def _draws(n: int, seed: int = 0) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(2, 16), rng.randint(2, 4), rng.randint(1, 6)) for _ in range(n)]


@pytest.mark.parametrize(("p", "v", "rounds"), _draws(12))
def test_interleaved_first_rank_holds_korthikanti_factor(p: int, v: int, rounds: int) -> None:
    """With m a multiple of p, rank 0 holds p v + p - 1 chunk-micro-batches of L/(p v) layers: p (1 + (p-1)/(p v))
    micro-batches of a stage's L/p layers [korthikanti2022, Sec. 4.2.3] when the step has that many (m v chunk
    forwards: at m = p and v > 1 the warmup is capped there); the last rank (v - 1) p + 1."""
    m = p * rounds
    first = in_flight("interleaved", p, m, 0, v)
    assert sum(first) == min(p * v + p - 1, m * v)  # capped by the m v chunk-micro-batches a step has
    if m * v >= p * v + p - 1:
        assert sum(first) / v == pytest.approx(p * interleaving_factor(p, v))
    assert sum(in_flight("interleaved", p, m, p - 1, v)) == min((v - 1) * p + 1, m * v)
    assert all(sum(in_flight("interleaved", p, m, r, v)) <= sum(first) for r in range(p))


@pytest.mark.parametrize(("p", "m"), [(p, m) for p, _, m in _draws(12, seed=1)])
def test_1f1b_first_stage_is_megatron_discount_and_gpipe_holds_all(p: int, m: int) -> None:
    """Megatron-LM's report_theoretical_memory scales the first stage's L layers of activations by min(1, m/p)
    under 1F1B: p stages' worth of L/p layers times min(p, m)/p. GPipe holds all m everywhere [narayanan2021]."""
    L = 4 * p
    first = in_flight("1f1b", p, m, 0)[0] * (L // p)
    assert first == pytest.approx(L * min(1, m / p))
    assert [in_flight("1f1b", p, m, r)[0] for r in range(p)] == [min(p - r, m) for r in range(p)]
    assert all(in_flight("gpipe", p, m, r) == (m,) for r in range(p))


@pytest.mark.parametrize("n_layers", [5, 7, 8, 13])
def test_virtual_stages_cover_every_block_once(n_layers: int) -> None:
    for n in (2, 3, 4):
        if n > n_layers:
            continue
        stages = virtual_stage_layers(n_layers, n)
        assert [i for r in stages for i in r] == list(range(n_layers))
        assert max(map(len, stages)) - min(map(len, stages)) <= 1


@pytest.mark.parametrize("setup", [
    Setup(batch=2, seq=64),
    Setup(batch=1, seq=32, precision="amp-bf16", recompute="selective"),
    Setup(batch=3, seq=16, tp=2, sp=True, recompute="full", precision="bf16"),
    Setup(batch=2, seq=64, zero_stage=1, world_size=4, optimizer="sgd-momentum"),
])
@pytest.mark.parametrize("config", [TINY, DEEP])
def test_one_rank_without_pp_or_cp_is_the_estimator(config: TransformerConfig, setup: Setup) -> None:
    """pp = cp = 1: one rank, all blocks, one micro-batch: its states and saved tensors are estimate()'s."""
    bd = estimate(config, setup, device_type="cpu")
    (row,) = parallel_estimate(config, setup, device_type="cpu").rows
    assert row.states_bytes == bd.model_state_bytes(step_counters=False)
    assert row.activations_bytes == bd.activations_bytes
    assert row.buffers_bytes == 0 and row.in_flight == (1,)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved"])
def test_stages_partition_the_parameters_and_gpipe_holds_most(schedule: str) -> None:
    setup = Setup(batch=2, seq=32, pp=2, pp_schedule=schedule, pp_chunks=2 if schedule == "interleaved" else 1,
                  micro_batches=4)
    rep = parallel_estimate(DEEP, setup, device_type="cpu")
    tied_copy = DEEP.vocab_size * DEEP.d_model  # the last stage's own LM head (Megatron-LM)
    assert sum(r.params for r in rep.rows) == DEEP.param_count() + tied_copy
    gpipe = parallel_estimate(DEEP, setup.with_(pp_schedule="gpipe", pp_chunks=1), device_type="cpu")
    assert gpipe.worst.activations_bytes >= rep.worst.activations_bytes
    assert rep.peak_bytes == max(r.peak_bytes for r in rep.rows)


def test_cp_splits_the_sequence() -> None:
    """Each of cp ranks saves what a seq / cp run saves; ring attention adds its K/V chunks as a transient."""
    s = Setup(batch=2, seq=64, attention="flash", cp=4)
    assert micro_batch_bytes(DEEP, s, "cpu") == micro_batch_bytes(DEEP, s.with_(seq=16, cp=1), "cpu")
    with_cp = parallel_estimate(DEEP, s, device_type="cpu").rows[0]
    local = parallel_estimate(DEEP, s.with_(seq=16, cp=1), device_type="cpu").rows[0]
    assert with_cp.activations_bytes == local.activations_bytes
    assert with_cp.transient_bytes - local.transient_bytes == 2 * 2 * 2 * 16 * DEEP.kv_dim * 4


@pytest.mark.parametrize(("fields", "words"), [
    ({"cp": 2}, "fused kernel"),
    ({"pp": 2, "pp_chunks": 2}, "pp_schedule='interleaved'"),
    ({"pp": 2, "pp_schedule": "interleaved"}, "pp_chunks > 1"),
    ({"micro_batches": 4}, "grad_accum_steps"),
    ({"pp": 2, "grad_accum_steps": 2}, "not modelled"),
    ({"pp": 2, "optimizer": "adafactor"}, "not modelled"),
])
def test_unmodelled_layouts_are_one_line_refusals(fields: dict, words: str) -> None:
    """Contradictory fields are refused by Setup; valid layouts memlab does not model, by the estimate
    (memlab.predict.coverage): a trace or a real run may still take them."""
    with pytest.raises(SetupError, match=words) as info:
        estimate(DEEP, Setup(**fields))
    assert "\n" not in str(info.value)


def test_estimate_answers_pp_with_one_row_per_rank() -> None:
    """One estimate: pp is answered per pipeline rank, the worst rank's bytes as the components."""
    setup = Setup(pp=2, micro_batches=2, seq=64)
    bd, rep = estimate(DEEP, setup), parallel_estimate(DEEP, setup)
    assert [r.peak_bytes for r in bd.ranks] == [r.peak_bytes for r in rep.rows]
    assert bd.peak_bytes == rep.peak_bytes == bd.total_bytes
    assert bd.model_state_bytes() == rep.worst.states_bytes and bd.activations_bytes == rep.worst.activations_bytes
    assert bd.layout == {"kind": "pipeline", "worst_rank": rep.worst.rank, "bubble_fraction": rep.bubble_fraction}
    assert bd.to_dict()["ranks"][0]["detail"]["in_flight"] == list(rep.rows[0].in_flight)
    with pytest.raises(SetupError, match="multiple of pp x pp_chunks"):
        parallel_estimate(DEEP.with_(n_layers=6), Setup(pp=2, pp_schedule="interleaved", pp_chunks=2, seq=64))
