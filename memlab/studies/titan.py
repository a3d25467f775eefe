"""A peer in the shoot-out: torchtitan's memory estimator (its protocol and torch pieces, :mod:`memlab.tracing.peer`)
against memlab's estimate and trace of the same FSDP2 setup, step-2 peaks, every residual named.

:func:`titan_rows` runs, for one model and setup (made torchtitan's with :func:`memlab.tracing.peer.titan_setup`:
its wrapping plan, the loss outside the model, ``MixedPrecisionPolicy(bf16, fp32)``): the estimate
(:func:`memlab.predict.estimate.estimate`, CPU widths), memlab's trace (:func:`memlab.tracing.gpt.trace_gpt`) and the
peer (:func:`memlab.tracing.peer.titan_estimate`), and names what separates them:

- ``first sharding propagation``: the peer's printed maximum minus its step-2 peak, when positive: under fake tensors
  its first optimizer step counts DTensor's global-shape temporaries, as memlab's trace's first optimizer step does
  (there marked unreliable);
- ``clip_grad_norm_``: torchtitan's step clips gradients (``foreach``); memlab's step does not: the peer's step-2
  peak minus the trace's, when the clip runs at the peak;
- ``model code``: torchtitan's own Llama (its RMSNorm and attention save other tensors) cannot be imported on a
  CPU-only torch (``No module named 'triton'``), so the peer runs memlab's reference GPT: not measured.

:data:`TITAN_DEBUG` is torchtitan's ``debugmodel`` flavour as memlab's config; ``preset("llama-3-8b")`` its ``8B``.
:func:`recorded_titan` reads the full-size result ``scripts/record_titan_peer.py`` wrote (a CPU fake-tensor run,
shown as recorded, never as GPU evidence).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memlab.compare.tolerances import TOLERANCE
from memlab.predict.estimate import estimate
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

TITAN_DEBUG = TransformerConfig(name="titan-debugmodel", d_model=256, n_layers=6, n_heads=16, d_ff=768,
                                vocab_size=2048, max_seq=2048, mlp="swiglu", positions="rotary", norm="rmsnorm",
                                bias=False, tied_embeddings=False)
"""torchtitan v0.2.2 ``llama3_args["debugmodel"]``: dim 256, 6 layers, 16 heads, vocabulary 2048, SwiGLU hidden
``256 * ceil(int(2 * 4 * 256 / 3) / 256)`` = 768 (``FeedForward``), ``max_seq_len`` = its debug ``seq_len`` 2048."""

TITAN_SMALL = TransformerConfig(name="titan-small", d_model=64, n_layers=4, n_heads=4, d_ff=192, vocab_size=512,
                                max_seq=64, mlp="swiglu", positions="rotary", norm="rmsnorm", bias=False,
                                tied_embeddings=False)
"""The debug model's kind (SwiGLU, RMSNorm, rotary, untied head) at width 64, 4 layers: small enough that the
FSDP2 moments are a large share of the peak (tests/predict/memory/test_fsdp.py, benchmarks/titan_peer.py)."""

RECORDED = Path(__file__).resolve().parents[2] / "data" / "recorded" / "titan_peer_cpu_trace.json"
"""Where ``scripts/record_titan_peer.py`` writes the full-size rows with their provenance."""


def titan_rows(config: TransformerConfig, setup: Setup) -> dict[str, Any]:
    """One row: the estimate's, the trace's and the peer's step-2 (steady) peaks, the peer's printed maximum, and
    the residuals (module docstring), bytes on rank 0."""
    from memlab.tracing.gpt import trace_gpt
    from memlab.tracing.peer import titan_estimate, titan_setup

    s = titan_setup(setup)
    bd = estimate(config, s, device_type="cpu")
    t = trace_gpt(config, s, device_type="cpu")
    peer = titan_estimate(config, s, device_type="cpu")
    steady = t.peak_of("steady")
    est = max(r.held_bytes for r in bd.phases if r.step == "steady")
    return {**_named_estimate_residual(config, s, bd, t, est - steady),
        "model": config.name, "setup": f"b{s.batch}x{s.seq} {s.attention} recompute {s.recompute} {s.optimizer}/"
        f"{s.optimizer_impl} FSDP2 x{s.world_size} torchtitan plan, bf16/fp32", "estimate_step2": est,
        "trace_step2": steady, "titan_step2": peer["step2"], "titan_printed_max": peer["printed_max"],
        "residual_first_sharding": max(0, peer["printed_max"] - peer["step2"]),
        "residual_clip_grad_norm": peer["step2"] - steady, "residual_estimate": est - steady,
    }


def _named_estimate_residual(config: TransformerConfig, setup: Setup, bd: Any, trace: Any, diff: int) -> dict[str, str]:
    """``estimate_named``: the terms the estimate names as left out
    (``bd.named_terms``: :func:`memlab.predict.coverage.named_terms`) on the phase of the trace's step-2 peak whose
    sign matches ``diff`` (estimate - trace), with their sizes; empty when ``diff`` is within :data:`TOLERANCE`
    (0.1 %) of the trace."""
    peak = trace.peak_of("steady")
    if abs(diff) <= TOLERANCE * peak:
        return {"estimate_named": ""}
    phase = next(r.phase for r in trace.phases if r.step == "steady" and r.held_bytes == peak)
    terms = [n for n in bd.named_terms if n.applies(phase) and (n.sign > 0) == (diff < 0)]
    return {"estimate_named": "; ".join(f"{n.name}: up to {n.sign * n.bytes:+,} B" for n in terms)
            or "not named by the estimate"}


def residual_names(row: dict[str, Any]) -> list[str]:
    """Sentences naming each residual of one :func:`titan_rows` row with its size (computed, for the chapters)."""
    from memlab.units import GiB

    named = row.get("estimate_named", "")
    out = [f"estimate - trace (step 2): {row['residual_estimate']:+,} B "
           f"({100 * row['residual_estimate'] / row['trace_step2']:+.3f} %)" + (f": {named}" if named else ""),
           f"peer step 2 - trace step 2: {row['residual_clip_grad_norm']:+,} B (torchtitan's clip_grad_norm_, "
           "which memlab's step does not run; 0 when the clip is not at the peak)",
           f"peer printed maximum - peer step 2: {row['residual_first_sharding'] / GiB:+.3f} GiB (DTensor's first "
           "sharding propagation under fake tensors, in the first optimizer step)",
           "model code: the peer runs memlab's reference GPT (torchtitan's Llama does not import on a CPU-only "
           "torch: No module named 'triton'), so its RMSNorm/attention traits are not compared"]
    return out


def recorded_titan() -> dict[str, Any] | None:
    """The full-size rows and provenance ``scripts/record_titan_peer.py`` wrote, or None when absent."""
    if not RECORDED.exists():
        return None
    return json.loads(RECORDED.read_text())
