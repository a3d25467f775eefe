"""memlab.labs.allocator (the CUDA caching allocator's documented rules) and memlab.labs.oom.oom_kind."""

from __future__ import annotations

import random

import pytest
import torch

from memlab.errors import SetupError
from memlab.labs import allocator as A
from memlab.labs.oom import oom_kind
from memlab.measure.oom import parse_oom_message
from memlab.measure.oom_examples import RECORDED_OOM_MESSAGES

MiB = 2**20


@pytest.mark.parametrize(("nbytes", "block", "pool", "segment"), [
    (0, 512, "small", 2 * MiB), (4, 512, "small", 2 * MiB), (513, 1024, "small", 2 * MiB),
    (MiB, MiB, "small", 2 * MiB), (MiB + 1, MiB + 512, "large", 20 * MiB),
    (10 * MiB - 512, 10 * MiB - 512, "large", 20 * MiB), (10 * MiB, 10 * MiB, "large", 10 * MiB),
    (11 * MiB + 1, 11 * MiB + 512, "large", 12 * MiB),
])
def test_requests_are_rounded_pooled_and_segmented_as_the_allocator_source_says(nbytes, block, pool, segment):
    assert (A.rounded_size(nbytes), A.pool_of(nbytes), A.segment_size(nbytes)) == (block, pool, segment)


def test_rounding_holds_for_generated_sizes() -> None:
    rng = random.Random(3)
    for n in (rng.randrange(1, 2**31) for _ in range(300)):
        r = A.rounded_size(n)
        assert r % 512 == 0 and n <= r < n + 512
        assert A.segment_size(n) >= r


def test_interleaved_frees_fragment_and_the_retry_cannot_help() -> None:
    res = A.replay(A.interleaved_frees(24, 6 * MiB, 30 * MiB), 170 * MiB)
    assert res.oom is not None and res.released_on_retry_bytes == 0
    assert res.oom["reserved_unallocated_bytes"] > 30 * MiB > res.oom["largest_free_block_bytes"]
    assert res.oom["driver_free_bytes"] < 30 * MiB


def test_a_wholly_free_segment_is_returned_by_the_retry_and_the_request_served() -> None:
    events = [("alloc", f"t{i}", 6 * MiB) for i in range(24)] + [("free", "t0"), ("free", "t1"), ("free", "t2"),
                                                                 ("alloc", "big", 30 * MiB)]
    res = A.replay(events, 170 * MiB)
    assert res.oom is None and res.released_on_retry_bytes == 20 * MiB and res.reserved_bytes == 170 * MiB


def test_blocks_tile_their_segments_and_totals_add_up_for_random_sequences() -> None:
    rng = random.Random(7)
    for _ in range(30):
        events, live = [], []
        for i in range(60):
            if live and rng.random() < 0.4:
                events.append(("free", live.pop(rng.randrange(len(live)))))
            else:
                events.append(("alloc", f"x{i}", rng.choice([rng.randrange(1, 4096), rng.randrange(1, 12 * MiB)])))
                live.append(f"x{i}")
        res = A.replay(events, 2**40, max_split_size_mb=rng.choice([None, 4, 64]))
        assert res.oom is None
        for seg in res.segments:
            ends = [o + s for o, s, _ in seg["blocks"]]
            assert [o for o, _, _ in seg["blocks"]] == [0, *ends[:-1]] and ends[-1] == seg["size_bytes"]
        assert res.allocated_bytes == sum(s for seg in res.segments for _, s, t in seg["blocks"] if t)
        assert res.reserved_bytes == sum(seg["size_bytes"] for seg in res.segments)


def test_an_oversize_block_is_not_split_for_a_small_request() -> None:
    events = [("alloc", "a", 40 * MiB), ("free", "a"), ("alloc", "b", 5 * MiB)]
    plain = A.replay(events, 2**40)
    capped = A.replay(events, 2**40, max_split_size_mb=32)
    assert len(plain.segments) == 1  # b is carved out of a's cached 40 MiB block
    assert len(capped.segments) == 2  # 40 MiB >= max_split: b gets its own 20 MiB segment


@pytest.mark.parametrize("events", [[("alloc", "a", -1)], [("free", "a")], [("alloc", "a", 8), ("alloc", "a", 8)],
                                    [("move", "a")]])
def test_bad_events_get_one_clear_error(events) -> None:
    with pytest.raises(SetupError):
        A.replay(events, 2**30)


def test_oom_kind_judges_each_recorded_message_by_its_own_fields() -> None:
    kinds = {r.key: oom_kind(parse_oom_message(r.message))["kind"] for r in RECORDED_OOM_MESSAGES}
    assert kinds["fragmented-2.5"] == "too big"  # 22.78 > 12.73 + 9.35 GiB
    for key, kind in kinds.items():
        info = parse_oom_message(next(r.message for r in RECORDED_OOM_MESSAGES if r.key == key))
        if kind == "too big":
            assert info.tried_to_allocate_bytes > info.free_bytes + (info.reserved_unallocated_bytes or 0)


def test_the_sentence_shape_reads_a_per_process_cap() -> None:
    msg = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
           "120.00 GiB is free. Including non-PyTorch memory, this process has 4.50 GiB memory in use. 4.00 GiB "
           "allowed; Of the allocated memory 3.00 GiB is allocated by PyTorch, and 0.50 GiB is reserved by PyTorch "
           "but unallocated.")
    info = parse_oom_message(msg)
    assert info.allowed_bytes == 4 * 2**30 and info.free_bytes == 120 * 2**30
    assert oom_kind(info)["kind"] == "under the free memory"


def test_small_updates_are_rounded_away_in_16_bits_and_kept_by_an_fp32_master() -> None:
    from memlab.labs.precision import update_swamping

    swamp = update_swamping(weight=1.0, update=2.0**-12, steps=64)
    last = swamp.iloc[-1]
    assert last["bf16 weight"] == 1.0 and last["fp16 weight"] == 1.0  # below half an ulp of 1.0 in both
    assert last["fp32 master"] == 1.0 + 64 * 2.0**-12  # exact in fp32
    big = update_swamping(weight=1.0, update=2.0**-6, steps=4).iloc[-1]
    assert big["bf16 weight"] == 1.0 + 4 * 2.0**-6  # above the ulp: bf16 moves too
    with pytest.raises(SetupError):
        update_swamping(steps=0)


def test_activation_gradients_are_the_gradients_between_ops() -> None:
    from memlab.labs.precision import activation_gradients
    from memlab.predict.spec.model import preset

    cfg = preset("tiny-gpt")
    g = activation_gradients(cfg, batch=1, seq=8)
    # one gradient per Attention, MLP and Block output: 3 per layer, each batch x seq x d_model
    assert g.dtype == torch.float32 and g.numel() == 3 * cfg.n_layers * 1 * 8 * cfg.d_model
    assert torch.isfinite(g).all() and (g != 0).any()


def test_a_recorded_run_replays_with_a_timeline_that_ends_at_its_totals() -> None:
    def run() -> None:
        a = torch.ones(1000)  # 4,000 B
        b = torch.ones(300_000)  # 1.2 MB: large pool
        c = (a * 2).sum()
        del a, b
        assert c.item() == 2000.0

    events = A.record_allocations(run)
    sizes = sorted(e[2] for e in events if e[0] == "alloc")
    assert 4000 in sizes and 1_200_000 in sizes
    res = A.replay(events, 2**40)
    assert len(res.timeline) == len(events) and res.timeline[-1] == (res.allocated_bytes, res.reserved_bytes)
    assert max(a for a, _ in res.timeline) >= A.rounded_size(4000) + A.rounded_size(1_200_000)
    assert all(a <= r for a, r in res.timeline)
