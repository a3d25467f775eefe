"""Seeded draws of every supported Hugging Face family (configs and calls memlab's tests did not choose), each
trained one real step on this machine and judged against the estimate: exact, refused, off or unbuildable
(:mod:`memlab.compare.hf_draws`). Prints the counts, the worst error per component and every draw that is off;
exits 1 when any draw is off.

Usage: ``python benchmarks/hf_draws.py [--draws 2040] [--seed 0]`` (120 draws a family; a few minutes on two cores).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from memlab.compare.hf_draws import hf_agreement, verdict_counts
from memlab.course.hf_configs import config_names, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2040)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    tiny = {name: load_config(name) for name in config_names("tiny")}
    verdicts = hf_agreement(tiny, args.draws, seed=args.seed)
    counts = verdict_counts(verdicts)
    print(f"{args.draws} draws, seed {args.seed}, {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for component in ("activations", "states"):
        errors = [(abs(e), e, v) for v in verdicts if (e := v.error(component)) is not None]
        if errors:
            _, worst, v = max(errors, key=lambda x: x[0])
            print(f"worst {component} error: {worst:+.4%} ({v.draw.label()})")
    for v in verdicts:
        if v.verdict in ("off", "unbuildable"):
            print(f"{v.verdict}: {v.draw.label()}: {v.reason}")
    return 1 if counts["off"] else 0


if __name__ == "__main__":
    sys.exit(main())
