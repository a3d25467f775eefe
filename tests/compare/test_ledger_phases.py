"""The ledger compares the predicted peak and phases with measured (runner) and traced ones."""

from __future__ import annotations

from memlab.compare.ledger import compare, compare_trace, predict_for
from memlab.predict.estimate import estimate
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.run.runner import run_step
from memlab.tracing.gpt import trace_gpt


def test_ledger_has_phase_and_peak_rows_against_the_measurement() -> None:
    cfg, setup = preset("tiny-gpt"), Setup(batch=2, seq=32)
    m = run_step(cfg, setup, "cpu", steps=1, with_counted_flops=False, with_mfu=False)
    table = compare(predict_for(cfg, m), m)
    peak = table[table["component"] == "peak (inside the step)"].iloc[0]
    assert peak["measured"] == m.peak_bytes and abs(peak["rel_error"]) < 0.01
    phases = table[table["component"].str.startswith("phase: ")]
    assert len(phases) == 8 and phases["rel_error"].abs().max() < 0.01


def test_compare_trace_rows() -> None:
    cfg, setup = preset("tiny-gpt"), Setup(batch=2, seq=32)
    t = trace_gpt(cfg, setup, device_type="cpu")
    table = compare_trace(estimate(cfg, setup, device_type="cpu"), t)
    assert "peak (inside the step)" in set(table["component"])
    assert table["rel_error"].abs().max() < 0.01


def test_three_columns_formula_trace_measurement() -> None:
    cfg, setup = preset("tiny-gpt"), Setup(batch=2, seq=32, attention="flash", precision="amp-bf16")
    m = run_step(cfg, setup, "cpu", steps=1, with_counted_flops=False, with_mfu=False)
    table = compare(predict_for(cfg, m), m, trace=trace_gpt(cfg, setup, device_type="cpu")).set_index("component")
    for comp in ("params", "grads", "optimizer", "peak (inside the step)", "phase: steady backward"):
        assert table.loc[comp, "traced"] == table.loc[comp, "measured"], comp
