"""What the device adds beyond the step's tensors (memlab.predict.gpu.device): each term from its source, the three
peaks stacked, and the formula's reserve bound held against the allocator replay on generated setups."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from memlab.errors import SetupError
from memlab.predict.gpu import device as D
from memlab.predict.spec.setup import Setup


def test_cublas_workspace_defaults_are_pytorchs_per_architecture() -> None:
    # CublasHandlePool.cpp: ":4096:2:16:8" off sm90, 32 MiB on sm90; cuBLASLt 1024 KiB; both per (handle, stream)
    assert D.CUBLAS_WORKSPACE_DEFAULT_BYTES == 8_519_680 and D.CUBLAS_WORKSPACE_SM90_BYTES == 32 * 2**20
    assert D.workspace_bytes("a100-80gb-sxm", 1) == 8_519_680 + 2**20
    assert D.workspace_bytes("h100-sxm", 2) == 2 * (32 * 2**20 + 2**20)
    assert D.workspace_bytes("b200", 1) == 8_519_680 + 2**20  # sm100 is not "major 9 minor 0"


def test_training_uses_two_handles_inference_one() -> None:
    assert D.handles_of("train") == 2 and D.handles_of("inference") == 1


def test_context_is_the_documented_range() -> None:
    assert D.CUDA_CONTEXT_LOW_BYTES == 287_047_680 - 20 * 2**20 < D.CUDA_CONTEXT_HIGH_BYTES == 426 * 2**20
    ctx = next(t for t in D.terms("h100-sxm", Setup(), D.DeviceOverheads(), 0) if t.name == "cuda_context")
    assert (ctx.low, ctx.high, ctx.layer) == (D.CUDA_CONTEXT_LOW_BYTES, D.CUDA_CONTEXT_HIGH_BYTES, "device")
    given = next(t for t in D.terms("h100-sxm", Setup(), D.DeviceOverheads(cuda_context_bytes=5), 0)
                 if t.name == "cuda_context")
    assert given.low == given.high == 5


def test_nccl_and_ddp_only_with_ranks() -> None:
    one = {t.name for t in D.terms("a100-80gb-sxm", Setup(), D.DeviceOverheads(), 100)}
    assert one == {"cublas_workspaces", "cuda_context"}
    ddp = {t.name: t for t in D.terms("a100-80gb-sxm", Setup(world_size=4), D.DeviceOverheads(), 100)}
    assert ddp["ddp_buckets"].high == 100 and ddp["ddp_buckets"].layer == "allocated"
    assert (ddp["nccl_buffers"].low, ddp["nccl_buffers"].high) == (2 * 4 * 2**20, 2 * 4 * 2**20 * 32)
    zero3 = {t.name for t in D.terms("a100-80gb-sxm", Setup(world_size=4, zero_stage=3), D.DeviceOverheads(), 100)}
    assert "ddp_buckets" not in zero3 and "nccl_buffers" in zero3
    view = {t.name for t in D.terms("a100-80gb-sxm", Setup(world_size=4), D.DeviceOverheads(ddp_buckets=False), 9)}
    assert "ddp_buckets" not in view


def test_peaks_stack_and_the_verdict_takes_the_high_end() -> None:
    extra = D.terms("h100-sxm", Setup(), D.DeviceOverheads(), 0)
    p = D.device_peaks(10 * 2**30, (0, 2**30), 80 * 2**30, extra, "test")
    assert p.allocated_bytes == 10 * 2**30 + D.workspace_bytes("h100-sxm", 2)
    assert p.reserved_low_bytes == p.allocated_bytes and p.reserved_bytes == p.allocated_bytes + 2**30
    assert p.device_high_bytes == p.reserved_bytes + D.CUDA_CONTEXT_HIGH_BYTES and p.fits and p.word == "FITS"
    tight = D.device_peaks(10 * 2**30, (0, 2**30), p.device_low_bytes + 1, extra, "test")
    assert not tight.fits and tight.word.startswith("FITS ONLY IF") and tight.margin_bytes < 0
    assert D.device_peaks(10 * 2**30, (0, 0), 2**30, extra, "").word == "DOES NOT FIT"


def test_bad_overrides_are_one_error() -> None:
    with pytest.raises(SetupError, match="cuda_context_bytes"):
        D.DeviceOverheads(cuda_context_bytes=-1)


def _generated(seed: int, n: int) -> list[tuple[object, Setup]]:
    """Small reference-GPT setups drawn with ``seed``: width, depth, batch, sequence, optimizer, recompute,
    precision, gradient accumulation."""
    from memlab.predict.spec.model import preset

    rng, tiny = random.Random(seed), preset("tiny-gpt")
    out = []
    for _ in range(n):
        d, s = rng.choice([64, 128, 256, 384]), rng.choice([16, 64, 128, 256])
        cfg = replace(tiny, d_model=d, n_layers=rng.choice([1, 2, 3]), d_ff=4 * d, max_seq=max(s, tiny.max_seq))
        out.append((cfg, Setup(batch=rng.choice([1, 2, 4, 8]), seq=s, optimizer=rng.choice(["adamw", "sgd"]),
                               recompute=rng.choice(["none", "full"]), attention="math",
                               precision=rng.choice(["fp32", "amp-bf16", "bf16"]),
                               grad_accum_steps=rng.choice([1, 2]))))
    return out


def _check_bound(cfg: object, setup: Setup) -> None:
    from memlab.predict.estimate import estimate
    from memlab.tracing.gpt import trace_gpt

    r = trace_gpt(cfg, setup).replay()
    bd = estimate(cfg, setup, device_type="cpu")
    bound = D.reserve_bound(bd.peak_bytes, bd.params_bytes + bd.optimizer_bytes)
    assert r.total.reserved_bytes <= bd.peak_bytes + bound, (cfg, setup)


def test_reserve_bound_holds_the_replay_on_one_small_setup() -> None:
    from memlab.predict.spec.model import preset

    cfg = replace(preset("tiny-gpt"), d_model=64, n_layers=1, d_ff=256)
    _check_bound(cfg, Setup(batch=2, seq=64, optimizer="adamw", precision="fp32", attention="math"))


@pytest.mark.wide
@pytest.mark.parametrize("seed", range(4))
def test_reserve_bound_holds_the_replay_on_generated_setups(seed: int) -> None:
    for cfg, setup in _generated(seed, 6):
        _check_bound(cfg, setup)


def test_chapter_calls_for_an_estimate_and_a_replay() -> None:
    from types import SimpleNamespace

    from memlab.predict.estimate import Overheads, estimate
    from memlab.predict.spec.model import preset

    setup = Setup(batch=2, seq=64)
    bd = estimate(preset("tiny-gpt"), setup, overheads=Overheads(cuda_context_bytes=7))
    p = D.for_estimate(bd, setup, "a100-80gb-sxm", 2**34)
    assert p.tensors_bytes == bd.peak_bytes - 7 and p.reserved_low_bytes == p.allocated_bytes < p.reserved_bytes
    replay = SimpleNamespace(total=SimpleNamespace(reserved_bytes=30, active_bytes=12, requested_bytes=10))
    r = D.for_replay(10, replay, setup, "a100-80gb-sxm", 2**34)
    assert r.allocated_bytes == 12 + D.workspace_bytes("a100-80gb-sxm", 2)
    assert r.reserved_bytes - r.allocated_bytes == 18
    assert r.reserved_low_bytes == r.reserved_bytes
    given = D.for_replay(10, replay, setup, "a100-80gb-sxm", 2**34, overheads=D.DeviceOverheads(reserve_bytes=3))
    assert given.reserved_bytes - given.allocated_bytes == 3
