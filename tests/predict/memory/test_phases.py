"""The phase model: the peak of a step, not the sum (memlab.predict.memory.phases through estimate())."""

from __future__ import annotations

import pytest

from memlab.errors import MemlabError, SetupError
from memlab.predict import estimate as E
from memlab.predict.memory.phases import PHASES, PhaseRow, find_phase, optimizer_temporary_bytes
from memlab.predict.memory.sharding import shape_summary
from memlab.predict.spec.model import preset
from memlab.predict.spec.precision import precision_policy
from memlab.predict.spec.setup import Setup, resolve_optimizer_impl
from memlab.units import GiB


def test_phases_cover_both_steps_and_peak_is_their_max() -> None:
    bd = E.estimate(preset("gpt2"), Setup(seq=1024, batch=4))
    assert [(r.step, r.phase) for r in bd.phases] == [(s, p) for s in ("first", "steady") for p in PHASES]
    top = max(bd.phases, key=lambda r: r.peak_bytes)
    assert bd.peak_bytes == top.peak_bytes and bd.peak_phase == top.phase and bd.peak_step == top.step
    # GPT-2's 50257-token logits: the loss's fp32 gradients are a transient the sum has no term for
    assert bd.peak_bytes > bd.total_bytes
    d = bd.to_dict()
    assert d["per_device"]["peak"] == bd.peak_bytes and d["per_device"]["total"] == bd.total_bytes
    assert {"step", "phase", "peak_bytes"} <= set(d["phases"][0])


def test_llama7b_fp32_steady_peak_is_params_states_activations_and_logit_gradients() -> None:
    cfg = preset("llama-2-7b")
    bd = E.estimate(cfg, Setup(precision="fp32", attention="flash", seq=4096, batch=1, optimizer_impl="for-loop"))
    p, o, a = bd.params_bytes, bd.optimizer_bytes, bd.activations_bytes
    logits = 2 * 4096 * cfg.vocab_size * 4  # the fp32 gradients of the log-softmax and of the logits
    assert bd.phase_bytes("backward") == p + o + a + logits + 4 + bd.overhead["model_buffers"]  # loss, rotary tables
    assert (bd.peak_step, bd.peak_phase) == ("steady", "backward")
    # the for-loop step's worst moment: the LM head's sqrt and division beside the final norm's denom
    loop = 2 * cfg.vocab_size * cfg.d_model + cfg.d_model
    assert shape_summary(cfg).loop_peak_elements == loop
    ids = 2 * 4096 * 8  # the batch's input and target token ids, held by the loop
    buffers = bd.overhead["model_buffers"]  # the rotary cos/sin tables
    assert bd.phase_bytes("optimizer step", "first") == p + bd.grads_bytes + o + 4 * loop + ids + buffers
    assert bd.total_bytes / GiB > 140 > bd.peak_bytes / GiB


def test_first_step_has_no_optimizer_state_before_its_step() -> None:
    bd = E.estimate(preset("gpt2"), Setup(seq=512))
    assert bd.phase_bytes("backward", "steady") - bd.phase_bytes("backward", "first") == bd.optimizer_bytes


def test_optimizer_implementations_order_the_step_transient() -> None:
    cfg = preset("gpt2")
    step = {impl: E.estimate(cfg, Setup(seq=256, optimizer_impl=impl)).phase_bytes("optimizer step")
            for impl in ("fused", "for-loop", "foreach")}
    assert step["fused"] < step["for-loop"] < step["foreach"]
    n = E.estimate(cfg, Setup()).params_bytes // 4
    assert step["foreach"] - step["fused"] == 4 * n  # one fp32 temporary per parameter: 4 B/param
    assert resolve_optimizer_impl("adamw", "auto", "cuda") == "foreach"
    assert resolve_optimizer_impl("adamw", "auto", "cpu") == "for-loop"
    assert resolve_optimizer_impl("adam-8bit", "foreach") == "for-loop"
    with pytest.raises(SetupError, match="fused"):
        Setup(optimizer="adafactor", optimizer_impl="fused")
    assert optimizer_temporary_bytes("sgd", "foreach", precision_policy("fp32"), 10, 5) == 0


def test_grad_accumulation_and_set_to_none_keep_gradients() -> None:
    cfg = preset("gpt2")
    base = E.estimate(cfg, Setup(seq=1024, batch=8))
    acc = E.estimate(cfg, Setup(seq=1024, batch=8, grad_accum_steps=4))
    keep = E.estimate(cfg, Setup(seq=1024, batch=8, zero_grad_to_none=False))
    g = base.grads_bytes
    assert acc.phase_bytes("backward (accumulating)") - acc.phase_bytes("backward") == g
    assert keep.phase_bytes("backward") - base.phase_bytes("backward") == g
    assert keep.phase_bytes("zero_grad") - base.phase_bytes("zero_grad") == g
    assert acc.total_bytes == base.total_bytes  # the sum of components does not see the phases
    with pytest.raises(SetupError, match="grad_accum_steps"):
        Setup(grad_accum_steps=0)


def test_inference_phases_are_prefill_and_decode() -> None:
    bd = E.estimate(preset("llama-2-7b"), Setup(mode="inference", seq=4096, attention="flash"))
    assert [r.phase for r in bd.phases] == ["prefill", "decode"]
    # prefill: the weights, the prompt's (seq - 1 tokens') dynamic cache, the token ids and the largest moment
    prompt_kv = bd.kv_cache_bytes * 4095 // 4096
    assert bd.peak_phase == "prefill"
    assert bd.peak_bytes == bd.params_bytes + prompt_kv + 8 * 4096 + bd.activations_bytes + bd.overhead_bytes


def test_bare_parameter_count_has_phases() -> None:
    bd = E.estimate(7 * 10**9, Setup(optimizer_impl="fused"))
    assert bd.peak_bytes == bd.params_bytes + bd.grads_bytes + bd.optimizer_bytes  # no batch without a config


def test_the_estimates_phase_rows_are_phase_rows_with_one_lookup() -> None:
    bd = E.estimate(preset("gpt2"), Setup(seq=1024, batch=4))
    assert all(isinstance(r, PhaseRow) for r in bd.phases)
    back = find_phase(bd.phases, "backward", "first")
    assert bd.phase_bytes("backward", "first") == back.peak_bytes == back.held_bytes and back.end_bytes is None
    zero = find_phase(bd.phases, "zero_grad")  # predicted: what is held after it, in both fields
    assert zero.end_bytes == zero.peak_bytes == zero.held_bytes == bd.phase_bytes("zero_grad")
    d = bd.to_dict()["phases"]
    assert d[0]["peak_bytes"] == bd.phases[0].peak_bytes and [PhaseRow.from_dict(r) for r in d] == list(bd.phases)
    with pytest.raises(SetupError, match="no phase 'prefill' in the steady step: phases are backward, "
                                         "forward, optimizer step, zero_grad"):
        bd.phase_bytes("prefill")
    with pytest.raises(SetupError, match="no phase 'forward' in step 3"):
        find_phase([PhaseRow(1, "forward", 10)], "forward", 3)


def test_phase_rows_round_trip_and_read_older_dicts() -> None:
    row = PhaseRow("first", "zero_grad", 30, end_bytes=20, start_bytes=25, by_category={"gradients": 5},
                   source="live tensor bytes", reliable=False)
    assert PhaseRow.from_dict(row.to_dict()) == row and row.held_bytes == 20
    old = {"step": "steady", "phase": "forward", "peak_bytes": 10, "end_bytes": 8, "source": "x"}  # a sweep row
    assert PhaseRow.from_dict(old) == PhaseRow("steady", "forward", 10, end_bytes=8, source="x")
    with pytest.raises(MemlabError, match="unknown keys bytes; missing peak_bytes"):
        PhaseRow.from_dict({"step": "steady", "phase": "forward", "bytes": 10})
