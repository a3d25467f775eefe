"""TP, SP, PP and CP side by side for one model: the per-rank bytes of each layout, chapter-ready.

:func:`parallel_layouts` runs the estimator (:func:`memlab.predict.estimate.estimate` for tp/sp/ZeRO on one rank,
:func:`memlab.predict.parallel.parallel_estimate` for pp/cp, its worst rank) over a list of layouts and returns one
DataFrame row each: model states, saved activations, buffers and the peak, so a chapter section ("when DP cannot
shrink activations") can show that ZeRO shrinks the states but not the activations, while TP+SP, PP and CP do.
"""

from __future__ import annotations

from typing import Any

from memlab.errors import SetupError
from memlab.predict.estimate import estimate
from memlab.predict.models import TransformerConfig
from memlab.predict.parallel import parallel_estimate
from memlab.predict.setup import Setup
from memlab.units import GiB

DEFAULT_LAYOUTS: tuple[dict[str, Any], ...] = (
    {},
    {"zero_stage": 3, "world_size": 8},
    {"tp": 8},
    {"tp": 8, "sp": True},
    {"pp": 8, "micro_batches": 8},
    {"pp": 8, "micro_batches": 8, "pp_schedule": "gpipe"},
    {"cp": 8},
)
"""Eight ranks spent five ways (and one rank): ZeRO-3, TP, TP+SP, PP under 1F1B and GPipe, CP."""


def parallel_layouts(config: TransformerConfig, setup: Setup, layouts: tuple[dict[str, Any], ...] = DEFAULT_LAYOUTS,
                     *, device_type: str = "cuda") -> Any:
    """One row per layout (``setup`` with the layout's fields): ``layout``, ``ranks`` (the devices it spends),
    ``states_bytes``, ``activations_bytes``, ``buffers_bytes``, ``peak_bytes`` on the worst rank, ``peak_gib``.

    The single-rank rows (no pp/cp) are :func:`~memlab.predict.estimate.estimate`'s: peak over its phases, buffers 0.
    A layout the estimator refuses raises its one-line :class:`~memlab.errors.SetupError`."""
    import pandas as pd

    if not isinstance(setup, Setup):
        raise SetupError(f"setup must be a memlab.predict.setup.Setup, got {type(setup).__name__}")
    rows = []
    for fields in layouts:
        s = setup.with_(**fields)
        label = ", ".join(f"{k}={v}" for k, v in fields.items()) or "one rank"
        ranks = s.tp * s.pp * s.cp * s.world_size
        if s.pp > 1 or s.cp > 1:
            worst = parallel_estimate(config, s, device_type=device_type).worst
            states, acts, bufs, peak = worst.states_bytes, worst.activations_bytes, worst.buffers_bytes, \
                worst.peak_bytes
        else:
            bd = estimate(config, s, device_type=device_type)
            states, acts, bufs, peak = bd.model_state_bytes(), bd.activations_bytes, 0, bd.peak_bytes
        rows.append({"layout": label, "ranks": ranks, "states_bytes": states, "activations_bytes": acts,
                     "buffers_bytes": bufs, "peak_bytes": peak, "peak_gib": peak / GiB})
    return pd.DataFrame(rows)
