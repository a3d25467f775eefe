"""How fast the estimator answers where a user waits: the command line's fit answers, the scalar path on distinct
setups, and the vectorised sweep.

- ``memlab estimate --hf llama-2-7b --gpu h100-sxm --max-batch --levers``, a fresh process each time (Python's
  start, the imports, the fit search and the levers): target at most 0.5 s;
- scalar: ``estimate(config, setup)`` once per configuration, every configuration a distinct setup (precision,
  optimizer, recompute, attention, ZeRO stage, batch, seq), its caches cleared first: what a fit search or the
  levers pay (target: 1,000 configs/s, so the levers' hundred estimates take 0.1 s);
- vectorised: ``sweep_totals(config, setup, batch=array, seq=array, peak=True)`` over a batch x seq grid, once per
  setting of the other fields (target: 1,000,000 configs/s, for sweeps and plots).

Usage: ``python benchmarks/estimator_speed.py [--preset NAME] [--seconds S]``. Prints each rate beside its target.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from memlab.predict import coverage
from memlab.predict.estimate import estimate, sweep_totals
from memlab.predict.memory.plan import plan
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

CLI_SECONDS = 0.5
"""The most ``memlab estimate --max-batch --levers`` may take, start to answer (issue 33)."""
SCALAR_TARGET = 1_000
"""Configs/second of the scalar path on distinct setups: the levers' hundred estimates in 0.1 s."""
VECTOR_TARGET = 1_000_000
"""Configs/second of the vectorised sweep."""
COMMAND = ["estimate", "--hf", "llama-2-7b", "--gpu", "h100-sxm", "--max-batch", "--levers"]


def _setups(max_seq: int) -> list[Setup]:
    """A grid of training and inference setups, each distinct in its fields other than batch and seq."""
    train = [
        Setup(batch=1, seq=min(1024, max_seq), precision=p, optimizer=o, recompute=r, attention=a, zero_stage=z,
              world_size=8)
        for p, o, r, a, z in itertools.product(("fp32", "amp-bf16", "mixed-bf16", "bf16"), ("adamw", "sgd"),
                                               ("none", "selective", "full"), ("eager", "flash"), (0, 1, 2, 3))
    ]
    infer = [Setup(mode="inference", seq=min(1024, max_seq), inference_weights=w, attention=a)
             for w, a in itertools.product(("bf16", "int8", "int4"), ("eager", "flash"))]
    return train + infer


def cli_seconds(repeats: int = 3) -> float:
    """Median wall time of :data:`COMMAND` in a fresh process, after one warm-up run (compiled bytecode)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    run = [sys.executable, "-m", "memlab", *COMMAND]
    subprocess.run(run, env=env, capture_output=True, check=True)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(run, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def scalar_rate(config_name: str, seconds: float) -> tuple[int, float]:
    """(configs evaluated, configs/second) calling ``estimate`` once per distinct configuration, caches cleared."""
    config = preset(config_name)
    batches, seqs = (1, 2, 4, 8), (128, 256, min(512, config.max_seq))
    cases = [s.with_(batch=b, seq=q) for s in _setups(config.max_seq) for b in batches for q in seqs]
    n, spent = 0, 0.0
    while spent < seconds:
        plan.cache_clear()
        coverage.clear_cache()
        start = time.perf_counter()
        for setup in cases:
            estimate(config, setup)
        spent += time.perf_counter() - start
        n += len(cases)
    return n, n / spent


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
    """Print the command line's wall time and the two paths' configs/second, each beside its target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-2-7b")
    parser.add_argument("--seconds", type=float, default=1.0, help="time spent on each path")
    args = parser.parse_args(argv)
    print(f"memlab estimator speed, preset {args.preset}")
    wall = cli_seconds()
    print(f"  memlab {' '.join(COMMAND)}: {wall:.2f} s (median of 3; target at most {CLI_SECONDS} s: "
          f"{'meets' if wall <= CLI_SECONDS else 'ABOVE'})")
    for label, fn, target in (("scalar estimate(), distinct", scalar_rate, SCALAR_TARGET),
                              ("vectorised sweep_totals()", vector_rate, VECTOR_TARGET)):
        n, rate = fn(args.preset, args.seconds)
        print(f"  {label:<28} {rate:>14,.0f} configs/second  ({n:,} configs; target {target:,}: "
              f"{'meets' if rate >= target else 'BELOW'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
