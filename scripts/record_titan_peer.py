"""Record the torchtitan-peer comparison at full size (memlab.studies.titan) into data/recorded/ with provenance.

Runs :func:`memlab.studies.titan.titan_rows` on torchtitan's debug model and on Llama-3-8B (torchtitan's ``8B``:
``preset("llama-3-8b")``) with torchtitan's Llama-3-8B training setup (batch 1, seq 8192, full activation
checkpointing, fused AdamW, FSDP2 over 8 ranks, bf16/fp32 MixedPrecisionPolicy), each on fake tensors on this CPU
(a few minutes in all), and writes ``data/recorded/titan_peer_cpu_trace.json``: the rows plus torch version, memlab
commit, date and host. A CPU fake-tensor result: chapters show it as recorded, never as a GPU measurement.

Usage: ``python scripts/record_titan_peer.py``.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys

import torch

from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.studies.titan import RECORDED, TITAN_DEBUG, titan_rows

SETUPS = (
    (TITAN_DEBUG, Setup(batch=8, seq=2048, attention="flash", world_size=8, optimizer_impl="fused")),
    (preset("llama-3-8b"), Setup(batch=1, seq=8192, attention="flash", recompute="full", world_size=8,
                                 optimizer_impl="fused")),
)
"""torchtitan's debug_model.toml (local batch 8, seq 2048) and llama3_8b.toml (batch 1, seq 8192) shapes."""


def main() -> int:
    """Run every setup and write the JSON file."""
    rows = [titan_rows(cfg, setup) for cfg, setup in SETUPS]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"rows": rows, "provenance": {
        "kind": "CPU fake-tensor run (FakeTensorMode, fake process group), not a GPU measurement",
        "torch": torch.__version__, "memlab_commit": commit, "host": platform.node(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "script": "scripts/record_titan_peer.py"}}
    RECORDED.parent.mkdir(parents=True, exist_ok=True)
    RECORDED.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
