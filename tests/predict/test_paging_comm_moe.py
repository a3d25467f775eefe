"""Communication volumes per ZeRO stage, KV reservation waste, and mixture-of-experts parameter counts."""

from __future__ import annotations

import numpy as np
import pytest

from memlab.errors import ConfigError, SetupError
from memlab.predict.compute import flops
from memlab.predict.estimate import estimate
from memlab.predict.paging import kv_waste, max_sequences, reserved_tokens, synthetic_request_lengths
from memlab.predict.parallel.communication import collective_volume_bytes, ring_wire_bytes, zero_comm_bytes
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup


def test_zero_communication_is_2_psi_then_3_psi_for_stage_3() -> None:
    assert [sum(zero_comm_bytes(100, s).values()) for s in (0, 1, 2, 3)] == [200, 200, 200, 300]
    assert sum(zero_comm_bytes(100, 3, regather_in_backward=False).values()) == 200
    assert collective_volume_bytes("all_reduce", 10) == 20 and ring_wire_bytes(400, 4) == 300
    with pytest.raises(SetupError):
        collective_volume_bytes("all_to_all", 1)


def test_paged_waste_is_under_one_block_per_request() -> None:
    lengths = synthetic_request_lengths(500, seed=1)["total"]
    rows = {r["policy"]: r for r in kv_waste(lengths, block_tokens=16)}
    assert rows["oracle"]["wasted_fraction"] == 0
    assert rows["paged"]["reserved_tokens"] - rows["paged"]["used_tokens"] < 16 * len(lengths)
    assert rows["max"]["wasted_fraction"] > rows["pow2"]["wasted_fraction"] > rows["paged"]["wasted_fraction"]
    assert list(reserved_tokens([1, 17, 33], "pow2")) == [1, 32, 64]
    with pytest.raises(SetupError, match="max_len"):
        reserved_tokens([3000], "max", max_len=2048)


def test_synthetic_lengths_are_seeded_and_clipped() -> None:
    a, b = synthetic_request_lengths(100, seed=3), synthetic_request_lengths(100, seed=3)
    assert np.array_equal(a["total"], b["total"]) and a["total"].max() <= 2048


def test_max_sequences_is_what_the_weights_leave_over_kv_per_sequence() -> None:
    cfg = preset("llama-3-8b")
    weights = estimate(cfg, Setup(mode="inference", batch=1, seq=1)).params_bytes
    n = max_sequences(cfg, 80 * 2**30, 4096)
    per = 2 * 32 * 4096 * 8 * 128 * 2
    assert n == (80 * 2**30 - weights) // per


def test_mixtral_counts_every_expert_and_activates_two() -> None:
    mix = preset("mixtral-8x7b")
    assert round(mix.param_count() / 1e9, 1) == 46.7 and round(mix.active_param_count() / 1e9, 1) == 12.9
    dense = mix.with_(n_experts=1, top_k=1)
    assert mix.param_count() - dense.param_count() == 32 * (7 * 3 * 4096 * 14336 + 8 * 4096)
    # memory follows every expert, FLOPs follow the active ones
    assert estimate(mix, Setup(mode="inference", batch=1, seq=1)).params_bytes >= 2 * mix.param_count()
    per_token = flops.flops_per_token(mix, 1, include_attention=False)
    assert per_token == 6 * (mix.matmul_param_count() - mix.inactive_expert_params(matmul_only=True))


def test_moe_fields_are_validated() -> None:
    with pytest.raises(ConfigError, match="top_k"):
        preset("tiny-gpt").with_(n_experts=4, top_k=5)
    with pytest.raises(ConfigError, match="n_shared_experts"):
        preset("tiny-gpt").with_(n_shared_experts=1)
    assert preset("tiny-gpt").active_param_count() == preset("tiny-gpt").param_count()


def test_attention_io_standard_is_quadratic_and_flash_divides_by_the_block() -> None:
    from memlab.predict.compute.attention_io import attention_hbm_bytes

    std = [attention_hbm_bytes(1, 1, n, 64, kernel="standard", element_bytes=1) for n in (1024, 2048)]
    assert std == [4 * 1024 * 64 + 4 * 1024**2, 4 * 2048 * 64 + 4 * 2048**2]
    flash = attention_hbm_bytes(1, 1, 1024, 64, kernel="flash", element_bytes=1, sram_bytes=4 * 64 * 128)
    assert flash == 2 * 1024 * 64 + 8 * (3 * 1024 * 64 + 4 * 1024)  # blocks of 128 columns: 8 passes
    assert flash < std[0]
    with pytest.raises(SetupError):
        attention_hbm_bytes(1, 1, 8, 8, kernel="sparse")
