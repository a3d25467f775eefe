"""``memlab estimate --ep``: one expert-parallel rank's bytes and all-to-all volume, the API's numbers; ``--schedule``
is ``--pp-schedule``."""

from __future__ import annotations

import json

import pytest

from memlab import cli
from memlab.predict.parallel.experts import expert_estimate
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup


@pytest.mark.parametrize("routing", ["balanced", "worst"])
def test_ep_json_is_expert_estimate(capsys: pytest.CaptureFixture[str], routing: str) -> None:
    argv = ["estimate", "--preset", "tiny-moe", "--batch", "2", "--seq", "64", "--ep", "4", "--world-size", "8",
            "--zero", "1", "--ep-routing", routing, "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rep = expert_estimate(preset("tiny-moe"), Setup(batch=2, seq=64, ep=4, world_size=8, zero_stage=1,
                                                    ep_routing=routing))
    assert out["per_device"]["peak"] == rep.peak_bytes and out["layout"]["sent_bytes"] == rep.sent_bytes > 0
    # 128 tokens x top-2; worst: 4 ranks x 128 tokens x min(2, 8 / 4) of this rank's experts
    assert out["ranks"][0]["detail"]["received_pairs"] == (256 if routing == "balanced" else 4 * 128 * 2)


def test_ep_table_schedule_alias_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["estimate", "--preset", "tiny-moe", "--seq", "64", "--ep", "2", "--world-size", "2",
                     "--gpu", "h100-sxm"]) == 0
    text = capsys.readouterr().out
    assert "all-to-all" in text and "verdict: FITS" in text and "4 of 8 experts" in text
    base = ["estimate", "--preset", "tiny-gpt", "--seq", "64", "--pp", "2", "--micro-batches", "2", "--json"]
    assert cli.main([*base, "--schedule", "gpipe"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert cli.main([*base, "--pp-schedule", "gpipe"]) == 0
    assert json.loads(capsys.readouterr().out) == short and short["setup"]["pp_schedule"] == "gpipe"
    for argv, words in ((["--preset", "tiny-moe", "--ep", "3", "--world-size", "3"], "must divide n_experts"),
                        (["--preset", "tiny-gpt", "--ep", "2", "--world-size", "2"], "set ep=1"),
                        (["--preset", "tiny-moe", "--ep", "2"], "must divide world_size"),
                        (["--params", "1000000", "--ep", "2", "--world-size", "2"], "mixture-of-experts config")):
        assert cli.main(["estimate", "--seq", "64", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_ep_on_a_hugging_face_config(capsys: pytest.CaptureFixture[str], family: str) -> None:
    from memlab.course.hf_configs import CONFIG_DIR

    path = CONFIG_DIR / "tiny" / f"{family}.json"
    argv = ["estimate", "--hf", str(path), "--seq", "32", "--ep", "2", "--world-size", "4", "--json"]
    assert cli.main(argv) == 0
    one = json.loads(capsys.readouterr().out)["ranks"][0]["detail"]
    assert cli.main([*argv[:-5], "--ep", "4", "--world-size", "4", "--json"]) == 0
    four = json.loads(capsys.readouterr().out)["ranks"][0]["detail"]
    assert one["local_experts"] == 2 and four["local_experts"] == 1
    assert four["expert_params"] * 2 == one["expert_params"] and four["dense_params"] == one["dense_params"]
