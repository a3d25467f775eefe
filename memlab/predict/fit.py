"""Will it fit? A predicted step against a device's memory, and the largest batch or sequence that fits.

The verdict compares the estimator's **peak** (the most a step holds at once, :mod:`memlab.predict.phases`), not the
sum of components, with the capacity torch reports (a detected device) or the datasheet (a table row).
This module imports no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from memlab.errors import SetupError
from memlab.predict.estimate import MemoryBreakdown, Overheads, estimate
from memlab.predict.models import TransformerConfig
from memlab.predict.setup import Setup
from memlab.predict.validate import LIMITS, check_int, show
from memlab.units import GiB


@dataclass(frozen=True)
class FitVerdict:
    """Whether a predicted step's peak fits a device's memory (bytes; headroom = capacity - peak, negative when it
    does not). ``total_bytes`` is the sum of components, shown beside the peak."""

    fits: bool
    total_bytes: int
    capacity_bytes: int
    headroom_bytes: int
    gpu: str
    gpu_name: str
    peak_bytes: int = 0
    peak_phase: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields."""
        return asdict(self)


@dataclass(frozen=True)
class FitSearch:
    """Result of :func:`max_batch` / :func:`max_seq`: the largest ``value`` of ``field`` whose peak fits (0 if none);
    ``total_bytes`` is the peak at that value (or at 1 when nothing fits)."""

    field: str
    value: int
    reason: str
    total_bytes: int | None
    capacity_bytes: int
    gpu: str

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields."""
        return asdict(self)


def _capacity(gpu: Any) -> tuple[str, str, int]:
    """(key, name, memory bytes) of a GPU name, an ``Accelerator`` row, or the DeviceInfo of
    ``memlab.measure.machine.detect()``. A memory that is not a whole number of bytes >= 1 (zero, negative, a
    float) is a :class:`SetupError`: no step fits in it, and a verdict against it would be meaningless."""
    from memlab.predict.hardware import Accelerator, DeviceInfo

    if isinstance(gpu, str):
        from memlab.predict.hardware import gpu as lookup

        gpu = lookup(gpu)
    if isinstance(gpu, Accelerator):
        key, name, memory = gpu.key, gpu.name, gpu.memory_bytes
    elif isinstance(gpu, DeviceInfo) and gpu.total_memory_bytes is not None:  # the memory torch reports
        key, name, memory = gpu.accelerator.key if gpu.accelerator else gpu.kind, gpu.name, gpu.total_memory_bytes
    else:
        raise SetupError(f"cannot tell the memory of {show(gpu)}: pass a GPU name (see 'memlab gpus'), an "
                         "Accelerator or detect()'s DeviceInfo")
    limit = LIMITS["overhead_bytes"]
    return key, name, check_int("memory_bytes", memory, hi=int(limit.max), why=limit.why, owner=f"GPU {key!r}",
                                err=SetupError)


def fits(what: MemoryBreakdown | TransformerConfig | int, gpu: Any, setup: Setup | None = None, *,
         overheads: Overheads | None = None) -> FitVerdict:
    """Does ``what`` (a breakdown, or a config/count with ``setup``) fit in ``gpu``'s memory?

    ``gpu``: a name for :func:`memlab.predict.hardware.gpu`, an ``Accelerator`` row (its table memory), or
    ``memlab.measure.machine.detect()``'s ``DeviceInfo`` (the memory torch reports). The
    CUDA context and fragmentation count only when given in ``overheads`` (see the assumptions). Fits when the
    peak (``MemoryBreakdown.peak_bytes``) <= capacity.
    """
    key, name, cap = _capacity(gpu)
    if not isinstance(what, MemoryBreakdown):
        if setup is None:
            raise SetupError("fits() needs a setup when given a model config or parameter count")
        what = estimate(what, setup, overheads=overheads)
    peak = what.peak_bytes
    return FitVerdict(peak <= cap, what.total_bytes, cap, cap - peak, key, name, peak, what.peak_phase)


def _search(config: TransformerConfig, setup: Setup, gpu: Any, field: str, limit: int,
            overheads: Overheads | None) -> FitSearch:
    if not isinstance(config, TransformerConfig):
        raise SetupError(f"max_{field} needs a model config: with a bare parameter count {field} changes nothing")
    if not isinstance(setup, Setup):
        raise SetupError(f"setup must be a memlab.predict.setup.Setup, got {type(setup).__name__}")
    hi = LIMITS[field].max
    check_int("limit", limit, hi=hi, why=f"Setup's bound on {field}", err=SetupError)
    key, _, cap = _capacity(gpu)

    def total(v: int) -> int:
        return estimate(config, setup.with_(**{field: v}), overheads=overheads).peak_bytes

    first = total(1)
    if first > cap:
        return FitSearch(field, 0, f"even {field}=1 needs {first / GiB:.2f} GiB > {cap / GiB:.2f} GiB on {key}",
                         first, cap, key)
    top = total(limit)
    if top <= cap:
        return FitSearch(field, limit, f"{field}={limit} (the search limit) fits", top, cap, key)
    lo, hi = 1, limit  # total(lo) fits, total(hi) does not; memory is non-decreasing in batch and seq
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid) <= cap else (lo, mid)
    return FitSearch(field, lo, f"{field}={lo} fits; {field}={lo + 1} does not", total(lo), cap, key)


def max_batch(config: TransformerConfig, setup: Setup, gpu: Any, *, limit: int = 1 << 16,
              overheads: Overheads | None = None) -> FitSearch:
    """Largest micro-batch (1..``limit``) whose predicted peak fits ``gpu``, by bisection (memory grows with batch)."""
    return _search(config, setup, gpu, "batch", limit, overheads)


def max_seq(config: TransformerConfig, setup: Setup, gpu: Any, *, limit: int | None = None,
            overheads: Overheads | None = None) -> FitSearch:
    """Largest sequence length (1..``limit``, default the model's ``max_seq``) that fits ``gpu``, by bisection."""
    return _search(config, setup, gpu, "seq", config.max_seq if limit is None else limit, overheads)
