"""The ledger of published GPU measurements: the shipped file parses, is big and varied enough, every row carries
its provenance, a malformed file is one MemlabError line, and each row gets memlab's figure or says why not."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from memlab.compare.published import (
    COLUMNS,
    KINDS,
    PUBLISHED_CSV,
    PublishedRow,
    parse_setup,
    published_rows,
    read_published,
)
from memlab.compare.published_predict import predict_row, published_frame, residual_summary
from memlab.errors import MemlabError


def test_shipped_ledger_has_thirty_rows_from_five_sources() -> None:
    rows = published_rows()
    assert len(rows) >= 30
    assert len({r.source_id for r in rows}) >= 5
    assert len({r.url.split("/blob/")[0] for r in rows}) >= 4  # distinct repositories


def test_every_row_carries_source_quote_kind_unit_gpu() -> None:
    for r in published_rows():
        assert r.source and r.url.startswith("https://") and r.quote and r.gpu and r.unit, r.row_id
        assert r.kind in KINDS, r.row_id


def test_every_url_is_pinned_to_a_commit() -> None:
    for r in published_rows():
        assert re.search(r"/blob/[0-9a-f]{40}/", r.url), f"{r.row_id}: pin the URL to a commit"


def test_every_figure_is_in_its_quote() -> None:
    """The figure is the quoted number, not a conversion: it appears in the quote (thousands commas ignored)."""
    for r in published_rows():
        quote = r.quote.replace(",", "")
        assert any(float(n) == r.figure for n in re.findall(r"\d+(?:\.\d+)?", quote)), r.row_id


def test_memory_rows_name_a_model_or_say_why_not() -> None:
    for r in published_rows():
        if r.is_memory:
            assert r.memlab_model or r.memlab_gap, r.row_id


def test_chapter_filter_keeps_rows_bearing_on_that_chapter() -> None:
    rows = published_rows(chapter="07")
    assert rows and all("07" in r.chapter_list for r in rows)


def _write(tmp_path: Path, change: dict[str, str]) -> Path:
    with PUBLISHED_CSV.open(newline="", encoding="utf-8") as fh:
        first = next(csv.DictReader(fh))
    path = tmp_path / "ledger.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerow({**first, **change})
    return path


@pytest.mark.parametrize(("change", "says"), [
    ({"quote": ""}, "empty quote"),
    ({"kind": "peak"}, "kind 'peak'"),
    ({"unit": "gigs"}, "unit 'gigs'"),
    ({"figure": "82,4"}, "not a number"),
    ({"memlab_setup": "batch"}, "not key=value"),
    ({"memlab_model": "llama-9b"}, "not a memlab preset"),
    ({"memlab_model": "params:7e9"}, "params:N takes a whole parameter count"),
    ({"source_flops": "6N"}, "source_flops '6N' is not one of"),
])
def test_malformed_row_is_one_memlab_error_line(tmp_path: Path, change: dict[str, str], says: str) -> None:
    with pytest.raises(MemlabError, match=re.escape(says)) as info:
        read_published(_write(tmp_path, change))
    assert "\n" not in str(info.value) and "line 2" in str(info.value)


def test_wrong_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.csv"
    path.write_text("row_id,figure\nx,1\n")
    with pytest.raises(MemlabError, match="header"):
        read_published(path)


def test_parse_setup_reads_ints_bools_and_names() -> None:
    assert parse_setup("batch=2;sp=true;recompute=op") == {"batch": 2, "sp": True, "recompute": "op"}


def test_reserved_row_is_predicted_as_allocated_below_it() -> None:
    """torchtitan's 8-GPU FSDP row (82.4 GiB reserved): memlab predicts the allocated peak, which sits below."""
    row = next(r for r in published_rows() if r.row_id == "tt-h100-01")
    p = predict_row(row)
    assert p.status == "predicted" and p.predicted is not None and p.predicted < row.figure
    assert "reserved" in p.note


def test_mfu_row_gets_memlab_mfu_and_the_source_formula() -> None:
    row = next(r for r in published_rows() if r.row_id == "tt-a100-04")
    p = predict_row(row)
    assert p.status == "predicted" and p.residual is not None and abs(p.residual) < 0.1
    assert "61.1 %" in p.note  # torchtitan's own formula on memlab's Llama 2 13B reproduces the published 61.1 %


def test_params_row_gets_6n_and_the_sources_formula_reproduces_the_figure() -> None:
    """llm-foundry's MPT-7B row: memlab from the bare parameter count counts 6N; the source's 6N + 12*l*d*T with
    memlab's H100 peak gives the published 46.4 %."""
    row = next(r for r in published_rows() if r.row_id == "lf-h100-05")
    p = predict_row(row)
    assert p.status == "predicted" and p.predicted is not None and p.predicted < row.figure
    assert "gives 46.4 %" in p.note


def test_unexpressible_row_says_why_without_raising() -> None:
    row = next(r for r in published_rows() if r.row_id == "peft-01")
    p = predict_row(row)
    assert p.status == "not expressible" and p.predicted is None and "encoder-decoder" in p.note


def test_refused_setup_is_a_note_not_a_traceback() -> None:
    row = next(r for r in published_rows() if r.row_id == "tt-h100-08")
    p = predict_row(row)
    assert p.status == "refused" and p.note


def test_residual_summary_has_a_line_per_kind() -> None:
    rows = tuple(r for r in published_rows() if r.source_id.startswith("torchtitan"))
    summary = residual_summary(published_frame(rows))
    assert set(summary["kind"]) == {r.kind for r in rows}
    mfu = summary.set_index("kind").loc["mfu"]
    assert mfu["predicted"] == 8 and mfu["median_abs_residual"] < 0.1


def test_row_label_says_published() -> None:
    row: PublishedRow = published_rows()[0]
    assert row.label.startswith("published: ") and row.gpu in row.label


def test_memory_rows_carry_allocated_reserved_and_device_used_and_match_their_kind() -> None:
    from memlab.compare.published import MEMORY_UNITS
    from memlab.predict.gpu.device import CUDA_CONTEXT_HIGH_BYTES, CUDA_CONTEXT_LOW_BYTES

    rows = {r.row_id: r for r in published_rows()}
    for row_id in ("tt-h100-01", "hf-v100-08", "td-01"):
        p, r = predict_row(rows[row_id]), rows[row_id]
        unit = MEMORY_UNITS[r.unit]
        assert p.allocated <= p.reserved_low <= p.reserved_high <= p.device_high and p.reserved_low <= p.device_low
        assert p.device_low - p.reserved_low >= CUDA_CONTEXT_LOW_BYTES / unit * 0.999
        assert p.device_high - p.reserved_high >= CUDA_CONTEXT_HIGH_BYTES / unit * 0.999
        match = {"reserved": p.reserved_low, "nvidia_smi_used": p.device_low}.get(r.kind, p.allocated)
        assert p.predicted == match and p.residual == pytest.approx((match - r.figure) / r.figure)
    summary = residual_summary(published_frame()).set_index("kind")
    assert summary.loc["reserved", "within_range"] <= summary.loc["reserved", "predicted"]


def test_every_kind_has_words_for_a_page() -> None:
    from memlab.compare.published import KIND_WORDS, KINDS
    from memlab.compare.published_predict import chapter_frame

    assert set(KIND_WORDS) == set(KINDS)
    shown = chapter_frame("09")["what the number is"]
    assert not shown.str.contains("_").any(), list(shown)
