"""A 10-point sweep of tiny-gpt whose points each take at least ``DELAY_S``, so a test can kill it midway.

``python tests/scripts/slow_sweep.py OUT.jsonl`` sweeps :func:`grid` into OUT.jsonl on the CPU. The test that
kills it imports :func:`grid` from this file so the resumed sweep has exactly the same points.
"""

from __future__ import annotations

import itertools
import sys
import time

from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup

DELAY_S = 0.5
"""Extra seconds per point: a real measurement takes time; this keeps the kill from arriving after the end."""


def grid() -> list[tuple[TransformerConfig, Setup]]:
    """Ten (config, setup) points: tiny-gpt, batch 1, seq 8, varying recompute, precision and optimizer."""
    cfg = preset("tiny-gpt")
    points = [
        Setup(batch=1, seq=8, recompute=r, precision=p)
        for r, p in itertools.product(("none", "selective", "full"), ("fp32", "amp-bf16", "bf16"))
    ]
    points.append(Setup(batch=1, seq=8, optimizer="sgd"))
    return [(cfg, s) for s in points]


def slow_run(*args, **kwargs):
    """run_step, then a pause."""
    from memlab.run.runner import run_step

    out = run_step(*args, **kwargs)
    time.sleep(DELAY_S)
    return out


if __name__ == "__main__":
    from memlab.run.sweep import sweep

    sweep(grid(), sys.argv[1], device="cpu", progress=False, run=slow_run, steps=1, with_counted_flops=False,
          with_mfu=False)
