"""Verdicts: does a prediction equal what it is compared with, and if not, is the gap one the estimate names?

:func:`gap_verdict` sorts one phase or peak into one of three verdicts:

- ``within``: ``|predicted - measured| <= tol * measured`` (:data:`~memlab.compare.tolerances.TOLERANCE`, 0.1 %, by
  default);
- ``named``: outside that, but within it once the terms the estimate names as left out for that phase are allowed
  for (:attr:`~memlab.predict.memory.breakdown.MemoryBreakdown.named_terms`: each term says its phases, its size
  and its sign):
  the measurement may hold up to the ``+`` terms more and up to the ``-`` terms less;
- ``off``: neither (a bug to fix).

:func:`summary` counts the verdicts of a table of rows (one per phase, ``phase == "peak"`` for each draw's peak).
The seeded sample of the Setup space that produces such rows, the estimator against memlab's trace, is a study:
:mod:`memlab.studies.setup_draws`.
"""

from __future__ import annotations

from typing import Any

from memlab.compare.tolerances import TOLERANCE
from memlab.predict.memory.breakdown import NamedTerm


def gap_verdict(predicted: float, measured: float, named: list[NamedTerm], tol: float = TOLERANCE) -> str:
    """``within``, ``named`` or ``off`` (module docstring) for one phase or peak: ``predicted`` against
    ``measured`` (a trace, or a real step's live bytes) in bytes, ``named`` the terms the estimate names for it."""
    diff = predicted - measured
    slack = tol * measured
    more = sum(n.bytes for n in named if n.sign > 0)  # the measurement may hold this much more than the estimate
    less = sum(n.bytes for n in named if n.sign < 0)  # ... or this much less
    if abs(diff) <= slack:
        return "within"
    if named and -more - slack <= diff <= less + slack:
        return "named"
    return "off"


def summary(frame: Any) -> dict[str, Any]:
    """Counts of ``within`` / ``named`` / ``off`` over the draws' peaks and over all phases, and the worst phase."""
    peaks = frame[frame["phase"] == "peak"]
    worst = frame.loc[frame["rel_diff"].abs().idxmax()]
    return {
        "draws": len(peaks),
        "peak": {v: int((peaks["verdict"] == v).sum()) for v in ("within", "named", "off")},
        "phases": {v: int((frame["verdict"] == v).sum()) for v in ("within", "named", "off")},
        "worst": {"draw": worst["draw"], "phase": f"{worst['step']} {worst['phase']}".strip(),
                  "rel_diff": float(worst["rel_diff"]), "verdict": worst["verdict"]},
    }
