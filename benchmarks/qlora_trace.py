"""QLoRA at full size on fake tensors (issue 18): a Llama-2-7B-shaped model, NF4 base with double quantisation
under peft LoRA adapters, traced (memlab.tracing.hf.trace_hf, bitsandbytes' fake kernels:
memlab.model.hf.fake_params4bit) and estimated (memlab.predict.estimate), component by component and phase by phase.

What is what: the trace is exact for bitsandbytes' Python-level path (packed weights, absmax, nested absmax and
codes, LoRA params, grads, optimizer states, activations, the dequantised bf16 weight in MatMul4Bit's backward);
a CUDA ``gemm_4bit`` forward dequantises inside its kernel, which no trace sees: the estimate's named overhead
``qlora_dequantised_weight`` (added to every phase) is the one term that is predicted only, with paged optimizers
(CUDA unified memory; counted as resident). Usage: ``python benchmarks/qlora_trace.py [--seq S] [--rank R]``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from memlab.model.hf import hf_config
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.spec.setup import Setup
from memlab.tracing.hf import trace_hf

LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096}
"""Llama-2-7B's shape (Llama 2 [touvron2023]; meta-llama/Llama-2-7b-hf's config.json), built from it: no download."""


def main(argv: list[str] | None = None) -> int:
    """Trace and estimate one QLoRA step; print the components, each phase and their differences (bytes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args(argv)
    setup = Setup(batch=1, seq=args.seq, finetune="qlora", precision="bf16", attention="flash",
                  lora_rank=args.rank, lora_targets="q,k,v,o,gate,up,down", optimizer="adamw",
                  optimizer_impl="foreach")
    start = time.perf_counter()
    traced = trace_hf(hf_config("llama", **LLAMA2_7B), setup, device_type="cpu")
    took = time.perf_counter() - start
    bd = estimate(from_hf({"model_type": "llama", **LLAMA2_7B}), setup, device_type="cpu")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"traced on fake tensors in {took:.0f} s, max RSS {rss:.2f} GiB")
    tc, pc = traced.components(), bd.components()
    for k in ("params", "grads", "optimizer", "activations"):
        print(f"{k:<12} traced {tc[k]:>16,} predicted {pc[k]:>16,} diff {pc[k] - tc[k]:+,} B")
    dq = bd.overhead.get("qlora_dequantised_weight", 0)
    print(f"predicted only: qlora_dequantised_weight {dq:,} B (in every estimated phase below)")
    for r in traced.phases:
        e = bd.phase_bytes(r.phase, r.step) - dq
        print(f"{r.step:>6} {r.phase:<16} traced {r.held_bytes:>16,} predicted-less-overhead {e:>16,} "
              f"diff {e - r.held_bytes:+,} B ({100 * (e - r.held_bytes) / r.held_bytes:+.3f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
