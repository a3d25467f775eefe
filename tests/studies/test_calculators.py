"""memlab.studies.calculators: each public estimator's formula, checked by hand on a full-size config (no model is
built for the formula tools), the packaged tools called for real, and the shoot-out table on two real tiny runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from memlab.predict.families.reader import from_hf
from memlab.run.hf import measure_run
from memlab.studies.calculators import (
    CALCULATORS,
    COMPONENTS,
    KORTHIKANTI,
    OUT_OF_SCOPE,
    Run,
    error_table,
    gpu_poor,
    held_out_table,
    korthikanti_guides,
    memlab_formula,
    memlab_trace,
    scope_table,
    shoot_out,
    trace_components,
    trace_run,
    transformer_math_101,
    ultrascale_playbook,
)

CONFIGS = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs"


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
    r = gpu_poor(Run(LLAMA7, 1, 100, "bf16"))
    params = 2 * 32000 * 4096 + 32 * 4 * 4096**2 + 32 * 3 * 11008 * 4096
    assert r.states == 8 * params
    n, h, a, f = 100, 4096, 32, 11008
    per_layer = (5 * n * h * 2 + n * n * a * (2 + 4 + 2) + 3 * n * h * 2) + (2 * h * n * 2 + 12 * n * f) + (
        8 * n + 12 * n * h)
    assert r.activations == per_layer * 32


def test_accelerate_and_deepspeed_call_their_own_functions() -> None:
    pytest.importorskip("accelerate")
    run = Run(config("tiny", "llama"), 2, 24, "bf16", precision="mixed-bf16")
    acc = CALCULATORS["accelerate"](run)
    assert acc.available and acc.activations is None and acc.states is None and acc.peak > 0
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


def test_memlab_trace_runs_cudas_memory_efficient_kernel_through_its_op() -> None:
    """fp32 SDPA on CUDA is the memory-efficient kernel, which has no CPU version: the trace makes the op call CUDA
    makes on fake tensors (memlab.tracing.hf.cuda_efficient_on_fake), so the row is available and its states are the
    formula's within 0.01 % (the trace counts the optimizer's step counters, which CUDA keeps on the host)."""
    pytest.importorskip("transformers")
    run = Run(config("tiny", "llama"), 1, 16, "fp32", "sdpa", device_type="cuda")
    r, f = memlab_trace(run), memlab_formula(run)
    assert r.available and abs(r.states - f.states) <= 1e-4 * f.states


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
    measured_components = [c for c in COMPONENTS if c != "peak"]  # no peak is measured on a CPU run
    assert len(frame) == len(runs) * len(CALCULATORS) * len(measured_components)
    table = error_table(frame).set_index("tool")
    assert table.loc["memlab", "activations worst"] == 0.0
    assert table.loc["memlab-trace", "states worst"] == 0.0
    assert abs(table.loc["memlab-trace", "activations worst"]) < 0.01
    # the guides' 16 B/param is fp32's 4 + 4 + 8 (to GPT-2's position table, which the measurement leaves with the
    # buffers); their 2-byte activations are not scored on fp32 and their states not on pure bf16: one run each
    assert abs(table.loc[KORTHIKANTI, "states worst"]) < 1e-3 and table.loc[KORTHIKANTI, "states runs"] == 1
    assert table.loc[KORTHIKANTI, "activations runs"] == 0  # per-layer formula: a measured run has no per-layer truth
    assert (frame[frame["scope"] == OUT_OF_SCOPE]["rel_error"].isna()).all()


def test_per_layer_formula_is_scored_on_the_blocks_not_the_head_and_loss() -> None:
    """Korthikanti's full-recomputation 2 sbhL is the blocks' bytes exactly (each block keeps its 2-byte input); the
    whole-model truth adds the embeddings, the head and the loss, which the formula leaves out by definition."""
    pytest.importorskip("transformers")
    from memlab.studies.calculators import traced_truth

    run = Run(config("tiny", "gpt2"), 2, 24, "bf16", "eager", precision="mixed-bf16", recompute="full")
    t = traced_truth(run)
    h, L = run.hf["n_embd"], run.hf["n_layer"]
    assert t["per_layer"] == 2 * 48 * h * L < t["activations"]
    row = shoot_out([(run, t)], tools=[KORTHIKANTI]).set_index("component").loc["activations"]
    assert row["scope"] == "scored" and row["measured"] == t["per_layer"] and row["rel_error"] == 0.0


def _fake_frame(errors: dict[str, list[float | None]]) -> pd.DataFrame:
    """A shoot-out frame with the given signed errors per tool (None: out of scope), for every component."""
    return pd.DataFrame([{"tool": t, "component": c, "rel_error": e, "available": True, "recipe": "mixed-bf16",
                          "recompute": "none", "truth": "traced", "config": f"c{i}", "family": "llama",
                          "parameters": N7 + i,
                          "experiment": f"run{i}", "scope": "scored" if e is not None else OUT_OF_SCOPE,
                          "note": "" if e is not None else "assumes another recipe"}
                         for t, es in errors.items() for i, e in enumerate(es) for c in COMPONENTS])


@pytest.mark.parametrize("seed", range(3))
def test_error_table_medians_keep_their_sign(seed: int) -> None:
    """A tool that always under-predicts gets a negative median (the review's +40 % that was really -40 %)."""
    import random

    rng = random.Random(seed)
    under = [-rng.uniform(0.05, 0.6) for _ in range(rng.randint(1, 7))]
    over = [rng.uniform(0.05, 0.6) for _ in range(rng.randint(1, 7))]
    table = error_table(_fake_frame({"under": under, "over": over, "none": [None, None]})).set_index("tool")
    assert table.loc["under", "activations median"] < 0 < table.loc["over", "activations median"]
    assert table.loc["under", "peak worst"] == min(under)
    assert table.loc["none", "states median"] == OUT_OF_SCOPE and table.loc["none", "states runs"] == 0


def test_shootout_figure_per_component_names_out_of_scope_tools() -> None:
    from memlab.compare.plots import shootout_component

    frame = _fake_frame({"memlab": [0.0, 0.01], "x": [0.5, -0.2], "y": [None, None]})
    for comp in COMPONENTS:
        fig = shootout_component(frame, comp, title="t", source="s")
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert texts == ["out of scope"] and comp in fig.get_suptitle()


def test_each_tool_is_scored_only_on_its_recipe_and_components() -> None:
    """Pure bf16, mixed bf16 and fp32 runs of full-size Llama-2-7B: gpu_poor's states only on pure bf16, DeepSpeed
    only on mixed, accelerate only a peak (fp32 or mixed), the guides' 2-byte activations never on fp32; every
    missing number has a reason and no tool without activations has a total."""
    pytest.importorskip("accelerate")
    runs = {r: Run(LLAMA7, 1, 512, d, "sdpa", device_type="cuda", precision=p)
            for r, d, p in (("bf16", "bf16", ""), ("mixed-bf16", "bf16", "mixed-bf16"), ("fp32", "fp32", ""))}
    for recipe, run in runs.items():
        assert run.recipe == recipe
        gp, guides, acc = gpu_poor(run), korthikanti_guides(run), CALCULATORS["accelerate"](run)
        assert (gp.states is not None) == (recipe == "bf16")
        assert (guides.activations is None) == (recipe == "fp32")
        assert (guides.states is None) == (recipe == "bf16")
        assert acc.states is None and acc.activations is None and acc.total is None
        assert (acc.peak is not None) == (recipe != "bf16")
        for r in (gp, guides, acc):
            for comp in COMPONENTS:
                assert r.claim(comp) is not None or r.reason(comp)
    ds = CALCULATORS["deepspeed-zero2"](runs["fp32"])
    if ds.available:
        assert ds.states is None and "mixed" in ds.reason("states")
    assert korthikanti_guides(runs["mixed-bf16"]).states == 16 * N7


def test_one_formula_is_one_tool_applied_as_documented() -> None:
    """TM101 and the Playbook print the same formula: one CALCULATORS row; eager keeps the 5as/h scores term, a
    fused SDPA kernel drops it, full checkpointing is 2 sbhL."""
    assert "transformer-math-101" not in CALCULATORS and "ultrascale-playbook" not in CALCULATORS
    s, b, h, L, a = 1024, 2, 4096, 32, 32
    eager = Run(LLAMA7, b, s, "bf16", "eager", precision="mixed-bf16")
    assert korthikanti_guides(eager).activations == transformer_math_101(eager).activations \
        == ultrascale_playbook(eager).activations == s * b * h * L * (34 + 5 * a * s / h)
    sdpa = Run(LLAMA7, b, s, "bf16", "sdpa", precision="mixed-bf16")
    assert korthikanti_guides(sdpa).activations == s * b * h * L * 34
    ckpt = Run(LLAMA7, b, s, "bf16", "sdpa", precision="mixed-bf16", recompute="full")
    assert korthikanti_guides(ckpt).activations == 2 * s * b * h * L


@pytest.mark.parametrize("bad", [dict(dtype="fp32", precision="mixed-bf16"), dict(precision="amp"),
                                 dict(dtype="bf16", precision="amp-bf16"),
                                 dict(recompute="selective")])
def test_a_run_refuses_a_recipe_it_cannot_train(bad: dict) -> None:
    from memlab.errors import SetupError

    with pytest.raises(SetupError, match=r"Run|mixed|autocasts"):
        Run(LLAMA7, 1, 16, **bad)


def test_held_out_table_labels_each_config_by_its_sample() -> None:
    frame = _fake_frame({"memlab": [0.0, -0.05, 0.02]})
    frame.loc[frame["config"] == "c2", "family"] = "mamba"
    frame.loc[frame["config"] == "c0", "parameters"] = N7
    held = held_out_table(frame, tested={"c0": LLAMA7, "c1": config("tiny", "llama")}).set_index("config")
    assert held.loc["c0", "sample"].startswith("in-sample")
    assert held.loc["c1", "sample"].startswith("held-out config") and held.loc["c1", "activations worst"] == -0.05
    assert held.loc["c2", "sample"] == "held-out family"
    assert scope_table(frame).set_index("tool").loc["memlab", "peak"] == "scored on 3: mixed-bf16"


def test_traced_truth_of_a_mixed_run_counts_master_weights_and_a_peak_above_the_sum() -> None:
    """The real HF step in mixed bf16 on fake tensors: the formula's 16 B/param of states (2 + 2 + 12) plus AdamW's
    4-byte step count per parameter tensor, which the formula leaves out; a peak inside the step above the
    states."""
    pytest.importorskip("transformers")
    from memlab.studies.calculators import traced_truth

    run = Run(config("tiny", "llama"), 2, 24, "bf16", "sdpa", device_type="cuda", precision="mixed-bf16")
    t = traced_truth(run)
    n = from_hf(run.hf).param_count()
    assert memlab_formula(run).states == 16 * n and 0 < t["states"] - 16 * n <= 4 * 64
    assert t["peak"] > t["states"] and "step" in t["peak_in"]


def test_fine_tuning_runs_are_scored_only_on_what_each_calculator_claims() -> None:
    h, L = 4096, 32
    full, lora = gpu_poor(Run(LLAMA7, 1, 100, "bf16")), gpu_poor(Run(LLAMA7, 1, 100, "bf16", finetune="lora"))
    assert lora.states == full.states / 4 + L * 8 * h * 2 * 4 * 3 * 2  # App.js lines 297-301: rank-free adapters
    assert lora.activations == full.activations  # its LoRA activation term is commented out
    q = gpu_poor(Run(LLAMA7, 2, 200, "bf16", finetune="qlora"))
    assert q.states < lora.states / 2
    for tool in (KORTHIKANTI, "deepspeed-zero2"):
        r = CALCULATORS[tool](Run(LLAMA7, 1, 100, "bf16", finetune="lora"))
        assert r.states is None and r.activations is None


def test_a_lora_shoot_out_run_is_measured_with_peft_and_memlab_is_exact() -> None:
    pytest.importorskip("peft")
    run = Run(config("tiny", "llama"), 2, 24, "fp32", "eager", finetune="lora", lora_rank=4, lora_targets="q,v")
    m = measure_run(run)
    r = CALCULATORS["memlab"](run)
    assert (r.states, r.activations) == (m["states"], m["activations"])
    acc, gp = CALCULATORS["accelerate"](run), gpu_poor(run)
    assert acc.activations is None and acc.states is None and "no lora mode" in acc.note  # no claim in its mouth
    assert gp.states is None and gp.activations is None and "16-bit" in gp.reason("states")  # fp32: not its recipe


def test_finetune_scope_shows_what_each_tool_claims_for_a_lora_run() -> None:
    from memlab.studies.calculators import FINETUNE_TOOLS, finetune_scope

    run = Run(LLAMA7, 1, 100, "bf16", finetune="lora")
    scope = finetune_scope(run, tools=[t for t in CALCULATORS if t != "memlab-trace"]).set_index("tool")
    claimed = scope[(scope["states"] == "claimed") | (scope["activations"] == "claimed")].index
    assert set(claimed) == set(FINETUNE_TOOLS) - {"accelerate"}  # accelerate has no LoRA mode
    assert scope.loc["accelerate", "states"] == "not modelled" and scope.loc["gpu_poor", "states"] == "claimed"


def test_finetune_shoot_out_takes_given_measurements_and_measures_the_rest_with_peft() -> None:
    pytest.importorskip("peft")
    from memlab.studies.calculators import finetune_shoot_out, lora_runs

    runs = lora_runs({"llama": config("tiny", "llama"), "qwen2": config("tiny", "qwen2")}, 1, 8, lora_rank=4)
    assert [r.finetune for r in runs] == ["lora", "lora"] and runs[1].name == "qwen2"
    fake = {"states": 1000, "activations": 2000}
    frame = finetune_shoot_out(runs, {runs[0]: fake})
    first = frame[(frame["experiment"] == runs[0].label) & (frame["component"] == "states")]
    assert (first["measured"] == 1000).all()  # given: not re-measured
    second = frame[(frame["experiment"] == runs[1].label) & (frame["tool"] == "memlab")]
    assert (second["predicted"] == second["measured"]).all()  # measured here with peft: memlab exact
    assert set(frame["tool"]) == {"memlab", "gpu_poor", "accelerate"}


def test_full_size_runs_train_the_mixed_recipe_within_each_context() -> None:
    from memlab.studies.calculators import full_size_runs

    runs = full_size_runs({"gpt2": config("full", "gpt2"), "llama": LLAMA7},
                          [("gpt2", "eager", "full", "mixed-bf16"), ("llama", "sdpa", "none", "")], 4096)
    assert [(r.seq, r.recipe, r.recompute, r.batch) for r in runs] == [(1024, "mixed-bf16", "full", 1),
                                                                       (4096, "bf16", "none", 1)]
    assert runs[0].setup().precision == "mixed-bf16" and runs[0].setup().recompute == "full"
    assert runs[0].label == "gpt2 eager mixed-bf16 b1x1024 ckpt"


def test_an_autocast_run_is_traced_and_scored_only_by_the_tools_that_assume_it() -> None:
    """HF Trainer's bf16=True (an fp32 model under autocast, review 10.8): memlab's formula equals the trace's states;
    DeepSpeed (master-weights recipe) and gpu_poor's states (pure 16-bit) are out of scope."""
    pytest.importorskip("transformers")
    from memlab.studies.calculators import traced_truth

    run = Run(config("tiny", "gpt2"), 2, 24, "fp32", "eager", precision="amp-bf16")
    t = traced_truth(run)
    assert memlab_formula(run).states == t["states"]
    assert gpu_poor(run).states is None and korthikanti_guides(run).states is not None
    ds = CALCULATORS["deepspeed-zero2"](run)
    assert ds.states is None
