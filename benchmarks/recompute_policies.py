"""Each recompute policy against the trace (issue 34 point 3): per policy, how many phases and peaks the estimate
gets within 0.1 % of memlab's fake-tensor trace of the reference GPT, named (inside the terms the estimate names),
or off; then transformers' saved bytes under the layer policy on real CPU steps of every tiny HF config.

Policies: none, selective (Korthikanti's attention core), full (every block), full with recompute_every 2 and 3
(torchtitan's layer policy) and op (torchtitan's per-op policy). Models: the CI-lab dense GPT, the GQA model with a
large vocabulary and tiny-llama; fp32, amp-bf16 and bf16; eager and flash attention. Estimates use CPU widths (the
traces run on CPU). The HF section builds each tiny config with 4 layers, checkpoints every 2nd layer
(memlab.model.hf.checkpoint_every) and compares the bytes saved for backward with the formula's; a family the
coverage table refuses under that setup is counted as refused.

Usage: ``python benchmarks/recompute_policies.py [--no-hf]``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import Counter

from memlab.errors import MemlabError
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.studies.setup_draws import _CI_MODELS, Draw, compare_draw

POLICIES = {"none": {}, "selective": {"recompute": "selective"}, "full": {"recompute": "full"},
            "full, every 2nd block": {"recompute": "full", "recompute_every": 2},
            "full, every 3rd block": {"recompute": "full", "recompute_every": 3}, "op": {"recompute": "op"}}
MODELS = {"dense": _CI_MODELS["dense"], "gqa-128k": _CI_MODELS["gqa-128k"], "tiny-llama": preset("tiny-llama")}


def trace_counts() -> None:
    """Print, per policy, the phases and peaks within / named / off over the model x precision x attention grid."""
    for policy, fields in POLICIES.items():
        start, phases, peaks, worst = time.perf_counter(), Counter(), Counter(), (0.0, "every phase exact")
        for (name, cfg), precision, attention in itertools.product(MODELS.items(), ("fp32", "amp-bf16", "bf16"),
                                                                   ("eager", "flash")):
            setup = Setup(batch=2, seq=64, precision=precision, attention=attention, optimizer_impl="for-loop",
                          **fields)
            for r in compare_draw(Draw(cfg, setup, name)):
                (peaks if r["phase"] == "peak" else phases)[r["verdict"]] += 1
                if abs(r["rel_diff"]) > abs(worst[0]):
                    worst = (r["rel_diff"], f"{r['step']} {r['phase']} of {name} {precision} {attention}".strip())
        print(f"{policy:<22} phases within {phases['within']}, named {phases['named']}, off {phases['off']}; peaks "
              f"within {peaks['within']}, named {peaks['named']}, off {peaks['off']}; worst {100 * worst[0]:+.3f} % "
              f"({worst[1]}); {time.perf_counter() - start:.0f} s")


def hf_counts(every: int = 2) -> None:
    """Print how many (family, attention) pairs save exactly the formula's bytes under recompute_every ``every``."""
    from memlab.course.hf_configs import config_names, load_config
    from memlab.model.hf import attention_implementations, build_hf_model, checkpoint_every
    from memlab.predict.coverage import refusal
    from memlab.predict.families.reader import from_hf
    from memlab.predict.memory.activations import activation_bytes
    from memlab.run.hf import measure_hf

    counts, off = Counter(), []
    for family in config_names():
        raw = dict(load_config(family))
        raw.update({k: 4 for k in ("num_hidden_layers", "n_layer") if k in raw})
        for attention in attention_implementations(raw):
            try:
                cfg = from_hf(dict(raw))
                model = build_hf_model(raw, attn_implementation=attention, gradient_checkpointing=True)
                checkpoint_every(model, every)
                m = measure_hf(model, batch=2, seq=16, attn_implementation=attention)
            except MemlabError:
                counts["unbuildable"] += 1
                continue
            setup = m.setup(cfg).with_(recompute_every=every)
            if refusal(cfg, setup, "cpu"):
                counts["refused"] += 1
                continue
            diff = sum(activation_bytes(cfg, setup, device_type="cpu").values()) - m.saved_bytes
            counts["exact" if diff == 0 else "off"] += 1
            if diff:
                off.append(f"{family} {attention} {diff:+,} B")
    print(f"transformers, recompute_every={every} (4 layers, CPU): saved bytes exact {counts['exact']}, off "
          f"{counts['off']}, refused {counts['refused']}" + (f" ({'; '.join(off)})" if off else ""))


def main(argv: list[str] | None = None) -> int:
    """Run the trace grid, then (unless ``--no-hf``) the transformers section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-hf", action="store_true", help="skip the real transformers steps")
    args = parser.parse_args(argv)
    trace_counts()
    if not args.no_hf:
        hf_counts()
    return 0


if __name__ == "__main__":
    sys.exit(main())
