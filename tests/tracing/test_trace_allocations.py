"""The allocation log a trace records, replayed through the CUDA caching allocator model (memlab.predict.gpu).

On CPU fake tensors the storages are booked at their exact byte size, so the replay's requested bytes must equal
the trace's bytes, peak for peak, and the allocator can only add: reserved >= active >= requested.
"""

from __future__ import annotations

import pytest
import torch

from memlab.errors import SetupError
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.tracing.gpt import trace_gpt
from memlab.tracing.tracer import Trace, trace

TINY = preset("tiny-gpt")


def _check(t: Trace) -> None:
    """Requested == traced, phase by phase (the reliable phases; the whole log's peak equals the trace's when every
    phase is reliable, else it may count an unreliable one's), and the allocator only adds."""
    r = t.replay()
    assert r.fits and r.total.requested_bytes >= t.peak_bytes
    assert r.total.requested_bytes == t.peak_bytes or not all(row.reliable for row in t.phases)
    assert r.total.reserved_bytes >= r.total.active_bytes >= r.total.requested_bytes
    assert [p.label for p in r.phases] == [f"{row.step} {row.phase}" for row in t.phases]
    for p, row in zip(r.phases, t.phases, strict=True):
        assert p.requested_bytes == row.peak_bytes or not row.reliable, p.label
        assert p.reserved_bytes >= p.active_bytes >= p.requested_bytes


@pytest.fixture(scope="module")
def plain() -> Trace:
    return trace_gpt(TINY, Setup(batch=2, seq=32))


def test_gpt_trace_replay_peak_requested_is_the_trace_peak(plain: Trace) -> None:
    _check(plain)
    _check(trace_gpt(TINY, Setup(batch=2, seq=32, precision="amp-bf16", grad_accum_steps=2)))


def test_hf_trace_replay() -> None:
    pytest.importorskip("transformers")
    from memlab.model.hf import hf_config
    from memlab.tracing.hf import trace_hf

    cfg = hf_config("llama", hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
    _check(trace_hf(cfg, Setup(batch=2, seq=32)))


def test_fsdp2_trace_replay_follows_resized_storages() -> None:
    """FSDP2 (zero_stage 3 over a fake process group) frees and re-gathers parameters by resizing their storages:
    each resize is a free and an allocation in the log, and the phases still match."""
    t = trace_gpt(TINY, Setup(batch=2, seq=16, world_size=2, zero_stage=3))
    assert not all(row.reliable for row in t.phases)  # the first optimizer step, on fake tensors
    _check(t)


def test_inference_trace_has_a_log() -> None:
    _check(trace_gpt(TINY, Setup(batch=2, seq=32, mode="inference")))


def test_user_module_trace_replay() -> None:
    t = trace(model_fn=lambda: torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                                   torch.nn.Linear(1024, 256)),
              batch_fn=lambda: torch.randn(8, 64, 256), optimizer_fn=lambda m: torch.optim.AdamW(m.parameters()),
              loss_fn=lambda m, x: m(x).square().mean())
    _check(t)
    assert t.allocations.source == "fake-tensor trace"
    assert t.replay("expandable_segments:True").total.requested_bytes == t.peak_bytes


def test_allocation_log_stays_out_of_to_dict_and_a_logless_trace_refuses(plain: Trace) -> None:
    from dataclasses import replace

    from memlab.predict.gpu.allocator import AllocationLog

    t = plain
    assert "allocations" not in t.to_dict() and len(t.allocations) > 0
    with pytest.raises(SetupError):
        replace(t, allocations=AllocationLog()).replay()
