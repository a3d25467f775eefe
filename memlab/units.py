"""Units: decimal (GB, TB/s, TFLOP/s as vendors print them) and binary (GiB, as torch and nvidia-smi report).

One formatter for bytes, so a figure, a table and a sentence show the same number the same way.
"""

from __future__ import annotations

import math

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
"""Decimal byte multiples (datasheets, disks, network)."""
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40
"""Binary byte multiples (torch's allocator, nvidia-smi's 'MiB')."""
TERA = 1e12
"""10**12, for FLOP/s and bytes/s."""

_BINARY = (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB))
_DECIMAL = (("TB", TB), ("GB", GB), ("MB", MB), ("kB", KB))


def byte_unit(max_bytes: float, *, binary: bool = True) -> tuple[str, float]:
    """The largest unit (B, KiB, MiB, GiB, TiB; or kB ... TB) in which ``max_bytes`` is at least 1, and its size."""
    for name, size in _BINARY if binary else _DECIMAL:
        if abs(max_bytes) >= size:
            return name, float(size)
    return "B", 1.0


def fmt_bytes(n: float | None, *, binary: bool = True, digits: int = 2) -> str:
    """``n`` bytes for a reader: ``"23.54 GiB"``, ``"512 B"``; ``"-"`` for None or NaN.

    ``digits`` decimals in the chosen unit (none for plain bytes); ``binary=False`` uses GB, MB, ... (10**9, ...).
    """
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    unit, size = byte_unit(n, binary=binary)
    if unit == "B":
        return f"{n:,.0f} B"
    return f"{n / size:,.{digits}f} {unit}"


def fmt_rate(per_s: float | None, unit: str = "FLOP/s", *, digits: int = 1) -> str:
    """A rate with an SI prefix: ``"312.0 TFLOP/s"``, ``"3.35 TB/s"`` (use ``unit="B/s"``); ``"-"`` for None."""
    if per_s is None or (isinstance(per_s, float) and math.isnan(per_s)):
        return "-"
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(per_s) >= size:
            return f"{per_s / size:,.{digits}f} {prefix}{unit}"
    return f"{per_s:,.{digits}f} {unit}"


def fmt_pct(fraction: float | None, *, digits: int = 1) -> str:
    """A fraction as a percentage (``0.462`` -> ``"46.2 %"``); ``"unknown"`` for None or NaN."""
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return "unknown"
    return f"{100 * fraction:.{digits}f} %"
