"""LoRA, QLoRA and frozen layers under transformers' checkpointing and gradient accumulation: the formula against
the trace of the same peft step (:func:`memlab.tracing.hf.trace_hf`), phase by phase, on seeded draws over the
shipped tiny Hugging Face configs.

Each draw picks a family, a fine-tuning kind (lora, qlora over an ``nn.Linear`` family, frozen bottom blocks over
an untied head), precision (fp32, bf16, amp-bf16 where the kind allows), LoRA rank, targets and dropout, and runs
the four combinations recompute ``none``/``full`` x ``grad_accum_steps`` 1/2. Every phase of both steps is judged as
the other agreement studies judge it (:func:`memlab.compare.agreement.gap_verdict`: ``within`` 0.1 %, ``named``
inside the terms the estimate names for that phase, ``off``), and the saved activations (the trace's end of forward)
checked to be one micro-batch's under accumulation. The plain step (``none`` x 1) is the baseline the LoRA tests
accept (states and saved activations against a real peft step); a phase that is ``off`` there (QLoRA's dequantised
weight, counted in every phase for CUDA's kernel; a family the LoRA tests do not measure) is counted apart as
``inherited`` in the other combinations, and only a new ``off`` fails the run.

Usage: ``python benchmarks/finetune_recompute.py [--draws 4] [--seed 0]`` (four traces a draw, 5-15 s a draw on two
cores). Prints one line per combination (verdict counts) and every new ``off`` phase; exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import warnings
from collections import Counter
from typing import Any

FAMILIES = ("llama", "qwen2", "mistral", "stablelm", "gpt2", "gemma", "qwen3")
"""Tiny configs (memlab/predict/families/configs/tiny) the draws pick from: the families the LoRA tests measure with
peft and more (Phi-3 is left out: its fused ``gate_up_proj`` under a LoRA target is off in the plain step already)."""
_LINEAR = ("llama", "qwen2", "mistral", "stablelm", "gemma", "qwen3")
"""Families whose blocks are ``nn.Linear`` (QLoRA quantises those) and have separate q, k, v, gate, up, down."""
COMBOS = (("none", 1), ("full", 1), ("none", 2), ("full", 2))


def draw(rng: random.Random, configs: dict[str, dict]) -> tuple[str, dict[str, Any]]:
    """One (family, Setup keywords) draw without recompute or accumulation (:data:`COMBOS` adds them)."""
    kind = rng.choice(("lora", "lora", "qlora", "frozen"))
    names = {"qlora": _LINEAR, "frozen": tuple(f for f in FAMILIES if configs[f].get("tie_word_embeddings") is False
)}.get(kind, FAMILIES)
    family = rng.choice(sorted(names))
    kw: dict[str, Any] = {"batch": rng.choice([1, 2]), "seq": rng.choice([16, 32]), "finetune": kind,
                          "attention": rng.choice(["eager", "math", "flash"])}  # flash: the library default
    if kind == "frozen":
        return family, {**kw, "frozen_layers": 1, "precision": rng.choice(["fp32", "bf16", "amp-bf16"])}
    kinds = ["q", "k", "v", "o", "gate", "up", "down"] if family in _LINEAR else ["q", "o", "up", "down"]
    targets = ",".join(k for k in kinds if rng.random() < 0.5) or rng.choice(kinds)
    precision = "bf16" if kind == "qlora" else rng.choice(["fp32", "bf16", "amp-bf16"])
    return family, {**kw, "precision": precision, "lora_rank": rng.choice([2, 4, 8]), "lora_targets": targets,
                    "lora_dropout": rng.choice([0.0, 0.1])}


def judge(config: dict, kw: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per combination: ``phases`` {(step, phase): (estimate, trace, verdict)} and ``saved`` (estimate - trace of the
    saved activations, bytes)."""
    from memlab.compare.agreement import gap_verdict
    from memlab.model.hf import hf_config
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf
    from memlab.predict.spec.setup import Setup
    from memlab.tracing.hf import trace_hf

    out = {}
    for recompute, accum in COMBOS:
        setup = Setup(**kw, recompute=recompute, grad_accum_steps=accum)
        traced = trace_hf(hf_config(dict(config)), setup, device_type="cpu")
        bd = estimate(from_hf(dict(config)), setup, device_type="cpu")
        est = {(r.step, r.phase): r.held_bytes for r in bd.phases}
        phases = {}
        for r in traced.phases:
            if r.reliable:
                e = est[(r.step, r.phase)]
                named = [n for n in bd.named_terms if n.applies(r.phase)]
                phases[(r.step, r.phase)] = (e, r.held_bytes, gap_verdict(e, r.held_bytes, named))
        out[(recompute, accum)] = {"phases": phases,
                                   "saved": bd.components()["activations"] - traced.components()["activations"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from memlab.course.hf_configs import load_config

    configs = {f: dict(load_config(f)) for f in FAMILIES}
    rng, start = random.Random(args.seed), time.perf_counter()
    counts: dict[tuple[str, int], Counter] = {c: Counter() for c in COMBOS}
    saved, offs = Counter(), []
    for _ in range(args.draws):
        family, kw = draw(rng, configs)
        label = f"{family} " + " ".join(f"{k}={v}" for k, v in kw.items() if k not in ("batch", "seq")) \
            + f" b={kw['batch']} s={kw['seq']}"
        res = judge(configs[family], kw)
        plain = res[("none", 1)]
        for combo, r in res.items():
            # the trace's activations hold the step's ids and labels besides what is saved: compare the effect
            saved["exact" if combo[0] == "none" or r["saved"] == res[(combo[0], 1)]["saved"] else "off"] += 1
            for key, (e, t, verdict) in r["phases"].items():
                base = plain["phases"].get((key[0], key[1].replace(" (accumulating)", "")))
                inherited = verdict == "off" and base is not None and base[2] == "off"
                counts[combo]["inherited" if inherited else verdict] += 1
                if verdict == "off" and not inherited:
                    offs.append(f"off: recompute={combo[0]} accum={combo[1]} {key[0]} {key[1]} estimate {e:,} trace "
                                f"{t:,} ({(e - t) / t:+.2%}): {label}")
    print(f"{args.draws} draws of lora/qlora/frozen, each with checkpointing x accumulation, vs trace_hf, seed "
          f"{args.seed}, {time.perf_counter() - start:.0f} s")
    for combo in COMBOS:
        c = counts[combo]
        print(f"  recompute={combo[0]:4s} grad_accum_steps={combo[1]}: phases within {c['within']}, named "
              f"{c['named']}, off {c['off']} (+ {c['inherited']} off where the plain step is off too)")
    print(f"  saved activations under accumulation equal to one micro-batch's: {saved['exact']} exact, "
          f"{saved['off']} off")
    for line in offs:
        print(line)
    return 1 if offs or saved["off"] else 0


if __name__ == "__main__":
    sys.exit(main())
