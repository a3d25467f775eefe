"""Live tensor bytes over time, on any device: the CPU's stand-in for the CUDA allocator's history.

:class:`LiveTensorBytes` is a ``TorchDispatchMode``: every op that runs inside it (forward, backward, optimizer
step) reports its outputs, and each new storage is held by a weak reference whose callback subtracts its bytes
the moment the storage is freed. So ``live_bytes`` is exactly the bytes of storages created inside the block and
still alive (plus what :meth:`LiveTensorBytes.track` added, e.g. the parameters), ``peak_bytes`` its maximum, and
``samples`` one row per op with the label set by :meth:`mark` and the label under which each live byte was
allocated (``by_label``): a stacked timeline by what created the bytes, drawn by
:func:`memlab.compare.plots.sampled_timeline` or :func:`memlab.measure.live.stacked_by_label`.

What it does not see: the caching allocator (reserved but unallocated bytes, fragmentation), workspaces that
kernels allocate internally, and memory outside torch. A reference cycle that holds a tensor keeps it live until
``gc`` runs, exactly as it holds real memory. Introduced for chapter 01 (anatomy of an OOM).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

if TYPE_CHECKING:
    import pandas as pd


class LiveTensorBytes(TorchDispatchMode):
    """Count the bytes of live storages created while the block runs (see the module docstring).

    ``sample_every`` keeps one sample per that many ops (1: every op); the peak is exact either way.
    Use::

        with LiveTensorBytes() as live:
            live.track(model.parameters(), label="params")
            live.mark("forward"); loss = model(x, y)
            live.mark("backward"); loss.backward()
        live.peak_bytes, live.frame()
    """

    def __init__(self, *, sample_every: int = 1) -> None:
        super().__init__()
        if not isinstance(sample_every, int) or sample_every < 1:
            from memlab.errors import MemlabError

            raise MemlabError(f"sample_every must be a positive integer, got {sample_every!r}.")
        self.sample_every = sample_every
        self.label = "start"
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_label = "start"
        self._live: dict[int, tuple[int, str, weakref.ref]] = {}
        self._by_label: dict[str, int] = {}
        self._ops = 0
        self.samples: list[dict[str, Any]] = []

    # -- bookkeeping ----------------------------------------------------------------------------------------
    def _add(self, t: torch.Tensor, label: str) -> None:
        if t.device.type == "meta" or t.is_sparse:
            return
        st = t.untyped_storage()
        n = st.nbytes()
        key = st.data_ptr()
        if n == 0 or key in self._live:
            return
        ref = weakref.ref(st, lambda _r, key=key: self._free(key, _r))
        self._live[key] = (n, label, ref)
        self._by_label[label] = self._by_label.get(label, 0) + n
        self.live_bytes += n
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_label = self.live_bytes, self.label

    def _free(self, key: int, ref: weakref.ref) -> None:
        entry = self._live.get(key)
        if entry is None or entry[2] is not ref:
            return
        n, label, _ = self._live.pop(key)
        self.live_bytes -= n
        self._by_label[label] -= n

    def track(self, tensors: Iterable[torch.Tensor | None], label: str = "existing") -> int:
        """Count tensors made before the block (parameters, a batch) under ``label``; returns bytes added."""
        before = self.live_bytes
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t, label)
        self._sample()
        return self.live_bytes - before

    def mark(self, label: str) -> None:
        """Name what runs from now on (a phase, an iteration); new bytes are attributed to it."""
        self.label = str(label)
        self._sample()

    def _sample(self) -> None:
        self.samples.append({"op": self._ops, "label": self.label, "live_bytes": self.live_bytes,
                             **{f"from {k}": v for k, v in self._by_label.items()}})

    def by_label(self) -> dict[str, int]:
        """Live bytes now, by the label under which they were allocated."""
        return {k: v for k, v in self._by_label.items() if v}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t, self.label)
        self._ops += 1
        if self._ops % self.sample_every == 0:
            self._sample()
        return out

    def frame(self) -> pd.DataFrame:
        """One row per sample: op index, label, live bytes, and ``from <label>`` bytes still live (0 if none)."""
        import pandas as pd

        return pd.DataFrame(self.samples).fillna(0)


def stacked_by_label(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``from <label>`` columns of :meth:`LiveTensorBytes.frame` indexed by op, for a stacked area plot."""
    cols = [c for c in frame.columns if c.startswith("from ")]
    return frame.set_index("op")[cols].rename(columns=lambda c: c.removeprefix("from "))
