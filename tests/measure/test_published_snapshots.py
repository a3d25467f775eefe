"""Issue 38, part 4: memlab's caching allocator model against allocator snapshots recorded on real GPUs by others
(data/published/allocator_snapshots, reduced by scripts/reduce_snapshot.py; benchmarks/published_snapshots.py
prints the table). Replayed from the state the allocator held when each history began, the model must make the
segments the GPU made, in order, and end with the GPU's layout and reserved bytes where the snapshot records its
whole starting state."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memlab.errors import MemlabError
from memlab.measure.snapshot import expand_reduced, reduce_snapshot, segment_check

FOLDER = Path(__file__).resolve().parents[2] / "data" / "published" / "allocator_snapshots"
FILES = sorted(FOLDER.glob("*.json"))
EXACT = ("eor_nn_counterfactuals", "cs336_ctx128_forward", "cs336_medium_128_inference",
         "cs336_medium_1024_inference")
"""Snapshots whose history starts from a state the snapshot records whole (no block allocated before the history
is freed during it): the model must agree byte for byte."""


def _check(name: str) -> dict:
    return segment_check(expand_reduced(FOLDER / f"{name}.json"))


def test_every_published_snapshot_is_cited_at_a_commit() -> None:
    assert len(FILES) >= 5
    for path in FILES:
        prov = json.loads(path.read_text())["provenance"]
        assert re.search(r"github\.com/[^/]+/[^/]+/blob/[0-9a-f]{40}/", prov["source"]), path.name
        assert len(prov["sha256"]) == 64 and prov["note"], path.name


@pytest.mark.parametrize("name", EXACT)
def test_the_model_makes_the_gpus_segments_and_ends_with_its_layout(name: str) -> None:
    r = _check(name)
    assert r["match"] and r["layout_match"], name
    assert r["model_end_reserved_bytes"] == r["snapshot_reserved_bytes"] > 0
    assert "(0 frees of blocks allocated before recording left out)" in r["source"]


def test_a_real_gpus_seven_new_segments_come_in_the_same_order() -> None:
    """JasperSolt/EoR_NN's snapshot: three segments held before the history, then 5 x 20 MiB and 2 x 2 MiB made
    during it, in this order, by the GPU and by the model."""
    r = _check("eor_nn_counterfactuals")
    assert r["seeded_segments"] == 3
    assert [size >> 20 for _, size in r["model"]] == [20, 2, 2, 20, 20, 20, 20] == [s >> 20 for _, s in r["snapshot"]]


def test_where_the_start_is_not_recorded_whole_the_reserve_is_within_half_a_per_cent() -> None:
    """The CS336 training snapshots free 438 blocks allocated before the history (their places are not recorded),
    and ftcourse's differs from its 12th new segment (its torch version is not recorded): named misses, each within
    0.5 % of the GPU's reserved bytes at the end."""
    for path in FILES:
        if path.stem in EXACT:
            continue
        r = segment_check(expand_reduced(path))
        gpu, model = r["snapshot_reserved_bytes"], r["model_end_reserved_bytes"]
        assert abs(model - gpu) <= 0.005 * gpu, (path.stem, model, gpu)


def test_a_reduced_snapshot_round_trips_and_a_foreign_file_is_one_error(tmp_path: Path) -> None:
    snap = expand_reduced(FOLDER / "eor_nn_counterfactuals.json")
    again = expand_reduced(json.loads(json.dumps(reduce_snapshot(snap))))
    assert segment_check(again)["layout_match"]
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(MemlabError, match="not a reduced allocator snapshot"):
        expand_reduced(bad)
