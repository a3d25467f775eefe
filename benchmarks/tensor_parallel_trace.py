"""DTensor tensor parallelism traced on a fake process group (rank 0) against memlab's estimate, phase by phase.

The difference trace - estimate at tp > 1 is compared with the same difference at tp = 1 (what the estimator and the
trace already differ by without TP) plus the named terms of the traced plan (the embeddings, head and loss left
replicated: :func:`memlab.tracing.tensor_parallel.explained`): "left" is what no term explains (0 in forward and
backward on both shapes; the optimizer step and zero_grad are shown, not explained). Run: ``PYTHONPATH=. python
benchmarks/tensor_parallel_trace.py``.
"""

from __future__ import annotations

from memlab.predict.estimate import estimate
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup
from memlab.tracing.gpt import trace_gpt
from memlab.tracing.tensor_parallel import explained, replicated_terms, trace_gpt_tp

SHAPES = (preset("tiny-gpt"), TransformerConfig(name="tp-llama", d_model=96, n_layers=2, n_heads=4, n_kv_heads=2,
                                                 vocab_size=256, max_seq=64, mlp="swiglu", positions="rotary",
                                                 norm="rmsnorm", bias=False, tied_embeddings=False))


def phases(tr) -> dict[tuple[str, str], int]:
    return {(r.step, r.phase): r.peak_bytes for r in tr.phases}


def main() -> None:
    for cfg in SHAPES:
        base = Setup(batch=2, seq=64, optimizer="adamw")
        t1, e1 = phases(trace_gpt(cfg, base, device_type="cpu")), {(r.step, r.phase): r.peak_bytes for r in
                                                                   estimate(cfg, base, device_type="cpu").phases}
        setup = base.with_(tp=2)
        t2 = phases(trace_gpt_tp(cfg, setup, device_type="cpu"))
        e2 = {(r.step, r.phase): r.peak_bytes for r in estimate(cfg, setup, device_type="cpu").phases}
        named = replicated_terms(cfg, setup)
        print(f"\n{cfg.name}, tp=2 (rank 0), named: {named}")
        print(f"{'phase':<24}{'trace tp2':>12}{'est tp2':>12}{'resid tp2':>12}{'resid tp1':>12}{'tp effect':>10}"
              f"{'named':>10}{'left':>8}")
        for key in t2:
            r2, r1 = t2[key] - e2[key], t1[key] - e1[key]
            named = explained(cfg, setup, *key, device_type="cpu")
            left = "" if named is None else f"{r2 - r1 - named:,}"
            print(f"{' '.join(key):<24}{t2[key]:>12,}{e2[key]:>12,}{r2:>12,}{r1:>12,}{r2 - r1:>10,}"
                  f"{'' if named is None else f'{named:,}':>10}{left:>8}")


if __name__ == "__main__":
    main()
