"""The estimator's peak against ``memlab trace``'s over a grid of models and setups: median and worst error.

Each point traces one reference-GPT step on fake tensors (:func:`memlab.tracing.gpt.trace_gpt`, CPU, the optimizer
implementation torch picks on CUDA) and predicts it (:func:`memlab.predict.estimate.estimate`, CUDA widths: the same
as the CPU trace for fp32, and within the few autocast/norm widths :mod:`memlab.predict.memory.activations` lists
otherwise). Issue 9's target: median <= 3 %, worst <= 8 %. Sharded setups (ZeRO-3 over 8 ranks) trace FSDP2 over
a fake process group in this one process (rank 0's bytes), as torchtitan's memory estimator does.

Usage: ``python benchmarks/peak_errors.py [--quick]`` (quick: the small models only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from memlab.compare.ledger import peak_error_grid
from memlab.units import GiB


def main(argv: list[str] | None = None) -> int:
    """Trace and predict each grid point; print one line each and the median / worst |error| of the peak."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models only")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = peak_error_grid(quick=args.quick)
    print(f"{'model':<12} {'setup':<44} {'trace GiB':>10} {'formula GiB':>12} {'error':>8}  peak phase")
    for r in rows:
        if r["trace_peak"] is None:
            print(f"{r['model']:<12} {r['setup']:<44} {'-':>10} {r['formula_peak'] / GiB:>12.3f} {'-':>8}  {r['note']}")
            continue
        print(f"{r['model']:<12} {r['setup']:<44} {r['trace_peak'] / GiB:>10.3f} {r['formula_peak'] / GiB:>12.3f} "
              f"{100 * r['rel_error']:>+7.2f}%  {r['trace_phase']} / {r['formula_phase']}"
              + (f"  ({r['note']})" if r["note"] else ""))
    errs = [abs(r["rel_error"]) for r in rows if r["rel_error"] is not None]
    print(f"peak error over {len(errs)} traced points: median {100 * statistics.median(errs):.2f} %, worst "
          f"{100 * max(errs):.2f} % (targets 3 % and 8 %); {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
