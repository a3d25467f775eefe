"""Provenance: where and with what a number was made. The one builder for the report and for recorded GPU data
(:func:`write_recorded` writes a recorded table with it).

Every rendered report and every file under ``data/recorded/`` carries this dict, so a reader can tell a CPU run
at ci scale from a recording on a named GPU (driver, torch, CUDA), and which memlab commit (dirty or not) made it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import json
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = ("torch", "numpy", "pandas", "matplotlib", "transformers", "accelerate", "deepspeed", "papermill",
             "nvidia-ml-py", "psutil")
"""Packages whose versions provenance lists (absent ones are left out)."""


def _git(*args: str, root: Path = REPO_ROOT) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    """memlab's commit and whether the work tree differs from it (``dirty``); "unknown" outside a git clone."""
    commit = _git("rev-parse", "HEAD", root=root)
    if not commit:
        return {"memlab_commit": "unknown (not a git clone)", "memlab_dirty": None}
    status = _git("status", "--porcelain", root=root)
    return {"memlab_commit": commit, "memlab_dirty": bool(status)}


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str]:
    """Installed versions of ``names`` (distribution names); missing packages are omitted."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def hardware_table_revision() -> str:
    """The first 12 hex digits of the SHA-256 of the accelerator table's source: which datasheet figures were used."""
    from memlab.predict.hardware import table as hardware_table

    return hashlib.sha256(Path(hardware_table.__file__).read_bytes()).hexdigest()[:12]


def provenance(device: str = "auto", *, measure_cpu_peak: bool = True) -> dict[str, Any]:
    """Device (:func:`memlab.measure.machine.describe`), ``gpu`` (its name on CUDA, else None), peak source, driver,
    torch and CUDA, Python, OS, host memory, library versions, the hardware table's revision, memlab's commit and
    dirty flag, and the date (UTC)."""
    from memlab.measure.machine import describe

    info = describe(device, measure_cpu_peak=measure_cpu_peak)
    import psutil

    return {
        "device": info["device"],
        "device_kind": info["device_kind"],
        "gpu": info["device"] if info["device_kind"] == "cuda" else None,
        "accelerator": info.get("accelerator"),
        "total_memory_bytes": info.get("total_memory_bytes"),
        "peak_source": info["peak_source"] + (f" ({info['peak_reason']})" if info.get("peak_reason") else ""),
        "driver": info.get("driver_version") or "unavailable (no NVIDIA driver or NVML on this machine)",
        "torch": info.get("torch_version") or "not installed",
        "cuda": info.get("cuda_version"),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "host_memory_bytes": psutil.virtual_memory().total,
        "libraries": library_versions(),
        "hardware_table": hardware_table_revision(),
        **git_state(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_recorded(out_dir: Path | str, name: str, frame: pd.DataFrame, extra: dict[str, Any] | None = None, *,
                   device: str = "cuda", prov: dict[str, Any] | None = None) -> Path:
    """Write ``NAME.csv`` (``frame``) and ``NAME.json`` (``{"provenance": ..., **extra}``) into ``out_dir``, the pair
    :func:`memlab.course.chapter.load_recorded` reads; returns the csv's path. ``prov`` defaults to
    ``provenance(device)`` (pass one built once to label several tables alike)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / f"{name}.csv", index=False)
    meta = {"provenance": provenance(device) if prov is None else prov, **(extra or {})}
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1, default=str))
    return out / f"{name}.csv"


def record_gpu_data(doc: str, record: Callable[[Path], Any], argv: list[str] | None = None) -> int:
    """The ``main`` of a ``scripts/record_*.py``: parse ``--out DIR`` (default ``data/recorded``), refuse with one
    line on stderr and exit code 2 when no CUDA GPU is here (GPU data is never recorded on a CPU), else call
    ``record(out)`` and return 0."""
    import argparse
    import sys

    import torch

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/recorded"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{parser.prog}: no CUDA GPU here; this script records GPU data and does nothing on a CPU",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    record(args.out)
    return 0
