"""This machine's CPU as the operating system describes it: its model name and its caches.

``cpu_model`` reads ``/proc/cpuinfo`` (else :mod:`platform`); ``cpu_cache_bytes`` reads each cache level from Linux
sysfs (``lscpu`` as a fallback), the last level also summed over its instances. The roofline sizes its arrays from
these and :func:`memlab.measure.machine.detect` names the CPU with them. No torch.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else :mod:`platform`)."""
    return cpu_identity()[0]


def cpu_identity() -> tuple[str, str]:
    """(model string, vendor) from /proc/cpuinfo, else from :mod:`platform`."""
    model = vendor = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "model name" and not model:
                model = v.strip()
            elif k.strip() == "vendor_id" and not vendor:
                vendor = v.strip()
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    return model, vendor or platform.machine() or "unknown"


CPU_CACHE_DIR = Path("/sys/devices/system/cpu")
"""Where Linux lists each CPU's caches (``cpu*/cache/index*``); :func:`cpu_cache_bytes` reads it."""


def _parse_size(text: str) -> int | None:
    """``"48K"``, ``"32768K"``, ``"2 MiB"``, ``"1M"`` -> bytes (powers of two, as sysfs and lscpu mean them)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if match is None:
        return None
    return int(match.group(1)) * 1024 ** " KMG".index((match.group(2) or " ").upper())


def _with_last_level(levels: dict[str, int], last_total: dict[str, int]) -> dict[str, int]:
    if not levels:
        return {}
    last = max(levels, key=lambda n: (int(n[1]), n))
    return {**levels, "last_level": levels[last], "last_level_total": last_total.get(last, levels[last])}


def _sysfs_caches(root: Path) -> dict[str, int]:
    levels: dict[str, int] = {}
    instances: dict[tuple[str, str], int] = {}
    for index in sorted(root.glob("cpu[0-9]*/cache/index[0-9]*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except OSError:
            continue
        if size is None or kind == "Instruction":
            continue
        shared_file = index / "shared_cpu_list"
        shared = shared_file.read_text().strip() if shared_file.exists() else index.parent.parent.name
        name = f"L{level}" + ("d" if kind == "Data" else "")
        levels.setdefault(name, size)
        instances[(name, shared)] = size
    totals: dict[str, int] = {}
    for (name, _), size in instances.items():
        totals[name] = totals.get(name, 0) + size
    return _with_last_level(levels, totals)


def _lscpu_caches() -> dict[str, int]:
    import subprocess

    try:
        done = subprocess.run(["lscpu", "-B", "-C=NAME,ONE-SIZE,ALL-SIZE"], capture_output=True, text=True,
                              timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [line.split() for line in done.stdout.splitlines()[1:] if len(line.split()) == 3]
    levels = {name.upper().replace("D", "d"): int(one) for name, one, _ in rows if one.isdigit() and
              not name.lower().endswith("i")}
    totals = {name.upper().replace("D", "d"): int(all_) for name, _, all_ in rows if all_.isdigit()}
    return _with_last_level(levels, totals)


def cpu_cache_bytes(root: Path | str | None = None) -> dict[str, int]:
    """This CPU's data and unified caches in bytes: ``L1d``, ``L2``, ``L3`` ... (one instance each, as the hardware
    reports them), ``last_level`` (one instance of the highest level) and ``last_level_total`` (all its instances
    on the machine: the cache a multi-threaded kernel can fill).

    Read from Linux sysfs (``root``, default :data:`CPU_CACHE_DIR`: ``cpu*/cache/index*/{level,type,size,
    shared_cpu_list}``, the figures ``lscpu`` prints), else, for the default root, from ``lscpu -B``. Empty where
    neither says (macOS, Windows, some containers): callers then size arrays from a stated default instead of
    guessing. Used to size bandwidth arrays beyond the last level, so they measure DRAM rather than cache
    (:func:`memlab.measure.roofline.cache_bytes` is this reading on a CPU and a GPU's L2 on CUDA).
    """
    if root is not None:
        return _sysfs_caches(Path(root))
    return _sysfs_caches(CPU_CACHE_DIR) or _lscpu_caches()
