"""How many configurations per second the memory estimator evaluates (target: at least 100,000; fit searches call it).

Two paths, both running the same formula functions of :mod:`memlab.predict.estimate`:

- scalar: ``estimate(config, setup)`` once per configuration (a full :class:`MemoryBreakdown` each time);
- vectorised: ``sweep_totals(config, setup, batch=array, seq=array)`` over a batch x seq grid, once per setting
  of the other fields (precision, optimizer, recompute, attention, ZeRO stage).

Usage: ``python benchmarks/estimator_speed.py [--preset NAME] [--seconds S]``. Prints configs/second per path.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from memlab.predict.estimate import estimate, sweep_totals
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

TARGET = 100_000
"""Configs/second the issue requires (fit searches and sweeps evaluate it in loops)."""


def _setups(max_seq: int) -> list[Setup]:
    """A grid of training and inference setups (batch/seq varied by the callers)."""
    train = [
        Setup(batch=1, seq=min(1024, max_seq), precision=p, optimizer=o, recompute=r, attention=a, zero_stage=z,
              world_size=8)
        for p, o, r, a, z in itertools.product(("fp32", "amp-bf16", "mixed-bf16", "bf16"), ("adamw", "sgd"),
                                               ("none", "selective", "full"), ("eager", "flash"), (0, 1, 2, 3))
    ]
    infer = [Setup(mode="inference", seq=min(1024, max_seq), inference_weights=w, attention=a)
             for w, a in itertools.product(("bf16", "int8", "int4"), ("eager", "flash"))]
    return train + infer


def scalar_rate(config_name: str, seconds: float) -> tuple[int, float]:
    """(configs evaluated, configs/second) calling ``estimate`` once per configuration."""
    config = preset(config_name)
    setups = _setups(config.max_seq)
    batches, seqs = (1, 2, 4, 8), (128, 256, min(512, config.max_seq))
    cases = [s.with_(batch=b, seq=q) for s in setups for b in batches for q in seqs]
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for setup in cases:
            estimate(config, setup)
        n += len(cases)
    return n, n / (time.perf_counter() - start)


def vector_rate(config_name: str, seconds: float) -> tuple[int, float]:
    """(configs evaluated, configs/second) with ``sweep_totals(..., peak=True)`` (the phase-aware peak, which
    evaluates the sum too) over a 64 x 256 batch x seq grid per setup."""
    config = preset(config_name)
    setups = _setups(config.max_seq)
    batch = np.arange(1, 65)[:, None]
    seq = np.linspace(16, config.max_seq, 256).astype(np.int64)[None, :]
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for setup in setups:
            n += sweep_totals(config, setup, batch=batch, seq=seq, peak=True).size
    return n, n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    """Print configs/second for the scalar and the vectorised path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-2-7b")
    parser.add_argument("--seconds", type=float, default=1.0, help="time spent on each path")
    args = parser.parse_args(argv)
    print(f"memlab estimator speed, preset {args.preset} (target: {TARGET:,} configs/second)")
    for label, fn in (("scalar estimate()", scalar_rate), ("vectorised sweep_totals()", vector_rate)):
        n, rate = fn(args.preset, args.seconds)
        verdict = "meets" if rate >= TARGET else "below"
        print(f"  {label:<27} {rate:>14,.0f} configs/second  ({n:,} configs; {verdict} the target)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
