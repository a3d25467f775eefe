"""Generated Hugging Face configs and calls (memlab.compare.hf_draws): every draw is exact or refused, never off."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from memlab.compare.hf_draws import HfDraw, draw_hf, hf_agreement, judge, verdict_counts
from memlab.course.hf_configs import config_names, load_config
from memlab.predict.hf import SUPPORTED

TINY = {name: load_config(name) for name in config_names("tiny")}


def test_a_seeded_sample_of_every_family_is_exact_or_refused() -> None:
    assert {c["model_type"] for c in TINY.values()} == set(SUPPORTED)  # every family has a tiny config
    verdicts = hf_agreement(TINY, len(SUPPORTED) // 2, seed=7)  # a seeded slice; the bench runs hundreds
    counts = verdict_counts(verdicts)
    assert counts["off"] == 0, [f"{v.draw.label()}: {v.reason}" for v in verdicts if v.verdict == "off"]
    assert counts["exact"] >= 1
    for v in verdicts:
        if v.draw.refused_key is not None:
            assert v.verdict == "refused" and v.draw.refused_key in v.reason


def test_draws_vary_the_config_and_the_call_and_are_reproducible() -> None:
    draws = [draw_hf(random.Random(3), TINY[f]) for f in sorted(TINY)]
    again = [draw_hf(random.Random(3), TINY[f]) for f in sorted(TINY)]
    assert draws == again
    assert len({(d.attention, d.dtype, d.autocast) for d in draws}) > 2
    assert len({d.seq for d in draws}) > 3


def test_a_refused_key_that_the_estimate_accepted_would_be_off() -> None:
    # the judge's own check: a draw that says a refused key was set, yet from_hf accepts the config, is "off"
    base = draw_hf(random.Random(0), TINY["llama"])
    cheat = HfDraw(**{**base.__dict__, "refused_key": "hidden_size", "checkpointing": False, "seq": 8, "batch": 1})
    assert judge(cheat).verdict == "off"
