"""compare: prediction next to measurement. ``ledger`` (formula vs measurement per component, :func:`compare` for
one pair), ``calculators`` (every public estimator on the same runs), ``plots``.

``from memlab.compare import compare`` is the one-pair comparison; the room and the function share the name, so
the function is imported from here rather than from ``memlab`` itself.
"""

from memlab.compare.ledger import compare, error_summary

__all__ = ["compare", "error_summary"]
