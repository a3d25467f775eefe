"""Does the inference formula equal the trace of the same setup? Generated shapes, prefill and decode.

:func:`draw_inference` samples a reference GPT (gelu or swiglu, learned or rotary positions, multi-head or grouped
KV heads, one to three blocks, any d_ff and vocabulary) and an inference :class:`~memlab.predict.spec.setup.Setup`
(batch, seq, weights, ``kv_cache`` dynamic or static, ``logits_to_keep`` 0, 1 or a few) from a seed;
:func:`compare_inference` predicts it (:func:`memlab.predict.estimate.estimate`, CPU widths) and traces it
(:func:`memlab.tracing.gpt.trace_gpt`: fake tensors, the reference GPT's prefill of ``seq - 1`` tokens and one
decode step), phase by phase. Under a fused kernel the formula claims equality, under eager or math attention a
lower bound (:mod:`memlab.predict.memory.inference`); tests/predict/memory/test_inference.py and
benchmarks/inference_vs_trace.py check both.
"""

from __future__ import annotations

import random
from typing import Any

from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup


def draw_inference(seed: int, attention: str = "flash") -> tuple[TransformerConfig, Setup]:
    """A generated (config, inference setup) pair for ``seed``, with ``attention`` as the kernel."""
    rng = random.Random(seed)
    base = preset(rng.choice(["tiny-gpt", "tiny-llama"]))
    heads, hd = rng.choice([2, 4]), rng.choice([8, 16])
    kv = rng.choice([h for h in (1, 2, 4) if heads % h == 0])
    cfg = base.with_(n_layers=rng.choice([1, 2, 3]), n_heads=heads, n_kv_heads=kv if base.n_kv_heads else None,
                     d_model=heads * hd, d_ff=rng.choice([8, 16, 48, 96, 200]), vocab_size=rng.choice([64, 512, 3000]),
                     name=f"draw-{seed}")
    seq = rng.choice([2, 5, 17, 40])
    weights = rng.choice(["fp32", "bf16"])
    setup = Setup(mode="inference", batch=rng.choice([1, 2, 3]), seq=seq, attention=attention,
                  inference_weights=weights, kv_cache_dtype=weights, kv_cache=rng.choice(["dynamic", "static"]),
                  logits_to_keep=rng.choice([0, 1, min(3, seq)]))
    return cfg, setup


def compare_inference(config: TransformerConfig, setup: Setup) -> dict[str, Any]:
    """The predicted and the traced bytes of each phase (``prefill``, ``decode``), and the prefill's largest moment
    by the formula's name: ``{"predicted": {...}, "traced": {...}, "moment": name}``."""
    from memlab.predict.estimate import estimate
    from memlab.tracing.gpt import trace_gpt

    bd = estimate(config, setup, device_type="cpu")
    traced = {r.phase: r.peak_bytes for r in trace_gpt(config, setup).phases}
    return {"predicted": {r.phase: r.peak_bytes for r in bd.phases}, "traced": traced,
            "moment": max(bd.activation_detail, key=bd.activation_detail.get)}
