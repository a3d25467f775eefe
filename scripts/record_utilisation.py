"""Record what the monitors' "utilisation" numbers count (:mod:`memlab.labs.monitors`), with provenance.

Writes into ``--out`` ``utilisation_NAME.csv`` plus ``utilisation_NAME.json`` (provenance: GPU, driver, CUDA,
torch, memlab commit, date) for NAME in nvml_ledger, gpu_util (both CUDA; a ``skipped`` row with the reason
elsewhere), cpu_busy, rss and monitor. Usage: ``python scripts/record_utilisation.py --out DIR [--device auto]
[--duration 2]``; ``scripts/gpu_session.sh`` runs it on a GPU, for chapter 09.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memlab.course.provenance import provenance, write_recorded
from memlab.labs import monitors as utilisation
from memlab.measure.machine import detect


def main(argv: list[str] | None = None) -> int:
    """Run the demonstrations, print each table and write it with one provenance for all."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for utilisation_NAME.csv and .json")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per GPU-Util workload")
    args = parser.parse_args(argv)
    frames = {"nvml_ledger": utilisation.nvml_memory_ledger(args.device)}  # first: before anything initialises CUDA
    frames["gpu_util"] = utilisation.gpu_util_demo(args.device, duration_s=args.duration)
    frames["cpu_busy"] = utilisation.cpu_busy_vs_work(peak_flops_per_s=detect(device="cpu").peak_flops["fp32"])
    frames["rss"] = utilisation.rss_vs_live_bytes()
    frames["monitor"] = utilisation.monitor_snapshot()
    prov = provenance(args.device)
    for name, frame in frames.items():
        write_recorded(args.out, f"utilisation_{name}", frame, prov=prov)
        print(f"--- {name}\n{frame.to_string(index=False)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
