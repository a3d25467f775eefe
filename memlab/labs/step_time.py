"""Where a training step's wall time goes, and how much MFU each non-model cost takes away.

:func:`training_loop` trains the reference GPT for a few steps with a synthetic input pipeline and records, per
step, the time spent waiting for data, in forward, backward and the optimizer step, in host work (``.item()``
syncs, logging) and in checkpointing. Variants of it measure the seed's low-utilisation row [seed-004]: a slow
loader with and without worker processes, ``pin_memory``, prefetching, and a ``.item()`` every step; and the
rule that MFU's step time excludes logging and checkpointing [seed-001], [chowdhery2022].

Per-phase times on CUDA need a synchronize at each phase boundary (``split_phases=True``), which itself removes
the CPU-GPU overlap a real loop has; with ``split_phases=False`` only the data wait and the whole step are timed.
On a CPU every op is synchronous, so ``.item()`` costs almost nothing there: the stall it causes is a GPU effect.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from memlab.device import resolve_device
from memlab.errors import SetupError
from memlab.measure.cuda import synchronize
from memlab.model.step import Meter
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

PHASES = ("data", "forward", "backward", "optimizer", "host", "checkpoint")
"""The loop's timed spans; ``optimizer`` is :func:`memlab.model.step.train_step`'s optimizer step and zero_grad."""


class _Marks(Meter):
    """``perf_counter`` at the end of the forward, the backward and zero_grad (after a synchronize with
    ``split_phases``), and the step's loss, kept for the host work after the step."""

    def __init__(self, device: torch.device, split_phases: bool, marks: list[float]) -> None:
        self.device, self.split_phases, self.marks = device, split_phases, marks
        self.last_loss: torch.Tensor | None = None

    def mark(self) -> None:
        if self.split_phases:
            synchronize(self.device)
        self.marks.append(time.perf_counter())

    @contextlib.contextmanager
    def phase(self, step: Any, name: str) -> Iterator[None]:
        yield
        if name != "optimizer step":  # the optimizer span ends after zero_grad
            self.mark()

    def loss(self, step: Any, loss: torch.Tensor) -> None:
        self.last_loss = loss.detach()


class SlowTokens(torch.utils.data.Dataset):
    """Synthetic token sequences that take ``delay_s`` each to produce (``time.sleep``: I/O-like, the worker
    processes of a DataLoader can overlap it). Item ``i`` is a (seq + 1) int64 vector, seeded by ``i``."""

    def __init__(self, vocab_size: int, seq: int, length: int, delay_s: float = 0.0) -> None:
        if delay_s < 0:
            raise SetupError(f"delay_s must be >= 0 seconds, got {delay_s!r}")
        self.vocab_size, self.seq, self.length, self.delay_s = vocab_size, seq, length, delay_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        gen = torch.Generator().manual_seed(int(i))
        return torch.randint(0, self.vocab_size, (self.seq + 1,), generator=gen)


@dataclass(frozen=True)
class LoopResult:
    """One measured loop: median seconds per phase per step, the step time, tokens/s and MFU."""

    label: str
    steps: int
    phase_s: dict[str, float]
    """Mean per step of each of :data:`PHASES` (seconds)."""
    step_s: float
    """Mean wall time of a whole step (seconds), every phase included."""
    model_step_s: float
    """Mean of data + forward + backward + optimizer: the step time MFU should use (no logging, checkpoints)."""
    tokens_per_s: float
    mfu: float | None
    """MFU on ``step_s`` (None when the peak is unknown)."""
    mfu_model_time: float | None
    """MFU on ``model_step_s``."""
    mfu_reason: str | None
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict; ``phase_s`` flattened to ``<phase>_s`` keys by :meth:`to_row`."""
        return asdict(self)

    def to_row(self) -> dict[str, Any]:
        """One flat row for a DataFrame."""
        row = {k: v for k, v in asdict(self).items() if k not in ("phase_s", "settings")}
        row.update({f"{p}_s": v for p, v in self.phase_s.items()})
        row.update(self.settings)
        return row


def training_loop(config: TransformerConfig, setup: Setup, device: str | torch.device = "auto", *, steps: int = 4,
                  label: str = "", delay_s: float = 0.0, num_workers: int = 0, pin_memory: bool = False,
                  prefetch_factor: int | None = None, item_every: int = 0, log_every: int = 0,
                  checkpoint_every: int = 0, split_phases: bool = True, accelerator: Any = None,
                  seed: int = 0) -> LoopResult:
    """Train ``steps`` steps (after one warm-up step) from a :class:`SlowTokens` DataLoader and time each phase.

    ``delay_s``: seconds to produce one sequence (a batch takes ``batch x delay_s`` in the main process).
    ``num_workers``, ``pin_memory``, ``prefetch_factor``: passed to ``torch.utils.data.DataLoader``
    (``pin_memory`` only matters for CUDA copies). ``item_every``: call ``loss.item()`` every that many steps (a
    host sync). ``log_every``: format a log line with the loss (an ``.item()``) into a buffer. ``checkpoint_every``:
    ``torch.save`` the model and optimizer state into memory. ``accelerator``: what
    :func:`memlab.predict.compute.flops.mfu`
    divides by (default: :func:`memlab.measure.machine.detect` for the device).
    """
    from memlab.measure.machine import detect
    from memlab.model.step import build_training, train_step
    from memlab.predict.compute.flops import mfu

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise SetupError(f"steps must be an integer >= 1, got {steps!r}")
    dev = resolve_device(device)
    model, step = build_training(config, setup, dev, seed=seed)
    dataset = SlowTokens(config.vocab_size, setup.seq, setup.batch * (steps + 1), delay_s)
    extra = {"prefetch_factor": prefetch_factor} if num_workers and prefetch_factor else {}
    loader = torch.utils.data.DataLoader(dataset, batch_size=setup.batch, num_workers=num_workers,
                                         pin_memory=pin_memory and dev.type == "cuda", **extra)
    log = io.StringIO()
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    walls: list[float] = []
    it = iter(loader)
    for i in range(steps + 1):
        t0 = time.perf_counter()
        batch = next(it).to(dev, non_blocking=pin_memory)
        idx, tgt = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        meter = _Marks(dev, split_phases, [t0, time.perf_counter()])
        train_step(step, lambda idx=idx, tgt=tgt: model(idx, tgt), meter=meter, label=i)
        marks, loss = meter.marks, meter.last_loss
        assert loss is not None
        if item_every and i % item_every == 0:
            float(loss.item())
        if log_every and i % log_every == 0:
            log.write(f"step {i} loss {loss.item():.4f}\n")
        synchronize(dev)
        marks.append(time.perf_counter())
        if checkpoint_every and i % checkpoint_every == 0:
            torch.save({"model": model.state_dict(), "optimizer": step.state_holder().state_dict()}, io.BytesIO())
        marks.append(time.perf_counter())
        if i == 0:
            continue  # warm-up: worker start-up, lazy optimizer state
        walls.append(marks[-1] - t0)
        spans = [b - a for a, b in itertools.pairwise(marks)]
        for name, span in zip(PHASES, spans, strict=True):
            times[name].append(span)
    del it
    # Means, not medians: a checkpoint every k steps costs its amortised share of each step.
    phase = {p: statistics.fmean(v) if v else 0.0 for p, v in times.items()}
    step_s = statistics.fmean(walls)
    model_s = step_s - phase["host"] - phase["checkpoint"]
    tokens = setup.batch * setup.seq
    acc = accelerator if accelerator is not None else detect(device=dev)
    dtype = setup.policy.compute_dtype
    full = mfu(config, tokens / step_s, accelerator=acc, dtype=dtype, seq=setup.seq)
    model_only = mfu(config, tokens / model_s, accelerator=acc, dtype=dtype, seq=setup.seq)
    settings = {"delay_s": delay_s, "num_workers": num_workers, "pin_memory": pin_memory,
                "prefetch_factor": prefetch_factor, "item_every": item_every, "log_every": log_every,
                "checkpoint_every": checkpoint_every, "split_phases": split_phases, "device": str(dev)}
    return LoopResult(label or "loop", steps, phase, step_s, model_s, tokens / step_s, full.mfu, model_only.mfu,
                      full.reason, settings)
