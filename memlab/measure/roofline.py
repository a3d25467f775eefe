"""Microbenchmarks for the roofline's points: matmul FLOP/s over shapes and dtypes, and memory bandwidth.

Both return tidy DataFrames (one row per measurement). Timing: warm-up runs first; on CUDA each repeat is timed
with CUDA events after writing a buffer larger than the L2 cache (so operands come from HBM, not L2) and
synchronising once at the end; on CPU each repeat is timed with ``time.perf_counter`` and caches are not
flushed. The reported time is the median of the repeats (``min_s`` is kept too).

A dtype the device cannot run gives one row with ``status="unsupported"`` and the ``reason`` (the exception's
message), not an exception. Dtype names are those of :data:`memlab.predict.spec.precision.DTYPE_BYTES`; ``tf32`` means
fp32 storage with TF32 tensor-core matmuls (a CUDA mode). Sizes scale with ``scale``: ``"ci"`` is small enough for a
2-core CI runner, ``"full"`` is for a real machine, ``"auto"`` picks ``full`` on CUDA and ``ci`` on CPU.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pandas as pd
import torch

from memlab.device import Device, resolve_device, resolve_scale, torch_dtype
from memlab.errors import MemlabError, unknown_name
from memlab.measure.cpu import cpu_cache_bytes, cpu_model
from memlab.measure.timing import time_fn
from memlab.predict.spec.precision import DTYPE_BYTES

BANDWIDTH_KINDS = ("copy", "triad")
L2_FLUSH_MIN_BYTES = 256 * 2**20
"""Smallest L2-flush buffer; :func:`l2_flush_bytes` uses 4x the device's reported L2 when that is larger."""

_REPEATS = {"ci": (5, 2), "full": (20, 5)}  # (repeats, warm-up runs)


def default_shapes(device: Device = None, scale: str = "auto") -> list[tuple[int, int, int]]:
    """Matmul shapes ``(m, n, k)`` for ``scale`` on ``device``: a few square GEMMs plus skinny ones (``m`` small,
    a decode step's GEMV-like shape) whose low arithmetic intensity puts them under the bandwidth roof."""
    cuda = resolve_device(device).type == "cuda"
    if resolve_scale(scale, device) == "ci":
        sizes, wide = ((1024, 2048), 1024) if cuda else ((128, 256), 256)
        return [(1, wide, wide)] + [(s, s, s) for s in sizes]
    if cuda:
        return [(1, 8192, 8192), (16, 8192, 8192), (128, 8192, 8192)] + [(s, s, s) for s in (1024, 2048, 4096, 8192)]
    return [(1, 2048, 2048), (16, 2048, 2048)] + [(s, s, s) for s in (256, 512, 1024, 2048)]


def _l2_bytes(dev: torch.device) -> int:
    """The CUDA device's L2 in bytes (torch's ``L2_cache_size``; 0 when torch does not say)."""
    return int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0)


def cache_bytes(device: Device = None) -> dict[str, int]:
    """The device's cache sizes in bytes: ``L1d``, ``L2``, ``L3`` ... (one instance each, as the hardware reports
    them), ``last_level`` (one instance of the highest level) and ``last_level_total`` (all its instances on the
    machine: the cache a multi-threaded kernel can fill). {} when unknown.

    CPU: :func:`memlab.measure.cpu.cpu_cache_bytes` (Linux sysfs, else ``lscpu``). CUDA: the L2 from torch's
    device properties (``L2_cache_size``), the GPU's last level.
    """
    dev = resolve_device(device)
    if dev.type == "cuda":
        l2 = _l2_bytes(dev)
        return {"L2": l2, "last_level": l2, "last_level_total": l2} if l2 > 0 else {}
    return cpu_cache_bytes()


def _mib_up(n: float) -> int:
    return math.ceil(n / 2**20) * 2**20


def default_sizes(device: Device = None, scale: str = "auto", caches: dict[str, int] | None = None) -> list[int]:
    """Array sizes in bytes (per array) for the bandwidth benchmark, from the detected caches (:func:`cache_bytes`,
    or ``caches``).

    One size fits in half the L2 (cache bandwidth) and one is at least twice the whole last-level cache of the
    machine (``last_level_total``), so the three STREAM arrays (12 or more times that cache) come from DRAM or
    HBM. ``full`` adds sizes in between and beyond (8 x the last level on CPU, at least 4 GiB on CUDA). Without
    cache information a last level of 512 MiB (a large server) is assumed. On CPU no size exceeds 1/16 of the
    available memory (the three arrays then take under a fifth of it)."""
    dev = resolve_device(device)
    cuda = dev.type == "cuda"
    caches = cache_bytes(dev) if caches is None else caches
    mib = 2**20
    llc = caches.get("last_level_total") or caches.get("last_level") or (0 if cuda else 512 * mib)
    l2 = caches.get("L2") or caches.get("last_level") or mib
    small = max(_mib_up(l2 / 2) if l2 >= 2 * mib else 256 * 2**10 if l2 >= 512 * 2**10 else 64 * 2**10, 64 * 2**10)
    if cuda:
        beyond = max(64 * mib, _mib_up(4 * llc))
        ci, full = [beyond, 4 * beyond], [16 * mib, beyond, 4 * beyond, max(4096 * mib, 16 * beyond)]
    else:
        beyond = max(16 * mib, _mib_up(2 * llc))
        middle = _mib_up(caches.get("last_level", llc) / 4) if caches.get("last_level", 0) >= 4 * mib else 2 * mib
        ci, full = [small, beyond], [small, middle, beyond, 4 * beyond]
        cap = _mib_up(_available_ram() / 16) if _available_ram() else None
        ci, full = ([min(v, cap) for v in sizes] if cap else sizes for sizes in (ci, full))
    return sorted(set(ci if resolve_scale(scale, dev) == "ci" else full))


def _available_ram() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def l2_flush_bytes(device: Device = None) -> int:
    """Size of the buffer written between CUDA repeats: 4x the device's L2 (torch's ``L2_cache_size``), at least
    :data:`L2_FLUSH_MIN_BYTES`. 0 on CPU (no flush)."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        return 0
    l2 = _l2_bytes(dev)
    return max(L2_FLUSH_MIN_BYTES, 4 * l2)


def device_name(device: Device = None) -> str:
    """A human name for the device: the GPU's name on CUDA, the processor (or machine) on CPU."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return cpu_model()


@contextlib.contextmanager
def _fp32_matmul_mode(tf32: bool) -> Iterator[None]:
    """Set CUDA fp32 matmuls to TF32 (``tf32=True``) or IEEE fp32, and restore the previous setting."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9
        previous = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if tf32 else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = previous
    else:
        previous_flag = matmul.allow_tf32
        matmul.allow_tf32 = tf32
        try:
            yield
        finally:
            matmul.allow_tf32 = previous_flag


def _check_names(names: Iterable[str], known: Sequence[str], kind: str) -> list[str]:
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise MemlabError(f"give at least one {kind}.")
    for name in names:
        if name not in known:
            raise unknown_name(kind, name, list(known))
    return names


def _why(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, MemlabError) else f"{type(exc).__name__}: {exc}"


def _frame(rows: list[dict[str, Any]], keys: Sequence[str], int_columns: Sequence[str]) -> pd.DataFrame:
    """Rows as a DataFrame; integer columns stay integers (nullable Int64) even beside reason rows' blanks."""
    return pd.DataFrame(rows, columns=list(keys)).astype(dict.fromkeys(int_columns, "Int64"))


def _unsupported(base: dict[str, Any], keys: Sequence[str], reason: str) -> dict[str, Any]:
    return {**dict.fromkeys(keys), **base, "status": "unsupported", "reason": reason}


_MATMUL_KEYS = (
    "device", "device_name", "dtype", "m", "n", "k", "flops", "bytes_moved", "arithmetic_intensity", "median_s",
    "min_s", "flops_per_s", "repeats", "warmup", "l2_flush_bytes", "status", "reason",
)


def _check_shapes(shapes: Iterable[Sequence[int]]) -> list[tuple[int, int, int]]:
    out = []
    for shape in shapes:
        if len(shape) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape):
            raise MemlabError(f"a matmul shape is (m, n, k) of positive integers, got {shape!r}.")
        out.append((int(shape[0]), int(shape[1]), int(shape[2])))
    if not out:
        raise MemlabError("give at least one matmul shape (m, n, k).")
    return out


def matmul_flops_per_s(
    shapes: Iterable[Sequence[int]] | None = None,
    dtypes: Iterable[str] = ("fp32", "bf16"),
    *,
    device: Device = None,
    scale: str = "auto",
    repeats: int | None = None,
    warmup: int | None = None,
) -> pd.DataFrame:
    """Measured FLOP/s of ``C = A @ B`` with ``A`` m x k and ``B`` k x n, one row per (dtype, shape).

    ``flops = 2 m n k``; ``bytes_moved = (m k + k n + m n) x element size`` (each operand read once, the result
    written once: the minimum traffic); ``arithmetic_intensity = flops / bytes_moved`` (FLOP per byte), the
    roofline's x-axis. ``flops_per_s = flops / median_s``. Shapes default to :func:`default_shapes`;
    ``repeats``/``warmup`` default to 5/2 (ci) or 20/5 (full).
    """
    dev = resolve_device(device)
    level = resolve_scale(scale, dev)
    shape_list = _check_shapes(default_shapes(dev, level) if shapes is None else shapes)
    names = _check_names(dtypes, list(DTYPE_BYTES), "dtype")
    reps, warm = _REPEATS[level]
    reps, warm = reps if repeats is None else repeats, warm if warmup is None else warmup
    flush = l2_flush_bytes(dev)
    base = {"device": str(dev), "device_name": device_name(dev), "repeats": reps, "warmup": warm,
            "l2_flush_bytes": flush}
    rows: list[dict[str, Any]] = []
    for name in names:
        if name == "tf32" and dev.type != "cuda":
            rows.append(_unsupported({**base, "dtype": name}, _MATMUL_KEYS,
                                     "TF32 is a CUDA tensor-core mode; on CPU fp32 matmuls are IEEE fp32"))
            continue
        try:
            dtype = torch_dtype(name)
            probe = torch.ones(2, 2, device=dev).to(dtype)
            torch.mm(probe, probe)
        except Exception as exc:  # the device cannot run this dtype's matmul: say why, keep going
            rows.append(_unsupported({**base, "dtype": name}, _MATMUL_KEYS, _why(exc)))
            continue
        elt = DTYPE_BYTES[name]
        mode = _fp32_matmul_mode(name == "tf32") if dev.type == "cuda" else contextlib.nullcontext()
        with mode:
            for m, n, k in shape_list:
                a = torch.randn(m, k, device=dev).to(dtype)
                b = torch.randn(k, n, device=dev).to(dtype)
                c = torch.mm(a, b)
                times = time_fn(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), device=dev, repeats=reps,
                                warmup=warm, flush_bytes=flush)
                del a, b, c
                flops = 2 * m * n * k
                moved = int((m * k + k * n + m * n) * elt)
                median = statistics.median(times)
                rows.append({
                    **base, "dtype": name, "m": m, "n": n, "k": k, "flops": flops, "bytes_moved": moved,
                    "arithmetic_intensity": flops / moved, "median_s": median, "min_s": min(times),
                    "flops_per_s": flops / median, "status": "ok", "reason": None,
                })
    return _frame(rows, _MATMUL_KEYS, ("m", "n", "k", "flops", "bytes_moved", "repeats", "warmup", "l2_flush_bytes"))


_BANDWIDTH_KEYS = (
    "device", "device_name", "kind", "dtype", "array_bytes", "n_elements", "bytes_moved", "median_s", "min_s",
    "bytes_per_s", "repeats", "warmup", "l2_flush_bytes", "status", "reason",
)
_ARRAYS_TOUCHED = {"copy": 2, "triad": 3}  # STREAM's counting: copy reads b, writes a; triad reads b and c


def _stream_ops(n: int, name: str, dev: torch.device, kinds: list[str]) -> dict[str, Callable[[], Any]]:
    """The STREAM kernels on three ``n``-element arrays, each run once as a probe (raises if unsupported)."""
    dtype = torch_dtype(name)
    a = torch.zeros(n, device=dev, dtype=dtype)
    b = torch.ones(n, device=dev, dtype=dtype)
    c = torch.ones(n, device=dev, dtype=dtype)
    scalar = 3.0 if dtype.is_floating_point else 3
    ops = {"copy": lambda: a.copy_(b), "triad": lambda: torch.add(b, c, alpha=scalar, out=a)}
    for kind in kinds:
        ops[kind]()
    return ops


def bandwidth_bytes_per_s(
    sizes: Iterable[int] | None = None,
    kinds: Iterable[str] = BANDWIDTH_KINDS,
    *,
    dtype: str = "fp32",
    device: Device = None,
    scale: str = "auto",
    repeats: int | None = None,
    warmup: int | None = None,
) -> pd.DataFrame:
    """Measured memory bandwidth of STREAM-style kernels, one row per (kind, array size).

    ``copy``: ``a[:] = b`` moves ``2 N`` elements; ``triad``: ``a = b + s c`` moves ``3 N`` (the counting of
    McCalpin's STREAM benchmark, www.cs.virginia.edu/stream). ``sizes`` are bytes per array (default
    :func:`default_sizes`); ``bytes_per_s = bytes_moved / median_s``. On CPUs with write-allocate caches the
    hardware also reads the destination before writing it, so true traffic exceeds ``bytes_moved``; the figure
    is the bandwidth a program sees, as STREAM reports it.
    """
    dev = resolve_device(device)
    level = resolve_scale(scale, dev)
    size_list = [sizes] if isinstance(sizes, int) else list(default_sizes(dev, level) if sizes is None else sizes)
    kind_list = _check_names(kinds, BANDWIDTH_KINDS, "bandwidth kind")
    name = _check_names([dtype], list(DTYPE_BYTES), "dtype")[0]
    elt = DTYPE_BYTES[name]
    for size in size_list:
        if isinstance(size, bool) or not isinstance(size, int) or size < elt:
            raise MemlabError(f"array sizes are bytes per array (integers >= {elt} for {name}), got {size!r}.")
    if not size_list:
        raise MemlabError("give at least one array size in bytes.")
    reps, warm = _REPEATS[level]
    reps, warm = reps if repeats is None else repeats, warm if warmup is None else warmup
    flush = l2_flush_bytes(dev)
    base = {"device": str(dev), "device_name": device_name(dev), "dtype": name, "repeats": reps,
            "warmup": warm, "l2_flush_bytes": flush}
    rows: list[dict[str, Any]] = []
    for size in size_list:
        n = int(size // elt)
        try:
            ops = _stream_ops(n, name, dev, kind_list)
        except Exception as exc:  # this dtype cannot run the kernels on this device: say why, keep going
            for kind in kind_list:
                rows.append(_unsupported({**base, "kind": kind, "array_bytes": size}, _BANDWIDTH_KEYS,
                                         _why(exc)))
            continue
        for kind in kind_list:
            times = time_fn(ops[kind], device=dev, repeats=reps, warmup=warm, flush_bytes=flush)
            moved = int(_ARRAYS_TOUCHED[kind] * n * elt)
            median = statistics.median(times)
            rows.append({
                **base, "kind": kind, "array_bytes": size, "n_elements": n, "bytes_moved": moved,
                "median_s": median, "min_s": min(times), "bytes_per_s": moved / median, "status": "ok",
                "reason": None,
            })
        ops = {}  # free this size's arrays before the next size allocates
    return _frame(rows, _BANDWIDTH_KEYS,
                  ("array_bytes", "n_elements", "bytes_moved", "repeats", "warmup", "l2_flush_bytes"))


DRAM_FALLBACK_BYTES = 256 * 2**20
"""Per-array size :func:`beyond_cache_bytes` uses on a CPU whose caches sysfs does not report."""


def beyond_cache_bytes(device: Device = None, factor: int = 4) -> int:
    """Bytes per bandwidth array that no cache can hold: ``factor`` x the last-level cache.

    The last level is ``last_level`` of :func:`cache_bytes`. CPU: ``factor`` x one instance of it (sysfs or lscpu),
    or :data:`DRAM_FALLBACK_BYTES` when it is not reported. CUDA: ``factor`` x the L2 (at least 256 MiB). Rounded
    up to a whole MiB. With ``factor >= 2`` a STREAM kernel's arrays together are at least 4x the cache, so its
    bandwidth is DRAM's (or HBM's), not the cache's.
    """
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 2:
        raise MemlabError(f"factor must be an integer >= 2 (arrays larger than the cache), got {factor!r}.")
    dev = resolve_device(device)
    last = cache_bytes(dev).get("last_level", 0)
    if dev.type == "cuda":
        size = max(L2_FLUSH_MIN_BYTES, factor * last)
    else:
        size = factor * last if last else DRAM_FALLBACK_BYTES
    mib = 2**20
    return -(-size // mib) * mib
