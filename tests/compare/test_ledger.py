"""memlab.compare.ledger on the CPU validation grid: the estimator equals the accounting exactly.

The 48-config grid is measured ONCE per test session module (``ci_sweep``) and reused by the other tests here:
ledger columns, error summary, plots, and ``memlab ledger`` reading the finished sweep without re-running it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from memlab import cli, units
from memlab.compare import plots
from memlab.compare.ledger import COLUMNS, ci_grid, compare, error_summary, experiment_label, ledger, predict_for
from memlab.predict.memory.activations import CATEGORIES
from memlab.predict.spec.model import preset
from memlab.run.sweep import measurement_of, point_key, read_rows, sweep

STATE_COMPONENTS = ("params", "grads", "optimizer", "activations")


@pytest.fixture(scope="module")
def ci_sweep(tmp_path_factory: pytest.TempPathFactory):
    """(path, pairs, table): the CI grid swept on CPU into a JSON-lines file, its (config, Measurement) pairs and
    its ledger with activation detail (single-threaded, as the whole suite: see conftest.py)."""
    path = tmp_path_factory.mktemp("ledger") / "ci-cpu.jsonl"
    sweep(ci_grid(), path, device="cpu", steps=1, with_counted_flops=False, with_mfu=False, progress=False)
    pairs = [measurement_of(r) for r in read_rows(path)]
    return path, pairs, ledger(pairs, activations_detail=True)


def test_ci_grid_covers_the_issue_3_axes() -> None:
    grid = ci_grid()
    assert len(grid) >= 24 and len(grid) == 48
    setups = [s for _, s in grid]
    assert {s.attention for s in setups} >= {"eager", "flash"}
    assert {s.recompute for s in setups} == {"none", "selective", "full"}
    assert {s.precision for s in setups} >= {"fp32", "amp-bf16"}
    assert len({c.name for c, _ in grid}) >= 2
    assert len({(s.batch, s.seq) for s in setups}) >= 2
    assert len({point_key(c, s, "cpu") for c, s in grid}) == len(grid)


@pytest.mark.slow
def test_estimator_matches_accounting_on_ci_grid(ci_sweep) -> None:
    path, pairs, table = ci_sweep
    assert len(pairs) == 48 and all(m.status == "ok" for _, m in pairs)
    assert len({r["key"] for r in read_rows(path)}) == 48
    assert list(table.columns) == list(COLUMNS)
    for comp in STATE_COMPONENTS:
        rows = table[table["component"] == comp]
        assert len(rows) == 48, comp
        assert (rows["measured"] > 0).all(), comp
        assert (rows["abs_error"] == 0).all() and (rows["rel_error"] == 0).all(), rows[rows["abs_error"] != 0]
    detail = table[table["component"].str.startswith("activations: ")]
    assert set(detail["component"].str.removeprefix("activations: ")) <= set(CATEGORIES)
    assert (detail["abs_error"] == 0).all(), detail[detail["abs_error"] != 0]
    # the categories add up to the activations row, per experiment
    per_exp = detail.groupby("experiment")["measured"].sum()
    acts = table[table["component"] == "activations"].set_index("experiment")["measured"]
    assert (per_exp.sort_index() == acts.sort_index()).all()


@pytest.mark.slow
def test_error_summary_reports_zero_error_per_component(ci_sweep) -> None:
    _, _, table = ci_sweep
    summary = error_summary(table)
    assert list(summary.columns) == ["component", "rows", "median_abs_rel_error", "max_abs_rel_error",
                                     "worst_experiment"]
    by = summary.set_index("component")
    for comp in (*STATE_COMPONENTS, "modelled total"):
        assert by.loc[comp, "rows"] == 48 and by.loc[comp, "max_abs_rel_error"] == 0


@pytest.mark.slow
def test_no_cuda_residual_rows_on_cpu(ci_sweep) -> None:
    _, pairs, table = ci_sweep
    assert not table["component"].str.contains("allocator|residual").any()
    assert all(m.cuda_peak_allocated_bytes is None and m.device == "cpu" for _, m in pairs)


@pytest.mark.slow
def test_error_is_signed_prediction_minus_measurement(ci_sweep) -> None:
    _, pairs, _ = ci_sweep
    cfg, m = pairs[0]
    doubled = dataclasses.replace(m, params_bytes=2 * m.params_bytes)
    rows = compare(predict_for(cfg, doubled), doubled).set_index("component")
    assert rows.loc["params", "rel_error"] == -0.5
    assert rows.loc["params", "abs_error"] == -m.params_bytes
    total = rows.loc["modelled total"]
    assert total["predicted"] == sum(rows.loc[c, "predicted"] for c in STATE_COMPONENTS)


@pytest.mark.slow
def test_cuda_residual_rows_from_allocator_and_nvml_numbers(ci_sweep) -> None:
    """The arithmetic of the residual rows, fed with made-up allocator numbers (not presented as a GPU result)."""
    _, pairs, _ = ci_sweep
    cfg, m = pairs[0]
    fake = dataclasses.replace(m, device="cuda:0", cuda_peak_allocated_bytes=10_000_000,
                               cuda_peak_reserved_bytes=12_000_000,
                               nvml={"available": True, "process_used_bytes": 15_000_000})
    rows = compare(predict_for(cfg, fake), fake).set_index("component")
    assert rows.loc["allocator peak (max_memory_allocated)", "measured"] == 10_000_000
    assert rows.loc["residual: reserved but not allocated at peak", "measured"] == 2_000_000
    assert rows.loc["residual: outside PyTorch's allocator (process used - reserved)", "measured"] == 3_000_000
    no_nvml = dataclasses.replace(fake, nvml={"available": False, "reason": "no NVML"})
    assert not compare(predict_for(cfg, no_nvml), no_nvml)["component"].str.contains("outside").any()


@pytest.mark.slow
def test_failed_measurement_is_one_row_with_its_message(ci_sweep) -> None:
    _, pairs, _ = ci_sweep
    cfg, m = pairs[0]
    failed = dataclasses.replace(m, status="oom", error="CUDA out of memory. Tried to allocate 2.00 GiB")
    rows = compare(predict_for(cfg, failed), failed)
    assert len(rows) == 1 and rows.loc[0, "measured"] is None
    assert rows.loc[0, "note"].startswith("oom: CUDA out of memory")


@pytest.mark.slow
def test_plots_have_titles_labels_and_one_bar_pair_per_experiment(ci_sweep) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    _, pairs, table = ci_sweep
    some = table[table["experiment"].isin(list(dict.fromkeys(table["experiment"]))[:3])]
    fig = plots.stacked_breakdown(some, title="predicted vs measured", source="CPU ledger")
    ax = fig.axes[0]
    assert isinstance(fig, Figure)
    assert ax.get_title() == "predicted vs measured\nCPU ledger"
    assert ax.get_ylabel().startswith("memory per device (")
    assert len(ax.patches) == 3 * 2 * len(STATE_COMPONENTS)  # 3 experiments x (predicted, measured) x components
    assert [t.get_text() for t in ax.get_xticklabels()] == list(dict.fromkeys(some["experiment"]))
    plt.close(fig)
    import pandas as pd

    phases = pd.DataFrame(list(pairs[0][1].phases))
    fig = plots.phase_timeline(phases, title="first step")
    ax = fig.axes[0]
    assert "phase" in ax.get_xlabel() and ax.get_ylabel().startswith("bytes held (")
    assert [t.get_text() for t in ax.get_xticklabels()] == list(phases["phase"])
    assert ax.get_title() == "first step"
    plt.close(fig)


def test_byte_unit_picks_binary_units() -> None:
    assert units.byte_unit(3 * 2**30) == ("GiB", 2.0**30)
    assert units.byte_unit(2**20) == ("MiB", 2.0**20)
    assert units.byte_unit(1023) == ("B", 1.0)


@pytest.mark.slow
def test_memlab_ledger_reads_the_finished_sweep_without_rerunning(ci_sweep, capsys, monkeypatch) -> None:
    import memlab.run.runner

    path, _, _ = ci_sweep

    def must_not_run(*args, **kwargs):
        raise AssertionError("a finished sweep must not be measured again")

    monkeypatch.setattr(memlab.run.runner, "run_step", must_not_run)
    before = path.read_text()
    assert cli.main(["ledger", "--device", "cpu", "--out", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["configs"] == 48 and out["failed"] == 0
    summary = {r["component"]: r for r in out["summary"]}
    assert all(summary[c]["max_abs_rel_error"] == 0 for c in STATE_COMPONENTS)
    assert cli.main(["ledger", "--device", "cpu", "--out", str(path)]) == 0
    human = capsys.readouterr().out
    assert "48 configs on cpu, 0 failed" in human and "0.0000 %" in human
    assert path.read_text() == before


def test_experiment_label_names_the_setup() -> None:
    from memlab.predict.spec.setup import Setup
    from memlab.run.runner import Measurement

    m = Measurement(model="tiny-gpt", setup=Setup(batch=2, seq=32, precision="amp-bf16").to_dict(), device="cpu",
                    device_name="cpu")
    assert experiment_label(m) == "tiny-gpt amp-bf16 adamw eager none b2x32"
    inf = dataclasses.replace(m, setup=Setup(mode="inference", seq=8).to_dict())
    assert experiment_label(inf) == "tiny-gpt infer bf16 b1x8 eager"
    assert preset("tiny-gpt").name == "tiny-gpt"
