"""Roofline points of this machine: matmul FLOP/s over shapes and dtypes, copy/triad bandwidth.

Usage: ``python benchmarks/roofline_points.py [--scale ci|full] [--device auto|cpu|cuda]``. Prints tidy rows
(the same functions chapter 00 plots) and the best achieved value per dtype against the device's peak.
"""

from __future__ import annotations

import argparse

import pandas as pd

from memlab.measure import machine as device_mod
from memlab.measure import roofline as bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="auto", choices=("auto", "ci", "full"))
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    info = device_mod.detect(device=args.device)
    device = "cuda" if info.kind == "cuda" else "cpu"
    mm = bench.matmul_flops_per_s(device=device, scale=args.scale)
    bw = bench.bandwidth_bytes_per_s(device=device, scale=args.scale)
    pd.set_option("display.width", 160)
    print(f"device: {info.name} (peaks: {info.peak_source})")
    ok = mm[mm["status"] == "ok"].copy()
    ok["peak_flops_per_s"] = ok["dtype"].map(info.peak_flops)
    ok["achieved_over_peak"] = ok["flops_per_s"] / ok["peak_flops_per_s"]
    cols = ["dtype", "m", "n", "k", "arithmetic_intensity", "flops_per_s", "achieved_over_peak"]
    print(ok[cols].to_string(index=False))
    print(bw[["kind", "array_bytes", "bytes_moved", "median_s", "bytes_per_s"]].to_string(index=False))


if __name__ == "__main__":
    main()
