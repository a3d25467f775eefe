"""Per-rank predictions of each data-parallel strategy (no ranks launched)."""

from __future__ import annotations

from memlab.compare.sharding import predicted_rank, sharding_ledger
from memlab.predict.spec.model import preset


def test_predicted_rank_divides_by_stage() -> None:
    cfg = preset("tiny-gpt")
    psi = 4 * cfg.param_count()
    ddp, z3 = predicted_rank(cfg, "ddp", 4), predicted_rank(cfg, "fsdp2-zero3", 4)
    assert ddp["params"] == psi and z3["params"] == psi // 4
    assert ddp["comm_volume"] == 2 * psi and z3["comm_volume"] == 3 * psi
    assert predicted_rank(cfg, "fsdp2-zero2", 4)["gathered"] == psi
    off = predicted_rank(cfg, "fsdp2-offload", 4)
    assert off["params"] == off["optimizer"] == 0 and off["host"] > 0


def test_ledger_rows_from_rank_rows() -> None:
    cfg = preset("tiny-gpt")
    psi = 4 * cfg.param_count()
    rows = [{"strategy": "ddp", "rank": r, "world_size": 2, "device": "cpu", "batch": 2, "seq": 32, "status": "ok",
             "params_bytes": psi, "grads_bytes": psi, "optimizer_bytes": 2 * psi + 4 * len(cfg.param_shapes()),
             "gathered_peak_bytes": 0, "comm_volume_bytes": 2 * psi} for r in (0, 1)]
    led = sharding_ledger(rows, cfg)
    assert set(led["component"]) == {"params", "grads", "optimizer", "comm volume/step"}
    assert (led["predicted"] == led["measured"]).all()
