"""Every config key of every supported Hugging Face family, flipped alone and drawn jointly, memlab's parameter count
and the estimate's states against the real model's (:mod:`memlab.studies.key_draws`, issue 36 "States"): each
config exact, refused or unbuildable, never off. Prints the counts of the boolean flips and of the joint draws, the
joint verdicts by family, and every config that is off; exits 1 when any is off.

Usage: ``python benchmarks/config_key_counts.py [--draws 150] [--seed 0]`` (joint draws a family; the models are
built on the meta device: about 45 s for the default on a loaded two-core machine).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter

from memlab.course.hf_configs import config_names, load_config
from memlab.studies.key_draws import VERDICTS, count_verdict, flipped_booleans, key_draws, verdict_counts


def main(argv: list[str] | None = None) -> int:
    """Run the flips and the joint draws, print them; 1 when a config is off."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    tiny = {name: load_config(name) for name in config_names("tiny")}
    flips = [count_verdict(cfg, {key: cfg[key]}) for c in tiny.values()
             for key, cfg in flipped_booleans(str(c["model_type"]), {k: v for k, v in c.items() if k[0] != "_"})]
    print("boolean keys flipped one at a time: " + ", ".join(f"{k} {v}" for k, v in verdict_counts(flips).items()))
    joint = key_draws(tiny, args.draws, seed=args.seed)
    print(f"{args.draws} joint draws a family, seed {args.seed}, {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in verdict_counts(joint).items()))
    by_family = Counter((v.family, v.verdict) for v in joint)
    for family in sorted({v.family for v in joint}):
        print(f"  {family:<12}" + "".join(f"{k} {by_family[family, k]:<5}" for k in VERDICTS))
    off = [v for v in flips + joint if v.verdict == "off"]
    for v in off:
        print(f"OFF {v.label()}: {v.reason}")
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
