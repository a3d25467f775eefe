"""Reduce a CUDA allocator snapshot to what memlab's allocator check reads, as a small JSON (issue 38).

``python scripts/reduce_snapshot.py SNAPSHOT.pickle OUT.json [--source URL] [--note TEXT]``: the snapshot is read
with memlab's restricted unpickler (:func:`memlab.measure.snapshot.load_snapshot`: reading it runs no code), and
:func:`memlab.measure.snapshot.reduce_snapshot` keeps the allocator's events and final segments, with addresses
replaced by their rank and no stack frames, file names or program text: a run's allocator history, shareable. The
check (:func:`memlab.measure.snapshot.segment_check`) reads the result through
:func:`memlab.measure.snapshot.expand_reduced`; ``benchmarks/published_snapshots.py`` runs it on the files in
``data/published/allocator_snapshots/``. A bad file is one line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from memlab.errors import MemlabError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot")
    ap.add_argument("out")
    ap.add_argument("--source", default="", help="where the snapshot comes from (a URL pinned to a commit)")
    ap.add_argument("--note", default="", help="what the run was, in the source's words")
    args = ap.parse_args(argv)
    from memlab.measure.snapshot import load_snapshot, reduce_snapshot

    try:
        raw = Path(args.snapshot).read_bytes()
        snap = load_snapshot(raw)
        reduced = reduce_snapshot(snap, provenance={
            "source": args.source, "note": args.note, "sha256": hashlib.sha256(raw).hexdigest(),
            "bytes": len(raw), "kind": "a CUDA caching allocator snapshot recorded on a real GPU by its source, "
                                       "reduced by scripts/reduce_snapshot.py (addresses ranked, no frames)"})
    except (OSError, MemlabError) as exc:
        print(f"reduce_snapshot: {exc}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(reduced, separators=(",", ":")))
    print(f"reduce_snapshot: {len(reduced['events']):,} events, {len(reduced['segments'])} segments -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
