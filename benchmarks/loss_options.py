"""The loss options (chunked, fused, logits_to_keep) and activation offload, traced beside the estimate, phase by phase:
the reference GPT over a seeded grid, and the shipped tiny Hugging Face configs (transformers' models built from
them, :func:`memlab.tracing.hf.trace_hf`). For HF models the estimator's plain step is itself not exact in every
phase (its traits are checked on saved activations, tests/run/test_hf.py), so each option's row also shows its
*effect*: (traced option - traced plain) - (predicted option - predicted plain), the error of the option alone.

``python benchmarks/loss_options.py [--families llama,gpt2,...] [--grid N]``; bytes throughout.
"""

from __future__ import annotations

import argparse
import random
import warnings

OPTIONS = ({}, {"logits_to_keep": 5}, {"loss": "chunked"}, {"loss": "fused"}, {"offload_activations": True})


def _phases(trace, est) -> dict[str, tuple[int, int]]:
    return {r.phase: (r.held_bytes, est.phase_bytes(r.phase, r.step)) for r in trace.phases if r.step == "steady"}


def hf_rows(families: list[str]) -> list[dict]:
    from memlab.course.hf_configs import load_config
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf
    from memlab.predict.spec.setup import Setup
    from memlab.tracing.hf import trace_hf

    rows = []
    for fam in families:
        raw = load_config(fam)
        cfg = from_hf(raw)
        base = None
        for kw in OPTIONS:
            st = Setup(batch=2, seq=32, **kw)
            ph = _phases(trace_hf(raw, st, device_type="cpu"), estimate(cfg, st, device_type="cpu"))
            base = base or ph
            for phase, (tr, pr) in ph.items():
                btr, bpr = base[phase]
                rows.append({"model": f"hf:{fam}", "option": str(kw or "plain"), "phase": phase,
                             "traced - predicted": tr - pr, "effect error": (tr - btr) - (pr - bpr)})
    return rows


def gpt_rows(n: int, seed: int = 0) -> list[dict]:
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.model import TransformerConfig
    from memlab.predict.spec.setup import Setup
    from memlab.tracing.gpt import trace_gpt

    rng, rows = random.Random(seed), []
    for _ in range(n):
        cfg = TransformerConfig(d_model=rng.choice([32, 64]), n_layers=rng.choice([1, 2]), n_heads=4,
                                vocab_size=rng.randrange(1000, 8000), max_seq=128, dropout=0.0,
                                tied_embeddings=rng.random() < 0.5)
        kw = dict(rng.choice(OPTIONS))
        st = Setup(batch=rng.choice([1, 2, 3]), seq=rng.choice([16, 32, 64]),
                   precision=rng.choice(["fp32", "bf16", "mixed-bf16"]), **kw)
        for phase, (tr, pr) in _phases(trace_gpt(cfg, st, device_type="cpu"), estimate(cfg, st, device_type="cpu")
                                       ).items():
            rows.append({"model": f"gpt h={cfg.d_model} L={cfg.n_layers} V={cfg.vocab_size}",
                         "option": str(kw or "plain"), "phase": phase, "traced - predicted": tr - pr,
                         "share of traced": (tr - pr) / tr})
    return rows


def main() -> None:
    import pandas as pd

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="llama,gpt2,qwen2")
    p.add_argument("--grid", type=int, default=12, help="reference-GPT setups drawn (seeded)")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    pd.set_option("display.width", 200)
    if args.grid:
        gpt = pd.DataFrame(gpt_rows(args.grid))
        print("reference GPT, steady step: traced - predicted (bytes)")
        print(gpt.pivot_table(index=["model", "option"], columns="phase", values="traced - predicted").to_string())
    hf = pd.DataFrame(hf_rows([f for f in args.families.split(",") if f]))
    print("\nHugging Face tiny configs, steady step: traced - predicted, and the option's effect error (bytes)")
    print(hf.pivot_table(index=["model", "option"], columns="phase",
                         values=["traced - predicted", "effect error"]).to_string())


if __name__ == "__main__":
    main()
