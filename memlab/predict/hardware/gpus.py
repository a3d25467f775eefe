"""Accelerators: a sourced table of dense peaks, name resolution, and :class:`DeviceInfo`, what
:func:`memlab.measure.machine.detect` reports for this process's device.

Conventions used in every row of :data:`GPUS`:

- ``peak_flops`` are **dense** peaks per dtype in FLOP/s (int8 in op/s). Vendors often print tensor-core
  figures "with sparsity" (2:4 structured sparsity doubles them); those are divided by 2 and the row's notes
  say so. ``None`` means the device has no such unit, or its vendor publishes no figure for it.
- ``memory_bytes`` is the datasheet capacity read in GiB (``N GB`` -> ``N * 2**30``): HBM and GDDR parts are
  built from power-of-two dies, and the totals PyTorch/NVML report sit 0.5-8 % *below* these figures (ECC,
  firmware reservations). :func:`resolve` allows for that gap.
- ``bandwidth_bytes_per_s`` is the vendor's decimal figure (``3.35 TB/s`` -> ``3.35e12``).

An unknown device is never given another device's peak: :func:`resolve` returns ``None`` and
:func:`memlab.measure.machine.detect` reports the peak as unknown with the reason. For a CPU the peak is measured
(a short matmul benchmark), cached as JSON and marked ``measured``. This module imports no torch; detecting a
device (which does) lives in :mod:`memlab.measure.machine`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from memlab.errors import UnknownNameError, unknown_name
from memlab.predict.hardware.table import ALIASES, GPUS, PEAK_DTYPES, Accelerator
from memlab.predict.spec.frozen import FrozenDict
from memlab.predict.spec.validate import LIMITS, check_int

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GPUS", "PEAK_DTYPES", "Accelerator", "gpu", "list_gpus", "resolve", "to_frame"]

_VENDOR_WORDS = ("nvidia", "amd", "instinct", "tesla", "geforce", "google", "cloud")


def _normalise(name: str, sep: str) -> str:
    """Lower case, separators (space, _, -, /) collapsed to ``sep``, vendor words and '(gfx...)' suffixes dropped."""
    text = re.sub(r"\(gfx[^)]*\)", "", name.strip().lower())
    words = [w for w in re.split(r"[\s_\-/]+", text) if w]
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    return sep.join(words)


def gpu(name: str) -> Accelerator:
    """The table row for ``name``: a key (``"h100-sxm"``), a spelling of it (``"H100 SXM"``, ``"h100_sxm"``), an
    alias, or a device name as torch reports it (``"NVIDIA H100 80GB HBM3"``).

    Raises :class:`UnknownNameError` for an unknown name and, for a name that covers several rows with different
    peaks (``"a100"``, ``"h100"``), an error listing the candidates to choose from.
    """
    if not isinstance(name, str) or not name.strip():
        raise unknown_name("GPU", str(name), list(GPUS))
    key = _normalise(name, "-")
    target = ALIASES.get(key, key)
    if isinstance(target, tuple):
        raise UnknownNameError(
            f"GPU name {name!r} is ambiguous: its variants differ in memory or peak FLOP/s. memlab's table has "
            f"{', '.join(target)}; pass one of these keys"
        )
    if target in GPUS:
        return GPUS[target]
    found = resolve(name)
    if found is not None:
        return found
    raise unknown_name("GPU", name, list(GPUS))


def list_gpus() -> list[Accelerator]:
    """Every table row, in table order."""
    return list(GPUS.values())


def to_frame(rows: Iterable[Accelerator] | None = None) -> pd.DataFrame:
    """The table (or ``rows``) as a DataFrame: one row per accelerator, peaks as ``peak_<dtype>_flops`` columns."""
    import pandas as pd

    records = []
    for acc in list_gpus() if rows is None else rows:
        rec: dict[str, Any] = {
            "key": acc.key, "name": acc.name, "vendor": acc.vendor, "form_factor": acc.form_factor,
            "memory_bytes": acc.memory_bytes, "memory_gib": acc.memory_gib,
            "bandwidth_bytes_per_s": acc.bandwidth_bytes_per_s,
        }
        rec.update({f"peak_{d}_flops": acc.peak_flops[d] for d in PEAK_DTYPES})
        rec.update({"unofficial": acc.unofficial, "measured": acc.measured, "source": acc.source, "notes": acc.notes})
        records.append(rec)
    return pd.DataFrame.from_records(records)


# Device names as torch.cuda.get_device_name() / NVML / ROCm report them, normalised with spaces (see _normalise).
# Every pattern must match the whole name: MIG slices ("... MIG 1g.5gb"), other memory variants and unknown
# suffixes therefore resolve to None rather than to a near neighbour.
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"v100 sxm2 32gb", "v100-sxm2-32gb"),
    (r"v100 sxm2 16gb", "v100-sxm2-16gb"),
    (r"a100 sxm4 40gb", "a100-40gb-sxm"),
    (r"a100 sxm4? 80gb", "a100-80gb-sxm"),
    (r"a100 (pcie 40gb|40gb pcie)", "a100-40gb-pcie"),
    (r"a100 (pcie 80gb|80gb pcie)", "a100-80gb-pcie"),
    (r"a10g", "a10g"),
    (r"l4", "l4"),
    (r"l40s", "l40s"),
    (r"t4", "t4"),
    (r"h100 (80gb hbm3|sxm5?( 80gb)?( hbm3)?)", "h100-sxm"),
    (r"h100 pcie( 80gb)?", "h100-pcie"),
    (r"h100 nvl", "h100-nvl"),
    (r"h200( sxm5?)?( 141gb)?( hbm3e)?", "h200-sxm"),
    (r"h200 nvl", "h200-nvl"),
    (r"h20", "h20"),
    (r"b200", "b200"),
    (r"gb200", "gb200"),
    (r"rtx 3090", "rtx-3090"),
    (r"rtx 4090", "rtx-4090"),
    (r"mi250x", "mi250x"),
    (r"mi250", "mi250"),
    (r"mi300x( vf)?", "mi300x"),
    (r"tpu v4", "tpu-v4"),
    (r"tpu v5e|tpu v5 lite", "tpu-v5e"),
    (r"tpu v5p", "tpu-v5p"),
)
_MI250_CUS = {110: "mi250x", 104: "mi250"}  # compute units per GCD (AMD CDNA2 whitepaper: 220 / 208 per package)
_MEMORY_TOLERANCE = (0.85, 1.02)  # reported / datasheet: ECC and reservations take up to ~8 % (T4 shows 15 of 16)


def resolve(device_name: str, total_memory_bytes: int | None = None, *,
            multiprocessor_count: int | None = None) -> Accelerator | None:
    """Map a device name from torch/NVML/ROCm (plus its total memory) to a table row, or None when unsure.

    The name must match one known form completely (``"NVIDIA H100 80GB HBM3"`` is the SXM part, ``"NVIDIA H100
    PCIe"`` and ``"NVIDIA H100 NVL"`` the others; ``"NVIDIA H20"`` is not ``"NVIDIA H200"``; ``"NVIDIA GB200"``
    not ``"NVIDIA B200"``; ``"NVIDIA GH200 480GB"`` is none of them). When ``total_memory_bytes`` is given it
    must lie within 85-102 % of the row's datasheet memory, else None. ROCm names both MI250X and MI250 GCDs
    ``"AMD Instinct MI250X/MI250"``: ``multiprocessor_count`` (compute units: 110 vs 104) decides, and without
    it the answer is None. None means MFU will be reported as unknown, never borrowed from another device. A
    memory or compute-unit count that is not a positive whole number (``"80"``, ``[110]``) is a
    :class:`~memlab.errors.MemlabError`.
    """
    if not isinstance(device_name, str):
        return None
    if total_memory_bytes is not None:
        check_int("total_memory_bytes", total_memory_bytes, hi=LIMITS["overhead_bytes"].max,
                  why=LIMITS["overhead_bytes"].why, owner="resolve")
    if multiprocessor_count is not None:
        check_int("multiprocessor_count", multiprocessor_count, hi=10**6, why="a million compute units",
                  owner="resolve")
    text = _normalise(device_name, " ")
    if text == "mi250x mi250":
        key = _MI250_CUS.get(multiprocessor_count) if multiprocessor_count is not None else None
    else:
        key = next((k for pattern, k in _DEVICE_PATTERNS if re.fullmatch(pattern, text)), None)
    if key is None:
        return None
    row = GPUS[key]
    if total_memory_bytes is not None:
        ratio = total_memory_bytes / row.memory_bytes
        if not _MEMORY_TOLERANCE[0] <= ratio <= _MEMORY_TOLERANCE[1]:
            return None
    return row


# --------------------------------------------------------------------------------------------------------------
# DeviceInfo: the device this process would use, as memlab.measure.machine.detect() reports it
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceInfo:
    """The device this process would use (``cuda:0`` when available, else the CPU) and its peak, if known."""

    kind: str
    """``"cuda"`` (also ROCm builds, which use the cuda API) or ``"cpu"``."""
    name: str
    """Device name as reported (GPU name, or the CPU model string)."""
    accelerator: Accelerator | None
    """The table row (GPU), the measured row (CPU), or None when the peak is unknown."""
    total_memory_bytes: int | None
    """Device memory as reported by torch (GPU) or host RAM (CPU)."""
    peak_flops: Mapping[str, float | None] = field(hash=False)
    """Dense peak FLOP/s per dtype; all None when unknown."""
    peak_source: str
    """``"table: <source>"``, ``"measured: <benchmark>"`` or ``"unknown"``."""
    peak_reason: str | None
    """Why the peak is unknown (None when known)."""
    torch_version: str | None
    cuda_version: str | None
    """CUDA (or ``"hip X"``) version torch was built with; None for a CPU-only build."""
    driver_version: str | None
    """NVIDIA driver version via NVML, None when NVML is unavailable."""
    cpu_count: int | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_flops", FrozenDict({d: self.peak_flops.get(d) for d in PEAK_DTYPES}))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready); the accelerator row is nested as its own dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["peak_flops"] = dict(self.peak_flops)
        out["accelerator"] = self.accelerator.to_dict() if self.accelerator else None
        return out


GEMM_TILE = 128
"""A typical cuBLAS output tile edge, elements (it also picks 128 x 256, 256 x 128 and others) [nvidia-gemm-perf]."""


def tile_waves(m: int, n: int, sms: int, tile: int = GEMM_TILE) -> dict[str, float]:
    """Tile and wave quantisation of an m x n GEMM output on a device with ``sms`` SMs [nvidia-gemm-perf]: the
    output is cut into ``tile`` x ``tile`` tiles, run one per SM at a time in waves of ``sms`` tiles. Returns the
    tiles, the waves, the share of the tiles' elements that are output (tile fill, %), the share of SMs busy in the
    last wave (%), and the useful share of all SM-tile slots of the waves (%)."""
    m, n = check_int("m", m), check_int("n", n)
    sms, tile = check_int("sms", sms), check_int("tile", tile)
    tiles = -(-m // tile) * -(-n // tile)
    waves = -(-tiles // sms)
    return {"m": m, "n": n, "tiles": tiles, "waves": waves, "tile fill (%)": 100 * m * n / (tiles * tile * tile),
            "last wave's SMs busy (%)": 100 * (tiles - (waves - 1) * sms) / sms,
            "useful share of SM-tile slots (%)": 100 * m * n / (waves * sms * tile * tile)}
