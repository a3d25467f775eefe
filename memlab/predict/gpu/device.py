"""What the device holds beyond the step's tensors: the CUDA context, cuBLAS/cuBLASLt workspaces, NCCL buffers,
DDP's buckets and the caching allocator's reserve, each with its source; and the three peaks a ``--gpu`` verdict
names (allocated, reserved, device-used: what nvidia-smi shows).

Layers, from the inside out:

- **allocated** (``torch.cuda.max_memory_allocated``): the step's peak tensors (the estimate or the trace) plus the
  allocator-managed blocks memlab's peak leaves out: cuBLAS and cuBLASLt workspaces (allocated through the caching
  allocator, ``getNewWorkspace`` / ``getNewCUDABlasLtWorkspace`` in ``aten/src/ATen/cuda/CublasHandlePool.cpp``
  [pytorch-cublas-workspace]) and DDP's gradient buckets [pytorch-ddp-buckets];
- **reserved** (``max_memory_reserved``): allocated plus the allocator's reserve: the replayed number on the trace
  path (:mod:`memlab.predict.gpu.replay`), a stated bound (:func:`reserve_bound`) on the formula path;
- **device-used** (nvidia-smi): reserved plus what lives outside the allocator: the CUDA context and NCCL's
  communicator buffers. Where the sources give a range (the context, NCCL's channel count) the peak is a range and
  the verdict is decided on its high end, with the margin named.

No number here is fitted to a measurement: each is read from a library's source or documentation (cited where it
is defined, and in memlab/SOURCES.md). Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from memlab.errors import SetupError
from memlab.predict.gpu.alloc_conf import K_LARGE_BUFFER, K_SMALL_BUFFER

MIB = 1 << 20

CUDA_CONTEXT_LOW_BYTES = 287_047_680 - K_LARGE_BUFFER
"""The lowest documented CUDA context with lazy module loading: pytorch/pytorch#86509 (torch 1.13, CUDA 11.7,
``CUDA_MODULE_LOADING=LAZY``) measured total - free = 287,047,680 B after one 6.4 MB tensor; that tensor's request
(under kMinLargeAlloc) took one 20 MiB large-pool segment (kLargeBuffer), subtracted here. Eager loading
(``CUDA_MODULE_LOADING=DEFAULT``) measured 666,632,192 B in the same PR. [pytorch-cuda-context]"""
CUDA_CONTEXT_HIGH_BYTES = 426 * MIB
"""The highest documented CUDA context with lazy loading: 426 MiB in nvidia-smi after ``torch.cuda.mem_get_info``
alone (context only, no tensor, no cuBLAS), torch 2.10.0+cu130 on an RTX 6000 Ada (unslothai/unsloth-zoo#1053). A
PyTorch maintainer's figures lie inside the range: "~300MB" (pytorch/pytorch#107667) and "around 400MB"
(pytorch/pytorch#109888) with CUDA >= 11.7 and lazy loading. No source gives it per architecture: a range. With
eager loading (CUDA before 11.7, or ``CUDA_MODULE_LOADING=EAGER``) it is larger (666,632,192 B in #86509; 1343 MiB
on the V100 of the published ledger's row hf-v100-01): pass ``--cuda-context-mib`` there. [pytorch-cuda-context]"""
CUBLAS_WORKSPACE_DEFAULT_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
"""``parseChosenWorkspaceSize`` without ``CUBLAS_WORKSPACE_CONFIG``: ``:4096:2:16:8`` = 8,519,680 B per (handle,
stream), on every CUDA architecture but sm90. [pytorch-cublas-workspace]"""
CUBLAS_WORKSPACE_SM90_BYTES = 4096 * 8 * 1024
"""The same on compute capability 9.0 (Hopper: ``properties->major == 9 && properties->minor == 0``): 32 MiB.
[pytorch-cublas-workspace]"""
CUBLASLT_WORKSPACE_BYTES = 1024 * 1024
"""``parseCUDABlasLtWorkspaceSize`` without ``CUBLASLT_WORKSPACE_SIZE``: 1024 KiB per (handle, stream), a separate
pool unless ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1``. [pytorch-cublas-workspace]"""
NCCL_BUFFSIZE_BYTES = 4 * MIB
"""``NCCL_BUFFSIZE``'s default, 4194304 B (NCCL docs, Environment Variables): the Simple protocol's buffer per
channel and direction of a connection. [nccl-env]"""
NCCL_MAX_CHANNELS = 32
"""``MAXCHANNELS`` in NCCL's device header (src/include/device.h, 32 in NCCL 2.x): the most channels a
communicator opens; NCCL picks the count at run time from the topology. [nccl-env]"""
SM90_KEYS = ("h100", "h200", "h20", "gh200")
"""memlab table keys (prefixes) of compute capability 9.0 cards: Hopper (NVIDIA H100/H200 datasheets)."""


@dataclass(frozen=True)
class DeviceOverheads:
    """The terms outside memlab's tensor peak, each overridable; None means "from the library default and the
    setup" (see each field). Bytes."""

    cuda_context_bytes: int | None = None
    """None: the documented range (:data:`CUDA_CONTEXT_LOW_BYTES` .. :data:`CUDA_CONTEXT_HIGH_BYTES`)."""
    workspace_bytes: int | None = None
    """All cuBLAS/cuBLASLt workspaces; None: per handle from the card's architecture (:func:`workspace_bytes`)."""
    reserve_bytes: int | None = None
    """The allocator's reserve; None: replayed (trace) or :func:`reserve_bound` (formula)."""
    reserve_fraction: float | None = None
    """The allocator's reserve as this fraction of the allocated peak (``--fragmentation``,
    ``Overheads.fragmentation_fraction``); None: as ``reserve_bytes`` says. Not with ``reserve_bytes``."""
    nccl_buffsize_bytes: int = NCCL_BUFFSIZE_BYTES
    nccl_channels: int | None = None
    """None: the range 1 .. :data:`NCCL_MAX_CHANNELS`."""
    ddp_buckets: bool = True
    """DDP's default ``gradient_as_bucket_view=False`` (a bucket copy of every gradient); False for True."""

    def __post_init__(self) -> None:
        for name in ("cuda_context_bytes", "workspace_bytes", "reserve_bytes", "nccl_channels"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SetupError(f"DeviceOverheads.{name} must be a whole number >= 0 or None, got {v!r}")
        f = self.reserve_fraction
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f < 1):
            raise SetupError(f"DeviceOverheads.reserve_fraction must be a fraction in [0, 1) or None, got {f!r}")
        if f is not None and self.reserve_bytes is not None:
            raise SetupError("DeviceOverheads: give reserve_bytes or reserve_fraction, not both")
        if self.nccl_buffsize_bytes < 0:
            raise SetupError(f"DeviceOverheads.nccl_buffsize_bytes must be >= 0, got {self.nccl_buffsize_bytes}")


def from_overheads(overheads: Any, device: DeviceOverheads | None = None) -> DeviceOverheads:
    """The device terms a fit decides with: ``device`` when given (the command line builds it from its options),
    else the terms an estimate's :class:`~memlab.predict.estimate.Overheads` names (a term > 0 replaces its default:
    ``cuda_context_bytes``, ``workspace_bytes``, ``fragmentation_fraction`` as the reserve's fraction of allocated),
    else every default (None: no overheads)."""
    if device is not None and overheads is not None:
        _same_terms(overheads, device)
    if device is not None:
        return device
    if overheads is None:
        return DeviceOverheads()
    frac = overheads.fragmentation_fraction
    return DeviceOverheads(cuda_context_bytes=overheads.cuda_context_bytes or None,
                           workspace_bytes=overheads.workspace_bytes or None, reserve_fraction=frac or None)


def _same_terms(overheads: Any, device: DeviceOverheads) -> None:
    """One SetupError line where ``overheads`` names a term (> 0) that ``device`` gives differently: a term is given
    in one place (the command line builds both from the same option, so they agree there)."""
    pairs = (("cuda_context_bytes", overheads.cuda_context_bytes, device.cuda_context_bytes),
             ("workspace_bytes", overheads.workspace_bytes, device.workspace_bytes),
             ("fragmentation_fraction", overheads.fragmentation_fraction, device.reserve_fraction))
    for name, given, dev in pairs:
        if given and given != dev:
            raise SetupError(f"Overheads.{name}={given!r} and the device terms ({dev!r}) disagree: give the term in "
                             "one place (device=DeviceOverheads(...) for a fit)")


@dataclass(frozen=True)
class Term:
    """One named term: ``low``..``high`` bytes (equal when exact), in which layer, with its source."""

    name: str
    low: int
    high: int
    layer: str
    """``allocated`` (inside torch's allocator), ``reserved`` (the allocator's reserve) or ``device`` (outside)."""
    source: str


@dataclass(frozen=True)
class DevicePeaks:
    """The three peaks of a ``--gpu`` verdict, bytes, with their terms; device-used is a range where a term is."""

    tensors_bytes: int
    allocated_bytes: int
    reserved_low_bytes: int
    reserved_bytes: int
    """Reserved's high end (the replayed number on the trace path: then equal to ``reserved_low_bytes``)."""
    device_low_bytes: int
    device_high_bytes: int
    capacity_bytes: int
    terms: tuple[Term, ...] = field(default=())
    reserve_source: str = ""

    @property
    def fits(self) -> bool:
        """Decided on device-used's high end against the card's capacity."""
        return self.device_high_bytes <= self.capacity_bytes

    @property
    def word(self) -> str:
        """``FITS`` (the high end fits), ``DOES NOT FIT`` (the low end does not) or, between, ``FITS IF ...``: the
        most the ends may grow."""
        if self.fits:
            return "FITS"
        if self.device_low_bytes > self.capacity_bytes:
            return "DOES NOT FIT"
        return (f"FITS ONLY IF device-used stays under the capacity (its range straddles it; room "
                f"{(self.capacity_bytes - self.device_low_bytes) / 2**30:.2f} GiB above the low end)")

    @property
    def margin_bytes(self) -> int:
        """Capacity minus device-used's high end (negative when it does not fit)."""
        return self.capacity_bytes - self.device_high_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits, "margin_bytes": self.margin_bytes,
                "decided_on": "device-used (nvidia-smi), its high end, against the card's capacity"}


def is_sm90(gpu_key: str) -> bool:
    """Whether memlab's table key is a compute capability 9.0 card (:data:`SM90_KEYS`)."""
    return gpu_key.startswith(SM90_KEYS)


def workspace_bytes(gpu_key: str, handles: int) -> int:
    """cuBLAS + cuBLASLt workspaces of ``handles`` (handle, stream) pairs on ``gpu_key``'s architecture
    [pytorch-cublas-workspace]: each pair gets one cuBLAS workspace (``setWorkspaceForHandle``) and one cuBLASLt
    workspace (``getCUDABlasLtWorkspace``), both from the caching allocator."""
    cublas = CUBLAS_WORKSPACE_SM90_BYTES if is_sm90(gpu_key) else CUBLAS_WORKSPACE_DEFAULT_BYTES
    return handles * (cublas + CUBLASLT_WORKSPACE_BYTES)


def handles_of(mode: str) -> int:
    """(handle, stream) pairs a step uses on the default stream: cuBLAS handles are per thread
    (``DeviceThreadHandlePool``), and a training step's backward runs on the autograd engine's device thread, so
    training uses two (the Python thread's and autograd's), inference one."""
    return 2 if mode == "train" else 1


def process_groups(setup: Any) -> int:
    """NCCL communicators a rank holds: one per parallel dimension of more than one rank (data, tensor, pipeline,
    context, expert)."""
    dims = (setup.world_size, setup.tp, setup.pp, setup.cp, setup.ep)
    return sum(1 for d in dims if d > 1)


def reserve_bound(peak_bytes: int, long_lived_bytes: int) -> int:
    """The formula's bound on reserved - allocated, bytes, from the allocator's rules
    [pytorch-caching-allocator]: the step's transient bytes (peak minus the long-lived states) may be held twice,
    live and as cached free blocks of the sizes the phase before freed (freed blocks stay cached, best fit may not
    reuse them), plus one partly used segment per pool (kLargeBuffer 20 MiB, kSmallBuffer 2 MiB). A stated bound,
    checked against the replay (:func:`memlab.predict.gpu.replay.replay`) on generated setups
    (tests/predict/gpu/test_device.py); not proven for every allocation order."""
    return max(0, peak_bytes - long_lived_bytes) + K_LARGE_BUFFER + K_SMALL_BUFFER


def ddp_bucket_bytes(setup: Any, grads_bytes: int) -> int:
    """DDP's gradient buckets on a rank: with the default ``gradient_as_bucket_view=False`` the reducer's buckets
    hold a copy of every gradient (torch/nn/parallel/distributed.py: True "can reduce peak memory usage, where the
    saved memory size will be equal to the total gradients size") [pytorch-ddp-buckets]; 0 outside DDP
    (one rank, ZeRO/FSDP, inference)."""
    ddp = setup.mode == "train" and setup.world_size > 1 and setup.zero_stage == 0
    return grads_bytes if ddp else 0


def terms(gpu_key: str, setup: Any, ov: DeviceOverheads, grads_bytes: int) -> list[Term]:
    """The terms outside the tensor peak (not the reserve) for ``setup`` on ``gpu_key``."""
    ws = workspace_bytes(gpu_key, handles_of(setup.mode)) if ov.workspace_bytes is None else ov.workspace_bytes
    ws_src = ("given" if ov.workspace_bytes is not None else
              f"{handles_of(setup.mode)} cuBLAS handle(s) x ({'32 MiB, sm90' if is_sm90(gpu_key) else ':4096:2:16:8'}"
              " cuBLAS + 1 MiB cuBLASLt), CublasHandlePool.cpp")
    out = [Term("cublas_workspaces", ws, ws, "allocated", ws_src)]
    ddp = ddp_bucket_bytes(setup, grads_bytes) if ov.ddp_buckets else 0
    if ddp:
        out.append(Term("ddp_buckets", ddp, ddp, "allocated", "DDP gradient_as_bucket_view=False: a bucket copy of "
                        "every gradient (torch/nn/parallel/distributed.py)"))
    lo, hi = ((CUDA_CONTEXT_LOW_BYTES, CUDA_CONTEXT_HIGH_BYTES) if ov.cuda_context_bytes is None
              else (ov.cuda_context_bytes, ov.cuda_context_bytes))
    out.append(Term("cuda_context", lo, hi, "device", "given" if ov.cuda_context_bytes is not None else
                    "documented range with lazy loading: pytorch#86509 .. unsloth-zoo#1053"))
    groups = process_groups(setup)
    if groups:
        per = 2 * ov.nccl_buffsize_bytes
        c_lo, c_hi = (1, NCCL_MAX_CHANNELS) if ov.nccl_channels is None else (ov.nccl_channels, ov.nccl_channels)
        out.append(Term("nccl_buffers", groups * per * c_lo, groups * per * c_hi, "device",
                        f"{groups} communicator(s) x 2 x NCCL_BUFFSIZE x {c_lo}..{c_hi} channels (Simple protocol; "
                        "NCCL docs)"))
    return out


def rounding_term(nbytes: int) -> Term:
    """The replayed blocks' rounding (peak active - peak requested), an allocated term: torch's
    ``max_memory_allocated`` counts the rounded blocks (``alloc_found_block`` adds ``block->size``)."""
    return Term("block_rounding", nbytes, nbytes, "allocated", "replayed: every block rounded up to 512 B (or a "
                "roundup_power2_divisions step); max_memory_allocated counts them")


def device_peaks(tensors_bytes: int, reserve: tuple[int, int], capacity_bytes: int, extra: list[Term],
                 reserve_source: str, reserve_fraction: float | None = None) -> DevicePeaks:
    """Stack ``extra`` terms on the tensor peak: allocated, reserved (+ ``reserve``: its low and high end, or
    ``reserve_fraction`` x allocated when given), device-used (a range where a term is one)."""
    allocated = tensors_bytes + sum(t.high for t in extra if t.layer == "allocated")
    if reserve_fraction is not None:
        given = round(reserve_fraction * allocated)
        reserve, reserve_source = (given, given), f"--fragmentation {reserve_fraction:g} x allocated (given)"
    outside = [t for t in extra if t.layer == "device"]
    low = allocated + reserve[0] + sum(t.low for t in outside)
    high = allocated + reserve[1] + sum(t.high for t in outside)
    terms_ = (*extra, Term("allocator_reserve", reserve[0], reserve[1], "reserved", reserve_source))
    return DevicePeaks(tensors_bytes, allocated, allocated + reserve[0], allocated + reserve[1], low, high,
                       capacity_bytes, terms_, reserve_source)


def for_estimate(bd: Any, setup: Any, gpu_key: str, capacity_bytes: int,
                 overheads: DeviceOverheads | None = None) -> DevicePeaks:
    """The device peaks of a formula estimate (a :class:`~memlab.predict.estimate.MemoryBreakdown` of ``setup``):
    its peak less the overhead terms it was given (each then comes back in its own layer, as ``overheads`` says),
    the reserve from 0 to :func:`reserve_bound`. What chapter 08 calls for a formula's device-used range."""
    ov = overheads or DeviceOverheads()
    given = sum(int(bd.overhead.get(k, 0)) for k in ("cuda_context", "workspace", "fragmentation"))
    tensors = bd.peak_bytes - given
    extra = terms(gpu_key, setup, ov, bd.grads_bytes)
    if ov.reserve_bytes is not None:
        reserve, src = (ov.reserve_bytes, ov.reserve_bytes), "given"
    else:
        reserve = (0, reserve_bound(tensors, bd.params_bytes + bd.optimizer_bytes))
        src = ("0 up to the bound (peak - params - optimizer states) + 20 MiB + 2 MiB, from the allocator's rules "
               "(memlab.predict.gpu.device.reserve_bound); memlab trace --gpu replays it")
    return device_peaks(tensors, reserve, capacity_bytes, extra, src, ov.reserve_fraction)


def for_replay(tensors_bytes: int, replay: Any, setup: Any, gpu_key: str, capacity_bytes: int, *,
               grads_bytes: int = 0, overheads: DeviceOverheads | None = None) -> DevicePeaks:
    """The device peaks of a traced step: its peak ``tensors_bytes``, the reserve of ``replay`` (a
    :class:`~memlab.predict.gpu.replay.Replay` of its allocation log, ``Trace.replay()``: reserved - requested at
    the whole log's peaks), the terms outside the allocator. What chapter 01 calls beside its replay."""
    ov = overheads or DeviceOverheads()
    t = replay.total
    rounding = t.active_bytes - t.requested_bytes
    reserve = t.reserved_bytes - t.active_bytes if ov.reserve_bytes is None else ov.reserve_bytes
    src = ("replayed: the caching allocator model on the traced allocations (peak reserved - peak allocated over "
           "the step)" if ov.reserve_bytes is None else "given")
    extra = ([rounding_term(rounding)] if rounding else []) + terms(gpu_key, setup, ov, grads_bytes)
    return device_peaks(tensors_bytes, (reserve, reserve), capacity_bytes, extra, src, ov.reserve_fraction)


def allocator_room(capacity_bytes: int, extra: list[Term]) -> int:
    """The bytes the caching allocator can cudaMalloc on a card of ``capacity_bytes``: the capacity less what lives
    outside it (the context, NCCL's buffers: their high ends) and less the allocator-managed blocks a traced log
    does not hold (cuBLAS workspaces, DDP's buckets: :func:`terms`' ``allocated`` layer). Never below 0."""
    held = sum(t.high for t in extra if t.layer in ("device", "allocated"))
    return max(0, capacity_bytes - held)


def for_trace(trace: Any, setup: Any, gpu_key: str, capacity_bytes: int, *, config: Any = None,
              grads_bytes: int = 0, overheads: DeviceOverheads | None = None) -> tuple[DevicePeaks, Any]:
    """The device peaks of a traced step on a card, decided as the allocator decides: the trace's allocations
    replayed (``trace.replay(config, capacity_bytes=...)``, :mod:`memlab.predict.gpu.replay`) with the room the
    card leaves it (:func:`allocator_room`), so that where the whole step's reserve would pass the card the
    allocator frees its cached blocks and retries, as ``DeviceCachingAllocator::malloc`` does
    [pytorch-caching-allocator]. Where even that runs out, the reserve is the whole step's (an uncapped replay), so
    device-used is above the capacity and the step does not fit. Returns (peaks, the replay on the card: its
    ``alloc_retries`` are the cache flushes a fitting step pays, its ``oom_event`` where it runs out)."""
    ov = overheads or DeviceOverheads()
    extra = terms(gpu_key, setup, ov, grads_bytes)
    on_card = trace.replay(config, capacity_bytes=allocator_room(capacity_bytes, extra))
    whole = on_card if on_card.fits else trace.replay(config)
    src = ("replayed: the caching allocator model on the traced allocations, in the room the card leaves it "
           "(peak reserved - peak allocated over the step)" + (
               f"; it frees its cache and retries {on_card.alloc_retries} time(s) to fit" if on_card.fits
               and on_card.alloc_retries else "" if on_card.fits else "; it runs out even after freeing its cache"))
    p = for_replay(trace.peak_bytes, whole, setup, gpu_key, capacity_bytes, grads_bytes=grads_bytes, overheads=ov)
    return replace(p, reserve_source=src if ov.reserve_bytes is None and ov.reserve_fraction is None
                   else p.reserve_source), on_card
