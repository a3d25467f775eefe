"""``memlab shard --hf`` on real gloo ranks (issue 17 point 7): for generated tiny configs of several families the
formula maps (dims drawn so that some do not divide by the ranks: FSDP2 pads them), DDP and FSDP2 ZeRO-3 on 2 ranks,
each rank's bytes against ``memlab estimate --hf PATH --zero 3``. Prints, per config, how many (rank, component)
rows are exact, equal to a named residual (:func:`memlab.cli.shard.named_residuals`) or not explained, and exits 1
when any is not explained. The default suite checks the same path over a fake process group
(tests/cli/test_shard_hf.py); this runs the ranks for real (a launch takes 10-25 s on 2 loaded cores).

``python benchmarks/shard_hf.py [--ranks 2] [--draws 1] [--strategies ddp,fsdp2-zero3]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
import warnings
from pathlib import Path

from memlab import cli

CONFIGS = Path(__file__).resolve().parents[1] / "memlab" / "predict" / "families" / "configs" / "tiny"
FAMILIES = ("llama", "qwen2", "gpt2", "gpt_neox")


def draw(family: str, rng: random.Random) -> dict:
    """The shipped tiny config of ``family`` with a vocabulary and MLP width drawn odd (FSDP2 pads dim 0)."""
    raw = {k: v for k, v in json.loads((CONFIGS / f"{family}.json").read_text()).items() if not k.startswith("_")}
    raw["vocab_size"] = rng.randrange(301, 601, 2)
    for key in ("intermediate_size", "n_inner"):
        if raw.get(key):
            raw[key] = rng.randrange(51, 201, 2)
    return raw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--draws", type=int, default=1, help="configs drawn per family")
    ap.add_argument("--strategies", default="ddp,fsdp2-zero3")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    rng = random.Random(0)
    bad = 0
    print(f"{'config':28} {'exact':>5} {'named':>5} {'not explained':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            for i in range(a.draws):
                raw = draw(family, rng)
                path = Path(tmp) / f"{family}-{i}.json"
                path.write_text(json.dumps(raw))
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = cli.main(["shard", "--hf", str(path), "--ranks", str(a.ranks), "--cpu", "--seq", "16",
                                     "--strategies", a.strategies, "--json"])
                if code != 0:
                    print(f"{path.stem:28} failed: {err.getvalue().strip()}")
                    bad += 1
                    continue
                rows = json.loads(out.getvalue())["per_rank"]
                exact = sum(r["residual"] == "exact" for r in rows)
                named = sum(r["explained"] and r["residual"] != "exact" for r in rows)
                unexplained = [r for r in rows if not r["explained"]]
                bad += bool(unexplained)
                label = f"{path.stem} vocab {raw['vocab_size']}"
                print(f"{label:28} {exact:>5} {named:>5} {len(unexplained):>13}")
                for r in unexplained:
                    print(f"    {r['strategy']} rank {r['rank']} {r['component']}: {r['residual']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
