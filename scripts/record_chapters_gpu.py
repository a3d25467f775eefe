"""Record chapters 01, 03 and 04's GPU-only results on a real GPU, with provenance, for ``ch.recorded(...)``.

Writes into ``--out`` (default ``data/recorded``), each as ``NAME.csv`` plus ``NAME.json`` (provenance: GPU,
driver, CUDA, torch, memlab commit, date):

- ``01_fragmentation_gpu``: :func:`memlab.measure.snapshot.fragmentation_probe` with the default allocator and
  with ``expandable_segments:True`` (status, allocated/reserved before the request, the OOM message);
- ``03_mixed_precision_gpu``: GPT-2 (b=8, s=1024) under fp32, amp-bf16, amp-fp16, mixed-bf16 and bf16 with
  AdamW: exact states, activations, allocator peaks, step time and tokens/s (:func:`memlab.run.runner.run_step`);
- ``04_activations_checkpointing_gpu``: a 16-block GPT-2 (b=2, s=1024) under none / selective / full / every-k /
  ``checkpoint_sequential``: bytes kept, allocator peak, FLOPs, time (:mod:`memlab.labs.checkpointing`).

These are data recorded on that GPU; the chapters show them labelled and never regenerate them on a CPU. Usage
(with a CUDA GPU): ``python scripts/record_chapters_gpu.py [--out DIR]``; ``scripts/gpu_session.sh`` runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from memlab.course.provenance import record_gpu_data, write_recorded
from memlab.labs.checkpointing import measure_checkpointing
from memlab.measure.snapshot import fragmentation_probe
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.run.runner import run_step


def fragmentation() -> pd.DataFrame:
    """The probe at a 2 GiB cap, without and with expandable segments."""
    rows = []
    for expandable in (False, True):
        r = fragmentation_probe(2 * 2**30, expandable_segments=expandable)
        before = r.get("before_request", {})
        rows.append({"expandable_segments": expandable, "status": r["status"], "request_bytes": r.get("request_bytes"),
                     "allocated_before_bytes": before.get("allocated"), "reserved_before_bytes": before.get("reserved"),
                     "message": r.get("message")})
    return pd.DataFrame(rows)


def mixed_precision() -> pd.DataFrame:
    """GPT-2 under five precision policies with AdamW."""
    rows = []
    for policy in ("fp32", "amp-bf16", "amp-fp16", "mixed-bf16", "bf16"):
        m = run_step(preset("gpt2"), Setup(batch=8, seq=1024, precision=policy), "cuda", steps=5,
                     with_counted_flops=False)
        rows.append({"policy": policy, **{k: v for k, v in m.to_row().items() if not isinstance(v, dict | list)}})
    return pd.DataFrame(rows)


def checkpointing() -> pd.DataFrame:
    """A 16-block GPT-2 under each checkpointing strategy."""
    deep = preset("gpt2").with_(n_layers=16)
    strategies = [("none", {}), ("selective", {}), ("full", {}), ("every-k", {"k": 2}), ("every-k", {"k": 4}),
                  ("sequential", {"segments": 2}), ("sequential", {"segments": 4}), ("sequential", {"segments": 16})]
    rows = [measure_checkpointing(deep, st, batch=2, seq=1024, device="cuda", timing_repeats=10, **kw).to_row()
            for st, kw in strategies]
    return pd.DataFrame(rows)


def record(out: Path) -> None:
    """Each table into ``out`` with its provenance."""
    for name, make in (("01_fragmentation_gpu", fragmentation), ("03_mixed_precision_gpu", mixed_precision),
                       ("04_activations_checkpointing_gpu", checkpointing)):
        frame = make()
        write_recorded(out, name, frame)
        print(f"{name}: {len(frame)} rows", flush=True)


if __name__ == "__main__":
    sys.exit(record_gpu_data(__doc__, record))
