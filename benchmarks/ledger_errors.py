"""The estimator's achieved errors on the validation grid: prediction vs exact measurement.

Runs :func:`memlab.compare.ledger.ci_grid` (48 configs of the reference GPT: eager and flash attention, three recompute
policies, fp32 and amp-bf16, two model sizes, two batch x sequence points) as a resumable sweep on this machine's
device and prints, per component, the median and largest relative error. Same as ``memlab ledger``.

Usage: ``python benchmarks/ledger_errors.py [--device auto|cpu|cuda] [--fresh]``.
"""

from __future__ import annotations

import sys

from memlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["ledger", *sys.argv[1:]]))
