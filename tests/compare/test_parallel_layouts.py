"""memlab.compare.parallel_layouts: each layout's row is the estimator's (one rank) or its worst pipeline rank's."""

from __future__ import annotations

from memlab.compare.parallel import parallel_layouts
from memlab.predict.estimate import estimate
from memlab.predict.models import preset
from memlab.predict.parallel import parallel_estimate
from memlab.predict.setup import Setup


def test_rows_are_the_estimators() -> None:
    cfg, setup = preset("tiny-llama"), Setup(batch=2, seq=64, attention="flash")
    layouts = ({}, {"zero_stage": 3, "world_size": 2}, {"tp": 2, "sp": True}, {"pp": 2, "micro_batches": 2},
               {"cp": 2})
    df = parallel_layouts(cfg, setup, layouts)
    assert list(df["ranks"]) == [1, 2, 2, 2, 2]
    assert df["peak_bytes"][0] == estimate(cfg, setup).peak_bytes
    assert df["peak_bytes"][3] == parallel_estimate(cfg, setup.with_(pp=2, micro_batches=2)).peak_bytes
    # ZeRO shrinks the states, not the activations; TP+SP and CP shrink the activations
    assert df["activations_bytes"][1] == df["activations_bytes"][0] > df["activations_bytes"][2]
    assert df["states_bytes"][1] < df["states_bytes"][0] and df["activations_bytes"][4] < df["activations_bytes"][0]
