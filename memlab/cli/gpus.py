"""``memlab gpus``: the accelerator table (dense peaks per dtype, memory, bandwidth) with its sources."""

from __future__ import annotations

import argparse
from dataclasses import asdict, is_dataclass
from typing import Any

from memlab.cli.args import print_json
from memlab.units import GB, GiB


def _tera(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e12:,.0f}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def _plain(obj: Any) -> Any:
    return obj.to_dict() if hasattr(obj, "to_dict") else asdict(obj) if is_dataclass(obj) else dict(vars(obj))


def run(args: argparse.Namespace) -> int:
    """``memlab gpus``: the accelerator table (dense peaks), with sources."""
    from memlab.predict.hardware import gpus as hardware
    rows = list(hardware.list_gpus())
    if args.json:
        print_json([_plain(a) for a in rows], indent=2, default=str)
        return 0
    width = max(len(a.name) for a in rows)  # a card's name is never cut; the source is, and --json has it whole
    print(f"{'key':<14} {'name':<{width}} {'GiB':>7} {'GB':>7} {'TB/s':>6} {'bf16 TF':>8} {'fp8 TF':>7}  source")
    for a in rows:
        flag = " (unofficial)" if getattr(a, "unofficial", False) else ""
        print(f"{a.key:<14} {a.name:<{width}} {a.memory_bytes / GiB:>7.1f} {a.memory_bytes / GB:>7.1f} "
              f"{a.bandwidth_bytes_per_s / 1e12:>6.2f} {_tera(a.peak_flops.get('bf16')):>8} "
              f"{_tera(a.peak_flops.get('fp8')):>7}  {_clip(a.source, 56)}{flag}")
    print("(dense peaks, TF = 10**12 FLOP/s; GiB = 2**30 bytes, GB = 10**9 bytes; full sources with --json)")
    print("(a card or capacity not listed: --gpu NEAREST --gpu-memory-gib N with memlab estimate / trace; the "
          "architecture of NEAREST sets the cuBLAS workspaces)")
    return 0
