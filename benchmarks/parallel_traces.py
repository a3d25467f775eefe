"""TP, TP + SP and CP traced on fake process groups, every rank, both shapes, against the estimator (issue 19).

:mod:`memlab.studies.parallel_traces` rows for tiny-gpt and trace-llama: TP and TP + SP over 2 ranks (and 4 for
tiny-gpt, whose 4 heads allow it), ring-attention CP over 2 and 4 ranks; every rank. Prints each layout's rows and
the count of rows whose ``left`` (trace - estimate - named terms) is 0; then Llama-2-7B at full size (TP 8, TP 8 +
SP, CP 8 at 4096 tokens, first and last rank: fake tensors, about 35 s). Run: ``PYTHONPATH=. python
benchmarks/parallel_traces.py`` (about two minutes on 2 cores).
"""

from __future__ import annotations

import time

import pandas as pd

from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.studies.parallel_traces import cp_rows, tp_rows, trace_shapes, traced_parallel_rows


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
        total, exact = _show(cfg.name, pd.DataFrame([r.to_dict() for r in rows]), t0, total, exact)
    t0 = time.perf_counter()
    full = traced_parallel_rows(preset("llama-2-7b"), tp=8, cp=8, ranks=(0, 7), sp_ranks=(0,), batch=1, seq=4096)
    total, exact = _show("llama-2-7b, 8 ranks, 1 x 4096 tokens", full, t0, total, exact)
    print(f"\n{exact} of {total} rank/phase rows exact once the named terms are added (or within their bound)")


def _show(name: str, df: pd.DataFrame, t0: float, total: int, exact: int) -> tuple[int, int]:
    ok = (df["left"] == 0) | ((df["kind"] == "bound") & (df["left"] <= 0))
    print(f"\n{name} ({time.perf_counter() - t0:.1f} s)")
    print(df[[c for c in ("layout", "rank", "phase", "predicted", "traced", "one_rank", "named_bytes", "left", "kind")
              if c in df]].to_string(index=False))
    return total + len(df), exact + int(ok.sum())


if __name__ == "__main__":
    main()
