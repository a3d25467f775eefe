"""memlab.labs.allocator's views of the full allocator model (memlab.predict.gpu) for chapters 01 and 08."""

from __future__ import annotations

import pytest

from memlab.errors import MemlabError, SetupError
from memlab.labs import allocator as A
from memlab.predict.gpu.alloc_conf import parse_alloc_conf
from memlab.predict.gpu.allocator import AllocationLog
from memlab.predict.gpu.replay import replay

MiB = 2**20
LOG = AllocationLog(
    events=((0, 6 * MiB), (1, 6 * MiB), (2, 6 * MiB), (1,), (3, 700), (4, 30 * MiB), (3,), (0,), (2,), (4,)),
    phases=(("1", "forward", 0, 5), ("1", "backward", 5, 10)))


class _Trace:
    """Stands for memlab.tracing.tracer.Trace: replay(conf) on a fixed log."""

    def replay(self, conf: str = "") -> object:
        return replay(LOG, parse_alloc_conf(conf))


def test_settings_table_has_one_row_per_setting_with_that_settings_replay() -> None:
    table = A.settings_table(_Trace())
    assert table["setting"].tolist() == ["torch's defaults", "expandable_segments:True", "max_split_size_mb:20"]
    for conf, row in zip(A.SETTINGS, table.itertuples(), strict=True):
        total = _Trace().replay(conf).total
        assert (row.requested_bytes, row.allocated_bytes, row.reserved_bytes) == (
            total.requested_bytes, total.active_bytes, total.reserved_bytes)
        assert row.reserved_bytes >= row.allocated_bytes >= row.requested_bytes > 0
    assert table["requested_bytes"].nunique() == 1  # a setting changes the blocks, never the tensors


def test_a_bad_setting_is_refused_in_one_line() -> None:
    with pytest.raises(MemlabError) as err:
        A.settings_table(_Trace(), ("max_split_size_mb:1",))
    assert "\n" not in str(err.value)


def test_phase_table_has_each_phases_peaks() -> None:
    table = A.phase_table(_Trace().replay())
    assert table["phase"].tolist() == ["1 forward", "1 backward"]
    assert table["requested_bytes"].iloc[1] == 42 * MiB + 700  # two 6 MiB tensors, 700 B and 30 MiB live at once


def test_the_chapters_fragmentation_picture_agrees_with_the_full_model() -> None:
    demo = A.demo_on_model(A.interleaved_frees(24, 6 * MiB, 30 * MiB), 170 * MiB)
    assert not demo["served"].any()
    assert demo["reserved_bytes"].nunique() == 1


def test_events_keep_their_order_and_a_free_of_an_unknown_name_is_refused() -> None:
    assert A.as_model_events([("alloc", "a", 5), ("alloc", "b", 7), ("free", "a")]) == [(0, 5), (1, 7), (0,)]
    with pytest.raises(SetupError):
        A.as_model_events([("free", "a")])


def test_nvidia_smi_view_adds_up_to_reserved_plus_the_context() -> None:
    result = _Trace().replay()
    view = A.nvidia_smi_view(result, 500 * MiB, "a source")
    assert int(view["bytes"].sum()) == result.total.reserved_bytes + 500 * MiB
    assert view["bytes"].iloc[0] == result.total.requested_bytes
    with pytest.raises(SetupError):
        A.nvidia_smi_view(result, -1, "a source")
