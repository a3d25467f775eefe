"""compare: prediction next to measurement, and the verdicts on the difference.

``ledger`` (formula, trace and measurement per component and phase; :func:`compare` for one pair), ``scoring``
(each tool scored only on what it claims: signed errors, scopes, held-out configs), ``sharding`` (data-parallel
strategies against the ranks' measurements), ``plots`` (the standard figures), ``agreement`` (the verdicts: within
the tolerance, named by the estimate's left-out terms, or off; their counts) and ``tolerances`` (the one 0.1 %
every verdict uses). ``published`` reads the ledger of published GPU measurements (``data/published/ledger.csv``:
figure, quote, source pinned to a commit, setup) and ``published_predict`` puts memlab's prediction, the residual and
what explains it next to each row (``memlab ledger --published``).

The campaigns that run models, traces and steps to produce what is compared here (the calculator shoot-out, the
seeded draws, the upgrade canary, the parallel ranks and traces, the torchtitan peer) are :mod:`memlab.studies`,
the room above this one.

``from memlab.compare import compare`` is the one-pair comparison; the room and the function share the name, so
the function is imported from here rather than from ``memlab`` itself.
"""

from memlab.compare.ledger import compare, error_summary

__all__ = ["compare", "error_summary"]
