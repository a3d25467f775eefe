"""Record the largest batch a real GPU's caching allocator runs, beside memlab's answers for it (issue 38).

On a lent GPU, for each case of :data:`CASES` (GPT-2 small's training step, the step every memlab caller runs:
:func:`memlab.model.step.build_training` / :func:`~memlab.model.step.train_step`), the allocator is capped at
``--cap-gib`` with ``torch.cuda.set_per_process_memory_fraction`` (a card of that size for the allocator: the CUDA
context lives outside the cap), and the largest batch whose two steps run without ``torch.cuda.OutOfMemoryError`` is
found by bisection, one batch at a time with the cache emptied between them. Beside it, memlab's answers for the
same cap: the formula's two ends (:func:`memlab.predict.fit.max_batch`: fits for certain, may fit up to) and the
traced search (:func:`memlab.tracing.fit.traced_search`: each candidate traced on fake tensors and replayed through
the allocator model in the cap). No CUDA context or NCCL term applies inside the cap; the cuBLAS workspaces do (they
are the allocator's blocks). Writes ``max_batch.json`` into ``--out`` with the provenance.

``--dry-run`` runs memlab's side and the bisection's plumbing on a CPU (the tiny reference GPT; no GPU run,
``measured`` null): the tests run it. Without a GPU and without ``--dry-run`` it refuses in one line.

Usage: ``python scripts/record_max_batch.py [--out DIR] [--cap-gib 12] [--dry-run]``; ``scripts/gpu_session.sh``
runs it second.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

CASES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("gpt2_fp32_s1024", "gpt2", {"batch": 1, "seq": 1024, "precision": "fp32"}),
    ("gpt2_ampbf16_flash_s1024", "gpt2", {"batch": 1, "seq": 1024, "precision": "amp-bf16", "attention": "flash"}),
)
"""(name, preset, Setup fields): GPT-2 small, whose steps are quick on any card a session lends."""

DRY_CASES = (("tiny_fp32_s32", "tiny-gpt", {"batch": 1, "seq": 32, "precision": "fp32"}),)
DRY_CAP_BYTES = 23 * 2**20
"""The tiny model's cap in a dry run (a few batches fit)."""
LIMIT = 256
"""The largest batch tried."""


def predicted(name: str, setup: Setup, card: Any, gpu_key: str) -> dict[str, Any]:
    """memlab's answers inside the cap: the formula's two ends and the traced search (CUDA widths)."""
    from memlab.predict.fit import max_batch
    from memlab.predict.gpu.device import DeviceOverheads
    from memlab.tracing.fit import traced_search
    from memlab.tracing.gpt import trace_gpt

    inside = DeviceOverheads(cuda_context_bytes=0, nccl_channels=0)  # the cap is the allocator's, context outside
    formula = max_batch(preset(name), setup, card, device=inside, limit=LIMIT)
    traced = traced_search(lambda s: trace_gpt(preset(name), s, device_type="cuda"), setup, "batch", card,
                           formula=formula, limit=LIMIT, overheads=inside)
    return {"gpu_key": gpu_key, "formula_certain": formula.value, "formula_up_to": formula.up_to,
            "traced": traced.value, "traced_tried": [list(t) for t in traced.tried], "traced_reason": traced.reason}


def runs_at(name: str, setup: Setup) -> bool:
    """Whether two training steps of ``setup`` run on the capped GPU (False on ``torch.cuda.OutOfMemoryError``);
    the cache is emptied after either answer, so the next batch starts from a clean allocator."""
    import gc

    import torch

    try:
        _two_steps(name, setup, torch.device("cuda"))
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def _two_steps(name: str, setup: Setup, dev: Any) -> None:
    """Two steps of the step every memlab caller runs; its tensors go with this frame."""
    import torch

    from memlab.model.step import build_training, token_batch, train_step

    model, step = build_training(preset(name), setup, dev)
    idx, tgt = token_batch(preset(name).vocab_size, setup.batch, setup.seq, dev, 0)
    for i in range(2):
        train_step(step, lambda: model(idx, tgt), label=i)
    torch.cuda.synchronize()


def measured_max(name: str, setup: Setup, fits_at: Any) -> dict[str, Any]:
    """The largest batch ``fits_at`` accepts, by bisection (:func:`memlab.predict.fit.largest_fitting`), with every
    batch tried."""
    from memlab.predict.fit import largest_fitting

    tried: dict[int, bool] = {}

    def at(b: int) -> bool:
        if b not in tried:
            tried[b] = bool(fits_at(setup.with_(batch=b)))
        return tried[b]

    return {"max_batch": largest_fitting(at, LIMIT), "tried": sorted(tried.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/recorded")
    parser.add_argument("--cap-gib", type=float, default=12.0, help="the allocator's cap (GiB, default 12)")
    parser.add_argument("--dry-run", action="store_true", help="memlab's side and the plumbing on a CPU")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from memlab.predict.hardware.gpus import gpu

    if args.dry_run:
        cap, key, cases = DRY_CAP_BYTES, "rtx-4090", DRY_CASES
    else:
        from memlab.measure.cuda import cuda_unavailable_reason

        if (reason := cuda_unavailable_reason()) is not None:
            print(f"record_max_batch: GPU data is never recorded on a CPU, and {reason}; --dry-run runs the "
                  "plumbing", file=sys.stderr)
            return 2
        import torch

        from memlab.measure.machine import detect

        total = torch.cuda.get_device_properties(0).total_memory
        cap = int(args.cap_gib * 2**30)
        torch.cuda.set_per_process_memory_fraction(cap / total)
        info = detect(measure_cpu_peak=False)
        if info.accelerator is None:
            print(f"record_max_batch: {info.name} is not in memlab's GPU table (memlab gpus), so its cuBLAS "
                  "workspace size is unknown; add its row first", file=sys.stderr)
            return 2
        key = info.accelerator.key
        cases = CASES
    card = replace(gpu(key), key=key, memory_bytes=cap)
    rows = []
    for label, name, fields in cases:
        setup = Setup(**fields)
        row: dict[str, Any] = {"case": label, "preset": name, "setup": fields, "cap_bytes": cap,
                               "memlab": predicted(name, setup, card, key)}
        if args.dry_run:
            row["plumbing"] = measured_max(name, setup, lambda s: s.batch <= 3)  # a stand-in for the GPU's answer
            row["measured"] = None
        else:
            row["measured"] = measured_max(name, setup, lambda s, n=name: runs_at(n, s))
        rows.append(row)
        print(f"record_max_batch: {label}: memlab formula {row['memlab']['formula_certain']} for certain, up to "
              f"{row['memlab']['formula_up_to']}; traced {row['memlab']['traced']}; measured "
              f"{row['measured']['max_batch'] if row['measured'] else '(dry run)'}")
    from memlab.course.provenance import provenance

    prov = provenance("cpu" if args.dry_run else "cuda", measure_cpu_peak=False)
    prov["kind"] = ("CPU dry run of the plumbing: no GPU measurement" if args.dry_run else
                    f"the allocator capped at {cap:,} B with set_per_process_memory_fraction; two steps per batch")
    (out / "max_batch.json").write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1, default=str))
    print(f"record_max_batch: {len(rows)} case(s) -> {out / 'max_batch.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
