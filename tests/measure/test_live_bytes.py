"""LiveBytes counts live storages exactly: freed ones leave at once, views count once, cycles wait for gc;
phases keep their peak."""

from __future__ import annotations

import gc

import pytest
import torch

from memlab.errors import MemlabError
from memlab.measure.live_bytes import LiveBytes, stacked_by_label
from memlab.predict.memory.phases import PhaseRow


def test_counts_new_storages_and_drops_them_when_freed() -> None:
    with LiveBytes() as live:
        a = torch.zeros(1000)  # 4000 bytes
        v = a.view(10, 100)  # a view: same storage
        assert live.live_bytes == 4000
        b = a + 1
        assert live.live_bytes == 8000
        del b
        assert live.live_bytes == 4000
        assert live.peak_bytes == 8000
        del a, v
        assert live.live_bytes == 0


def test_track_adds_existing_tensors_under_their_label() -> None:
    w = torch.ones(256)
    view = w.view(16, 16)
    with LiveBytes() as live:
        assert live.track([w, view], "params") == 1024
        live.mark("forward")
        y = w * 2
        assert live.by_label() == {"params": 1024, "forward": 1024}
        del y
    frame = live.frame()
    assert {"op", "label", "live_bytes", "from params"} <= set(frame.columns)
    assert list(stacked_by_label(frame).columns)[:1] == ["params"]


def test_backward_gradients_and_saved_tensors_are_seen() -> None:
    lin = torch.nn.Linear(64, 64, bias=False)
    x = torch.randn(32, 64)
    with LiveBytes() as live:
        live.mark("forward")
        loss = lin(x).square().sum()
        live.mark("backward")
        loss.backward()
        del loss
    assert live.by_label().get("backward") == 64 * 64 * 4  # the weight's gradient stays alive


def test_a_reference_cycle_holds_its_tensor_until_gc() -> None:
    gc.disable()
    try:
        with LiveBytes() as live:
            holder: dict = {"t": torch.zeros(100)}
            holder["self"] = holder
            del holder
            assert live.live_bytes == 400
            gc.collect()
            assert live.live_bytes == 0
    finally:
        gc.enable()


def test_sample_every_must_be_positive() -> None:
    with pytest.raises(MemlabError, match="sample_every"):
        LiveBytes(sample_every=0)


def test_a_phase_keeps_the_peak_inside_it() -> None:
    with LiveBytes(sample_every=None) as live:
        a = torch.zeros(100)  # 400 bytes
        with live.phase("transient", step=1):
            b = a * 2
            c = a + 1
            del b  # a transient: gone before the phase ends
        del a, c
    assert live.phases == [PhaseRow(1, "transient", 1200, end_bytes=800, start_bytes=400)]
    assert live.samples == [] and live.peak_label == "transient"


def test_fake_tensors_are_counted_like_real_ones() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), LiveBytes() as live:
        x = torch.zeros(64, 64)
        y = x @ x
        assert live.live_bytes == 2 * 64 * 64 * 4
        del x, y
        assert live.live_bytes == 0
