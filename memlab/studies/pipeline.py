"""Pipeline ranks counted next to their prediction: torch.distributed.pipelining's schedules run on a fake group
(:func:`memlab.tracing.pipeline.run_stage_step`), every live storage counted
(:class:`memlab.measure.live_bytes.LiveBytes`), against :func:`memlab.predict.parallel.pipeline.parallel_estimate` rank
by rank.

What holds (tests/studies/test_pipeline_trace.py, two shapes, both schedules, both ranks of two): the bytes a rank
holds after the step equal the prediction's ``end_bytes``; under GPipe the peak grows by exactly the predicted
bytes per micro-batch; the predicted peak is a bound whose slack is named: the gradients not yet allocated at the
peak moment (the end of the forwards, or early in the first backward) and one block's or the loss's backward
temporaries as the estimator bounds them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from memlab.predict.parallel.pipeline import parallel_estimate
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup


@dataclass(frozen=True)
class StageTrace:
    """Bytes one pipeline rank held in one step (storages, as LiveBytes counts them), with its prediction."""

    rank: int
    params_bytes: int
    peak_bytes: int
    """The most held at once during the step (parameters included)."""
    end_bytes: int
    """Held after the step: parameters, gradients and the schedule's kept buffers."""
    predicted_peak_bytes: int
    predicted_end_bytes: int

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a DataFrame row)."""
        return asdict(self)


def trace_stage(config: TransformerConfig, setup: Setup, rank: int = 0) -> StageTrace:
    """Run pipeline rank ``rank``'s step (:func:`memlab.tracing.pipeline.run_stage_step`) and count it."""
    from memlab.measure.live_bytes import LiveBytes
    from memlab.tracing.pipeline import run_stage_step

    row = parallel_estimate(config, setup, device_type="cpu").rows[rank] if 0 <= rank < setup.pp else None
    box: dict[str, int] = {}

    @contextlib.contextmanager
    def meter(module: Any) -> Iterator[LiveBytes]:
        box["params"] = sum(q.untyped_storage().nbytes() for q in {id(q): q for q in module.parameters()}.values())
        with LiveBytes(sample_every=None) as live:
            live.track(module.parameters(), label="params")
            yield live
            box["end"] = live.live_bytes  # read here: the stage and its buffers are freed once the step returns

    live = run_stage_step(config, setup, rank, meter)
    assert row is not None  # run_stage_step refused any other rank
    return StageTrace(rank=rank, params_bytes=box["params"], peak_bytes=live.peak_bytes, end_bytes=box["end"],
                      predicted_peak_bytes=row.peak_bytes, predicted_end_bytes=row.end_bytes)
