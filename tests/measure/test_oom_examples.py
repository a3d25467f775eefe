"""The recorded OOM messages parse into every field they state; snapshots read offline; the probe checks input."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import MemlabError
from memlab.measure.oom import parse_oom_message
from memlab.measure.oom_examples import RECORDED_OOM_MESSAGES, decode_oom
from memlab.measure.snapshot import fragmentation_probe, snapshot_timeline

GiB = 2**30


@pytest.mark.parametrize("rec", RECORDED_OOM_MESSAGES, ids=[r.key for r in RECORDED_OOM_MESSAGES])
def test_each_recorded_message_decodes_to_at_least_request_capacity_and_allocated(rec) -> None:
    info = parse_oom_message(rec.message)
    fields = {row["field"] for row in decode_oom(info)}
    assert {"tried_to_allocate_bytes", "total_capacity_bytes", "allocated_by_pytorch_bytes"} <= fields
    assert rec.torch and rec.source


def test_the_fragmented_message_shows_a_large_unallocated_reserve() -> None:
    rec = next(r for r in RECORDED_OOM_MESSAGES if r.key == "fragmented-2.5")
    info = parse_oom_message(rec.message)
    assert info.reserved_unallocated_bytes == round(9.35 * GiB)
    assert info.reserved_unallocated_bytes > info.allocated_by_pytorch_bytes


def test_a_pid_only_message_gets_a_process_row() -> None:
    rec = next(r for r in RECORDED_OOM_MESSAGES if r.key == "container-2.1")
    rows = decode_oom(parse_oom_message(rec.message))
    assert any(r["field"] == "process 20398" and r["bytes"] == round(14.52 * GiB) for r in rows)


def test_snapshot_timeline_tracks_alloc_and_free_by_frame_category() -> None:
    snap = {"device_traces": [[
        {"action": "alloc", "addr": 1, "size": 100, "frames": [{"filename": "gpt.py", "name": "forward"}]},
        {"action": "alloc", "addr": 2, "size": 50, "frames": [{"filename": "torch/autograd/graph.py",
                                                               "name": "_engine_run_backward"}]},
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "oom", "size": 10**9},
    ]]}
    tl = snapshot_timeline(snap)
    assert list(tl["allocated_bytes"]) == [100, 150, 50, 50]
    assert list(tl["forward"]) == [100, 100, 0, 0] and tl["backward"].iloc[-1] == 50


def test_snapshot_timeline_names_a_missing_file(tmp_path) -> None:
    with pytest.raises(MemlabError, match="record_memory_history"):
        snapshot_timeline(tmp_path / "absent.pickle")


def test_fragmentation_probe_rejects_a_request_larger_than_what_is_freed() -> None:
    with pytest.raises(MemlabError, match="request_fraction"):
        fragmentation_probe(GiB, request_fraction=0.6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: this machine's torch sees none")
def test_expandable_segments_serve_the_request_the_default_allocator_refuses() -> None:
    default = fragmentation_probe(2 * GiB)
    expandable = fragmentation_probe(2 * GiB, expandable_segments=True)
    assert default["status"] == "oom"
    assert parse_oom_message(default["message"]).reserved_unallocated_bytes > 0.3 * GiB
    assert expandable["status"] == "ok"
