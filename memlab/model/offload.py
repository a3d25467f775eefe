"""Activation offload: every tensor autograd saves goes to host memory in forward and comes back in backward.

:class:`OffloadActivations` does what ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` does [pytorch-autograd]
(torch/autograd/graph.py: each saved tensor is copied into a new pinned host tensor of its own size when saved, and
copied back to its device when backward reads it; parameters a matmul saves are copied too), and keeps the books:
``host_bytes`` (bytes copied to the host in this forward, each saved tensor by its own elements) and ``tensors``.

On a CPU the "device" and the host are one memory, so a CPU run cannot show the device bytes offload frees by
itself. ``simulate=True`` (what the trace uses) makes the host copy a ``meta`` tensor, which takes no memory, and the
copy back a fresh tensor on the device: the device's bytes are then exactly what a GPU run holds, and
``host_bytes`` what it moves, while the values of the unpacked tensors (and so the gradients) are meaningless: a
memory experiment only. ``simulate=False`` copies for real (pinned when the tensor is on CUDA).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes


class OffloadActivations(torch.autograd.graph.saved_tensors_hooks):
    """``save_on_cpu(pin_memory=True)`` with bookkeeping (module docstring). Enter it around a forward."""

    def __init__(self, *, simulate: bool = False) -> None:
        self.host_bytes = 0
        self.tensors = 0
        self.simulate = simulate

        def pack(t: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
            self.host_bytes += t.numel() * t.element_size()
            self.tensors += 1
            if simulate:  # a meta tensor made outside every dispatch mode: no storage, nothing a tracker counts
                with _disable_current_modes():
                    return t.device, torch.empty(t.size(), dtype=t.dtype, device="meta")
            pinned = t.device.type == "cuda"
            host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=pinned)
            host.copy_(t, non_blocking=pinned)
            return t.device, host

        def unpack(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
            device, host = packed
            if host.device.type == "meta":
                return torch.empty(host.size(), dtype=host.dtype, device=device)
            return host.to(device, non_blocking=device.type == "cuda", copy=True)

        super().__init__(pack, unpack)

    def __enter__(self) -> Any:
        self.host_bytes = 0
        self.tensors = 0
        return super().__enter__()
