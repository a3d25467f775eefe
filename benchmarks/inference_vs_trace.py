"""Inference as generate() runs it (issue 34 point 4): the formula's prefill and decode against the reference GPT's
trace of the same setup, on generated shapes (memlab.studies.inference_draws).

For each draw: the model's shape, the setup (batch x seq, weights, KV cache kind, kept logits), the prefill's
largest moment by the formula, and predicted - traced for each phase, in bytes. Fused attention (flash): the
formula claims equality (0). Eager: a lower bound (<= 0). Prints the counts: exact, below (a bound that holds),
above (a bound that fails: a bug).

``python benchmarks/inference_vs_trace.py [--draws 24] [--eager 8]``; CPU, fake tensors, a few seconds.
"""

from __future__ import annotations

import argparse

from memlab.studies.inference_draws import compare_inference, draw_inference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=24, help="generated setups under the flash kernel")
    ap.add_argument("--eager", type=int, default=8, help="generated setups under eager attention")
    a = ap.parse_args()
    counts = {"exact": 0, "below": 0, "above": 0}
    print(f"{'draw':>5} {'attn':5} {'L':>1} {'h':>3} {'ff':>3} {'V':>4} {'kv/h':>4} {'pos':7} {'b x s':>6} "
          f"{'w':4} {'cache':7} {'keep':>4} {'moment':16} {'prefill diff':>12} {'decode diff':>12}")
    for attention, n, offset in (("flash", a.draws, 0), ("eager", a.eager, 100)):
        for seed in range(offset, offset + n):
            cfg, s = draw_inference(seed, attention)
            out = compare_inference(cfg, s)
            diff = {p: out["predicted"][p] - out["traced"][p] for p in out["traced"]}
            for d in diff.values():
                counts["exact" if d == 0 else "below" if d < 0 else "above"] += 1
            print(f"{seed:>5} {attention:5} {cfg.n_layers:>1} {cfg.d_model:>3} {cfg.ffn:>3} {cfg.vocab_size:>4} "
                  f"{cfg.n_kv_heads or cfg.n_heads}/{cfg.n_heads:<2} {cfg.positions:7} {s.batch}x{s.seq:<4} "
                  f"{s.inference_weights:4} {s.kv_cache:7} {s.logits_to_keep:>4} {out['moment']:16} "
                  f"{diff['prefill']:>12,} {diff['decode']:>12,}")
    print(f"phases: {counts['exact']} exact, {counts['below']} below the trace (eager's lower bound), "
          f"{counts['above']} above it (a formula that claims too much)")


if __name__ == "__main__":
    main()
