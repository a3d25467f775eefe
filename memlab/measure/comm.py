"""Collective and point-to-point traffic as the ranks really issue it: every ``c10d`` call counted, with its bytes.

:class:`CommCounter` is a ``TorchDispatchMode``. torch.distributed's eager calls (``dist.send``, ``dist.recv``,
``batch_isend_irecv``, ``all_reduce`` ...) reach the dispatcher as ``c10d.*`` ops and DTensor's redistributions as
``_c10d_functional.*`` ops; the counter sees both, so it counts what torch's own pipeline schedules and tensor
parallel styles send, not what memlab thinks they send. Each call is recorded by kind with the bytes of the buffer
handed to it on this rank (``untyped_storage`` is not used: a view's own ``numel() * element_size()`` is what
goes into the collective)::

    with CommCounter() as comm:
        schedule.step(x)            # or a DTensor forward and backward
    comm.totals()   # CommTotals(calls={'send': 3, 'recv': 3}, bytes={'send': 98304, 'recv': 98304})

What the bytes are, per kind: ``send``/``recv`` the tensor sent or received; ``all_reduce``, ``reduce_scatter``,
``all_gather``, ``all_to_all``, ``broadcast`` the local input buffer (for ``all_gather`` the local shard). They are
buffer bytes, not bytes on the wire: a ring all-reduce puts 2(t-1)/t of its buffer on each rank's link
[thakur2005] (:func:`memlab.predict.parallel.communication.ring_wire_bytes`), and gloo picks its own algorithm.
Process-group set-up traffic (a device mesh's ``broadcast``) is counted like any other call, so open the counter around
the step
only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_KINDS = (
    ("send", "send"), ("recv", "recv"),
    ("reduce_scatter", "reduce_scatter"), ("all_reduce", "all_reduce"), ("allreduce", "all_reduce"),
    ("all_gather", "all_gather"), ("allgather", "all_gather"),
    ("all_to_all", "all_to_all"), ("alltoall", "all_to_all"), ("broadcast", "broadcast"),
    ("scatter", "scatter"), ("gather", "gather"), ("reduce", "reduce"),
)
"""(fragment of the op's name, kind), first match wins: ``reduce_scatter`` before ``all_reduce``'s ``reduce``."""


def op_kind(name: str) -> str | None:
    """The kind of a dispatcher op named ``name`` (``c10d.send.default`` -> ``send``), or None for any op that
    moves no data between ranks (``wait_tensor``, ``barrier``, computation)."""
    namespace, _, rest = name.partition(".")
    if namespace not in ("c10d", "_c10d_functional", "_c10d_functional_autograd"):
        return None
    op = rest.split(".")[0]
    return next((kind for fragment, kind in _KINDS if fragment in op), None)


def _buffer_bytes(args: Any) -> int:
    """The bytes of the first tensor argument (or the tensors of the first list of them): the buffer the op moves."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.numel() * a.element_size()
        if isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
            return sum(t.numel() * t.element_size() for t in a)
    return 0


@dataclass(frozen=True)
class CommTotals:
    """Calls and buffer bytes per kind of communication on one rank (module docstring: what the bytes are)."""

    calls: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, dict[str, int]]:
        """Plain dicts, for JSON."""
        return {"calls": dict(self.calls), "bytes": dict(self.bytes)}


class CommCounter(TorchDispatchMode):
    """Count every collective and point-to-point call issued inside the block (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._calls: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kind = op_kind(str(func))
        if kind is not None:
            self._calls[kind] += 1
            self._bytes[kind] += _buffer_bytes(args)
        return func(*args, **(kwargs or {}))

    def totals(self) -> CommTotals:
        """What has been counted so far."""
        return CommTotals(calls=dict(self._calls), bytes=dict(self._bytes))
