"""Record the CUDA caching allocator on a real GPU beside memlab's model of it (issue 38), first in a GPU session.

For each step of :data:`STEPS` (the reference GPT's training step, two steps, with torch's default allocator
settings and with ``expandable_segments:True``): empty the cache, record the allocator's history
(:func:`memlab.measure.cuda.record_memory_history`), run the step (:func:`memlab.model.step.build_training` and
:func:`memlab.model.step.train_step`, the step every memlab caller runs), and write into ``--out``:

- ``allocator_snapshot_<name>.pickle``: ``torch.cuda.memory._snapshot()``, which pytorch.org/memory_viz opens and
  :func:`memlab.measure.snapshot.load_snapshot` reads with its restricted unpickler;
- ``allocator_replay.json``: per step, the GPU's ``max_memory_allocated`` / ``max_memory_reserved``, the model's
  segments replayed from the snapshot's own allocations beside torch's (:func:`memlab.measure.snapshot.segment_check`,
  byte for byte), and the model's replay of memlab's fake-tensor trace of the same step
  (:meth:`memlab.tracing.tracer.Trace.replay`), with the provenance (GPU, driver, CUDA, torch, memlab commit, date).

``--dry-run`` runs the plumbing on a CPU (the trace and its replay; no snapshot, ``measured`` null, the provenance
says CPU dry run): the tests run it, so the GPU session cannot fail on it. Without a GPU and without
``--dry-run`` it refuses in one line (GPU data is never recorded on a CPU).

Usage: ``python scripts/record_allocator_snapshot.py [--out DIR] [--dry-run]``; ``scripts/gpu_session.sh`` runs it
first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

STEPS: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    ("gpt2_fp32", "gpt2", {"batch": 4, "seq": 512, "precision": "fp32"}, ""),
    ("gpt2_fp32_expandable", "gpt2", {"batch": 4, "seq": 512, "precision": "fp32"}, "expandable_segments:True"),
    ("gpt2_ampbf16", "gpt2", {"batch": 4, "seq": 512, "precision": "amp-bf16", "attention": "flash"}, ""),
)
"""(name, preset, Setup fields, PYTORCH_CUDA_ALLOC_CONF): GPT-2 small, which fits every card a session lends."""

DRY_STEPS = (("tiny_fp32_expandable", "tiny-gpt", {"batch": 2, "seq": 32, "precision": "fp32"},
              "expandable_segments:True"),)
"""What ``--dry-run`` runs on a CPU: the same plumbing (a process per step) on the tiny reference GPT."""


def trace_replay(name: str, setup: Setup, alloc_conf: str) -> dict[str, Any]:
    """memlab's prediction of the step: the fake-tensor trace replayed through the allocator model (CUDA widths)."""
    from memlab.tracing.gpt import trace_gpt

    r = trace_gpt(preset(name), setup, device_type="cuda").replay(alloc_conf or None)
    return {"requested_peak_bytes": r.total.requested_bytes, "allocated_peak_bytes": r.total.active_bytes,
            "reserved_peak_bytes": r.total.reserved_bytes}


def gpu_parts() -> tuple[Any, ...]:
    """What :func:`record_step` calls, imported here so that ``--dry-run`` on a CPU imports it too."""
    import torch

    from memlab.measure.cuda import record_memory_history
    from memlab.measure.snapshot import segment_check
    from memlab.model.step import build_training, token_batch, train_step
    from memlab.predict.gpu.alloc_conf import parse_alloc_conf

    return torch, record_memory_history, segment_check, token_batch, build_training, train_step, parse_alloc_conf


def record_step(out: Path, label: str, name: str, setup: Setup, alloc_conf: str) -> dict[str, Any]:
    """Run two training steps on CUDA under ``alloc_conf`` with the allocator's history recorded; the snapshot's
    path, the GPU's peaks and the model's segment check. The allocator reads its settings once per process, so
    :func:`main` runs each step in a process of its own."""
    torch, record_memory_history, segment_check, token_batch, build_training, train_step, parse_alloc_conf = \
        gpu_parts()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    path = out / f"allocator_snapshot_{label}.pickle"
    dev = torch.device("cuda")
    with record_memory_history(path):
        model, step = build_training(preset(name), setup, dev)
        idx, tgt = token_batch(preset(name).vocab_size, setup.batch, setup.seq, dev, 0)
        for i in range(2):
            train_step(step, lambda: model(idx, tgt), label=i)
        torch.cuda.synchronize()
    measured = {"max_memory_allocated": torch.cuda.max_memory_allocated(),
                "max_memory_reserved": torch.cuda.max_memory_reserved()}
    check = segment_check(path, parse_alloc_conf(alloc_conf) if alloc_conf else None)
    return {"snapshot": path.name, "measured": measured, "segment_check": check}


def run_one(out: Path, label: str, name: str, fields: dict[str, Any], alloc_conf: str, dry_run: bool) -> dict:
    """One step's row of ``allocator_replay.json``."""
    setup = Setup(**fields)
    row: dict[str, Any] = {"step": label, "preset": name, "setup": fields, "alloc_conf": alloc_conf or "defaults",
                           "model_of_the_trace": trace_replay(name, setup, alloc_conf)}
    if dry_run:
        gpu_parts()
        row.update({"snapshot": None, "measured": None, "segment_check": None})
    else:
        row.update(record_step(out, label, name, setup, alloc_conf))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/recorded")
    parser.add_argument("--dry-run", action="store_true", help="the plumbing on a CPU: no snapshot, no measurement")
    parser.add_argument("--one", nargs=4, metavar=("LABEL", "PRESET", "FIELDS", "CONF"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:  # a child process: one step, its row on stdout
        label, name, fields, conf = args.one
        print(json.dumps(run_one(out, label, name, json.loads(fields), conf, args.dry_run)))
        return 0
    if not args.dry_run:
        from memlab.measure.cuda import cuda_unavailable_reason

        if (reason := cuda_unavailable_reason()) is not None:
            print(f"record_allocator_snapshot: GPU data is never recorded on a CPU, and {reason}; "
                  "--dry-run runs the plumbing", file=sys.stderr)
            return 2
    rows = [_child(out, *step, dry_run=args.dry_run) for step in (DRY_STEPS if args.dry_run else STEPS)]
    from memlab.course.provenance import provenance

    prov = provenance("cpu" if args.dry_run else "cuda", measure_cpu_peak=False)
    if args.dry_run:
        prov["kind"] = "CPU dry run of the plumbing: no GPU measurement"
    (out / "allocator_replay.json").write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1, default=str))
    print(f"record_allocator_snapshot: {len(rows)} step(s) -> {out / 'allocator_replay.json'}")
    return 0


def _child(out: Path, label: str, name: str, fields: dict[str, Any], alloc_conf: str, *,
           dry_run: bool = False) -> dict[str, Any]:
    """One step in a fresh process with its ``PYTORCH_CUDA_ALLOC_CONF`` (the allocator reads it once)."""
    import os
    import subprocess

    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": alloc_conf} if alloc_conf else dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)
    proc = subprocess.run([sys.executable, __file__, "--out", str(out), *(["--dry-run"] if dry_run else []),
                           "--one", label, name, json.dumps(fields), alloc_conf],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        return {"step": label, "error": proc.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
