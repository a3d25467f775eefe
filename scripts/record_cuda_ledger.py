"""Record the CUDA ledger on a real GPU: prediction vs exact accounting vs the allocator, with provenance.

Runs 10 configs of the reference GPT on ``cuda`` with :func:`memlab.run.runner.run_step`, compares each with
:func:`memlab.compare.ledger.compare` (estimator told ``device_type="cuda"``) and writes, into ``--out`` (default
``data/recorded``):

- ``cuda_ledger.csv``: every ledger row (params, grads, optimizer, activations by category, the modelled total,
  ``max_memory_allocated`` and the residual rows the estimator does not model);
- ``cuda_ledger.json``: provenance (GPU, driver, CUDA, torch, memlab commit, date) and the raw measurements.

These files are data recorded on that GPU; chapters show them labelled as such and never regenerate them on a
CPU. Usage (on a machine with a CUDA GPU): ``python scripts/record_cuda_ledger.py [--out DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from memlab.compare.ledger import compare, predict_for
from memlab.course.provenance import record_gpu_data, write_recorded
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.run.runner import run_step


def grid() -> list[tuple[object, Setup]]:
    """Ten configs: precision, attention kernel, recompute, GQA/SwiGLU and inference, at sizes that take seconds."""
    gpt2, medium = preset("gpt2"), preset("gpt2-medium")
    llama = preset("tiny-llama").with_(name="llama-style-350m", d_model=1024, n_layers=12, n_heads=16,
                                       n_kv_heads=4, d_ff=2816, vocab_size=32000, max_seq=2048)
    return [
        (gpt2, Setup(batch=8, seq=1024, precision="fp32", attention="eager")),
        (gpt2, Setup(batch=8, seq=1024, precision="amp-bf16", attention="eager")),
        (gpt2, Setup(batch=8, seq=1024, precision="amp-bf16", attention="flash")),
        (gpt2, Setup(batch=8, seq=1024, precision="amp-bf16", attention="eager", recompute="selective")),
        (gpt2, Setup(batch=8, seq=1024, precision="amp-bf16", attention="flash", recompute="full")),
        (gpt2, Setup(batch=8, seq=1024, precision="mixed-bf16", attention="flash")),
        (medium, Setup(batch=4, seq=1024, precision="amp-bf16", attention="efficient")),
        (llama, Setup(batch=4, seq=2048, precision="bf16", attention="flash")),
        (llama, Setup(batch=4, seq=2048, precision="mixed-bf16", optimizer="adam-8bit", attention="flash")),
        (medium, Setup(batch=16, seq=1024, mode="inference", inference_weights="bf16", kv_cache_dtype="bf16",
                       attention="flash")),
    ]


def record(out: Path) -> None:
    """Run the grid on ``cuda`` and write the ledger with its provenance and the raw measurements."""
    tables, raw = [], []
    for cfg, setup in grid():
        m = run_step(cfg, setup, "cuda", steps=3)
        raw.append(m.to_dict())
        tables.append(compare(predict_for(cfg, m), m, activations_detail=True))
        print(f"{cfg.name} {setup.precision} {setup.attention} {setup.recompute} {setup.mode}: {m.status}", flush=True)
    write_recorded(out, "cuda_ledger", pd.concat(tables, ignore_index=True), {"measurements": raw})


if __name__ == "__main__":
    sys.exit(record_gpu_data(__doc__, record))
