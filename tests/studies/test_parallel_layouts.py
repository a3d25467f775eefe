"""memlab.studies.parallel.parallel_layouts: each layout's row is the estimator's (one rank) or its worst pipeline
rank's."""

from __future__ import annotations

from memlab.predict.estimate import estimate
from memlab.predict.parallel.pipeline import parallel_estimate
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.studies.parallel import parallel_layouts


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


def test_llama3_405b_published_layouts_per_rank() -> None:
    """[grattafiori2024] Table 4's layouts: 16 pipeline ranks each; 126 blocks split 8 x 14 + 7 x 2; the first rank
    holds 16 micro-batches in flight under 1F1B and is the worst; CP 16 at 131,072 tokens leaves each rank the
    8,192-token micro-batch the pre-training layout has, plus ring attention's K/V chunks."""
    from memlab.studies.parallel import LLAMA3_405B, llama3_405b_ranks

    assert LLAMA3_405B.param_count() == 405_853_388_800
    df = llama3_405b_ranks()
    short, long = (df[df["layout"] == label].reset_index(drop=True) for label in df["layout"].unique())
    assert len(short) == len(long) == 16
    assert short["holds"][0] == "embeddings, blocks 0-7" and short["holds"][15] == "blocks 119-125, head + loss"
    assert short["in_flight"][0] == (16,) and short["peak_bytes"].idxmax() == 0
    assert list(long["activations_bytes"]) == list(short["activations_bytes"])
    assert (long["transient_bytes"] > short["transient_bytes"]).all()
