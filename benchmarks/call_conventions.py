"""Calling conventions (issue 17 point 2), measured: bytes saved for backward by one training step of each shipped tiny
Hugging Face config (memlab/predict/families/configs/tiny) on this machine's CPU, eager and SDPA, fp32, bf16 and fp32
under bf16 autocast, called with no attention mask, an all-ones mask, a right- and a left-padded batch
(:func:`memlab.run.hf.call_inputs`), a hand-written loss on the returned logits (``loss_call='manual'``, no mask and
left-padded) and, under gradient checkpointing (transformers', non-reentrant), with each mask convention. Prints the
saved bytes without a mask and what each other call adds to them (0: the same call for memory), and the largest
|measured - predicted| over the calls the estimate does not refuse (memlab.run.hf.predict_hf; 0: exact; "refused"
counts the calls refused in one line).

``--trace``: instead, the hand-written loss's effect on each phase of the step, traced (memlab.tracing.hf.trace_hf,
fake tensors) beside the estimate: (traced manual - traced labels) - (predicted manual - predicted labels), the
error of the ``loss_call`` term alone (0: exact; negative: the estimate of the manual call is high by that).

``python benchmarks/call_conventions.py [--batch 2] [--seq 24] [--pad-fraction 0.25] [--only llama,gpt2] [--trace]``;
bytes throughout. A CPU measurement: CUDA's kernels and autocast list differ (tests/run/test_calls.py, marked gpu).
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from memlab.errors import ConfigError, SetupError
from memlab.run.hf import predict_hf, run_hf

CONFIGS = Path(__file__).resolve().parents[1] / "memlab" / "predict" / "families" / "configs" / "tiny"
CALLS = {  # column: (attention_mask, padding_side, loss_call, gradient checkpointing)
    "none": ("none", "right", "labels", False), "ones": ("ones", "right", "labels", False),
    "padded": ("padded", "right", "labels", False), "left": ("padded", "left", "labels", False),
    "manual": ("none", "right", "manual", False), "manual-left": ("padded", "left", "manual", False),
    "gc": ("none", "right", "labels", True), "gc-ones": ("ones", "right", "labels", True),
    "gc-padded": ("padded", "right", "labels", True), "gc-left": ("padded", "left", "labels", True)}
PRECISIONS = (("fp32", False), ("bf16", False), ("fp32", True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=24)
    ap.add_argument("--pad-fraction", type=float, default=0.25)
    ap.add_argument("--only", default="", help="comma-separated families (default: every tiny config)")
    ap.add_argument("--trace", action="store_true", help="the manual loss's phase effects, traced")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    only = {f for f in a.only.split(",") if f}
    if a.trace:
        trace_effects(a.batch, a.seq, only)
        return
    cols = [c for c in CALLS if c not in ("none", "gc")]
    print(f"{'family':12} {'attn':5} {'prec':8} {'none':>8} {'gc':>7} " + " ".join(f"{c:>11}" for c in cols)
          + f" {'max err':>7} refused")
    for path in sorted(CONFIGS.glob("*.json")):
        if only and path.stem not in only:
            continue
        cfg = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
        for attn in ("eager", "sdpa"):
            for dtype, amp in PRECISIONS:
                prec = "amp-bf16" if amp else dtype
                try:
                    runs = {c: run_hf(cfg, attn_implementation=attn, dtype=dtype, batch=a.batch, seq=a.seq,
                                      autocast=amp, attention_mask=mask, padding_side=side, loss_call=call,
                                      gradient_checkpointing=gc,
                                      pad_fraction=a.pad_fraction if mask == "padded" else 0.0)
                            for c, (mask, side, call, gc) in CALLS.items()}
                except (ConfigError, SetupError) as err:
                    print(f"{path.stem:12} {attn:5} {prec:8} not run: {err}")
                    continue
                errs, refused = [], 0
                for tc, m in runs.values():
                    try:
                        errs.append(abs(m.saved_bytes - predict_hf(tc, m)["activations"]))
                    except SetupError:
                        refused += 1
                got = {c: m.saved_bytes for c, (_, m) in runs.items()}
                base = {c: got["gc" if c.startswith("gc") else "none"] for c in cols}
                print(f"{path.stem:12} {attn:5} {prec:8} {got['none']:8d} {got['gc']:7d} "
                      + " ".join(f"{got[c] - base[c]:11d}" for c in cols) + f" {max(errs, default=0):7d} {refused}")


def trace_effects(batch: int, seq: int, only: set[str]) -> None:
    """Per family and precision: the traced-minus-predicted effect of ``loss_call='manual'`` on each steady phase."""
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf
    from memlab.predict.spec.setup import Setup
    from memlab.tracing.hf import trace_hf

    print(f"{'family':12} {'prec':8} effect error by phase (traced - predicted), then the traced effect")
    for path in sorted(CONFIGS.glob("*.json")):
        if only and path.stem not in only:
            continue
        raw = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
        cfg = from_hf(raw)
        for prec in ("fp32", "bf16", "amp-bf16"):
            got = {}
            try:
                for call in ("labels", "manual"):
                    st = Setup(batch=batch, seq=seq, precision=prec, loss_call=call)
                    tr, est = trace_hf(raw, st, device_type="cpu"), estimate(cfg, st, device_type="cpu")
                    got[call] = {r.phase: (r.held_bytes, est.phase_bytes(r.phase, r.step)) for r in tr.phases
                                 if r.step == "steady"}
            except (ConfigError, SetupError) as err:
                print(f"{path.stem:12} {prec:8} refused: {err}")
                continue
            except RuntimeError as err:  # fake tensors: grouped_mm's meta kernel takes bf16 only (torch 2.13)
                print(f"{path.stem:12} {prec:8} not traced: {str(err).splitlines()[0]}")
                continue
            eff = {p: [got["manual"][p][i] - got["labels"][p][i] for i in (0, 1)] for p in got["labels"]}
            print(f"{path.stem:12} {prec:8} " + "  ".join(f"{p}: {t - q:+d} ({t:+d})" for p, (t, q) in eff.items()))


if __name__ == "__main__":
    main()
