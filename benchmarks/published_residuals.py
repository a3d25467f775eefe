"""memlab against the published GPU measurements: each row of ``data/published/ledger.csv`` with memlab's
prediction for its setup, the residual and what explains it, then the median and worst |residual| per kind of
figure. Same as ``memlab ledger --published`` (``--json`` for the rows and the summary as data).

Usage: ``python benchmarks/published_residuals.py [--chapter NN] [--json]``.
"""

from __future__ import annotations

import sys

from memlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["ledger", "--published", *sys.argv[1:]]))
