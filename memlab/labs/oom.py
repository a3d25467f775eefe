"""The OOM troubleshooting row of seed 004, made executable: small loops that leak, and the same loops fixed.

Each case runs the reference GPT for a few iterations and returns one row per iteration with the live tensor
bytes at its end (:class:`memlab.measure.live_bytes.LiveBytes`, on any device; on CUDA also the allocator's
allocated and reserved bytes). A leak is bytes that grow with the iteration number; :func:`growth_per_iteration`
is the least-squares slope.

Cases (``fixed=False`` is the bug, ``fixed=True`` the fix):

- ``keep-loss``: a training loop that keeps ``loss`` (a tensor) for logging instead of ``loss.item()``. After
  ``backward`` the graph's saved tensors are freed, so this keeps only the 4-byte scalar (a 512 B block on CUDA,
  whose allocator rounds every request up to 512 B; and its graph nodes, host memory that no tensor count sees): a
  slow leak.
- ``eval-grad``: an evaluation loop run without ``torch.no_grad()`` that sums the loss tensor: every batch's
  whole graph, activations included, stays alive. Fix: ``torch.no_grad()`` (and ``.item()``).
- ``cycle``: each step keeps an exception in a local variable (``except E as e: err = e``). Frame -> err ->
  traceback -> frame is a reference cycle, so the step's tensors are freed only when the cycle collector runs
  (``gc.collect(0)`` every ``gc_every`` iterations here; automatic collection is off during the loop): a
  sawtooth. Fix: ``del err`` (or ``traceback.clear_frames``), which breaks the cycle.
- ``empty-cache``: the ``eval-grad`` leak with ``torch.cuda.empty_cache()`` after every iteration (on CUDA; a CPU
  has no cache to empty, so there this case *is* ``eval-grad``). Live bytes grow exactly as before: the call returns
  only *unallocated* cached blocks to the driver. It cannot prevent an OOM either: the allocator frees the same
  blocks itself and retries before raising one (:mod:`memlab.labs.allocator`). Fix: the ``no_grad`` fix.

Introduced for chapter 01 (anatomy of an OOM).
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

import torch

from memlab.device import resolve_device
from memlab.errors import SetupError
from memlab.measure.live_bytes import LiveBytes
from memlab.model.gpt import GPT
from memlab.model.step import token_batch
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup
from memlab.run.live_steps import live_training_steps

if TYPE_CHECKING:
    import pandas as pd

CASES = ("keep-loss", "eval-grad", "cycle", "empty-cache")


class _StepFailed(Exception):
    pass


def _step_keeping_error(model: GPT, idx: torch.Tensor, tgt: torch.Tensor, fixed: bool) -> float:
    """A forward that records a (caught) exception, the way retry or logging code does."""
    logits = model(idx)  # a tensor local to this frame (batch x seq x vocab)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
    try:
        raise _StepFailed("a recoverable problem")
    except _StepFailed as exc:
        err = exc  # frame -> err -> traceback -> frame: a reference cycle holding this frame's tensors
    value = float(loss.detach())
    if fixed:
        del err
    return value


def leak_loop(case: str, *, fixed: bool, iters: int = 12, config: TransformerConfig | None = None,
              batch: int = 2, seq: int = 32, device: torch.device | str = "cpu", gc_every: int = 4,
              seed: int = 0) -> pd.DataFrame:
    """Run ``case`` (one of :data:`CASES`) for ``iters`` iterations; one row per iteration (bytes at its end)."""
    import pandas as pd

    if case not in CASES:
        raise SetupError(f"case must be one of {', '.join(CASES)}, got {case!r}")
    if not isinstance(iters, int) or iters < 2:
        raise SetupError(f"iters must be an integer of at least 2 (a slope needs two points), got {iters!r}")
    if not isinstance(gc_every, int) or gc_every < 1:
        raise SetupError(f"gc_every must be a positive integer, got {gc_every!r}")
    dev = resolve_device(device)
    config = config or preset("tiny-gpt")
    torch.manual_seed(seed)
    model = GPT(config, device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    idx, tgt = token_batch(config.vocab_size, batch, seq, dev, seed)
    rows: list[dict[str, Any]] = []
    running: Any = 0.0
    kept: list[Any] = []
    was_enabled = gc.isenabled()
    gc.disable()  # automatic collection off: only the loop's own gc.collect() frees a cycle
    try:
        with LiveBytes(sample_every=None) as live:
            live.track(model.parameters(), "params")
            baseline = live.live_bytes
            for i in range(iters):
                live.mark(f"iteration {i}")
                if case == "keep-loss":
                    model.train()
                    loss = model(idx, tgt)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    kept.append(loss.item() if fixed else loss)
                    del loss
                elif case in ("eval-grad", "empty-cache"):
                    model.eval()
                    with torch.no_grad() if fixed else torch.enable_grad():
                        loss = model(idx, tgt)
                    running = running + (loss.item() if fixed else loss)
                    del loss
                    if case == "empty-cache" and dev.type == "cuda":
                        torch.cuda.empty_cache()
                else:  # cycle
                    model.eval()
                    with torch.no_grad():
                        running += _step_keeping_error(model, idx, tgt, fixed)
                    if (i + 1) % gc_every == 0:
                        gc.collect(0)  # the youngest generation holds every object made since the last one
                row = {"case": case, "fixed": fixed, "iteration": i, "bytes_above_weights": live.live_bytes - baseline}
                if dev.type == "cuda":
                    row["cuda_allocated_bytes"] = torch.cuda.memory_allocated(dev)
                    row["cuda_reserved_bytes"] = torch.cuda.memory_reserved(dev)
                rows.append(row)
    finally:
        del running, kept
        if was_enabled:
            gc.enable()
        gc.collect(0)  # the loop's cycles are all in the youngest generation while collection is off
    return pd.DataFrame(rows)


def growth_per_iteration(frame: pd.DataFrame, column: str = "bytes_above_weights") -> float:
    """Least-squares slope of ``column`` over ``iteration``: bytes leaked per iteration (about 0 when fixed)."""
    import numpy as np

    x = frame["iteration"].to_numpy(dtype=float)
    y = frame[column].to_numpy(dtype=float)
    return float(np.polyfit(x, y, 1)[0])


def fit_sweep(config: TransformerConfig, setup: Setup, batches: list[int], capacity_bytes: int,
              device: torch.device | str = "cpu", *, steps: int = 2, seed: int = 0) -> pd.DataFrame:
    """Which batch sizes fit ``capacity_bytes``, measured: one row per batch, an OOM recorded as a result.

    On CUDA each batch runs :func:`memlab.run.runner.run_step` under
    :func:`memlab.measure.cuda.emulate_smaller_gpu` (a real allocator cap; ``status`` is ``ok`` or ``oom`` and the
    parsed message is kept). On a CPU there is no allocator to refuse: each batch's peak live tensor bytes over
    ``steps`` steps (:func:`live_training_steps`, the same setup: its optimizer implementation and zero_grad) is
    compared with the budget, and ``status`` says ``ok`` or ``over budget``; that is a byte count against a number,
    not an out-of-memory error.
    """
    import pandas as pd

    dev = resolve_device(device)
    rows = []
    for b in batches:
        s = setup.with_(batch=b)
        if dev.type == "cuda":
            from memlab.measure.cuda import emulate_smaller_gpu
            from memlab.run.runner import run_step

            with emulate_smaller_gpu(capacity_bytes, dev):
                m = run_step(config, s, dev, steps=steps, seed=seed, with_counted_flops=False, with_mfu=False)
            rows.append({"batch": b, "status": m.status, "peak_bytes": m.cuda_peak_allocated_bytes,
                         "reserved_peak_bytes": m.cuda_peak_reserved_bytes,
                         "oom_message": (m.oom or {}).get("raw")})
        else:
            peak = live_training_steps(config, s, dev, steps=steps, seed=seed).peak_bytes
            rows.append({"batch": b, "status": "ok" if peak <= capacity_bytes else "over budget",
                         "peak_bytes": peak})
    return pd.DataFrame(rows)


def oom_kind(info: Any) -> dict[str, Any]:
    """Which kind of OOM a parsed message (:class:`memlab.measure.oom.OomInfo`) describes, by arithmetic on its
    fields (GiB in the returned numbers).

    The most any layout of the allocator's cache could serve is what the driver has free plus what is reserved
    but unallocated (the allocator already returned wholly free segments before raising,
    ``[pytorch-caching-allocator]``). A request above that is *too big* however the cache is arranged: free live
    tensors or make the tensor smaller (chunking, a smaller batch). A request at or below it, with a reserve that
    alone would cover it, is a *fragmentation candidate* (``expandable_segments:True``, ``max_split_size_mb``).
    Otherwise the card is *full*: what holds it is the live tensors (or another process). A message that lacks
    the fields gives kind ``"unknown"``.
    """
    tried, free, unalloc = info.tried_to_allocate_bytes, info.free_bytes, info.reserved_unallocated_bytes
    if unalloc is None and info.reserved_by_pytorch_bytes is not None and info.allocated_by_pytorch_bytes is not None:
        unalloc = info.reserved_by_pytorch_bytes - info.allocated_by_pytorch_bytes
    if tried is None or free is None or unalloc is None:
        return {"kind": "unknown", "request (GiB)": None if tried is None else tried / 2**30,
                "free + reserved-unallocated (GiB)": None,
                "why": "the message does not state free and reserved-but-unallocated memory"}
    room = free + unalloc
    if tried > room:
        kind, why = "too big", (f"{tried / 2**30:.2f} GiB > {free / 2**30:.2f} free + {unalloc / 2**30:.2f} "
                                "reserved-unallocated GiB: no layout of the cache fits it; free live tensors or "
                                "split the tensor")
    elif tried <= free:
        kind, why = "under the free memory", (f"{tried / 2**30:.2f} GiB <= {free / 2**30:.2f} GiB free: a "
                                              "per-process cap (set_per_process_memory_fraction) or another "
                                              "process's allocation refused it, not this process's layout")
    elif unalloc >= tried:
        kind, why = "fragmentation candidate", (f"the {unalloc / 2**30:.2f} GiB reserved but unallocated alone "
                                                f"exceed the {tried / 2**30:.2f} GiB request, yet no cached block "
                                                "fits it: try expandable_segments:True")
    else:
        kind, why = "full and fragmented", (f"neither the {free / 2**30:.2f} GiB free nor the {unalloc / 2**30:.2f} "
                                            f"GiB cached alone covers the {tried / 2**30:.2f} GiB request, only "
                                            "both together: freeing live tensors or expandable_segments:True "
                                            "may each be enough")
    return {"kind": kind, "request (GiB)": tried / 2**30, "free + reserved-unallocated (GiB)": room / 2**30,
            "why": why}
