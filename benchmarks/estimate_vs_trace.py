"""The estimator against memlab's own trace over a seeded sample of the Setup space (issue 24): per phase and peak.

Each draw (:func:`memlab.compare.agreement.draw_setups`: dense GPT, Llama-style GQA with a large vocabulary, MoE;
every precision policy incl. FSDP2's MixedPrecisionPolicy; recompute; attention kernel; optimizer and
implementation; ZeRO stage, world size, FSDP2 plan and loss placement; accumulation; batch and seq) is traced on
fake tensors and estimated with CPU widths. Prints each draw that is not within 0.1 %, then the counts within /
named / off (peaks and phases) and the worst phase.

Usage: ``python benchmarks/estimate_vs_trace.py [--seed S] [--draws N] [--full K]``: ``N`` CPU-lab draws (default
40) and ``K`` full-size draws (default 2; Llama-3-8B-class traces take tens of seconds each on a loaded CPU).
Full-size mixture-of-experts draws cannot be traced (fake tensors cannot route by value; real ones would be
47B parameters) and are skipped.
"""

from __future__ import annotations

import argparse
import sys
import time

from memlab.compare.agreement import agreement, draw_setups, summary


def main(argv: list[str] | None = None) -> int:
    """Run the sample and print what is not within 0.1 %, the counts and the worst phase."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--full", type=int, default=2)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    draws = draw_setups(args.seed, args.draws)
    full = [d for d in draw_setups(args.seed, 4 * args.full, scale="full") if d.family != "moe"][:args.full]
    frame = agreement(draws + full)
    for _, r in frame[frame["verdict"] != "within"].iterrows():
        print(f"{r['verdict']:>6} {r['draw']:<90} {r['step']:>6} {r['phase']:<24} {100 * r['rel_diff']:+.3f} % "
              f"({r['diff_bytes']:+,} B){'  ' + r['named'] if r['named'] else ''}")
    out = summary(frame)
    w = out["worst"]
    print(f"{out['draws']} draws ({len(full)} full-size), seed {args.seed}: peaks within 0.1 % "
          f"{out['peak']['within']}, "
          f"named {out['peak']['named']}, off {out['peak']['off']}; phases within {out['phases']['within']}, "
          f"named {out['phases']['named']}, off {out['phases']['off']}; worst {100 * w['rel_diff']:+.3f} % "
          f"({w['verdict']}) at {w['phase']} of {w['draw']}; {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
