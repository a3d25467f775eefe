"""Data-parallel strategies, predicted next to the ranks' measurements (:mod:`memlab.run.distributed.launch` rows).

Each strategy the worker runs is mapped to the estimator's ZeRO stage [rajbhandari2019] and FSDP2's behaviour:

- ``ddp`` stage 0; ``zero1`` stage 1 (torch's ``ZeroRedundancyOptimizer`` under DDP);
- ``fsdp2-zero2`` (``reshard_after_forward=False``): sharded parameters at rest, like stage 3, but every block
  stays gathered from its forward to its backward, so the step holds a full copy of the parameters (what
  DeepSpeed's stage 2 keeps all the time) and backward needs no second all-gather;
- ``fsdp2-zero3`` stage 3, one block gathered at a time (plus the root module's own parameters, which FSDP2
  does not reshard after forward);
- ``fsdp2-offload`` stage 3 with the shards and AdamW states in host memory.

The rows are plain dicts (one per rank and strategy); the ledger compares the mean over ranks.
"""

from __future__ import annotations

from typing import Any

from memlab.errors import SetupError
from memlab.predict.estimate import Overheads, estimate
from memlab.predict.parallel.communication import zero_comm_bytes
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.precision import DTYPE_BYTES
from memlab.predict.spec.setup import Setup

STAGE = {"ddp": 0, "zero1": 1, "fsdp2-zero2": 3, "fsdp2-zero3": 3, "fsdp2-offload": 3}
"""ZeRO stage of each strategy's resting (between steps) state."""


NOTES = {
    ("fsdp2-zero3", "gathered params"): "; the estimator counts one gathered block; FSDP2 also keeps the root "
    "module's own parameters (embeddings, positions, final norm) gathered from forward to backward",
    ("fsdp2-zero3", "comm volume/step"): "; the paper's stage 3 moves 3 Psi; FSDP2 leaves the root module gathered "
    "from forward to backward (its default), so the root's parameters are all-gathered once, not twice",
    ("zero1", "comm volume/step"): "; the paper's stage 1 moves 2 Psi; torch's ZeroRedundancyOptimizer runs under "
    "DDP's all-reduce (2 Psi) and then broadcasts every updated partition (Psi more)",
}


def predicted_rank(config: TransformerConfig, strategy: str, world_size: int, *, batch: int = 2, seq: int = 32,
                   precision: str = "fp32", device_type: str = "cpu") -> dict[str, float]:
    """Predicted bytes on one rank: params, grads, optimizer, gathered parameters in the step, and the
    communication volume per step (ZeRO's convention, :mod:`memlab.predict.parallel.communication`)."""
    setup = Setup(batch=batch, seq=seq, precision=precision, optimizer="adamw", zero_stage=STAGE[strategy],
                  world_size=world_size)
    b = estimate(config, setup, device_type=device_type, overheads=Overheads(gathered_layers=1))
    psi = config.param_count() * setup.policy.grad_bytes
    if strategy == "fsdp2-zero2":
        gathered = config.param_count() * DTYPE_BYTES[precision if precision in DTYPE_BYTES else "fp32"]
    else:
        gathered = b.overhead["zero3_gathered_params"]
    comm_stage = 2 if strategy == "fsdp2-zero2" else STAGE[strategy]
    comm = sum(zero_comm_bytes(psi, comm_stage).values()) if world_size > 1 else 0
    out = {"params": b.params_bytes, "grads": b.grads_bytes, "optimizer": b.optimizer_bytes,
           "gathered": gathered, "comm_volume": comm, "psi_bytes": psi}
    if strategy == "fsdp2-offload":  # CPUOffloadPolicy: the estimator's own host line (Setup.fsdp_offload)
        if world_size > 1:
            off = estimate(config, setup.with_(fsdp_offload=True), device_type=device_type,
                           overheads=Overheads(gathered_layers=1))
            out.update(host=off.host_bytes, params=off.params_bytes, grads=off.grads_bytes,
                       optimizer=off.optimizer_bytes)
        else:
            out.update(host=out["params"] + out["grads"] + out["optimizer"], params=0, grads=0, optimizer=0)
    return out


def sharding_ledger(rows: list[dict[str, Any]], config: TransformerConfig, *, precision: str = "fp32") -> Any:
    """Ledger rows (experiment, component, unit, predicted, measured, note): the rank mean of every measured
    strategy and world size against :func:`predicted_rank`. Skipped strategies are left out; a SetupError names
    every row's reason when no row was measured."""
    import pandas as pd

    df = pd.DataFrame([r for r in rows if r.get("status") == "ok"])
    if df.empty:
        reasons = "; ".join(f"{r.get('strategy', '?')} N={r.get('world_size', '?')} {r.get('status')}: "
                            f"{r.get('reason', '')}" for r in rows) or "no rows"
        raise SetupError(f"no measured row to compare (every strategy failed or was skipped): {reasons}")
    out = []
    for (strategy, n), group in df.groupby(["strategy", "world_size"], sort=False):
        device_type = "cuda" if str(group["device"].iloc[0]).startswith("cuda") else "cpu"
        pred = predicted_rank(config, strategy, int(n), batch=int(group["batch"].iloc[0]),
                              seq=int(group["seq"].iloc[0]), precision=precision, device_type=device_type)
        for comp, col in (("params", "params_bytes"), ("grads", "grads_bytes"), ("optimizer", "optimizer_bytes"),
                          ("gathered params", "gathered_peak_bytes"), ("comm volume/step", "comm_volume_bytes")):
            if comp.startswith("comm") and n == 1:
                continue
            if comp == "gathered params" and (not strategy.startswith("fsdp2") or n == 1):
                continue
            key = {"gathered params": "gathered", "comm volume/step": "comm_volume"}.get(comp, comp)
            out.append({"experiment": f"{config.name} {strategy} N={n}", "component": comp, "unit": "bytes",
                        "predicted": float(pred[key]), "measured": float(group[col].mean()),
                        "note": f"mean of {len(group)} rank(s)" + NOTES.get((strategy, comp), "")})
    return pd.DataFrame(out)
