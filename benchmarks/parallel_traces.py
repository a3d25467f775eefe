"""TP, TP + SP and CP traced on fake process groups, every rank, both shapes, against the estimator (issue 19).

:mod:`memlab.compare.parallel_traces` rows for tiny-gpt and trace-llama: TP and TP + SP over 2 ranks (and 4 for
tiny-gpt, whose 4 heads allow it), ring-attention CP over 2 and 4 ranks; every rank. Prints each layout's rows and
the count of rows whose ``left`` (trace - estimate - named terms) is 0. Run: ``PYTHONPATH=. python
benchmarks/parallel_traces.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import time

import pandas as pd

from memlab.compare.parallel_traces import cp_rows, tp_rows, trace_shapes
from memlab.predict.setup import Setup


def main() -> None:
    pd.set_option("display.width", 200)
    total = exact = 0
    for cfg in trace_shapes():
        t0 = time.perf_counter()
        rows = []
        for tp in (2, 4) if (cfg.n_kv_heads or cfg.n_heads) % 4 == 0 else (2,):
            for sp in (False, True):
                rows += tp_rows(cfg, Setup(batch=2, seq=64, optimizer="adamw", tp=tp, sp=sp), tuple(range(tp)))
        for cp in (2, 4):
            rows += cp_rows(cfg, Setup(batch=2, seq=32 * cp, optimizer="sgd", attention="flash", cp=cp),
                            tuple(range(cp)))
        df = pd.DataFrame([r.to_dict() for r in rows])
        ok = (df["left"] == 0) | ((df["kind"] == "bound") & (df["left"] <= 0))
        total, exact = total + len(df), exact + int(ok.sum())
        print(f"\n{cfg.name} ({time.perf_counter() - t0:.1f} s)")
        print(df[["layout", "rank", "phase", "predicted", "traced", "one_rank", "named_bytes", "left", "kind"]]
              .to_string(index=False))
    print(f"\n{exact} of {total} rank/phase rows exact once the named terms are added (or within their bound)")


if __name__ == "__main__":
    main()
