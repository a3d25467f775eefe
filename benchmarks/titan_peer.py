"""The torchtitan peer (its estimation protocol with its torch pieces, :mod:`memlab.tracing.peer`) against memlab's
estimate and trace of the same FSDP2 step, at 2 and 8 ranks, without recompute and with full recompute, on
torchtitan's ``debugmodel`` at the chapter's CI shape and on a smaller model of the same kind (issue 36: within 1 %
at every size). Prints one line per setup (step-2 peaks, bytes on rank 0, and the estimate's residual against the
trace and the peer) and exits 1 when the estimate is more than 1 % from the peer anywhere.

Usage: ``python benchmarks/titan_peer.py`` (about five minutes on two loaded cores).
"""

from __future__ import annotations

import sys
import time
import warnings

from memlab.predict.spec.setup import Setup
from memlab.studies.titan import TITAN_DEBUG, TITAN_SMALL, titan_rows

BAR = 0.01
"""Issue 36's bar: the estimate within 1 % of the peer's step-2 peak."""


def main() -> int:
    warnings.filterwarnings("ignore")
    start, worst = time.perf_counter(), 0.0
    for config, shape in ((TITAN_SMALL, dict(batch=1, seq=32)), (TITAN_DEBUG, dict(batch=1, seq=128))):
        for ranks in (2, 8):
            for recompute in ("none", "full"):
                row = titan_rows(config, Setup(**shape, attention="flash", world_size=ranks, recompute=recompute,
                                               optimizer_impl="fused"))
                est, trace, peer = row["estimate_step2"], row["trace_step2"], row["titan_step2"]
                worst = max(worst, abs(est - peer) / peer)
                print(f"{config.name:17s} x{ranks} recompute {recompute:4s}: estimate {est:>12,} B  trace "
                      f"{trace:>12,} B  peer {peer:>12,} B  estimate vs trace {(est - trace) / trace:+.3%}  "
                      f"vs peer {(est - peer) / peer:+.3%}", flush=True)
    print(f"worst |estimate - peer| / peer: {worst:.3%} (bar {BAR:.0%}), {time.perf_counter() - start:.0f} s")
    return 0 if worst <= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
