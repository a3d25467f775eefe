"""The ``--gpu`` verdict on what the device sees, shared by ``memlab estimate`` and ``memlab trace``: allocated,
reserved and device-used (nvidia-smi) peaks (:mod:`memlab.predict.gpu.device`), the fit decided on device-used with
the margin named. The overhead options (``--cuda-context-mib``, ``--workspace-mib``, ``--fragmentation``) replace
their default term here; ``--gpu-memory-gib`` replaces the card's table capacity."""

from __future__ import annotations

import argparse
from typing import Any

from memlab.cli.args import MIB
from memlab.units import GiB


def capacity_bytes(args: argparse.Namespace) -> int:
    """``--gpu-memory-gib`` in bytes when given, else the table capacity of ``--gpu``."""
    from memlab.predict.hardware.gpus import gpu as lookup

    custom = getattr(args, "gpu_memory_gib", None)
    return round(custom * GiB) if custom is not None else int(lookup(args.gpu).memory_bytes)


def card(args: argparse.Namespace) -> Any:
    """The ``Accelerator`` row of ``--gpu``, its memory replaced by ``--gpu-memory-gib`` when given: what every fit
    of the command (the verdict, the searches, the levers) is decided against."""
    from dataclasses import replace

    from memlab.predict.hardware.gpus import gpu as lookup

    row = lookup(args.gpu)
    return row if getattr(args, "gpu_memory_gib", None) is None else replace(row, memory_bytes=capacity_bytes(args))


def refuse_capacity_without_gpu(args: argparse.Namespace) -> None:
    """``--gpu-memory-gib`` without ``--gpu``: one line (the card's architecture sets the workspaces)."""
    from memlab.errors import MemlabError

    if getattr(args, "gpu_memory_gib", None) is not None and args.gpu is None:
        raise MemlabError("--gpu-memory-gib replaces a card's capacity: give --gpu NAME too (its architecture sets "
                          "the workspaces)")


def given_overheads(args: argparse.Namespace) -> dict[str, float]:
    """The overhead options given on the command line (None-defaulted ones left out)."""
    names = ("cuda_context_mib", "workspace_mib", "fragmentation")
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def overheads_of(args: argparse.Namespace) -> Any:
    """The :class:`~memlab.predict.gpu.device.DeviceOverheads` of the options: each given one replaces its default
    term; the reserve is given only through ``--fragmentation`` (a fraction of allocated). The verdict, the fit
    searches and the levers all decide with it."""
    from memlab.predict.gpu.device import DeviceOverheads

    g = given_overheads(args)
    return DeviceOverheads(
        cuda_context_bytes=round(g["cuda_context_mib"] * MIB) if "cuda_context_mib" in g else None,
        workspace_bytes=round(g["workspace_mib"] * MIB) if "workspace_mib" in g else None,
        reserve_fraction=g.get("fragmentation"))


def peaks(args: argparse.Namespace, setup: Any, tensors_bytes: int, grads_bytes: int, reserve: tuple[int, int],
          reserve_source: str, rounding: int = 0) -> Any:
    """The :class:`~memlab.predict.gpu.device.DevicePeaks` of a step whose tensors peak at ``tensors_bytes``;
    ``reserve``: the replayed or bounded reserve, replaced by ``--fragmentation`` x allocated when given;
    ``rounding``: the replayed blocks' rounding (allocated - requested), an allocated term."""
    from memlab.predict.gpu.device import device_peaks, rounding_term, terms

    ov = overheads_of(args)
    extra = ([rounding_term(rounding)] if rounding else []) + terms(args.gpu, setup, ov, grads_bytes)
    return device_peaks(tensors_bytes, reserve, capacity_bytes(args), extra, reserve_source, ov.reserve_fraction)


def print_peaks(p: Any, gpu_name: str) -> None:
    """The three peaks, the terms between them, and the verdict on device-used with the margin."""
    dev = (f"{p.device_low_bytes / GiB:.2f} to {p.device_high_bytes / GiB:.2f} GiB"
           if p.device_low_bytes != p.device_high_bytes else f"{p.device_high_bytes / GiB:.2f} GiB")
    print(f"verdict: {p.word} on {gpu_name}: device-used (nvidia-smi) {dev} of {p.capacity_bytes / GiB:.2f} GiB;"
          f" margin {p.margin_bytes / GiB:+.2f} GiB (capacity - device-used's high end)")
    print(f"  {'tensors (memlab peak)':<26}{_span(p.tensors_bytes, p.tensors_bytes):>16} GiB")
    for layer, low, high in (("allocated", p.allocated_bytes, p.allocated_bytes),
                             ("reserved", p.reserved_low_bytes, p.reserved_bytes)):
        for t in p.terms:
            if t.layer == layer:
                print(f"  + {t.name:<24}{_span(t.low, t.high):>16} GiB  ({t.source})")
        what = "max_memory_allocated" if layer == "allocated" else "max_memory_reserved"
        print(f"  = {layer + ' peak':<24}{_span(low, high):>16} GiB  ({what})")
    for t in p.terms:
        if t.layer == "device":
            print(f"  + {t.name:<24}{_span(t.low, t.high):>16} GiB  ({t.source}; outside the allocator)")
    print(f"  = {'device-used peak':<24}{_span(p.device_low_bytes, p.device_high_bytes):>16} GiB  (nvidia-smi; a "
          "range where a source gives one: the verdict takes its high end)")
    if not p.fits and p.device_low_bytes <= p.capacity_bytes and p.reserved_low_bytes != p.reserved_bytes:
        print("  the allocator's reserve decides: memlab trace with the same options replays the traced step's "
              "allocations on this card and gives its number")


def _span(low: int, high: int) -> str:
    return f"{low / GiB:.3f}" if low == high else f"{low / GiB:.3f}..{high / GiB:.3f}"
