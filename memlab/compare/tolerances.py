"""The one home of the tolerance under which a prediction counts as equal to what it is compared with.

:data:`TOLERANCE` is the 0.1 % (issue 17) every verdict uses: the estimator against memlab's trace, phase by phase
(:func:`memlab.compare.agreement.gap_verdict`), a Hugging Face step's peaks against the estimate and the trace
(the studies' draws), the torchtitan peer's residual, and the ``memlab estimate`` hint that sends a wide peak range
to ``memlab trace --hf``. Change it here and every one of them moves together.
"""

from __future__ import annotations

TOLERANCE = 1e-3
"""Relative difference |predicted - measured| / measured under which a phase or a peak counts as equal (0.1 %)."""
