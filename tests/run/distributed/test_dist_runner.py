"""memlab's torchrun runner on real gloo ranks: one row per rank and strategy, collectives counted against the ZeRO
paper's volumes, a failing rank and a timeout turned into one LaunchError (never a hung call)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from memlab.errors import LaunchError, SetupError
from memlab.predict.parallel.communication import zero_comm_bytes
from memlab.predict.spec.model import preset
from memlab.run.distributed.handshake import HANG_VAR
from memlab.run.distributed.launch import WorkerSpec, launch, launch_sweep, torchrun_command

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                       reason="this torch build has no torch.distributed gloo backend"),
]

CFG = preset("tiny-gpt")
PSI = 4 * CFG.param_count()  # fp32 gradients


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    spec = WorkerSpec(config=CFG, batch=2, seq=16, steps=1, device="cpu",
                      strategies=("ddp", "zero1", "fsdp2-zero2", "fsdp2-zero3"))
    run = launch(spec, 2, timeout_s=240)
    return {(r["strategy"], r["rank"]): r for r in run.rows}


def test_every_rank_reports_every_strategy(two_ranks: dict) -> None:
    assert sorted(two_ranks) == sorted((s, r) for s in ("ddp", "zero1", "fsdp2-zero2", "fsdp2-zero3") for r in (0, 1))
    assert all(row["world_size"] == 2 and row["backend"] == "gloo" for row in two_ranks.values())


def test_ddp_and_fsdp2_move_the_zero_paper_volumes(two_ranks: dict) -> None:
    for rank in (0, 1):
        assert two_ranks[("ddp", rank)]["comm_volume_bytes"] == sum(zero_comm_bytes(PSI, 0).values()) == 2 * PSI
        assert two_ranks[("fsdp2-zero2", rank)]["comm_volume_bytes"] == 2 * PSI
        # ZeRO-3's 3 Psi less the root module's own parameters: FSDP2 does not reshard the root after forward
        # (its default, as torchtitan runs it), so backward does not gather it again
        root = 4 * sum(_numel(s) for name, s, _ in CFG.param_shapes() if not name.startswith("blocks."))
        assert two_ranks[("fsdp2-zero3", rank)]["comm_volume_bytes"] == sum(zero_comm_bytes(PSI, 3).values()) - root


def test_torch_zero1_adds_a_broadcast_of_the_parameters(two_ranks: dict) -> None:
    comm = two_ranks[("zero1", 0)]["comm"]
    assert comm["all_reduce"]["volume_bytes"] == 2 * PSI and comm["broadcast"]["buffer_bytes"] == PSI


def test_fsdp2_shards_states_and_gathers_inside_the_step(two_ranks: dict) -> None:
    z2, z3 = two_ranks[("fsdp2-zero2", 0)], two_ranks[("fsdp2-zero3", 0)]
    assert z2["params_bytes"] == z3["params_bytes"] == PSI // 2
    assert z2["gathered_peak_bytes"] == PSI  # every block stays gathered from forward to backward
    block = 4 * sum(n for name, s, _ in CFG.param_shapes() if name.startswith("blocks.0.") for n in [_numel(s)])
    assert block < z3["gathered_peak_bytes"] < PSI


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def test_a_failing_rank_raises_one_launch_error_with_its_traceback() -> None:
    spec = WorkerSpec(config=CFG, strategies=("ddp",), steps=1, device="cpu", fail_rank=1)
    with pytest.raises(LaunchError, match=r"rank1 of 2 failed first(.|\n)*fails on purpose"):
        launch_sweep(spec, (2,), timeout_s=120)


def test_a_launch_past_its_timeout_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HANG_VAR, "1")  # rank 1 signals ready, then never finishes
    spec = WorkerSpec(config=CFG, strategies=("ddp",), steps=1, device="cpu")
    with pytest.raises(LaunchError, match=r"timeout_s=1 s after its ranks were ready .* killed with its \d+ rank"):
        launch_sweep(spec, (2,), timeout_s=1)


def test_bad_specs_and_commands_are_refused() -> None:
    with pytest.raises(SetupError, match="unknown strategies"):
        WorkerSpec(config=CFG, strategies=("zero4",))
    with pytest.raises(SetupError, match="rendezvous"):
        torchrun_command(8, nnodes=2)
    cmd = torchrun_command(8, nnodes=2, rdzv_endpoint="host:29500")
    assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d" and "--standalone" not in cmd


def test_memlab_shard_prints_the_ledger(capsys: pytest.CaptureFixture[str]) -> None:
    from memlab.cli import main

    assert main(["shard", "--preset", "tiny-gpt", "--ranks", "1", "--strategies", "ddp,fsdp2-zero3", "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "tiny-gpt ddp N=1" in out and "fsdp2-zero3" in out
