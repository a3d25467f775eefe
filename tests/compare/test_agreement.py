"""memlab.compare.agreement: the verdicts (within, named, off) and their counts. The seeded sample of the Setup space
that produces them is a study: tests/studies/test_setup_draws.py."""

from __future__ import annotations

from memlab.compare.agreement import summary


def test_summary_counts_verdicts() -> None:
    import pandas as pd

    frame = pd.DataFrame([{"draw": "a", "step": "", "phase": "peak", "rel_diff": 0.0, "verdict": "within"},
                          {"draw": "b", "step": "", "phase": "peak", "rel_diff": -0.2, "verdict": "off"}])
    out = summary(frame)
    assert out["peak"] == {"within": 1, "named": 0, "off": 1} and out["worst"]["draw"] == "b"
