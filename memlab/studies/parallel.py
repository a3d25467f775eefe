"""TP, SP, PP and CP side by side for one model: the per-rank bytes of each layout, chapter-ready.

:func:`parallel_layouts` runs the estimator (:func:`memlab.predict.estimate.estimate` for tp/sp/ZeRO on one rank,
:func:`memlab.predict.parallel.pipeline.parallel_estimate` for pp/cp, its worst rank) over a list of layouts and
returns one DataFrame row each: model states, saved activations, buffers and the peak, so a chapter section ("when DP
cannot
shrink activations") can show that ZeRO shrinks the states but not the activations, while TP+SP, PP and CP do.
"""

from __future__ import annotations

from typing import Any

from memlab.errors import SetupError
from memlab.predict.estimate import estimate
from memlab.predict.parallel.pipeline import parallel_estimate
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup
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
        raise SetupError(f"setup must be a memlab.predict.spec.setup.Setup, got {type(setup).__name__}")
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


LLAMA3_405B = TransformerConfig(name="llama-3-405b", d_model=16384, n_layers=126, n_heads=128, n_kv_heads=8,
                                d_ff=53248, vocab_size=128256, max_seq=131072, mlp="swiglu", positions="rotary",
                                norm="rmsnorm", bias=False, tied_embeddings=False)
"""Llama 3 405B [grattafiori2024, Table 3: 126 layers, model dimension 16,384, FFN dimension 53,248, 128 heads, 8
KV heads; vocabulary 128,256 as in meta-llama/Llama-3.1-405B config.json]."""

LLAMA3_405B_LAYOUTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("8,192-token pre-training (TP 8, CP 1, PP 16, DP 128)",
     {"seq": 8192, "tp": 8, "sp": True, "pp": 16, "cp": 1, "world_size": 128, "micro_batches": 16}),
    ("131,072-token long-context (TP 8, CP 16, PP 16, DP 8)",
     {"seq": 131072, "tp": 8, "sp": True, "pp": 16, "cp": 16, "world_size": 8, "micro_batches": 16}),
)
"""Two of the published 4D layouts [grattafiori2024, Table 4]; micro-batches per step: 16 (each data-parallel rank's
share of the paper's 16M-token batch at 8,192 tokens is 16 sequences, run as 16 micro-batches of one); the paper's
interleaved schedule with one layer fewer on the first and last stages is not modelled (126 blocks over 16 stages
give 8 to the first 14 and 7 to the last 2 here, under 1F1B); bf16 weights with fp32 gradients and master copy and
ZeRO-1-like sharding of the optimizer (the paper's FSDP does not reshard parameters after forward), flash attention,
no recompute."""


def llama3_405b_ranks(device_type: str = "cuda") -> Any:
    """Per pipeline rank of each :data:`LLAMA3_405B_LAYOUTS` layout: one DataFrame, a ``layout`` column added."""
    import pandas as pd

    base = Setup(batch=1, seq=8192, precision="mixed-bf16-fp32-grads", attention="flash", zero_stage=1)
    frames = []
    for label, fields in LLAMA3_405B_LAYOUTS:
        df = parallel_estimate(LLAMA3_405B, base.with_(**fields), device_type=device_type).to_frame()
        df.insert(0, "layout", label)
        df["peak_gib"] = df["peak_bytes"] / GiB
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
