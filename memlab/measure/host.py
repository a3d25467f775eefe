"""Host memory: this process's resident set and the machine's RAM (psutil).

RSS is process-wide and coarse: it counts every page this process touches (the Python interpreter, torch's
libraries, memory the C allocator keeps after tensors are freed and has not returned to the OS), so on CPU it
rises with tensors but does not fall back exactly when they are freed. For exact tensor bytes on CPU use the
accounting in :mod:`memlab.measure.accounting`; RSS says what the operating system sees.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class HostReading:
    """One reading of host memory. Bytes throughout; None where the platform does not report a value.

    ``rss_bytes`` is this process's resident set size now; ``peak_rss_bytes`` its highest RSS so far
    (``getrusage`` ``ru_maxrss``; None on Windows); ``system_total_bytes`` / ``system_available_bytes`` the
    machine's RAM and what can be given to new allocations without swapping (psutil ``virtual_memory``);
    ``timestamp_s`` is ``time.time()``.
    """

    available: bool
    reason: str | None = None
    rss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    system_total_bytes: int | None = None
    system_available_bytes: int | None = None
    timestamp_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a pandas row)."""
        return asdict(self)


def peak_rss_bytes() -> int | None:
    """This process's peak RSS in bytes (``ru_maxrss`` is KiB on Linux, bytes on macOS); None without it."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def host_reading() -> HostReading:
    """Read this process's RSS and the machine's total and available RAM."""
    try:
        import psutil
    except ImportError as exc:
        return HostReading(available=False, reason=f"psutil is not installed: {exc}", timestamp_s=time.time())
    stamp = time.time()
    rss = int(psutil.Process().memory_info().rss)
    vm = psutil.virtual_memory()
    return HostReading(
        available=True,
        rss_bytes=rss,
        peak_rss_bytes=peak_rss_bytes(),
        system_total_bytes=int(vm.total),
        system_available_bytes=int(vm.available),
        timestamp_s=stamp,
    )
