"""Seeded draws of every supported Hugging Face family (configs and calls memlab's tests did not choose), each
trained two real steps on this machine and judged against the estimate: exact, traced, named, refused, off or
unbuildable (:mod:`memlab.studies.hf_draws`). Prints the counts, the worst error per component (activations,
states, the first step's peak, the steady step's states and peak) and per phase, the verdicts by family, and every
draw that is off or unbuildable; exits 1 when any draw is off.

Usage: ``python benchmarks/hf_draws.py [--draws 1140] [--seed 0]`` (60 draws a family; under a second a draw on
two cores, half of them refused before any step runs).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter

from memlab.course.hf_configs import config_names, load_config
from memlab.studies.hf_draws import COMPONENTS, VERDICTS, hf_agreement, verdict_counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1140)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    tiny = {name: load_config(name) for name in config_names("tiny")}
    verdicts = hf_agreement(tiny, args.draws, seed=args.seed)
    counts = verdict_counts(verdicts)
    print(f"{args.draws} draws, seed {args.seed}, {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for component in COMPONENTS:
        errors = [(abs(e), e, v) for v in verdicts if (e := v.error(component)) is not None]
        if errors:
            _, worst, v = max(errors, key=lambda x: x[0])
            print(f"worst {component} error: {worst:+.4%} ({v.draw.label()})")
    phase_errors = [(abs(p - live) / live, (p - live) / live, name, v) for v in verdicts
                    for name, (p, live, _) in v.phases.items() if live]
    if phase_errors:
        _, worst, name, v = max(phase_errors, key=lambda x: x[0])
        print(f"worst phase error (not in the verdict): {worst:+.4%} at {name} ({v.draw.label()})")
    split = sum(1 for v in verdicts for _, live, tracker in v.phases.values() if live != tracker)
    print(f"phases where live bytes and MemTracker disagree: {split} of {sum(len(v.phases) for v in verdicts)}")
    by_family = Counter((v.draw.family, v.verdict) for v in verdicts)
    for family in sorted({v.draw.family for v in verdicts}):
        print(f"  {family:12s} " + " ".join(f"{k} {by_family[family, k]}" for k in VERDICTS if by_family[family, k]))
    for v in verdicts:
        if v.verdict in ("off", "unbuildable"):
            print(f"{v.verdict}: {v.draw.label()}: {v.reason}")
    return 1 if counts["off"] else 0


if __name__ == "__main__":
    sys.exit(main())
