"""The leak loops leak what they should and the fixes leak nothing; live steps show optimizer state in step 2;
loss scaling and the deprecated AMP calls behave as chapter 03 says."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import SetupError
from memlab.labs.oom import fit_sweep, growth_per_iteration, leak_loop
from memlab.labs.precision import cast_survival, deprecated_amp_calls, scaler_trajectory
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.run.live_steps import live_training_steps

TINY = preset("tiny-gpt")


@pytest.mark.parametrize("case", ["keep-loss", "eval-grad", "cycle", "empty-cache"])
def test_fixed_loops_hold_no_extra_bytes(case: str) -> None:
    frame = leak_loop(case, fixed=True, iters=4, seq=16)
    assert growth_per_iteration(frame) == pytest.approx(0, abs=1e-6)


def test_eval_without_no_grad_leaks_a_graph_per_iteration_and_keep_loss_a_scalar() -> None:
    assert growth_per_iteration(leak_loop("eval-grad", fixed=False, iters=4, seq=16)) > 10_000
    assert growth_per_iteration(leak_loop("keep-loss", fixed=False, iters=4, seq=16)) == pytest.approx(4)


def test_a_cycle_is_a_sawtooth_that_gc_resets() -> None:
    frame = leak_loop("cycle", fixed=False, iters=4, seq=16, gc_every=2)
    held = list(frame["bytes_above_weights"])
    assert held[0] > held[-1] and held[1] == held[3] and held[0] == held[2]


def test_leak_loop_refuses_unknown_cases() -> None:
    with pytest.raises(SetupError, match="case must be one of"):
        leak_loop("oops", fixed=True)


def test_step_two_peaks_higher_by_the_adam_moments() -> None:
    live = live_training_steps(TINY, Setup(batch=2, seq=16, precision="fp32"), steps=2)
    fwd = live.peaks().query("phase == 'forward'").set_index("step")["peak_bytes"]
    # exp_avg and exp_avg_sq (fp32, like the params) and one 4-byte step counter per parameter tensor
    assert fwd[2] - fwd[1] == pytest.approx(2 * live.params_bytes, abs=4 * 64)
    assert live.phase("forward", 2).peak_bytes == fwd[2] and live.phase("forward", 2).start_bytes is not None


@pytest.mark.parametrize("impl", ["for-loop", "foreach"])
def test_the_phase_aware_estimate_predicts_every_measured_peak(impl: str) -> None:
    """LiveSteps.against: the estimator's phases beside the live peaks of two steps, within 0.2 % (a few KiB of
    token ids and small tensors on a 2-6 MiB model), for the for-loop and the foreach AdamW step."""
    from memlab.predict.estimate import estimate

    model, setup = preset("tiny-gpt"), Setup(batch=2, seq=16, precision="fp32", optimizer_impl=impl)
    live = live_training_steps(model, setup, steps=2)
    table = live.against(estimate(model, setup, device_type="cpu"))
    assert len(table) == 8 and set(table["step"]) == {1, 2}
    assert table["rel_error"].abs().max() < 2e-3
    assert table.loc[table["phase"] == "zero_grad", "measured"].iloc[0] < live.peak_bytes  # held after, not inside


def test_fit_sweep_records_over_budget_as_a_row() -> None:
    setup = Setup(batch=1, seq=16, precision="fp32")
    small = live_training_steps(TINY, setup, steps=2).peak_bytes
    frame = fit_sweep(TINY, setup, [1, 8], small)
    assert list(frame["status"]) == ["ok", "over budget"]


def test_fp16_flushes_small_gradients_and_bf16_does_not() -> None:
    g = torch.tensor([1e-9, 1e-6, 1e-3, 1.0])
    t = cast_survival(g, [1.0, 2.0**16]).set_index(["scale", "dtype"])
    assert t.loc[(1.0, "fp16"), "flushed to zero"] == 0.25
    assert t.loc[(1.0, "bf16"), "flushed to zero"] == 0.0
    assert t.loc[(2.0**16, "fp16"), "flushed to zero"] == 0.0
    assert t.loc[(2.0**16, "fp16"), "overflow to inf"] == 0.25  # 65536 > 65504


def test_grad_scaler_halves_and_skips_on_overflow() -> None:
    traj = scaler_trajectory(TINY, steps=2, init_scale=2.0**40, batch=1, seq=16)
    assert traj["skipped"].iloc[0]
    assert traj["scale after update"].iloc[0] == 2.0**39


def test_the_seed_amp_calls_warn_with_futurewarning() -> None:
    warn = deprecated_amp_calls()
    assert set(warn["seed 004 writes"]) == {"torch.cuda.amp.autocast()", "torch.cuda.amp.GradScaler()"}
    assert (warn["warning"] == "FutureWarning").sum() == 2


def test_at_chapter_01s_step_two_peak_no_weight_gradient_exists_yet() -> None:
    """Chapter 01's model (tiny-gpt; the chapter runs b=4, s=64, this b=1): step 2 peaks early in backward, where
    backward has made two fp32 tensors of the logits' shape and the loss's 4-byte gradient, and no weight gradient
    (the smallest is 256 B)."""
    setup = Setup(batch=1, seq=64, precision="fp32", optimizer_impl="for-loop")
    live = live_training_steps(TINY, setup, steps=2)
    held = live.held_at_peak()
    assert sum(held.values()) == live.peak_bytes
    logits = setup.batch * setup.seq * TINY.vocab_size * 4
    assert held["step 2: backward"] == 2 * logits + 4
    assert held["step 1: optimizer step"] > 0 and held["step 2: forward"] > 0
