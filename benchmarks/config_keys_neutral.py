"""The config keys memlab.predict.families.keys calls memory-neutral "traced equal", and the refused ones it sizes,
checked by tracing each family's tiny config with the key changed (issue 17, point 1).

For each (family, key change) the step is traced on fake tensors (:func:`memlab.tracing.hf.trace_hf`, bf16, batch 2,
seq 64, eager attention) and the peak is compared with the unchanged config's. A "neutral" change must give the
same peak to the byte; a "refused" one is printed with its difference (the sizes the accounts quote). A trace that
cannot run on fake tensors (data-dependent code, e.g. rope_type dynamic, OPT's layerdrop) is printed as such.

The parameter counts under every key (flipped alone and drawn jointly) are checked against the real model by
``benchmarks/config_key_counts.py``.

Usage: ``python benchmarks/config_keys_neutral.py [--family F ...]`` (about 2 s a trace; all families: a few
minutes on a loaded 2-core machine). Exit status 1 when a neutral change moved the peak.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memlab.predict.spec.setup import Setup
from memlab.tracing.hf import trace_hf

TINY = Path(__file__).resolve().parents[1] / "memlab" / "predict" / "families" / "configs" / "tiny"
COMMON_NEUTRAL: list[dict[str, Any]] = [
    {"use_cache": False}, {"use_cache": True}, {"chunk_size_feed_forward": 16}, {"is_encoder_decoder": True},
    {"dtype": "float16"}, {"pad_token_id": 0}, {"bos_token_id": 3}, {"initializer_range": 0.5},
    {"problem_type": "regression"}, {"id2label": {"0": "a"}},
]
ROPE_NEUTRAL: list[dict[str, Any]] = [
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                         "original_max_position_embeddings": 64}},
    {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
]
NEUTRAL: dict[str, list[dict[str, Any]]] = {
    "gpt2": [{"summary_type": "mean"}, {"summary_use_proj": False}, {"layer_norm_epsilon": 0.1}],
    "opt": [{"activation_dropout": 0.5}, {"init_std": 0.5}],
    "gpt_neox": [{"classifier_dropout": 0.5}, {"is_decoder": False}, {"layer_norm_eps": 0.1}],
    "phi": [{"layer_norm_eps": 0.1}],
    "llama": [{"pretraining_tp": 2}, {"rms_norm_eps": 0.1}, *ROPE_NEUTRAL],
    "mistral": [{"sliding_window": 16}, {"rms_norm_eps": 0.1}],  # eager: the same (b, 1, s, s) mask
    "qwen2": [{"max_window_layers": 1}, {"rms_norm_eps": 0.1}],
    "gemma": [{"rms_norm_eps": 0.1}, ROPE_NEUTRAL[1], {"hidden_activation": "relu"}],
}
REFUSED: dict[str, list[dict[str, Any]]] = {
    "gpt2": [{"add_cross_attention": True}, {"reorder_and_upcast_attn": True}],
    "opt": [{"layer_norm_elementwise_affine": False}, {"layerdrop": 0.5}],
    "gpt_neox": [{"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}],
    "phi": [{"qk_layernorm": True}],
    "llama": [{"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
              {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                                   "long_factor": [2.0] * 8, "original_max_position_embeddings": 32}}],
    "qwen2": [{"use_sliding_window": True, "sliding_window": 16}],
    "gemma": [{"use_bidirectional_attention": True}],
}


def _peak(config: dict[str, Any]) -> int | str:
    try:
        return trace_hf(config, Setup(batch=2, seq=64, precision="bf16", attention="eager")).peak_bytes
    except Exception as exc:  # a trace that cannot run on fake tensors: reported, not fatal
        return f"cannot trace: {str(exc)[:100]}"


def main(argv: list[str] | None = None) -> int:
    """Trace every change and print its peak difference; 1 when a neutral change moved the peak."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=sorted(NEUTRAL))
    args = parser.parse_args(argv)
    moved = 0
    for family in args.family or sorted(NEUTRAL):
        base = json.loads((TINY / f"{family}.json").read_text())
        ref = _peak(base)
        print(f"{family}: peak {ref:,} B")
        for kind, changes in (("neutral", COMMON_NEUTRAL + NEUTRAL[family]), ("refused", REFUSED.get(family, []))):
            for change in changes:
                got = _peak({**base, **change})
                diff = got if isinstance(got, str) else f"{got - ref:+,} B"
                bad = kind == "neutral" and got != ref
                moved += bad
                print(f"  {kind:<8}{json.dumps(change)[:80]:<82}{diff}{'  <- NOT NEUTRAL' if bad else ''}")
    print(f"{moved} neutral change(s) moved the peak")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
