"""The calculator shoot-out on the published GPU measurements (issue 35 part 3): memlab, accelerate, DeepSpeed's
estimators, gpu_poor, Transformer Math 101 / the Ultra-Scale Playbook and torchtitan on every memory and MFU row of
``data/published/ledger.csv``, each asked only what it claims (:mod:`memlab.studies.shootout`). Prints the summary
(per tool and kind of figure: scored rows with the median and worst |residual|, bounds and how many the tool's part
exceeds, rows it cannot express), then the rows x tools table, one block per row.

Usage: ``python benchmarks/published_shootout.py [--summary]`` (about ten seconds: the empty models accelerate and
DeepSpeed read are built on the meta device).
"""

from __future__ import annotations

import sys
import warnings

from memlab.compare.published import published_rows
from memlab.studies.shootout import published_shootout, shootout_rows, shootout_summary, shootout_table


def _pct(v: object, sign: str = "+") -> str:
    return "-" if v is None or v != v else f"{100 * float(v):{sign}.1f} %"


def main(argv: list[str]) -> int:
    import pandas as pd

    warnings.filterwarnings("ignore")
    frame = published_shootout()
    left_out = len(published_rows()) - len(shootout_rows())
    summary = shootout_summary(frame)
    summary["median_abs_residual"] = summary["median_abs_residual"].map(lambda v: _pct(v, ""))
    summary["worst_residual"] = summary["worst_residual"].map(_pct)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 500):
        print(f"{frame['row_id'].nunique()} published rows (memory and MFU figures; {left_out} time and throughput "
              "rows left out: no tool here predicts kernel time)\n")
        print(summary.fillna("-").to_string(index=False))
    if "--summary" in argv:
        return 0
    for row_id, cells in shootout_table(frame).iterrows():
        print(f"\n{row_id}: {cells['published']}")
        for tool, text in cells.drop("published").items():
            print(f"  {tool:>44s}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
