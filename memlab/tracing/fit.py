"""The largest batch or sequence that fits a card, each candidate traced and its allocations replayed on it.

The formula's searches (:func:`memlab.predict.fit.max_batch`, :func:`~memlab.predict.fit.max_seq`) give two ends:
the value that fits for certain (the allocator's reserve at its bound) and the value above which nothing fits (no
reserve at all). Between them the caching allocator decides, and only its allocations in order can say how: this
module traces the step at each candidate (fake tensors, :mod:`memlab.tracing.tracer`), replays its allocations
through the allocator model in the room the card leaves it (:func:`memlab.predict.gpu.device.for_trace`: freeing
its cache and retrying before it gives up, as torch does) and bisects. With the formula's ends it traces only
between them (a handful of traces); without them (a config the formula does not cover) it doubles from 1, then
bisects. A model of the allocator's rules on the traced code, not a GPU measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memlab.errors import SetupError
from memlab.predict.fit import FitSearch, card_capacity, largest_fitting
from memlab.predict.gpu.alloc_conf import AllocatorConfig
from memlab.predict.gpu.device import DeviceOverheads, DevicePeaks, for_trace
from memlab.predict.spec.setup import Setup
from memlab.predict.spec.validate import LIMITS
from memlab.units import GiB

DECIDED_ON_TRACE = ("device-used (nvidia-smi), its high end, with the traced allocations replayed through the caching "
                    "allocator model in the room the card leaves it")
"""What a traced search decides on (:func:`memlab.predict.gpu.device.for_trace`)."""


def traced_search(trace_at: Callable[[Setup], Any], setup: Setup, field: str, gpu: Any, *,
                  formula: FitSearch | None = None, limit: int | None = None,
                  overheads: DeviceOverheads | None = None, alloc_conf: AllocatorConfig | None = None,
                  grads_at: Callable[[Setup], int] | None = None,
                  progress: Callable[[str], None] | None = None) -> FitSearch:
    """The largest ``field`` (``batch`` or ``seq``) of ``setup`` whose traced step fits ``gpu`` (a name, an
    ``Accelerator`` row or a DeviceInfo, as :func:`memlab.predict.fit.fits` takes), as the allocator would decide.

    ``trace_at(setup)`` traces one step (a :class:`~memlab.tracing.tracer.Trace` with its allocation log);
    ``formula``: the formula's search of the same question, whose ends bound the bisection (the trace is not
    assumed to agree: the lower end is traced first, and past the upper end the search keeps doubling);
    ``limit``: the largest value tried (default the formula's ``up_to`` + 1, else Setup's bound); ``overheads``:
    the device terms (the verdict's defaults); ``alloc_conf``: ``PYTORCH_CUDA_ALLOC_CONF`` parsed (torch's
    defaults); ``grads_at``: a setup's gradient bytes, for DDP's buckets; ``progress``: called with one line per
    trace. The result is settled (``up_to == value``), its ``decided_on`` :data:`DECIDED_ON_TRACE`."""
    if field not in ("batch", "seq"):
        raise SetupError(f"a traced search is over batch or seq, not {field!r}")
    key, _, cap = card_capacity(gpu)
    ov = overheads or DeviceOverheads()
    top = int(LIMITS[field].max) if limit is None else limit
    seen: dict[int, tuple[Any, DevicePeaks]] = {}

    def at(v: int) -> tuple[Any, DevicePeaks]:
        if v not in seen:
            s = setup.with_(**{field: v})
            if progress is not None:
                progress(f"tracing {field}={v:,} and replaying its allocations on {key}")
            trace = trace_at(s)
            grads = grads_at(s) if grads_at is not None else 0
            seen[v] = trace, for_trace(trace, s, key, cap, config=alloc_conf, grads_bytes=grads, overheads=ov)[0]
        return seen[v]

    def fits_at(v: int) -> bool:
        return at(v)[1].fits

    start = max(formula.value, 1) if formula is not None else 1
    stop = min(top, (formula.up_to or formula.value) + 1) if formula is not None else None
    if stop is not None and stop > start and not fits_at(stop):
        value = largest_fitting(fits_at, stop, start=start)
    else:  # no formula, or the trace fits past the formula's upper end: double, then bisect
        value = _gallop(fits_at, max(start, stop or 1), top)
    trace, p = at(max(value, 1))
    over = seen.get(value + 1)
    reason = (f"{field}={value:,} fits: device-used {p.device_high_bytes / GiB:.2f} GiB, margin "
              f"{p.margin_bytes / GiB:+.2f} GiB" if value else
              f"even {field}=1 does not fit: device-used {p.device_high_bytes / GiB:.2f} GiB > {cap / GiB:.2f} GiB")
    if over is not None and value:
        reason += (f"; {field}={value + 1:,} does not: device-used {over[1].device_high_bytes / GiB:.2f} GiB"
                   if not over[1].fits else "")
    elif value == top:
        reason += f" ({top:,} is the search limit)"
    if formula is not None and not formula.settled:
        reason += f"; the formula's ends were {formula.value:,} (certain) and {formula.up_to:,}"
    reason += f"; {len(seen)} trace(s)"
    tried = tuple((v, t.peak_bytes, d.device_high_bytes, d.fits) for v, (t, d) in sorted(seen.items()))
    return FitSearch(field, value, reason, trace.peak_bytes, cap, key, p.device_high_bytes, p.margin_bytes,
                     DECIDED_ON_TRACE, up_to=value, tried=tried)


def _gallop(fits_at: Callable[[int], bool], start: int, top: int) -> int:
    """The largest fitting value in ``start``..``top``: doubling from ``start`` until one does not fit, then
    bisecting (0 when ``start`` does not fit)."""
    if not fits_at(start):
        return largest_fitting(fits_at, start, start=1) if start > 1 else 0
    lo = start
    while lo < top:
        hi = min(2 * lo, top)
        if not fits_at(hi):
            return largest_fitting(fits_at, hi, start=lo)
        lo = hi
    return lo
