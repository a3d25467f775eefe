"""memlab.compare.calculators: each public estimator's formula, checked by hand on a full-size config (no model is
built for the formula tools), the packaged tools called for real, and the shoot-out table on two real tiny runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlab.compare.calculators import (
    CALCULATORS,
    COMPONENTS,
    Run,
    error_table,
    gpu_poor,
    memlab_formula,
    memlab_trace,
    shoot_out,
    trace_components,
    trace_run,
    transformer_math_101,
    ultrascale_playbook,
)
from memlab.predict.hf import from_hf
from memlab.run.hf import measure_run

CONFIGS = Path(__file__).resolve().parents[2] / "memlab" / "course" / "configs"


def config(size: str, name: str) -> dict:
    return {k: v for k, v in json.loads((CONFIGS / size / f"{name}.json").read_text()).items()
            if not k.startswith("_")}


LLAMA7 = config("full", "llama-2-7b")
N7 = 6_738_415_616  # Llama-2-7B's parameter count (meta-llama/Llama-2-7b-hf)


def test_full_size_configs_have_their_published_parameter_counts() -> None:
    assert from_hf(LLAMA7).param_count() == N7
    assert from_hf(config("full", "gpt2")).param_count() == 124_439_808
    assert from_hf(config("full", "pythia-1.4b")).param_count() == 1_414_647_808


def test_transformer_math_101_by_hand() -> None:
    r = transformer_math_101(Run(LLAMA7, 1, 4096, "fp32"))
    assert r.states == 20 * N7  # 4 model + 12 AdamW + 4 gradients
    assert r.activations == 4096 * 4096 * 32 * (34 + 5 * 32 * 4096 / 4096)  # s b h L (10 + 24 + 5as/h)
    assert transformer_math_101(Run(LLAMA7, 1, 4096, "bf16")).states == 16 * N7


def test_ultrascale_playbook_by_hand() -> None:
    r = ultrascale_playbook(Run(LLAMA7, 2, 1024, "bf16"))
    assert r.states == 16 * N7
    assert r.activations == 32 * 1024 * 2 * 4096 * (34 + 5 * 32 * 1024 / 4096)


def test_gpu_poor_by_hand() -> None:
    """src/App.js: params = 2Vh + 4Lh^2 + 3L*inter*h; model 2 B/param, Adam 3 x 2 B/param."""
    r = gpu_poor(Run(LLAMA7, 1, 100))
    params = 2 * 32000 * 4096 + 32 * 4 * 4096**2 + 32 * 3 * 11008 * 4096
    assert r.states == 8 * params
    n, h, a, f = 100, 4096, 32, 11008
    per_layer = (5 * n * h * 2 + n * n * a * (2 + 4 + 2) + 3 * n * h * 2) + (2 * h * n * 2 + 12 * n * f) + (
        8 * n + 12 * n * h)
    assert r.activations == per_layer * 32


def test_accelerate_and_deepspeed_call_their_own_functions() -> None:
    pytest.importorskip("accelerate")
    run = Run(config("tiny", "llama"), 2, 24)
    acc = CALCULATORS["accelerate"](run)
    assert acc.available and acc.activations is None and acc.states > 0
    ds = CALCULATORS["deepspeed-zero2"](run)
    if not ds.available:
        pytest.skip(ds.note)
    n = from_hf(run.hf).param_count()
    assert ds.states == 20 * n  # 2 (16-bit params) + 18 per parameter on one GPU
    assert CALCULATORS["deepspeed-zero3"](run).states > 18 * n


def test_memlab_trace_matches_the_real_tiny_step() -> None:
    """The fake-tensor trace of the real HF model against the real step: states byte for byte; activations within
    the labels and the scalar loss (the trace counts both token-id tensors, the measurement the saved ones)."""
    pytest.importorskip("transformers")
    run = Run(config("tiny", "llama"), 2, 24, "bf16", "eager")
    r, m = memlab_trace(run), measure_run(run)
    assert r.available and r.states == m["states"]
    labels = run.batch * run.seq * 8
    assert 0 <= r.activations - m["activations"] <= labels + 4  # and the fp32 loss
    assert "peak" in r.note and trace_run(run) is trace_run(run)  # cached


def test_memlab_trace_says_why_a_cuda_only_kernel_cannot_be_traced() -> None:
    """fp32 SDPA on CUDA is the memory-efficient kernel, which has no CPU version: the row is unavailable, with
    the reason, never imitated."""
    pytest.importorskip("transformers")
    r = memlab_trace(Run(config("tiny", "llama"), 1, 16, "fp32", "sdpa", device_type="cuda"))
    assert not r.available and "efficient" in r.note and r.states is None


def test_memlab_trace_at_full_size_agrees_with_the_formula_on_states() -> None:
    """Full-size GPT-2 (dropout 0.1) on fake tensors, nothing allocated: the formula's model states exactly and its
    activations within 0.01 % (CPU kernels, so the formula for CPU), and a peak inside the step above states +
    activations (the transients no component counts)."""
    pytest.importorskip("transformers")
    run = Run(config("full", "gpt2"), 1, 1024, "bf16", "eager", device_type="cpu")
    r, f = memlab_trace(run), memlab_formula(run)
    assert r.states == f.states
    assert abs(r.activations - f.activations) / f.activations < 1e-4
    assert trace_components(trace_run(run))["states"] == r.states
    assert trace_run(run).peak_bytes > r.total


def test_shoot_out_on_real_runs_memlab_exact() -> None:
    pytest.importorskip("transformers")
    runs = [Run(config("tiny", "gpt2"), 2, 16, "fp32", "eager"), Run(config("tiny", "phi"), 1, 24, "bf16", "sdpa")]
    pairs = [(r, measure_run(r)) for r in runs]
    for r, m in pairs:
        p = memlab_formula(r)
        assert (p.states, p.activations) == (m["states"], m["activations"])
    frame = shoot_out(pairs)
    assert len(frame) == len(runs) * len(CALCULATORS) * len(COMPONENTS)
    table = error_table(frame).set_index("tool")
    assert table.loc["memlab", "activations worst"] == 0.0
    assert table.loc["memlab-trace", "states worst"] == 0.0
    assert abs(table.loc["memlab-trace", "activations worst"]) < 0.01
    assert table.loc["transformer-math-101", "states median"] > 0.2


def test_shootout_figure_has_one_panel_per_component() -> None:
    import pandas as pd

    from memlab.compare.plots import shootout_errors

    frame = pd.DataFrame([{"tool": t, "component": c, "rel_error": e, "available": a}
                          for t, e, a in (("memlab", 0.0, True), ("x", 0.5, True), ("y", None, False))
                          for c in COMPONENTS])
    fig = shootout_errors(frame, title="t", source="s")
    assert len(fig.axes) == len(COMPONENTS)


def test_fine_tuning_runs_are_scored_only_on_what_each_calculator_claims() -> None:
    h, L = 4096, 32
    full, lora = gpu_poor(Run(LLAMA7, 1, 100)), gpu_poor(Run(LLAMA7, 1, 100, "bf16", finetune="lora"))
    assert lora.states == full.states / 4 + L * 8 * h * 2 * 4 * 3 * 2  # App.js lines 297-301: rank-free adapters
    assert lora.activations == full.activations  # its LoRA activation term is commented out
    q = gpu_poor(Run(LLAMA7, 2, 200, "bf16", finetune="qlora"))
    assert q.states < lora.states / 2
    for tool in ("transformer-math-101", "ultrascale-playbook", "deepspeed-zero2"):
        r = CALCULATORS[tool](Run(LLAMA7, 1, 100, "bf16", finetune="lora"))
        assert r.states is None and r.activations is None


def test_a_lora_shoot_out_run_is_measured_with_peft_and_memlab_is_exact() -> None:
    pytest.importorskip("peft")
    run = Run(config("tiny", "llama"), 2, 24, "fp32", "eager", finetune="lora", lora_rank=4, lora_targets="q,v")
    m = measure_run(run)
    r = CALCULATORS["memlab"](run)
    assert (r.states, r.activations) == (m["states"], m["activations"])
    acc = CALCULATORS["accelerate"](run)
    assert acc.activations is None and acc.states is not None and acc.states < m["states"]


def test_finetune_scope_shows_what_each_tool_claims_for_a_lora_run() -> None:
    from memlab.compare.calculators import FINETUNE_TOOLS, finetune_scope

    run = Run(LLAMA7, 1, 100, "bf16", finetune="lora")
    scope = finetune_scope(run, tools=[t for t in CALCULATORS if t != "memlab-trace"]).set_index("tool")
    claimed = scope[(scope["states"] == "claimed") | (scope["activations"] == "claimed")].index
    assert set(claimed) == set(FINETUNE_TOOLS)
    assert scope.loc["accelerate", "activations"] == "not modelled" and scope.loc["gpu_poor", "states"] == "claimed"


def test_finetune_shoot_out_takes_given_measurements_and_measures_the_rest_with_peft() -> None:
    pytest.importorskip("peft")
    from memlab.compare.calculators import finetune_shoot_out, lora_runs

    runs = lora_runs({"llama": config("tiny", "llama"), "qwen2": config("tiny", "qwen2")}, 1, 8, lora_rank=4)
    assert [r.finetune for r in runs] == ["lora", "lora"] and runs[1].name == "qwen2"
    fake = {"states": 1000, "activations": 2000}
    frame = finetune_shoot_out(runs, {runs[0]: fake})
    first = frame[(frame["experiment"] == runs[0].label) & (frame["component"] == "states")]
    assert (first["measured"] == 1000).all()  # given: not re-measured
    second = frame[(frame["experiment"] == runs[1].label) & (frame["tool"] == "memlab")]
    assert (second["predicted"] == second["measured"]).all()  # measured here with peft: memlab exact
    assert set(frame["tool"]) == {"memlab", "gpu_poor", "accelerate"}
