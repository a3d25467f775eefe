"""Live tensor bytes through several training steps of the reference GPT, op by op, labelled by step and phase.

:func:`memlab.run.runner.run_step` gives exact bytes at the phase *boundaries* of the first step; this gives the
bytes *between* them (temporaries, the moment backward holds both activations and gradients, the optimizer's
``foreach`` scratch) for ``steps`` consecutive steps, counted by :class:`memlab.measure.live_bytes.LiveBytes`.
It shows why a job that survives step 1 can die at step 2: Adam's moments appear during the first
``optimizer.step()`` and are there for every later forward and backward. On CUDA the allocator's bytes are what
count (``run_step`` and ``memlab.measure.cuda``); this is the device-independent twin.

The phase-aware peak estimator (``estimate(...).phases``, :mod:`memlab.predict.memory.phases`) predicts these peaks:
:meth:`LiveSteps.against` puts its prediction beside each measured one; :mod:`memlab.tracing.tracer` gives the same
bytes at full scale on fake tensors. Introduced for chapter 01 (anatomy of an OOM).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from memlab.device import resolve_device
from memlab.errors import SetupError
from memlab.measure.live_bytes import LiveBytes
from memlab.model.step import PhaseMeter, build_training, token_batch, train_step
from memlab.predict.memory.phases import PhaseRow, find_phase
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class LiveSteps:
    """Live bytes over ``steps`` training steps: one row per op in ``frame``, the peak of each (step, phase)."""

    frame: pd.DataFrame
    """op, label ("step N: phase"), live_bytes, and ``from <label>`` bytes still live that were allocated there."""
    params_bytes: int
    peak_bytes: int
    peak_label: str
    phases: tuple[PhaseRow, ...] = ()
    """One :class:`~memlab.predict.memory.phases.PhaseRow` per (step, phase), the step numbered from 1: start_bytes,
    peak_bytes, end_bytes (:meth:`LiveBytes.phase`)."""

    def phase(self, name: str, step: int) -> PhaseRow:
        """The row of phase ``name`` in step number ``step`` (:func:`~memlab.predict.memory.phases.find_phase`)."""
        return find_phase(self.phases, name, step)

    def peaks(self) -> pd.DataFrame:
        """Largest live bytes in each step and phase, in order: columns step, phase, peak_bytes."""
        import pandas as pd

        return pd.DataFrame([r.to_dict() for r in self.phases], columns=["step", "phase", "peak_bytes"])

    def against(self, predicted: Any) -> pd.DataFrame:
        """The measured peaks beside a prediction's phases (``estimate(...)``, a MemoryBreakdown): step 1 is the
        estimator's ``first`` step, later ones ``steady``. ``measured`` is the peak inside the phase, for
        ``zero_grad`` the bytes held after it (what the estimator predicts there); columns step, phase, measured,
        predicted, rel_error. Predict with the optimizer implementation that ran (``foreach`` or ``for-loop``)."""
        import pandas as pd

        f = self.frame[self.frame["label"].str.startswith("step ")]
        ends = f.groupby("label", sort=False)["live_bytes"].last()
        rows = []
        for r in self.peaks().itertuples(index=False):
            measured = int(ends[f"step {r.step}: {r.phase}"]) if r.phase == "zero_grad" else int(r.peak_bytes)
            p = predicted.phase_bytes(r.phase, "first" if r.step == 1 else "steady")
            rows.append({"step": r.step, "phase": r.phase, "measured": measured, "predicted": p,
                         "rel_error": (p - measured) / measured})
        return pd.DataFrame(rows)

    def held_at_peak(self) -> dict[str, int]:
        """Live bytes at the op where the run peaks, by the label they were allocated under (``params``,
        ``step N: phase``): which components exist at that moment. Summing each component at its own largest (as
        seed 000's "effective utilisation" does) counts tensors that are never alive together, such as the gradients,
        which do not exist yet when step 2 peaks early in backward."""
        at = self.frame.loc[self.frame["live_bytes"].idxmax()]
        return {c.removeprefix("from "): int(at[c]) for c in self.frame.columns if c.startswith("from ") and at[c]}

    def step_peaks(self) -> pd.Series:
        """Largest live bytes of each step (index: step number)."""
        return self.peaks().groupby("step")["peak_bytes"].max()

    def to_dict(self) -> dict[str, Any]:
        """Plain dict; the frame as records."""
        d = asdict(self)
        d["frame"] = self.frame.to_dict("records")
        return d


def live_training_steps(config: TransformerConfig, setup: Setup, device: torch.device | str = "cpu", *,
                        steps: int = 2, seed: int = 0, lr: float = 1e-4) -> LiveSteps:
    """Train ``config`` under ``setup`` for ``steps`` steps and count live tensor bytes at every op.

    Each step is :func:`memlab.model.step.train_step` of :func:`memlab.model.step.build_training`'s step, as in
    :func:`memlab.run.runner.run_step`: ``setup.optimizer_impl`` picks the optimizer's implementation (``for-loop``:
    one parameter's scratch at a time, torch's default on a CPU; ``foreach``: torch's multi-tensor step, the
    default when every parameter is on CUDA, whose scratch is sized like all the parameters together),
    ``setup.zero_grad_to_none`` what ``zero_grad`` does; setups one process cannot run are refused alike.
    """
    if not isinstance(steps, int) or steps < 1:
        raise SetupError(f"steps must be a positive integer, got {steps!r}")
    if setup.mode != "train":
        raise SetupError("live_training_steps follows training steps; use run_step for inference")
    dev = resolve_device(device)
    model, step = build_training(config, setup, dev, seed=seed, lr=lr)
    idx, tgt = token_batch(config.vocab_size, setup.batch, setup.seq, dev, seed)
    with LiveBytes() as live:
        params = live.track(model.parameters(), "params")
        holder = step.state_holder()
        extra = getattr(holder, "memlab_state_tensors", None)
        if callable(extra):  # fp32 master weights exist before the first step
            live.track((t for ts in extra().values() for t in ts), "master weights")
        meter = PhaseMeter(lambda i, name: live.phase(name, label=f"step {i}: {name}", step=i))
        for i in range(1, steps + 1):
            train_step(step, lambda: model(idx, tgt), meter=meter, label=i)
        live.mark("done")
    return LiveSteps(frame=live.frame(), params_bytes=params, peak_bytes=live.peak_bytes, peak_label=live.peak_label,
                     phases=tuple(live.phases))
