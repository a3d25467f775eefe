"""Memory snapshots read safely (memlab.measure.snapshot): a pickle that would run code is refused, never run."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from memlab.errors import MemlabError
from memlab.measure.snapshot import load_snapshot, segment_check, snapshot_allocation_log, snapshot_timeline

MIB = 2**20


class _Evil:
    """A payload as an attacker writes one: unpickling it calls ``os.system``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def _snapshot() -> dict:
    """A snapshot dict of the shape torch.cuda.memory._snapshot() documents (synthetic values: the trace a 1000 B
    and a 3 MiB tensor would leave on a fresh allocator, its segment events as the allocator's rules make them)."""
    trace = [
        {"action": "segment_alloc", "addr": 0, "size": 2 * MIB, "stream": 0, "frames": []},
        {"action": "alloc", "addr": 0, "size": 1000, "stream": 0, "frames": [{"filename": "m.py", "line": 1,
                                                                               "name": "forward"}]},
        {"action": "segment_alloc", "addr": 1 << 30, "size": 20 * MIB, "stream": 0, "frames": []},
        {"action": "alloc", "addr": 1 << 30, "size": 3 * MIB, "stream": 0, "frames": []},
        {"action": "free_requested", "addr": 0, "size": 1000, "stream": 0, "frames": []},
        {"action": "free_completed", "addr": 0, "size": 1000, "stream": 0, "frames": []},
        {"action": "free_completed", "addr": 77, "size": 512, "stream": 0, "frames": []},
    ]
    segment = {"address": 0, "total_size": 2 * MIB, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
               "allocated_size": 0, "active_size": 0, "blocks": [{"size": 2 * MIB, "requested_size": 0, "address": 0,
                                                                  "state": "inactive", "frames": []}]}
    return {"segments": [segment], "device_traces": [trace]}


def test_a_pickle_that_runs_code_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):
        path.write_bytes(pickle.dumps({"segments": [], "x": _Evil(marker)}, protocol=protocol))
        with pytest.raises(MemlabError) as err:
            load_snapshot(path)
        assert "system" in str(err.value) and "\n" not in str(err.value)
        with pytest.raises(MemlabError):
            snapshot_timeline(path)
    assert not marker.exists()


def test_a_real_shaped_snapshot_loads_and_feeds_the_timeline(tmp_path: Path) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))
    assert load_snapshot(path) == _snapshot()
    assert load_snapshot(pickle.dumps([1, 2])) == {"segments": [1, 2]}  # older snapshots: the segment list
    tl = snapshot_timeline(path)
    assert tl["allocated_bytes"].max() == 1000 + 3 * MIB


@pytest.mark.parametrize("data", [b"not a pickle", pickle.dumps(3), pickle.dumps({"a": 1})[:-3]])
def test_not_a_snapshot_is_one_line(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(MemlabError) as err:
        load_snapshot(data)
    assert "\n" not in str(err.value)
    with pytest.raises(MemlabError):
        load_snapshot(tmp_path / "missing.pickle")


def test_snapshot_trace_feeds_the_allocator_model() -> None:
    log = snapshot_allocation_log(_snapshot())
    assert log.events == ((0, 1000), (1 << 30, 3 * MIB), (0,)) and "1 frees" in log.source
    check = segment_check(_snapshot())
    assert check["match"] and check["model"] == [("segment_alloc", 2 * MIB), ("segment_alloc", 20 * MIB)]
    with pytest.raises(MemlabError):
        snapshot_allocation_log({"segments": []})
