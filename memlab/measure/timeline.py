"""A background memory timeline with phase markers (forward, backward, optimizer step).

:class:`TimelineSampler` is a context manager that samples, every ``interval_s`` seconds on a daemon thread:

- the CUDA caching allocator (``cuda_allocated_bytes``, ``cuda_reserved_bytes``) when a CUDA device is in use;
- NVML (``nvml_used_bytes``, ``gpu_util_pct``, ``mem_util_pct``) when a CUDA device is in use and NVML is there;
- host RSS (``rss_bytes``) always.

A source that is absent is an absent column, never a column of zeros; :attr:`TimelineSampler.unavailable` says
why each one is missing. :meth:`TimelineSampler.mark` starts a new phase and takes a sample at once, so a phase
shorter than the interval still shows up. The allocator counters are updated on the host when an allocation is
requested, so no ``cuda.synchronize`` is needed to read them at a mark.

On CPU the timeline has only RSS, which is process-wide and coarse (see :mod:`memlab.measure.host`); the exact
CPU timeline of tensor bytes per phase comes from :mod:`memlab.measure.accounting`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pandas as pd
import torch

from memlab.device import Device, resolve_device
from memlab.errors import MemlabError
from memlab.measure.cuda import cuda_unavailable_reason
from memlab.measure.nvml import NvmlSession, nvml_index_for_cuda

_MAX_ERRORS = 20


class TimelineSampler:
    """Sample memory in the background and mark phases; read the result with :meth:`frame` and :meth:`markers`.

    ::

        with TimelineSampler(interval_s=0.01, device="cuda") as tl:
            tl.mark("forward");   loss = model(x).sum()
            tl.mark("backward");  loss.backward()
            tl.mark("optimizer"); opt.step()
        tl.frame()     # t_s, phase, cuda_allocated_bytes, cuda_reserved_bytes, nvml_used_bytes, ..., rss_bytes

    ``device``: None uses the current CUDA device when CUDA is available, otherwise CPU; ``"cpu"`` samples host
    RSS only; a CUDA device on a machine without CUDA is an error. ``nvml=False`` skips NVML. ``t_s`` is seconds
    since the sampler started (``time.perf_counter``). The thread stops on exit even when the body raises.
    """

    def __init__(
        self, interval_s: float = 0.01, device: Device = None, *, initial_phase: str = "start", nvml: bool = True
    ) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, int | float) or not 0 < interval_s <= 60:
            raise MemlabError(f"interval_s must be a number of seconds in (0, 60], got {interval_s!r}.")
        if not isinstance(initial_phase, str) or not initial_phase:
            raise MemlabError(f"initial_phase must be a non-empty string, got {initial_phase!r}.")
        self.interval_s = float(interval_s)
        self.device = device
        self.use_nvml = nvml
        self.unavailable: dict[str, str] = {}
        """Source name ("cuda", "nvml") -> why its columns are absent."""
        self.errors: list[str] = []
        """Errors raised while sampling in the background (first few), so a failing source is not silent."""
        self._phase = initial_phase
        self._rows: list[dict[str, Any]] = []
        self._markers: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cuda_index: int | None = None
        self._nvml: NvmlSession | None = None
        self._process: Any = None
        self._t0 = 0.0
        self._state = "new"

    # ----------------------------------------------------------------------------------------------- sources
    def _open_sources(self) -> None:
        # None: CUDA if it is here; an explicit device is resolved, so CUDA asked for on a machine without it fails
        dev = None if self.device is None else resolve_device(self.device)
        reason = cuda_unavailable_reason(dev)
        self._cuda_index = None if reason else resolve_device(dev).index
        if self._cuda_index is None:
            self.unavailable["cuda"] = str(reason)
            self.unavailable["nvml"] = "no CUDA device in use, so there is no GPU to read"
        elif not self.use_nvml:
            self.unavailable["nvml"] = "NVML sampling switched off (nvml=False)"
        else:
            session = NvmlSession(nvml_index_for_cuda(self._cuda_index)).__enter__()
            if session.available:
                self._nvml = session
            else:
                self.unavailable["nvml"] = str(session.reason)
                session.__exit__(None, None, None)
        import psutil

        self._process = psutil.Process()

    @property
    def columns(self) -> list[str]:
        """The measured columns this sampler produces (besides ``t_s`` and ``phase``)."""
        cols = []
        if self._cuda_index is not None:
            cols += ["cuda_allocated_bytes", "cuda_reserved_bytes"]
        if self._nvml is not None:
            cols += ["nvml_used_bytes", "gpu_util_pct", "mem_util_pct"]
        return [*cols, "rss_bytes"]

    def _sample(self) -> None:
        with self._lock:
            row: dict[str, Any] = {"t_s": time.perf_counter() - self._t0, "phase": self._phase}
        if self._cuda_index is not None:
            row["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated(self._cuda_index))
            row["cuda_reserved_bytes"] = int(torch.cuda.memory_reserved(self._cuda_index))
        if self._nvml is not None:
            reading = self._nvml.read(include_process=False)
            row["nvml_used_bytes"] = reading.memory_used_bytes
            row["gpu_util_pct"] = reading.gpu_util_pct
            row["mem_util_pct"] = reading.mem_util_pct
        row["rss_bytes"] = int(self._process.memory_info().rss)
        with self._lock:
            self._rows.append(row)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception as exc:  # keep sampling the other rows; report what failed
                if len(self.errors) < _MAX_ERRORS:
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------------------------------ life cycle
    def __enter__(self) -> TimelineSampler:
        if self._state != "new":
            raise MemlabError("a TimelineSampler runs once; create a new one for another timeline.")
        try:
            self._open_sources()
            self._t0 = time.perf_counter()
            self._state = "running"
            self._sample()
            self._thread = threading.Thread(target=self._run, name="memlab-timeline", daemon=True)
            self._thread.start()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._state == "running":
                self._sample()
        finally:
            self._close()

    def _close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 10 * self.interval_s))
        if self._nvml is not None:
            self._nvml.__exit__(None, None, None)
        self._state = "closed"

    def mark(self, phase: str) -> None:
        """Start ``phase`` now: record a marker and take a sample at once (inside the ``with`` block only)."""
        if not isinstance(phase, str) or not phase:
            raise MemlabError(f"a phase is a non-empty string such as 'forward', got {phase!r}.")
        if self._state != "running":
            raise MemlabError("mark() works inside 'with TimelineSampler(...) as tl:'; this sampler is not running.")
        with self._lock:
            self._phase = phase
            self._markers.append({"t_s": time.perf_counter() - self._t0, "phase": phase})
        self._sample()

    # --------------------------------------------------------------------------------------------- results
    def frame(self) -> pd.DataFrame:
        """All samples, ordered by time: ``t_s``, ``phase`` (current at the sample), then one column per source."""
        with self._lock:
            rows = list(self._rows)
        df = pd.DataFrame(rows, columns=["t_s", "phase", *self.columns])
        return df.sort_values("t_s", kind="stable").reset_index(drop=True)

    def markers(self) -> pd.DataFrame:
        """The phase markers: ``t_s`` (seconds since start) and ``phase``."""
        with self._lock:
            return pd.DataFrame(list(self._markers), columns=["t_s", "phase"])

    def peaks_by_phase(self) -> pd.DataFrame:
        """Highest sampled value of each column within each phase (phases in the order they started)."""
        df = self.frame()
        order = list(dict.fromkeys(df["phase"]))
        peaks = df.groupby("phase", sort=False)[self.columns].max()
        return peaks.reindex(order)
