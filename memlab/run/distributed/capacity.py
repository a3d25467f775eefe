"""How many data-parallel ranks this machine can run at once, and which limit decides (GPUs, CPU cores, memory).

NCCL ranks need one GPU each. gloo ranks on the CPU are bounded twice: by cores, :data:`RANKS_PER_CORE` ranks per
core of this process's CPU affinity (``os.sched_getaffinity``), and by memory, each rank taking
:data:`RANK_BASE_BYTES` plus the estimator's training peak of the model at N = 1
(:func:`memlab.predict.estimate.estimate`, fp32 AdamW: DDP holds the whole model on every rank, the largest
strategy) out of :data:`MEMORY_FRACTION` of the available memory (:func:`memlab.measure.host.host_reading`:
psutil's ``available``, Linux's MemAvailable). The smaller bound wins. A launch above it is refused
(:meth:`RankCapacity.check`); a chapter runs the sizes that fit (:meth:`RankCapacity.largest`) and prints
:meth:`RankCapacity.sentence`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from memlab.errors import SetupError
from memlab.measure.host import host_reading
from memlab.predict.estimate import estimate
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup
from memlab.units import GiB, MiB

RANKS_PER_CORE = 2
"""gloo ranks per CPU core (each rank runs one thread, OMP_NUM_THREADS=1). Two ranks time-sharing a core keep each
rank's step well inside the launcher's timeouts on a loaded machine (memlab issue 23: four ranks on two shared cores
passed in 17 s once all had started); beyond that a launch turns into a queue of ranks waiting for a core."""
RANK_BASE_BYTES = 512 * MiB
"""Resident bytes of one rank before its model: Python with torch, gloo, DDP and FSDP imported measured 273 MiB
RSS (torch 2.13 CPU build, psutil); twice that leaves room for gloo's buffers and the allocator's caches."""
MEMORY_FRACTION = 0.8
"""Share of the available memory the ranks may take; the rest stays for the launcher, the notebook and the page
cache."""


@dataclass(frozen=True)
class RankCapacity:
    """The most ranks this machine runs at once (``max_ranks``) and the facts behind it: ``gpus`` (NCCL ranks, one
    GPU each; 0 for gloo ranks), ``cores`` (CPU affinity), ``available_bytes`` (None when unknown) and
    ``rank_bytes`` (one gloo rank's estimated resident bytes)."""

    max_ranks: int
    gpus: int
    cores: int
    available_bytes: int | None
    rank_bytes: int

    @property
    def why(self) -> str:
        """The limit, in words: one GPU per rank, or the smaller of the core and memory bounds."""
        if self.gpus:
            return f"one GPU per NCCL rank, {self.gpus} visible"
        by_cores = f"{self.cores} core(s) x {RANKS_PER_CORE} ranks per core = {self.cores * RANKS_PER_CORE}"
        if self.available_bytes is None:
            return f"{by_cores}; available memory unknown"
        by_memory = (f"{MEMORY_FRACTION:.0%} of {self.available_bytes / GiB:.1f} GiB available / "
                     f"{self.rank_bytes / GiB:.2f} GiB per rank = "
                     f"{int(MEMORY_FRACTION * self.available_bytes) // self.rank_bytes}")
        return f"{by_cores}; {by_memory}"

    def check(self, ranks: int) -> None:
        """SetupError when ``ranks`` exceed :attr:`max_ranks`."""
        if ranks > self.max_ranks:
            fix = ("launch fewer ranks, or WorkerSpec(device='cpu') (memlab shard --cpu) for gloo ranks on the CPU"
                   if self.gpus else "launch fewer ranks, or run on a larger machine")
            raise SetupError(f"{ranks} ranks exceed what this machine can run at once: at most {self.max_ranks} "
                             f"({self.why}); {fix}")

    def largest(self, sizes: tuple[int, ...]) -> tuple[int, ...]:
        """The world sizes of ``sizes`` that fit, in order (N = 1 always does, see :func:`rank_capacity`)."""
        return tuple(n for n in sizes if n <= self.max_ranks)

    def sentence(self, sizes: tuple[int, ...]) -> str:
        """One sentence for a page: which of ``sizes`` ran and, when some did not fit, why."""
        ran = self.largest(sizes)
        left = [n for n in sizes if n not in ran]
        runs = f"N = {', '.join(map(str, ran))} ran"
        if not left:
            return f"{runs}: this machine runs up to {self.max_ranks} ranks at once ({self.why})."
        return (f"{runs}; N = {', '.join(map(str, left))} did not: this machine runs at most {self.max_ranks} "
                f"ranks at once ({self.why}), so the largest launch here is N = {max(ran)}.")


def rank_bytes(config: TransformerConfig, batch: int, seq: int) -> int:
    """Estimated resident bytes of one gloo rank: :data:`RANK_BASE_BYTES` + the fp32 AdamW training peak at N = 1."""
    peak = estimate(config, Setup(batch=batch, seq=seq), device_type="cpu").peak_bytes
    return RANK_BASE_BYTES + int(peak)


def rank_capacity(config: TransformerConfig, batch: int, seq: int, *, gpus: int = 0, cores: int | None = None,
                  available_bytes: int | None = None) -> RankCapacity:
    """The capacity for ranks of ``config`` at micro-batch ``batch`` x ``seq`` tokens: ``gpus`` > 0 for NCCL ranks
    (one per GPU), else gloo ranks bounded by ``cores`` and ``available_bytes`` (defaults: this process's CPU
    affinity and psutil's available memory). At least one rank always "fits": a single rank is the run itself."""
    per_rank = rank_bytes(config, batch, seq)
    if gpus:
        return RankCapacity(gpus, gpus, cores or _cores(), available_bytes, per_rank)
    cores = _cores() if cores is None else cores
    available = _available_bytes() if available_bytes is None else available_bytes
    limit = cores * RANKS_PER_CORE
    if available is not None:
        limit = min(limit, int(MEMORY_FRACTION * available) // per_rank)
    return RankCapacity(max(1, limit), 0, cores, available, per_rank)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _available_bytes() -> int | None:
    return host_reading().system_available_bytes
