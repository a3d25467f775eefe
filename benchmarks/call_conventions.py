"""Calling conventions (issue 17 point 2), measured: bytes saved for backward by one training step of each shipped tiny
Hugging Face config (memlab/course/configs/tiny) called with no attention mask, an all-ones mask and a right-padded
batch (:func:`memlab.run.hf.call_inputs`), eager and SDPA, fp32 and bf16, on this machine's CPU. Prints the saved
bytes without a mask, what ``ones`` and ``padded`` add to them (0: the same call for memory) and the largest
|measured - predicted| over the three calls (memlab.run.hf.predict_hf; 0: exact).

``python benchmarks/call_conventions.py [--batch 2] [--seq 24] [--pad-fraction 0.25]``; bytes throughout.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from memlab.errors import ConfigError, SetupError
from memlab.run.hf import predict_hf, run_hf

CONFIGS = Path(__file__).resolve().parents[1] / "memlab" / "course" / "configs" / "tiny"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=24)
    ap.add_argument("--pad-fraction", type=float, default=0.25)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    print(f"{'family':12} {'attn':6} {'dtype':5} {'none':>9} {'ones-none':>9} {'padded-none':>11} {'max err':>7}")
    for path in sorted(CONFIGS.glob("*.json")):
        cfg = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
        for attn in ("eager", "sdpa"):
            for dtype in ("fp32", "bf16"):
                try:
                    runs = [run_hf(cfg, attn_implementation=attn, dtype=dtype, batch=a.batch, seq=a.seq,
                                   attention_mask=conv, pad_fraction=frac)
                            for conv, frac in (("none", 0.0), ("ones", 0.0), ("padded", a.pad_fraction))]
                    got = [m.saved_bytes for _, m in runs]
                    err = max(abs(m.saved_bytes - predict_hf(tc, m)["activations"]) for tc, m in runs)
                except (ConfigError, SetupError) as err:
                    print(f"{path.stem:12} {attn:6} {dtype:5} refused: {err}")
                    continue
                print(f"{path.stem:12} {attn:6} {dtype:5} {got[0]:9d} {got[1] - got[0]:9d} {got[2] - got[0]:11d} "
                      f"{err:7d}")


if __name__ == "__main__":
    main()
