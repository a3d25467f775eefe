"""memlab.course.chapter: what every chapter notebook calls first (parameters, seeding, outputs, ledger, recorded GPU
data)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.course.chapter import Chapter, CpuNote, chapter, load_recorded
from memlab.device import device_string as resolve_device
from memlab.device import resolve_scale
from memlab.errors import ConfigError, MemlabError

ON_CPU = not torch.cuda.is_available()


@pytest.mark.skipif(not ON_CPU, reason="checks what 'auto' means on a machine without CUDA")
def test_auto_means_ci_scale_on_cpu() -> None:
    assert resolve_device("auto") == "cpu"
    assert resolve_scale("auto", "auto") == "ci"
    assert resolve_scale("full", "cpu") == "full", "an explicit scale is kept"


@pytest.mark.parametrize(("device", "kind"), [("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda")])
def test_device_type_is_the_kind_of_the_chapters_device(tmp_path: Path, device: str, kind: str) -> None:
    ch = Chapter(scale="ci", device=device, seed=0, out_dir=tmp_path)
    assert ch.device_type == kind


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"scale": "huge"}, "scale must be one of"),
    ({"device": "tpu"}, "device must be"),
    ({"seed": -1}, "seed must be"),
    ({"seed": 1.5}, "seed must be"),
    ({"ci_threads": 0}, "ci_threads must be"),
])
def test_bad_parameters_get_one_clear_error(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(MemlabError, match=match):
        chapter(**{"out_dir": tmp_path, **kwargs})


@pytest.mark.skipif(not ON_CPU, reason="asks for CUDA where there is none")
def test_asking_for_cuda_without_one_is_an_error() -> None:
    with pytest.raises(MemlabError, match="no CUDA GPU"):
        resolve_device("cuda")


def test_chapter_creates_out_dir_and_seeds_every_generator(tmp_path: Path) -> None:
    out = tmp_path / "build" / "00_x"
    ch = chapter("ci", "cpu", 7, out)
    first = (random.random(), torch.rand(1).item())
    chapter("ci", "cpu", 7, out)
    assert (random.random(), torch.rand(1).item()) == first
    assert ch.out_dir == out.resolve() and out.is_dir()
    assert ch.to_dict() == {"scale": "ci", "device": "cpu", "seed": 7, "out_dir": str(out.resolve())}


def test_ci_threads_pins_torch_on_a_cpu_at_ci_scale_only(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        chapter("full", "cpu", 0, tmp_path, ci_threads=1)
        assert torch.get_num_threads() == before
        chapter("ci", "cpu", 0, tmp_path, ci_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_seed_claims_are_saved_and_shown_whole(tmp_path: Path) -> None:
    ch = chapter("ci", "cpu", 0, tmp_path)
    long = "x" * 300
    shown = ch.seed_claims([{"#": 7, "claim": "halves memory [seed-000]", "verdict": "does not hold", "number": long}])
    assert pd.read_csv(tmp_path / "seed_claims.csv").to_dict("records") == shown.frame.to_dict("records")
    assert long in shown._repr_html_()
    tuples = ch.seed_claims([("001", "c", "holds", "1")], columns=["seed", "claim", "verdict", "number"])
    assert list(tuples.frame.columns) == ["seed", "claim", "verdict", "number"]
    with pytest.raises(MemlabError, match="verdict"):
        ch.seed_claims([{"claim": "c"}])
    with pytest.raises(MemlabError, match="at least one row"):
        ch.seed_claims([])


def test_save_figure_and_table_write_into_out_dir(tmp_path: Path) -> None:
    ch = chapter("ci", "cpu", 0, tmp_path)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    png = ch.save_figure(fig, "line plot")
    plt.close(fig)
    assert png == tmp_path / "line_plot.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv = ch.save_table(pd.DataFrame({"a": [1, 2]}), "t")
    assert pd.read_csv(csv)["a"].tolist() == [1, 2]


def _rows(predicted: float, measured: float, component: str = "params") -> pd.DataFrame:
    return pd.DataFrame({"experiment": ["e"], "component": [component], "unit": ["B"], "predicted": [predicted],
                         "measured": [measured]})


def test_record_ledger_computes_errors_and_replaces_rerun_rows(tmp_path: Path) -> None:
    ch = chapter("ci", "cpu", 0, tmp_path)
    ch.record_ledger(_rows(120.0, 100.0))
    ch.record_ledger(_rows(90.0, 100.0, component="grads"))
    path = ch.record_ledger(_rows(110.0, 100.0))  # the same row again, as when a cell is re-run
    ledger = pd.read_csv(path).set_index("component")
    assert sorted(ledger.index) == ["grads", "params"]
    assert ledger.loc["params", "abs_error"] == pytest.approx(10.0)
    assert ledger.loc["params", "rel_error"] == pytest.approx(0.1)
    assert ledger.loc["grads", "rel_error"] == pytest.approx(-0.1)


def test_record_ledger_uses_the_compare_ledgers_relative_error_at_zero(tmp_path: Path) -> None:
    ch = chapter("ci", "cpu", 0, tmp_path)
    ch.record_ledger(_rows(0.0, 0.0))
    path = ch.record_ledger(_rows(5.0, 0.0, component="grads"))
    ledger = pd.read_csv(path).set_index("component")
    assert ledger.loc["params", "rel_error"] == 0.0 and ledger.loc["grads", "rel_error"] == float("inf")


def test_record_ledger_names_missing_columns(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="measured"):
        chapter("ci", "cpu", 0, tmp_path).record_ledger(pd.DataFrame({"experiment": ["e"], "component": ["c"],
                                                                      "unit": ["B"], "predicted": [1.0]}))


def test_cpu_note_speaks_only_on_a_cpu(tmp_path: Path) -> None:
    note = Chapter("ci", "cpu", 0, tmp_path).cpu_note("no HBM here.")
    assert isinstance(note, CpuNote) and "On this CPU" in note._repr_markdown_()
    assert Chapter("full", "cuda", 0, tmp_path).cpu_note("no HBM here.") is None


def test_recorded_results_come_with_their_gpu_label(tmp_path: Path) -> None:
    assert load_recorded("absent", tmp_path) is None
    pd.DataFrame({"batch": [1, 2], "peak_bytes": [10, 20]}).to_csv(tmp_path / "sweep.csv", index=False)
    (tmp_path / "sweep.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "driver": "550.54",
                                                     "torch": "2.3.0", "date": "2024-05-01"}))
    rec = chapter("ci", "cpu", 0, tmp_path / "out").recorded("sweep", tmp_path)
    assert rec.frame["peak_bytes"].tolist() == [10, 20]
    assert rec.label == "recorded on NVIDIA H100 80GB HBM3, driver 550.54, torch 2.3.0, date 2024-05-01"
    assert "H100" in rec._repr_html_()
    (tmp_path / "rows.json").write_text(json.dumps({"provenance": {"gpu": "A100"}, "rows": [{"x": 1}]}))
    assert load_recorded("rows", tmp_path).frame["x"].tolist() == [1]


def test_recorded_results_without_provenance_are_refused(tmp_path: Path) -> None:
    pd.DataFrame({"x": [1]}).to_csv(tmp_path / "bare.csv", index=False)
    with pytest.raises(ConfigError, match="provenance"):
        load_recorded("bare", tmp_path)


@pytest.mark.parametrize(("value", "shown"), [
    (371315844094.552368, "371,315,844,095"), (1.6e10, "16,000,000,000"), (4484096.0, "4,484,096"),
    (23.540585, "23.54"), (0.222391, "0.222"), (16.0, "16"), (0.0, "0"), (float("nan"), "—"), (-0.5, "-0.5"),
    (6.38e-05, "0.0000638"), (-9.1e-08, "-9.10 × 10⁻⁸"), (1e20, "1.00 × 10²⁰"), (1.1754944e-38, "1.18 × 10⁻³⁸"),
    (9.999e-7, "1.00 × 10⁻⁶"), (float("inf"), "∞"),
])
def test_tables_show_numbers_rounded_for_a_reader(value: float, shown: str) -> None:
    from memlab.course.chapter import reader_number

    assert reader_number(value) == shown


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300).filter(lambda v: v != 0))
def test_a_table_number_is_never_scientific_and_keeps_three_digits(value: float) -> None:
    from memlab.course.chapter import reader_number

    shown = reader_number(value)
    assert "e" not in shown.lower() and shown not in ("0", "-0")
    if " × 10" in shown:
        mantissa, power = shown.split(" × 10")
        back = float(mantissa) * 10 ** int(power.translate(str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")))
    else:
        back = float(shown.replace(",", ""))
    assert abs(back - value) <= max(0.5, abs(value) * 0.006), (value, shown)


def test_reader_tables_show_missing_values_as_a_dash_and_integers_grouped() -> None:
    from memlab.course.chapter import reader_html

    html = reader_html(pd.DataFrame({"bytes": [1216392, 23068672], "x": [float("nan"), 0.5], "who": [None, "a"]}))
    assert "1,216,392" in html and "23,068,672" in html and "NaN" not in html and "None" not in html
    assert html.count("—") == 2
    mixed = reader_html(pd.Series({"reason": None, "peak": 1.5e12, "n": 4096, "ok": True, "what": "cpu"},
                                  name="this device").to_frame())
    assert "None" not in mixed and "1,500,000,000,000" in mixed and "4,096" in mixed and "True" in mixed


def test_a_chapter_shows_itself_without_a_machine_path(tmp_path: Path) -> None:
    ch = chapter("ci", "cpu", 0, tmp_path / "build" / "00_x")
    text = ch._repr_markdown_()
    assert "ci" in text and "cpu" in text and "build" not in text and str(tmp_path) not in text


def test_reader_tables_let_long_tokens_break_in_words_and_never_in_numbers() -> None:
    from memlab.course.chapter import reader_html

    html = reader_html(pd.DataFrame({"n": [23068672], "fix": ["try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"],
                                     "kind": ["fragmentation candidate"]}))
    assert "<td>23,068,672</td>" in html, "a number cell is left alone"
    assert "PYTORCH_<wbr>CUDA_<wbr>ALLOC_<wbr>CONF=<wbr>expandable_<wbr>segments:<wbr>True" in html
    assert '<td class="memlab-text">fragmentation candidate</td>' in html, "short words are not broken"


def test_reader_tables_hide_an_index_that_only_numbers_the_rows() -> None:
    from memlab.course.chapter import reader_html

    frame = pd.DataFrame({"peak_bytes": [1024, 2048, 4096], "what": ["a", "b", "c"]})
    assert "<th>0</th>" not in reader_html(frame) and "<th>2</th>" not in reader_html(frame[frame.what != "b"])
    assert "<th>x</th>" in reader_html(frame.set_index("what").rename(index={"a": "x"})), "a label index stays"
    assert "<th>0</th>" in reader_html(frame, index=True), "asked for, it is shown"
    pivot = pd.DataFrame({"world": [1, 8], "zero1": [3.0, 1.0]}).set_index("world").rename_axis(columns="stage")
    assert "<th>8</th>" in reader_html(pivot.rename_axis(index=None)), "a pivot's index stands under its axis name"


def test_recorded_gpu_data_shown_is_noted_for_the_report(tmp_path: Path) -> None:
    import json

    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "x.json").write_text(json.dumps({"provenance": {"gpu": "NVIDIA H100"}, "rows": [{"a": 1}]}))
    ch = chapter("ci", "cpu", 0, tmp_path / "out")
    assert ch.recorded("absent", tmp_path / "rec") is None and not (ch.out_dir / "recorded_shown.json").exists()
    ch.recorded("x", tmp_path / "rec")
    assert "H100" in json.loads((ch.out_dir / "recorded_shown.json").read_text())["x"]


def test_reader_columns_name_units_and_convert_values() -> None:
    import pandas as pd

    from memlab.course.chapter import reader_columns

    frame = pd.DataFrame({"peak_bytes": [3 * 2**30, 2**29], "rel_error": [0.01, -0.02], "world_size": [1, 2],
                          "tokens_per_s": [1.0, 2.0], "step_s": [0.1, 0.2], "U_cap": [1, 2], "name": ["a", "b"],
                          "small_bytes": [10, 20]})
    shown = reader_columns(frame)
    assert list(shown.columns) == ["peak (GiB)", "relative error (%)", "world size", "tokens/s", "step (s)", "U_cap",
                                   "name", "small (B)"]
    assert shown["peak (GiB)"].tolist() == [3.0, 0.5] and shown["relative error (%)"].tolist() == [1.0, -2.0]
    assert frame.columns[0] == "peak_bytes", "the chapter's own frame is not changed"
    assert reader_columns(frame.set_index("world_size")).index.name == "world size"
    for top in (1, 2**10, 2**20 - 1, 2**20, 2**45):  # the largest unit the largest value reaches
        label = reader_columns(pd.DataFrame({"x_bytes": [top, 1]})).columns[0]
        assert label == f"x ({ {1: 'B', 2**10: 'KiB', 2**20 - 1: 'KiB', 2**20: 'MiB', 2**45: 'TiB'}[top] })"


def test_published_evidence_is_labelled_and_saved(tmp_path: Path) -> None:
    """``ch.published("08")``: the published GPU rows of the chapter, labelled published, with memlab's figure."""
    ch = chapter("ci", "cpu", 0, tmp_path)
    shown = ch.published("08")
    assert shown.chapter == "08" and len(shown.frame) > 0
    assert "not measured by this project" in shown.label and "published" in shown.label.lower()
    assert {"source (published)", "hardware", "what the number is", "published", "memlab", "residual",
            "why"} <= set(shown.frame.columns)
    assert (tmp_path / "published.csv").exists() and "<table" in shown._repr_html_()


def test_every_chapter_has_published_rows() -> None:
    from memlab.compare.published import published_rows

    for number in range(13):
        assert published_rows(chapter=f"{number:02d}"), f"no published row bears on chapter {number:02d}"


def test_a_long_published_table_is_never_cut_and_names_the_command_for_the_rest(tmp_path: Path) -> None:
    """Chapter 11 has 80 published rows: pandas cut the table with '...' rows (the browser test's cut cells). The
    page shows the first rows whole and names the command that prints every one."""
    shown = chapter("ci", "cpu", 0, tmp_path).published("11")
    page = shown._repr_html_()
    assert len(shown.frame) > shown.shown_rows and ">...<" not in page and "…" not in page
    assert f"{len(shown.frame) - shown.shown_rows} more published rows" in page
    assert "memlab ledger --published --chapter 11" in page
