"""torch.distributed.pipelining's Schedule1F1B and ScheduleGPipe run on a fake process group and counted
(memlab.tracing.pipeline, memlab.studies.pipeline), against memlab.predict.parallel.pipeline rank by rank: what a rank
holds after the step is exact; the peak's growth with the micro-batches is exact under GPipe; the peak is a bound whose
slack is named (gradients not yet allocated at the peak moment, and one block's or the loss's backward temporaries
as the estimator bounds them)."""

from __future__ import annotations

import pytest

from memlab.predict.parallel.pipeline import parallel_estimate
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup
from memlab.studies.pipeline import trace_stage

TINY = preset("tiny-gpt")
LLAMA = TransformerConfig(name="pp-llama", d_model=96, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=256,
                          max_seq=64, mlp="swiglu", positions="rotary", norm="rmsnorm", bias=False,
                          tied_embeddings=False)


def _setup(schedule: str, m: int) -> Setup:
    return Setup(batch=2, seq=64, pp=2, micro_batches=m, pp_schedule=schedule, optimizer="sgd")


def _check(config: TransformerConfig, setup: Setup, rank: int) -> tuple[int, int]:
    """Trace one rank; assert the end is exact and the peak within its named bound; return (traced, predicted)."""
    row = parallel_estimate(config, setup, device_type="cpu").rows[rank]
    tr = trace_stage(config, setup, rank)
    assert tr.end_bytes == row.end_bytes
    grads = row.states_bytes // 2  # fp32 SGD without momentum: the states are parameters and gradients
    assert 0 <= row.peak_bytes - tr.peak_bytes <= grads + row.transient_bytes
    return tr.peak_bytes, row.peak_bytes


def test_gpipe_first_stage_grows_exactly_per_micro_batch() -> None:
    (t2, p2), (t3, p3) = (_check(TINY, _setup("gpipe", m), 0) for m in (2, 3))
    assert t3 - t2 == p3 - p2  # one micro-batch's saved tensors, its two buffers and its id chunk


def test_1f1b_last_stage_peak_is_exact() -> None:
    """The last stage under 1F1B holds one micro-batch in flight, every micro-batch's logits (step returns them)
    and the loss's backward: the prediction is exact there."""
    traced, predicted = _check(TINY, _setup("1f1b", 3), 1)
    assert traced == predicted


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("m", [2, 3])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("config", [TINY, LLAMA], ids=["tiny-gpt", "pp-llama"])
def test_every_rank_schedule_and_shape(config: TransformerConfig, schedule: str, m: int, rank: int) -> None:
    _check(config, _setup(schedule, m), rank)


DEEP = TransformerConfig(name="deep", d_model=64, n_layers=8, n_heads=4, vocab_size=128, max_seq=64,
                         tied_embeddings=False)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("m", [2, 4])
def test_interleaved_ranks(m: int, rank: int) -> None:
    """ScheduleInterleaved1F1B, 2 ranks x 2 chunks of 2 blocks: rank 0 holds (v - 1) k + 2 (p - 1) + 1 chunk
    forwards at once (capped at m v), split over its chunks in torch's order; the end is exact."""
    setup = Setup(batch=2, seq=64, pp=2, pp_schedule="interleaved", pp_chunks=2, micro_batches=m, optimizer="sgd")
    _check(DEEP, setup, rank)
