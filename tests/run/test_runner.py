"""memlab.run.runner: a real training/inference step on CPU measures exactly what the estimator predicts, phase by
phase; FLOPs are counted; OOMs become results; bad setups get one clear error."""

from __future__ import annotations

import gc
import itertools
import json
import weakref

import pytest
import torch

from memlab.errors import SetupError
from memlab.measure import oom as oom_mod
from memlab.model.gpt import GPT
from memlab.predict.compute import flops as F
from memlab.predict.estimate import estimate
from memlab.predict.spec.model import preset
from memlab.predict.spec.precision import PRECISION_POLICIES
from memlab.predict.spec.setup import Setup
from memlab.run.runner import Measurement, count_flops, resolve_device, run_step

TINY = preset("tiny-gpt")
FAST = {"steps": 1, "with_counted_flops": False, "with_mfu": False}
OPTIMIZERS = ("adamw", "sgd", "sgd-momentum", "adafactor", "adam-8bit")


def _run(setup: Setup, config=TINY, **kwargs) -> Measurement:
    return run_step(config, setup, "cpu", **{**FAST, **kwargs})


@pytest.mark.parametrize(("precision", "optimizer"), list(itertools.product(PRECISION_POLICIES, OPTIMIZERS)))
def test_measured_states_and_activations_equal_the_estimate(precision: str, optimizer: str) -> None:
    setup = Setup(batch=2, seq=16, precision=precision, optimizer=optimizer)
    m = _run(setup)
    e = estimate(TINY, setup, device_type="cpu")
    assert m.status == "ok"
    assert (m.params_bytes, m.grads_bytes, m.optimizer_bytes, m.activations_bytes) == \
        (e.params_bytes, e.grads_bytes, e.optimizer_bytes, e.activations_bytes)
    assert {k: v for k, v in m.activations_by_category.items() if v} == \
        {k: v for k, v in e.activation_detail.items() if v}


@pytest.mark.parametrize(("precision", "per_param"), [
    ("mixed-bf16", 16),  # 2 + 2 + 12: Rajbhandari et al. 2019 (ZeRO), Sec. 3.1
    ("mixed-bf16-fp32-grads", 18),  # Megatron-LM distributed optimizer table
    ("mixed-fp16-fp32-accum", 20),
    ("fp32", 16),  # 4 + 4 + 8
    ("bf16", 8),
])
def test_measured_bytes_per_parameter_with_adamw(precision: str, per_param: int) -> None:
    m = _run(Setup(batch=1, seq=8, precision=precision, optimizer="adamw"))
    states = m.params_bytes + m.grads_bytes + m.optimizer_bytes - m.optimizer_by_key["step"]
    assert m.optimizer_by_key["step"] == 4 * len(TINY.param_shapes())  # a 0-dim fp32 counter per tensor
    assert states / TINY.param_count() == per_param


def test_phases_show_lazy_optimizer_state_and_freed_gradients() -> None:
    m = _run(Setup(batch=2, seq=16, precision="fp32", optimizer="adamw"))
    n = TINY.param_count()
    ph = {p["phase"]: p for p in m.phases}
    assert list(ph) == ["built", "forward", "backward", "optimizer step", "zero_grad"]
    assert all(p["params"] == 4 * n for p in m.phases)
    adam = 8 * n + m.optimizer_by_key["step"]  # exp_avg + exp_avg_sq (fp32) and the step counters
    assert [ph[k]["optimizer"] for k in ph] == [0, 0, 0, adam, adam]
    assert [ph[k]["grads"] for k in ph] == [0, 0, 4 * n, 4 * n, 0]
    assert ph["forward"]["activations"] == m.activations_bytes > 0
    assert ph["backward"]["activations"] == 0


def test_phases_of_master_weights_with_persistent_fp32_grads() -> None:
    """mixed-bf16-fp32-grads: fp32 master and fp32 gradient buffers exist from the start (Megatron's main grads
    are zeroed in place, not freed); the Adam moments appear at the first step."""
    m = _run(Setup(batch=1, seq=8, precision="mixed-bf16-fp32-grads", optimizer="adamw"))
    n = TINY.param_count()
    ph = {p["phase"]: p for p in m.phases}
    assert all(p["params"] == 2 * n and p["grads"] == 4 * n for p in m.phases)
    assert ph["backward"]["optimizer"] == 4 * n  # the master copy only
    assert ph["optimizer step"]["optimizer"] == 4 * n + 8 * n + m.optimizer_by_key["step"]


@pytest.mark.parametrize(("config", "weights"), [(TINY, "fp32"), (preset("tiny-llama"), "bf16")])
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_inference_kv_cache_and_weights_equal_the_estimate(config, weights: str, attention: str) -> None:
    setup = Setup(batch=2, seq=24, mode="inference", attention=attention, inference_weights=weights,
                  kv_cache_dtype=weights)
    m = _run(setup, config, steps=3)
    e = estimate(config, setup, device_type="cpu")
    assert m.status == "ok"
    assert m.kv_cache_bytes == e.kv_cache_bytes == 2 * config.n_layers * 2 * 24 * config.kv_dim * (
        4 if weights == "fp32" else 2)
    assert m.params_bytes == e.params_bytes
    assert m.grads_bytes == m.optimizer_bytes == 0 and m.activations_bytes is None
    assert m.decode_time_per_token_s > 0 and m.tokens_per_s == pytest.approx(2 / m.decode_time_per_token_s)


def test_counted_flops_equal_the_analytic_count_for_eager() -> None:
    setup = Setup(batch=2, seq=16, attention="eager")
    m = _run(setup, with_counted_flops=True)
    assert m.counted_flops_per_step == m.flops_per_step == 3 * F.forward_flops(TINY, 2, 16)


def test_flash_attention_flops_are_counted_with_the_cpu_mapping() -> None:
    """Without memlab's mapping FlopCounterMode counts 0 for the CPU flash kernel. With it, the count is the
    analytic one plus one QK^T per layer: the flash backward recomputes the scores (Dao et al. 2022)."""
    b, s = 2, 16
    m = _run(Setup(batch=b, seq=s, attention="flash"), with_counted_flops=True)
    qk_t = 2 * b * s * s * TINY.d_model  # one layer's QK^T (all heads)
    assert m.counted_flops_per_step == m.flops_per_step + TINY.n_layers * qk_t
    model = GPT(TINY, attention="flash")
    idx = torch.zeros(b, s, dtype=torch.long)
    with torch.no_grad():
        counted = count_flops(lambda: model(idx))
    assert counted == F.forward_flops(TINY, b, s)
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as plain:
        model(idx)
    assert plain.get_total_flops() == counted - TINY.n_layers * 2 * qk_t  # torch alone misses the attention core


def test_inference_counts_the_prefill_forward() -> None:
    setup = Setup(batch=1, seq=20, mode="inference", inference_weights="fp32", kv_cache_dtype="fp32")
    m = _run(setup, steps=4, with_counted_flops=True)
    assert m.counted_flops_per_step == m.flops_per_step == F.forward_flops(TINY, 1, 16)


def test_recompute_hardware_flops_exceed_model_flops() -> None:
    m = _run(Setup(batch=1, seq=16, recompute="full"))
    assert m.hardware_flops_per_step == F.megatron_iteration_flops(TINY, 1, 16, "full") > m.flops_per_step


def test_measurement_is_json_safe_and_flat_rows_have_category_columns() -> None:
    m = _run(Setup(batch=1, seq=8))
    d = json.loads(json.dumps(m.to_dict()))
    assert d["status"] == "ok" and d["setup"]["seq"] == 8 and d["device"] == "cpu"
    assert d["cuda_peak_allocated_bytes"] is None and d["nvml"] is None  # no CUDA: unavailable, never zeros
    row = m.to_row()
    assert row["precision"] == "fp32" and row["model"] == "tiny-gpt"
    assert sum(v for k, v in row.items() if k.startswith("act_")) == m.activations_bytes
    assert row["tokens_per_s"] == pytest.approx(8 / row["step_time_s"])
    assert m.host_rss_bytes > 0 and m.loss > 0


def test_mfu_on_cpu_uses_a_measured_peak(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the CPU peak benchmark's cache stays in tmp_path
    m = run_step(TINY, Setup(batch=1, seq=16), "cpu", steps=1, with_counted_flops=False, with_mfu=True)
    assert m.mfu is not None and m.mfu > 0 and m.hfu == m.mfu  # no recompute: HFU = MFU
    assert "measured" in m.peak_source


OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB "
    "is free. Including non-PyTorch memory, this process has 77.91 GiB memory in use. Of the allocated memory "
    "76.20 GiB is allocated by PyTorch, and 1.21 GiB is reserved by PyTorch but unallocated."
)


def test_out_of_memory_becomes_a_result_and_the_next_run_works(monkeypatch: pytest.MonkeyPatch) -> None:
    attempt: list[weakref.ref] = []
    alive_at_cleanup: list[bool] = []
    clean = oom_mod.clean_allocator

    def boom(self, *args, **kwargs):
        attempt.append(weakref.ref(self.tok_emb.weight))
        raise torch.OutOfMemoryError(OOM_MESSAGE)

    def spy(device=None):
        gc.collect()
        alive_at_cleanup.append(attempt[0]() is not None)
        return clean(device)

    monkeypatch.setattr(GPT, "forward", boom)
    monkeypatch.setattr(oom_mod, "clean_allocator", spy)
    m = _run(Setup(batch=1, seq=8))
    assert m.status == "oom"
    assert m.oom["tried_to_allocate_bytes"] == 2 * 2**30
    assert m.oom["total_capacity_bytes"] == round(79.15 * 2**30)
    assert m.error.startswith("CUDA out of memory")
    assert m.params_bytes is None and m.activations_bytes is None
    # The failed attempt's model is released before the allocator is cleaned (else its memory stays cached).
    assert alive_at_cleanup == [False]
    monkeypatch.undo()
    assert _run(Setup(batch=1, seq=8)).status == "ok"


def test_other_runtime_errors_are_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self, *args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(GPT, "forward", broken)
    with pytest.raises(RuntimeError, match="shapes"):
        _run(Setup(batch=1, seq=8))


@pytest.mark.parametrize(("setup", "config", "words"), [
    (Setup(zero_stage=1, world_size=2, seq=8), TINY, "torchrun"),
    (Setup(zero_stage=3, seq=8), TINY, "torchrun"),
    (Setup(tp=2, seq=8), TINY, "torchrun"),
    (Setup(attention="efficient", seq=8), TINY, "available here: eager, math, flash"),
    (Setup(attention="cudnn", seq=8, precision="amp-bf16"), TINY, "available here: eager, math, flash"),
    (Setup(seq=300), TINY, "max_seq=256"),
    (Setup(seq=300), preset("tiny-llama"), "max_seq=256"),
    (Setup(mode="inference", inference_weights="int8", kv_cache_dtype="int8", seq=8), TINY, "int8"),
    (Setup(mode="inference", inference_weights="bf16", kv_cache_dtype="fp8", seq=8), TINY, "kv_cache_dtype"),
])
def test_bad_setups_raise_one_clear_setup_error(setup: Setup, config, words: str) -> None:
    with pytest.raises(SetupError) as info:
        _run(setup, config)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_bad_steps_and_unavailable_device() -> None:
    with pytest.raises(SetupError, match="steps"):
        _run(Setup(seq=8), steps=0)
    for seq, steps in ((1, 2), (1, 1), (8, 8)):  # no prompt token left to prefill: refused, not silently clamped
        with pytest.raises(SetupError, match="at least steps \\+ 1"):
            _run(Setup(mode="inference", seq=seq, inference_weights="fp32", kv_cache_dtype="fp32"), steps=steps)
    if not torch.cuda.is_available():
        with pytest.raises(SetupError, match="no CUDA GPU"):
            resolve_device("cuda")
        assert resolve_device("auto") == torch.device("cpu")



def test_timeline_samples_the_first_step_by_phase_with_host_rss_on_cpu() -> None:
    m = run_step(preset("tiny-gpt"), Setup(batch=2, seq=32), "cpu", steps=1, with_counted_flops=False, with_mfu=False,
                 timeline=True)
    phases = {row["phase"] for row in m.timeline}
    assert {"forward", "backward", "optimizer step", "zero_grad"} <= phases
    assert all(row["rss_bytes"] > 0 for row in m.timeline)
    assert not any(key.startswith(("cuda_", "nvml_")) for row in m.timeline for key in row)
    assert "timeline" not in m.to_row()
