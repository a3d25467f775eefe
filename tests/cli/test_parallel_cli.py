"""``memlab estimate --pp/--cp``: one row per pipeline rank, the worst rank's verdict, the same numbers as the API."""

from __future__ import annotations

import json

import pytest

from memlab import cli
from memlab.predict.parallel.pipeline import parallel_estimate
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup


def test_pp_json_is_parallel_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--preset", "tiny-gpt", "--batch", "2", "--seq", "64", "--pp", "2", "--micro-batches", "4",
            "--pp-schedule", "gpipe", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rep = parallel_estimate(preset("tiny-gpt"), Setup(batch=2, seq=64, pp=2, micro_batches=4, pp_schedule="gpipe"))
    assert out["per_device"]["peak"] == rep.peak_bytes
    assert [r["peak_bytes"] for r in out["ranks"]] == [r.peak_bytes for r in rep.rows]
    assert out["layout"]["bubble_fraction"] == pytest.approx(1 / 5)


def test_pp_table_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["estimate", "--preset", "tiny-gpt", "--seq", "64", "--pp", "2", "--micro-batches", "2",
                     "--gpu", "h100-sxm"]) == 0
    text = capsys.readouterr().out
    assert "<- worst" in text and "verdict: FITS" in text and "head + loss" in text
    assert cli.main(["estimate", "--params", "1000000", "--pp", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model config" in err[0]


def test_shard_layouts_refuses_one_rank_before_any_launch(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["shard", "--layouts", "--ranks", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ranks 2" in err[0]
