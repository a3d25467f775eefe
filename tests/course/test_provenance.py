"""Recorded GPU tables: write_recorded writes the pair load_recorded reads; the recorders refuse a CPU."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from memlab.course.chapter import load_recorded
from memlab.course.provenance import record_gpu_data, write_recorded


def test_write_recorded_round_trips_through_load_recorded(tmp_path) -> None:
    frame = pd.DataFrame([{"policy": "fp32", "peak_bytes": 123}])
    prov = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "550", "memlab_commit": "abc"}
    path = write_recorded(tmp_path / "rec", "demo", frame, {"measurements": [{"x": 1}]}, prov=prov)
    assert path == tmp_path / "rec" / "demo.csv"
    assert json.loads((tmp_path / "rec" / "demo.json").read_text()) == {"provenance": prov,
                                                                         "measurements": [{"x": 1}]}
    rec = load_recorded("demo", tmp_path / "rec")
    assert rec is not None and rec.provenance == prov and rec.frame.to_dict("records") == frame.to_dict("records")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_recorder_refuses_a_cpu(tmp_path, capsys) -> None:
    called = []
    assert record_gpu_data("Record.\n", called.append, ["--out", str(tmp_path / "out")]) == 2
    assert not called and not (tmp_path / "out").exists()
    assert "no CUDA GPU here" in capsys.readouterr().err
