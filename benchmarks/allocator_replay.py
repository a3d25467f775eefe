"""The allocation log a trace records and its replay through the CUDA caching allocator model (issue 38), measured.

For the reference GPT presets given: the trace's CPU time, the number of events its log holds, what recording them
costs (``MemTracker._update_snap`` with and without the log, timeit, times the trace's events), the replay's time,
and the replay's peaks beside the trace's: requested (== the trace's peak on CPU fake tensors), active (512 B
blocks) and reserved (segments), with torch's default ``PYTORCH_CUDA_ALLOC_CONF`` and with
``expandable_segments:True``. The reserved and active bytes are the allocator model's, not a GPU measurement.

``python benchmarks/allocator_replay.py [--presets gpt2,llama-7b] [--batch 1] [--seq 512]``; bytes in MiB.
"""

from __future__ import annotations

import argparse
import time
import timeit


def _update_snap_extra_s() -> tuple[float, float]:
    """Seconds per ``_update_snap`` call for the stock MemTracker and for memlab's recording one."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _UpdateType, _WeakRefInfo

    from memlab.tracing.tracer import fast_mem_tracker

    w = _WeakRefInfo(1000, 4, torch.device("cpu"), _MemRefType.ACT)

    def run(t: object) -> None:
        for _ in range(1000):
            t._update_snap(_UpdateType.ADD, w)
            t._update_snap(_UpdateType.DEL, w)

    stock, fast = MemTracker(), fast_mem_tracker()
    a = min(timeit.repeat(lambda: run(stock), number=5, repeat=7)) / 10000
    b = min(timeit.repeat(lambda: run(fast), number=5, repeat=7)) / 10000
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="gpt2")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    from memlab.predict.spec.model import preset
    from memlab.predict.spec.setup import Setup
    from memlab.tracing.gpt import trace_gpt

    stock, rec = _update_snap_extra_s()
    print(f"_update_snap per call: stock {stock * 1e6:.2f} us, recording {rec * 1e6:.2f} us")
    for name in args.presets.split(","):
        t0 = time.process_time()
        t = trace_gpt(preset(name), Setup(batch=args.batch, seq=args.seq))
        t1 = time.process_time()
        r = t.replay()
        t2 = time.process_time()
        e = t.replay("expandable_segments:True")
        n = len(t.allocations)
        print(f"{name} b{args.batch} s{args.seq}: trace {t1 - t0:.2f} s CPU, {n} events, recording ~"
              f"{n * (rec - stock) * 1e3:.1f} ms, replay {t2 - t1:.2f} s")
        print(f"  trace peak {t.peak_bytes / 2**20:.1f} MiB; replay requested {r.total.requested_bytes / 2**20:.1f}, "
              f"active {r.total.active_bytes / 2**20:.1f}, reserved {r.total.reserved_bytes / 2**20:.1f} "
              f"(expandable: {e.total.reserved_bytes / 2**20:.1f}) MiB")
        for p, q in zip(r.phases, e.phases, strict=True):
            print(f"    {p.label:26s} requested {p.requested_bytes / 2**20:9.1f}  active {p.active_bytes / 2**20:9.1f}"
                  f"  reserved {p.reserved_bytes / 2**20:9.1f}  (expandable {q.reserved_bytes / 2**20:9.1f})")


if __name__ == "__main__":
    main()
