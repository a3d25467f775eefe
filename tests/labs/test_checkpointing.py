"""Checkpointing strategies on the reference GPT: what each keeps, its FLOPs, and the sqrt(n) model."""

from __future__ import annotations

import pytest

from memlab.errors import SetupError
from memlab.labs.checkpointing import SegmentedGPT, measure_checkpointing, sqrt_n_model
from memlab.predict.spec.model import preset

CFG = preset("tiny-gpt").with_(n_layers=8)
KW = {"batch": 1, "seq": 16, "with_counted_flops": False}


def test_every_1_block_keeps_the_same_block_inputs_as_full_recompute() -> None:
    full = measure_checkpointing(CFG, "full", **KW)
    every1 = measure_checkpointing(CFG, "every-k", k=1, **KW)
    assert every1.saved_by_category["block inputs (recompute)"] == full.saved_by_category["block inputs (recompute)"]
    assert every1.saved_bytes == full.saved_bytes


def test_checkpoint_sequential_leaves_its_last_segment_uncheckpointed() -> None:
    none = measure_checkpointing(CFG, "none", **KW)
    seq2 = measure_checkpointing(CFG, "sequential", segments=2, **KW)
    assert 0.45 < seq2.saved_bytes / none.saved_bytes < 0.6  # half the blocks keep everything
    assert seq2.recomputed_fraction == 0.5
    assert seq2.saved_by_category["block inputs (recompute)"] == 1 * 16 * CFG.d_model * 4  # one segment input


def test_recompute_adds_flops_in_proportion_to_the_checkpointed_blocks() -> None:
    none = measure_checkpointing(CFG, "none", **KW)
    full = measure_checkpointing(CFG, "full", **KW)
    seq2 = measure_checkpointing(CFG, "sequential", segments=2, **KW)
    assert none.hardware_flops == none.model_flops
    assert seq2.hardware_flops - none.model_flops == pytest.approx((full.hardware_flops - none.model_flops) / 2)


def test_counted_flops_grow_with_recompute() -> None:
    none = measure_checkpointing(CFG, "none", batch=1, seq=16)
    full = measure_checkpointing(CFG, "full", batch=1, seq=16)
    assert full.counted_flops > none.counted_flops


def test_peak_falls_with_checkpointing() -> None:
    kw = {**KW, "batch": 2, "seq": 64}
    none = measure_checkpointing(CFG, "none", **kw)
    full = measure_checkpointing(CFG, "full", **kw)
    assert full.peak_bytes < none.peak_bytes


def test_sqrt_n_model_is_smallest_at_sqrt_n_when_a_block_keeps_its_input_size() -> None:
    held = {k: sqrt_n_model(16, 1.0, 1.0, k) for k in (1, 2, 4, 8, 16)}
    assert min(held, key=held.get) == 4


def test_bad_group_sizes_are_refused() -> None:
    with pytest.raises(SetupError, match="k must be between"):
        SegmentedGPT(CFG, strategy="every-k", k=0)
    with pytest.raises(SetupError, match="segments"):
        measure_checkpointing(CFG, "sequential", segments=9, **KW)
    with pytest.raises(SetupError, match="strategy"):
        measure_checkpointing(CFG, "some", **KW)
