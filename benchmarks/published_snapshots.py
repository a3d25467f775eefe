"""memlab's caching allocator model against allocator snapshots recorded on real GPUs by others (issue 38).

For each reduced snapshot in ``data/published/allocator_snapshots/`` (``scripts/reduce_snapshot.py``: the
allocator's events and final segments of a public ``torch.cuda.memory._snapshot()``, cited in its ``provenance``),
:func:`memlab.measure.snapshot.segment_check` rebuilds the segments the allocator held when the history began,
replays the recorded allocations and frees through the model, and compares: the segments cudaMalloc'd during the
history (sizes, in order), the final layout (every segment's blocks, sizes and in use or free, in address order)
and the bytes reserved at the end. Published GPU data, replayed on a CPU; nothing here is fitted.

``python benchmarks/published_snapshots.py [--json]``
"""

from __future__ import annotations

import argparse
import json


def rows() -> list[dict]:
    """One row per reduced snapshot (:func:`memlab.compare.published.snapshot_checks`)."""
    from memlab.compare.published import snapshot_checks

    return snapshot_checks()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    found = rows()
    if args.json:
        print(json.dumps(found, indent=1))
        return
    print(f"{'snapshot':<30}{'events':>8}{'seeded':>8}{'made gpu/model':>16}{'segments':>10}{'layout':>8}"
          f"{'reserved GPU':>16}{'model':>16}{'error':>9}")
    for r in found:
        print(f"{r['snapshot']:<30}{r['events']:>8,}{r['seeded_segments']:>8}"
              f"{str(r['gpu_segments_made']) + '/' + str(r['model_segments_made']):>16}"
              f"{'same' if r['segments_match'] else 'diff@' + str(r['first_difference']):>10}"
              f"{'same' if r['layout_match'] else 'diff':>8}{r['gpu_reserved_bytes']:>16,}"
              f"{r['model_reserved_bytes']:>16,}{100 * r['reserved_error']:>+8.2f}%")
    print("sources: " + "; ".join(f"{r['snapshot']}: {r['source']}" for r in found))


if __name__ == "__main__":
    main()
