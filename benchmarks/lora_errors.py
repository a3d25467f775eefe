"""memlab's LoRA estimate against peft on generated configs: states and saved activations, exact or not.

Draws ``N`` configs (default 100) with a seeded sampler over families (Llama, Qwen2, Mistral, GPT-2: tiny shapes,
random init, nothing downloaded) x precision (fp32, bf16, fp32 under bf16 autocast) x attention (eager, SDPA) x
LoRA rank x target modules x dropout x batch x sequence, runs one real training step of each peft model on this CPU
(:func:`memlab.run.hf.run_hf` with ``lora=``) and compares params, grads, optimizer states and saved activations
with :func:`memlab.run.hf.predict_hf`, byte for byte. Prints one line per mismatch and the count; exits 1 on any.

Usage: ``python benchmarks/lora_errors.py [N] [SEED]``.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "predict" / "memory"))


def main(n: int = 100, seed: int = 0) -> int:
    warnings.filterwarnings("ignore")
    spec = importlib.util.spec_from_file_location("test_finetune", Path(sys.path[0]) / "test_finetune.py")
    tests = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(tests)  # type: ignore[union-attr]  # the one sampler, shared with the test
    from memlab.run.hf import predict_hf, run_hf

    rng, bad, start = random.Random(seed), 0, time.perf_counter()
    for _ in range(n):
        family, dtype, autocast, attn, batch, seq, setup = tests._draw(rng)
        tc, m = run_hf({"model_type": family, **tests.FAMILIES[family]}, attn_implementation=attn, dtype=dtype,
                       batch=batch, seq=seq, autocast=autocast, lora=setup)
        measured = {"activations": m.saved_bytes, "params": m.params_bytes, "grads": m.grads_bytes,
                    "optimizer": m.optimizer_bytes}
        predicted = predict_hf(tc, m)
        if predicted != measured:
            bad += 1
            print(f"MISS {family} {dtype}{' amp' if autocast else ''} {attn} b={batch} s={seq} r={setup.lora_r} "
                  f"targets={setup.lora_targets} dropout={setup.lora_dropout}: measured - predicted = "
                  f"{ {k: measured[k] - predicted[k] for k in measured if measured[k] != predicted[k]} }")
    print(f"LoRA on peft: {n - bad}/{n} generated configs exact (states and saved activations), seed {seed}, "
          f"{time.perf_counter() - start:.0f} s")
    qbad, nq = 0, max(1, n // 5)
    for _ in range(nq):  # QLoRA: bitsandbytes' NF4 on the CPU, nn.Linear families
        family = rng.choice(["llama", "qwen2", "mistral"])
        targets = ",".join(k for k in ("q", "k", "v", "o", "gate", "up", "down") if rng.random() < 0.5) or "q"
        setup = tests.Setup(finetune="qlora", precision="bf16", lora_rank=rng.choice([2, 4, 8]), lora_targets=targets,
                            lora_dropout=rng.choice([0.0, 0.1]))
        attn = rng.choice(["eager", "sdpa"])
        tc, m = run_hf({"model_type": family, **tests.FAMILIES[family]}, attn_implementation=attn, dtype="bf16",
                       batch=rng.choice([1, 2]), seq=rng.choice([8, 16]), lora=setup)
        measured = {"activations": m.saved_bytes, "params": m.params_bytes, "grads": m.grads_bytes,
                    "optimizer": m.optimizer_bytes}
        if predict_hf(tc, m) != measured:
            qbad += 1
            print(f"MISS qlora {family} targets={targets}: measured {measured}, predicted {predict_hf(tc, m)}")
    print(f"QLoRA on bitsandbytes + peft: {nq - qbad}/{nq} generated configs exact")
    return int(bad + qbad > 0)


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:3])))
