"""How fast ``memlab trace`` runs a Llama-2-7B-shaped training step at seq 4096 on fake tensors, and its peak RSS.

Issue 9 asks for <= 30 s and <= 1 GiB peak RSS on the 2-core course machine. The step (fp32, AdamW, flash
attention, batch 1) is traced once in this process (:func:`memlab.tracing.gpt.trace_gpt`); the RSS is the process's
peak (``resource.getrusage``), imports included.

Usage: ``python benchmarks/trace_speed.py [--preset NAME] [--seq S]``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from memlab.predict.estimate import estimate
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.tracing.gpt import trace_gpt
from memlab.units import GiB, MiB

TARGET_S, TARGET_RSS = 30.0, 1 * GiB


def main(argv: list[str] | None = None) -> int:
    """Trace once and print seconds, peak RSS and the traced vs predicted peak."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-2-7b")
    parser.add_argument("--seq", type=int, default=4096)
    args = parser.parse_args(argv)
    cfg, setup = preset(args.preset), Setup(precision="fp32", attention="flash", seq=args.seq, batch=1)
    start = time.perf_counter()
    t = trace_gpt(cfg, setup)
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    bd = estimate(cfg, setup)
    print(f"memlab trace speed: {args.preset}, fp32 AdamW, flash attention, batch 1 x seq {args.seq} (fake tensors)")
    verdict = "meets" if seconds <= TARGET_S else "below"
    print(f"  time      {seconds:8.1f} s      (target <= {TARGET_S:.0f} s: {verdict})")
    print(f"  peak RSS  {rss / MiB:8.0f} MiB    (target <= 1 GiB: {'meets' if rss <= TARGET_RSS else 'below'})")
    print(f"  traced peak {t.peak_bytes / GiB:.2f} GiB ({t.peak_step} {t.peak_phase}); steady-state peak "
          f"{t.peak_of('steady') / GiB:.2f} GiB; formula {bd.peak_bytes / GiB:.2f} GiB; sum of components "
          f"{bd.total_bytes / GiB:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
