"""``memlab ledger --published``: each published GPU figure with memlab's prediction, residual and note; JSON for
notebooks and benchmarks; options of the measured sweep refused beside it in one line."""

from __future__ import annotations

import json

import pytest

from memlab import cli


def test_published_prints_rows_and_the_summary_by_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ledger", "--published", "--chapter", "8"]) == 0
    out = capsys.readouterr().out
    assert "tt-a100-04" in out and "residual" in out and "residual by kind of figure" in out
    assert "published" in out.splitlines()[0]


def test_published_json_has_rows_and_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ledger", "--published", "--chapter", "5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] and {"residual", "predicted", "note", "status", "quote", "url"} <= set(data["rows"][0])
    assert {"kind", "median_abs_residual", "worst_row"} <= set(data["summary"][0])


@pytest.mark.parametrize(("argv", "says"), [
    (["ledger", "--published", "--fresh"], "--published reads the published ledger"),
    (["ledger", "--chapter", "3"], "use it with --published"),
    (["ledger", "--published", "--chapter", "42"], "no published row bears on chapter 42"),
])
def test_published_misuse_is_one_error_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
