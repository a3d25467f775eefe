"""The allocator model against PyTorch's own expectations.

Each test reproduces an assertion of torch's test suite (cited by file and test name, read at
github.com/pytorch/pytorch) or a rule stated in the allocator's source comments, with the model in place of a GPU.
A torch test that needs a capacity runs the model on one (``capacity_bytes``); the model's numbers are its rules',
never a measurement.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from dataclasses import replace
from pathlib import Path

import pytest

from memlab.errors import MemlabError
from memlab.predict.gpu.alloc_conf import (
    DEFAULT,
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    MB,
    allocation_size,
    parse_alloc_conf,
    round_size,
    roundup_power2_next_division,
)
from memlab.predict.gpu.allocator import CachingAllocatorModel
from memlab.predict.gpu.replay import replay


def _power2_div(size: int, div_factor: int) -> float:
    """test/test_cuda.py::TestCudaMallocAsync::test_allocator_settings's helper ``power2_div``, as written there."""
    pow2 = 1
    while pow2 < size:
        pow2 = pow2 * 2
    if pow2 == size:
        return pow2
    step = pow2 / 2 / div_factor
    ret = pow2 / 2
    while ret < size:
        ret = ret + step
    return ret


def _active_after(conf: str, nbytes: int) -> tuple[int, int]:
    m = CachingAllocatorModel(parse_alloc_conf(conf))
    m.malloc(nbytes)
    return m.active, m.requested


def test_memory_stats_a_256_float_tensor_is_one_kib_active() -> None:
    """test/test_cuda.py::TestCuda::test_memory_stats: ``torch.randn(256)`` adds 1024 to ``active_bytes``."""
    assert _active_after("", 256 * 4) == (1024, 1024)


def test_allocator_settings_roundup_power2_divisions() -> None:
    """test/test_cuda.py::TestCudaMallocAsync::test_allocator_settings: 21 Mi floats take exactly their bytes by
    default; ``power2_div(nbytes, 4)`` with ``roundup_power2_divisions:4`` (requested bytes unchanged);
    ``power2_div(nbytes, 8)`` and, for 100 Mi floats, ``power2_div(nbytes_big, 2)`` with the list
    ``[64:8,128:2,256:2,512:2,1024:1,>:1]``."""
    nbytes, nbytes_big = 4 * 21 * 1024 * 1024, 4 * 100 * 1024 * 1024
    assert _active_after("", nbytes) == (nbytes, nbytes)
    assert _active_after("roundup_power2_divisions:4", nbytes) == (_power2_div(nbytes, 4), nbytes)
    assert _active_after("garbage_collection_threshold:0.5,max_split_size_mb:40", nbytes)[0] == nbytes
    listed = "garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]"
    assert _active_after(listed, nbytes)[0] == _power2_div(nbytes, 8)
    assert _active_after(listed, nbytes_big)[0] == _power2_div(nbytes_big, 2)
    assert _active_after("release_lock_on_cudamalloc:True", nbytes)[0] == nbytes


@pytest.mark.parametrize("conf", ["foo:1,bar:2", "garbage_collection_threshold:1.2", "max_split_size_mb:2",
                                  "release_lock_on_cudamalloc:none", "pinned_use_cuda_host_register:none",
                                  "pinned_num_register_threads:none"])
def test_allocator_settings_refusals(conf: str) -> None:
    """test/test_cuda.py::TestCudaMallocAsync::test_allocator_settings: these settings raise ValueError in torch;
    here one MemlabError line naming the key."""
    with pytest.raises(MemlabError) as err:
        parse_alloc_conf(conf)
    assert "\n" not in str(err.value) and conf.split(":")[0] in str(err.value)


def test_allocator_config_test_roundup_divisions_by_size() -> None:
    """c10/test/core/AllocatorConfig_test.cpp::allocator_config_test: the divisions each size gets from the three
    ``roundup_power2_divisions`` spellings, and the other keys' values."""
    first = parse_alloc_conf("max_split_size_mb:40,max_non_split_rounding_mb:30,garbage_collection_threshold:0.5,"
                             "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],expandable_segments:True,"
                             "pinned_use_background_threads:True")
    assert (first.large_segment_bytes, first.max_split_size_bytes, first.max_non_split_rounding_bytes) == (
        20 * MB, 40 * MB, 30 * MB)
    assert first.garbage_collection_threshold == 0.5 and first.expandable_segments
    sizes = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    assert [first.divisions(s * MB) for s in sizes] == [8, 8, 2, 4, 2, 4, 1, 1, 1]
    second = parse_alloc_conf("large_segment_size_mb:15,max_split_size_mb:20,max_non_split_rounding_mb:40,"
                              "garbage_collection_threshold:0.8")
    assert (second.large_segment_bytes, second.max_split_size_bytes, second.max_non_split_rounding_bytes) == (
        15 * MB, 20 * MB, 40 * MB)
    third = parse_alloc_conf("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")
    assert [third.divisions(s * MB) for s in (64, 128, 256, 512, 1024, 2048, 4096)] == [8, 8, 16, 1, 0, 8, 2]
    single = parse_alloc_conf("roundup_power2_divisions:4")
    assert [single.divisions(s * MB) for s in (64, 256, 2048)] == [4, 4, 4]
    assert not parse_alloc_conf("expandable_segments:False,").expandable_segments


@pytest.mark.parametrize("conf", ["max_split_size_mb:20,large_segment_size_mb:25", "foo:123,bar:456",
                                  "max_split_size_mb", "max_split_size_mb:", "roundup_power2_divisions:[64:8",
                                  "garbage_collection_threshold:", "large_segment_size_mb:5",
                                  "backend:cudaMallocAsync"])
def test_allocator_config_test_refusals(conf: str) -> None:
    """c10/test/core/AllocatorConfig_test.cpp (allocator_config_test, malformed_config_raises_value_error): torch
    throws on these; ``large_segment_size_mb`` must be > 10 (parseLargeSegmentSize); the cudaMallocAsync backend is
    not the allocator modelled. One MemlabError line each."""
    with pytest.raises(MemlabError) as err:
        parse_alloc_conf(conf)
    assert "\n" not in str(err.value)


def test_round_size_rules() -> None:
    """CUDACachingAllocator.cpp ``round_size`` and ``roundup_power2_next_division``: under 512 B a 512 B block,
    else a multiple of 512 B; the source comment's example, 1200 with 4 divisions, gives 1280."""
    assert [round_size(n) for n in (1, 511, 512, 513, 1025)] == [512, 512, 512, 1024, 1536]
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(1024, 4) == 1024


def test_segment_sizes_by_request() -> None:
    """CUDACachingAllocator.cpp ``get_allocation_size``: up to 1 MiB a 2 MiB segment, under 10 MiB a 20 MiB one,
    else the request rounded to 2 MiB; ``large_segment_size_mb`` changes the middle case."""
    assert allocation_size(round_size(K_SMALL_SIZE)) == K_SMALL_BUFFER
    assert allocation_size(round_size(K_SMALL_SIZE + 1)) == K_LARGE_BUFFER
    assert allocation_size(round_size(K_MIN_LARGE_ALLOC - K_MIN_BLOCK_SIZE)) == K_LARGE_BUFFER
    assert allocation_size(round_size(K_MIN_LARGE_ALLOC + 1)) == K_MIN_LARGE_ALLOC + K_ROUND_LARGE
    assert allocation_size(3 * MB, parse_alloc_conf("large_segment_size_mb:64")) == 64 * MB


def test_one_to_ten_mib_requests_share_a_twenty_mib_segment() -> None:
    """CUDACachingAllocator.cpp header comment: "requests between 1MB and 10MB will allocate and split a 20MB
    block"; a split leaves the rest only when it is over 1 MiB (``should_split``), so six 3 MiB tensors share one
    segment (2 MiB left, kept) and the seventh opens a second."""
    r = replay([(i, 3 * MB) for i in range(7)])
    assert [kind for kind, _ in r.segment_log] == ["segment_alloc", "segment_alloc"]
    assert r.total.reserved_bytes == 2 * K_LARGE_BUFFER


def test_memory_snapshot_second_block_of_a_small_segment() -> None:
    """test/test_cuda.py::TestCudaMallocAsync::test_memory_snapshot: a freed 2*311x411 float tensor leaves its
    small segment free, a 310x410 one takes its start and the 311x411 ``x`` is "the second block in a segment";
    1000 tensors of 128 floats "tile evenly" at the 512 B minimum; after everything is freed, empty_cache ends the
    trace with a ``segment_free``."""
    events = [(0, 2 * 311 * 411 * 4), (0,), (1, 310 * 410 * 4), (2, 311 * 411 * 4)]
    events += [(10 + i, 128 * 4) for i in range(1000)] + [(10 + i,) for i in range(1000)]
    m = CachingAllocatorModel()
    live = {}
    for ev in events:
        if len(ev) == 2:
            live[ev[0]] = m.malloc(ev[1])
        else:
            m.free(live.pop(ev[0]))
    assert live[2].addr - live[1].addr == round_size(310 * 410 * 4) and live[1].addr == live[1].base
    assert all(size == K_SMALL_BUFFER for size in (sum(s for s, _ in seg) for seg in m.segments()))
    m.free(live.pop(1))
    m.free(live.pop(2))
    m.empty_cache()
    assert m.segment_log[-1][0] == "segment_free" and m.reserved == 0


def test_out_of_memory_retry_reuses_the_freed_block() -> None:
    """test/test_cuda.py::TestCuda::test_out_of_memory_retry: half the capacity twice does not fit, after freeing
    the first the second does (a cached block); with an 80 GB capacity (an example: half of it rounds up to 2 MiB,
    so two halves pass it)."""
    cap = 80 * 10**9
    half = cap // 2
    r = replay([(1, half), (2, half)], capacity_bytes=cap)
    assert not r.fits and r.oom_event == 1
    r = replay([(1, half), (1,), (2, half)], capacity_bytes=cap)
    assert r.fits and r.segments_allocated == 1


def test_set_per_process_memory_fraction() -> None:
    """test/test_cuda.py::TestCuda::test_set_per_process_memory_fraction: with fraction 0.5, 0.499 of the memory
    fits and 0.5 of it does not (its 2 MiB rounding passes the allowed half)."""
    cap = 80 * 10**9
    conf = replace(DEFAULT, per_process_memory_fraction=0.5)
    assert replay([(1, int(cap * 0.499))], conf, capacity_bytes=cap).fits
    assert not replay([(1, int(cap * 0.5))], conf, capacity_bytes=cap).fits


def _run(m: CachingAllocatorModel, steps: list[tuple[str, object]], live: dict[str, object] | None = None
         ) -> dict[str, object]:
    live = {} if live is None else live
    for name, arg in steps:
        if name == "conf":
            m.config = parse_alloc_conf(str(arg))
        elif name == "del":
            for key in str(arg).split(","):
                m.free(live.pop(key))
        else:
            live[name] = m.malloc(int(arg) * MB)
    return live


def test_max_split_expandable() -> None:
    """test/test_cuda.py::TestCudaMallocAsync::test_max_split_expandable: 120 MiB allowed, ``max_split_size_mb:40``,
    three 40 MiB tensors (the middle one with expandable segments) fit, a fourth raises OutOfMemoryError; freed,
    one 120 MiB tensor fits (release_cached_blocks with expandable blocks in the free list)."""
    m = CachingAllocatorModel(capacity_bytes=120 * MB)
    off, on = "expandable_segments:False,max_split_size_mb:40", "expandable_segments:True,max_split_size_mb:40"
    live = _run(m, [("conf", off), ("a", 40), ("conf", on), ("b", 40), ("conf", off), ("c", 40), ("d", 40)])
    assert live["d"] is None and all(live[k] is not None for k in "abc")
    live.pop("d")
    live = _run(m, [("del", "a,b,c"), ("e", 120)], live)
    assert live["e"] is not None and m.reserved == 120 * MB


def test_garbage_collect_expandable() -> None:
    """test/test_cuda.py::TestCudaMallocAsync::test_garbage_collect_expandable: 120 MiB allowed,
    ``garbage_collection_threshold:0.5``, 40 MiB without and 40 MiB with expandable segments, both freed: an 80 MiB
    tensor then fits (the GC releases the unsplit cached segment)."""
    m = CachingAllocatorModel(capacity_bytes=120 * MB)
    live = _run(m, [("conf", "expandable_segments:False,garbage_collection_threshold:0.5"), ("a", 40),
                    ("conf", "expandable_segments:True,garbage_collection_threshold:0.5"), ("b", 40),
                    ("del", "a,b"), ("c", 80)])
    assert live["c"] is not None and m.num_device_free >= 1


def test_expandable_segments_grow_one_segment_by_pages() -> None:
    """CUDACachingAllocator.cpp Note [Expandable Segments]: one segment per pool grows by 20 MiB pages (large pool)
    and "allocations will tile nicely into the one large segment": 3 + 3 + 30 MiB reserve 40 MiB there, 50 MiB
    (a 20 MiB and a 30 MiB segment) without."""
    events = [(1, 3 * MB), (2, 3 * MB), (3, 30 * MB)]
    assert replay(events, parse_alloc_conf("expandable_segments:True")).total.reserved_bytes == 40 * MB
    assert replay(events).total.reserved_bytes == 50 * MB
    small = replay([(i, 100_000) for i in range(30)], parse_alloc_conf("expandable_segments:True"))
    assert small.total.reserved_bytes == 2 * K_SMALL_BUFFER  # 30 x 100,352 B mapped in 2 MiB pages


def test_max_split_size_blocks_are_not_split_nor_given_to_small_requests() -> None:
    """CUDACachingAllocator.cpp header comment and ``get_free_block``: "blocks >= max_split_size are not allowed to
    be split" and a request under max_split_size does not take one; a request over it takes a cached block at most
    ``max_non_split_rounding_mb`` (default ``large_segment_size_mb``, 20) larger."""
    conf = parse_alloc_conf("max_split_size_mb:40")
    r = replay([(1, 100 * MB), (1,), (2, 30 * MB)], conf)
    assert r.segments_allocated == 2  # the cached 100 MiB block is not given to the 30 MiB request
    r = replay([(1, 100 * MB), (1,), (2, 90 * MB)], conf)
    assert r.segments_allocated == 1 and r.total.active_bytes == 100 * MB  # taken whole, not split
    r = replay([(1, 100 * MB), (1,), (2, 80 * MB)], conf)
    assert r.segments_allocated == 2  # 20 MiB or more larger: not taken
    assert replay([(1, 100 * MB), (1,), (2, 30 * MB)]).segments_allocated == 1  # unlimited: split


def test_freed_neighbours_merge() -> None:
    """CUDACachingAllocator.cpp ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours,
    so two freed 4 MiB halves of a segment serve one 8 MiB request without a new segment."""
    r = replay([(1, 4 * MB), (2, 4 * MB), (3, 4 * MB), (1,), (2,), (4, 8 * MB)])
    assert r.segments_allocated == 1


def test_release_and_retry_before_oom() -> None:
    """CUDACachingAllocator.cpp ``malloc``: when cudaMalloc would pass the capacity, cached unsplit segments are
    released and the allocation retried (``num_alloc_retries``) before an OOM."""
    r = replay([(1, 50 * MB), (1,), (2, 60 * MB)], capacity_bytes=100 * MB)
    assert r.fits and r.alloc_retries == 1 and r.total.reserved_bytes == 60 * MB


def test_phases_count_from_their_start() -> None:
    """Per-phase peaks as after ``torch.cuda.reset_peak_memory_stats()`` at each phase start."""
    from memlab.predict.gpu.allocator import AllocationLog

    log = AllocationLog(((1, 30 * MB), (1,), (2, 1000)), phases=(("s", "a", 0, 2), ("s", "b", 2, 3)))
    r = replay(log)
    assert r.phase("s a").requested_bytes == 30 * MB and r.phase("s b").requested_bytes == 1000
    assert r.phase("s b").reserved_bytes == 30 * MB + K_SMALL_BUFFER  # the cached segment stays reserved
    assert r.total.fragmentation_bytes == 0 and r.phase("s b").fragmentation_bytes == 30 * MB + K_SMALL_BUFFER - 1000


@pytest.mark.parametrize("events", [[(1,)], [(1, 10), (1, 10)], [(1, -5)], [("a", 3)]])
def test_bad_events_are_one_line(events: list) -> None:
    with pytest.raises(MemlabError) as err:
        replay(events)
    assert "\n" not in str(err.value)


def test_constants_match_the_installed_torch_headers() -> None:
    """The installed torch's ``include/c10/core/AllocatorConfig.h`` (torch 2.13) defines the constants the model
    uses, and MemTracker rounds CUDA storages to the same 512 B (``_PYTORCH_MIN_ALLOCATE``)."""
    spec = importlib.util.find_spec("torch")  # its files, without importing it
    root = Path(spec.origin).parent if spec is not None and spec.origin else Path("/nonexistent")
    header = root / "include" / "c10" / "core" / "AllocatorConfig.h"
    if not header.exists():
        pytest.skip("this torch ships no C++ headers")
    text = header.read_text()
    defined = {k: int(v) for k, v in re.findall(r"constexpr size_t (k\w+) = (\d+);", text)}
    assert defined == {"kSmallBuffer": K_SMALL_BUFFER, "kMinBlockSize": K_MIN_BLOCK_SIZE, "kSmallSize": K_SMALL_SIZE,
                       "kMinLargeAlloc": K_MIN_LARGE_ALLOC, "kRoundLarge": K_ROUND_LARGE}
    assert re.search(r"large_segment_size_\{(\d+)\}", text).group(1) == str(K_LARGE_BUFFER)
    tracker = (root / "distributed" / "_tools" / "mem_tracker.py").read_text()
    assert re.search(r"_PYTORCH_MIN_ALLOCATE = \(\s*2\*\*9 if", tracker) and K_MIN_BLOCK_SIZE == 2**9


def test_segments_list_their_blocks_as_a_snapshot_does() -> None:
    """torch/cuda/memory.py ``_snapshot``: each segment (cudaMalloc, or a mapped range of an expandable segment)
    lists its blocks in address order; a 30 MiB request gets a segment of its own, a 3 MiB one shares a 20 MiB one."""
    m = CachingAllocatorModel()
    big, small = m.malloc(30 * MB), m.malloc(3 * MB)
    assert sorted(m.segments()) == [[(3 * MB, True), (17 * MB, False)], [(30 * MB, True)]]
    m.free(big)
    m.free(small)
    assert sorted(m.segments()) == [[(20 * MB, False)], [(30 * MB, False)]]
    e = CachingAllocatorModel(parse_alloc_conf("expandable_segments:True"))
    e.malloc(3 * MB)
    assert e.segments() == [[(3 * MB, True), (17 * MB, False)]]


def test_constants_match_test_cuda_module_constants() -> None:
    """test/test_cuda.py's module constants (used by TestBlockStateAbsorption): MIN_BLOCK_SIZE = 512,
    SMALL_SIZE = 1048576, SMALL_BUFFER = 2097152, LARGE_BUFFER = 20971520."""
    assert (K_MIN_BLOCK_SIZE, K_SMALL_SIZE, K_SMALL_BUFFER, K_LARGE_BUFFER) == (512, 1048576, 2097152, 20971520)


def _blocks(m: CachingAllocatorModel) -> list:
    """Every block of every segment (mapped or not), each segment's chain in address order."""
    seen, out = set(), []
    pools = m.pools.values()
    starts = [b for p in pools for b in (*p.blocks.values(), *p.unmapped.values())] + list(m.active_blocks)
    for b in starts:
        while b.prev is not None:
            b = b.prev
        if id(b) in seen:
            continue
        seen.add(id(b))
        chain = []
        while b is not None:
            chain.append(b)
            b = b.next
        out.append(chain)
    return out


def _check(m: CachingAllocatorModel) -> None:
    """The allocator's invariants: a segment's blocks tile it (each ends where the next starts), free neighbours of
    the same mapped state are merged, reserved is the mapped bytes, active the allocated blocks' bytes, and every
    free mapped block is in its pool under its (size, address)."""
    mapped = active = 0
    for chain in _blocks(m):
        for a, b in itertools.pairwise(chain):
            assert a.addr + a.size == b.addr and b.prev is a
            assert a.allocated or b.allocated or a.mapped != b.mapped
        for b in chain:
            mapped += b.size if b.mapped else 0
            active += b.size if b.allocated else 0
            if b.mapped and not b.allocated:
                assert m.pools[b.small].blocks[(b.size, b.addr)] is b
    assert (mapped, active) == (m.reserved, m.active)


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:40",
                                  "roundup_power2_divisions:4,garbage_collection_threshold:0.6"])
def test_allocator_fuzz(conf: str) -> None:
    """test/test_cuda.py::TestCudaMallocAsync::test_allocator_fuzz, on the model: seed 123, int32 tensors of
    2-20 MiB, allocations, frees and empty_cache calls weighted 1 : 1 : 0.1, live bytes kept under 1 GB / 10 (here
    2000 steps, every third request 64 times smaller, on a 128 MiB capacity so that the release-and-retry path and
    out-of-memory refusals happen, and the allocator's invariants checked throughout)."""
    import random

    rng = random.Random(123)
    m = CachingAllocatorModel(parse_alloc_conf(conf), capacity_bytes=128 * MB)
    mem, total = [], 0
    for step in range(2000):
        while total >= 1024 * 1024 * 1024 / 10:
            b, n = mem.pop(rng.randrange(0, len(mem)))
            total -= n
            m.free(b)
        (action,) = rng.choices(["alloc", "free", "empty"], weights=[1, 1 if mem else 0, 0.1])
        if action == "alloc":
            n = 4 * rng.randrange(2 * 1024 * 1024 // 4, 20 * 1024 * 1024 // 4) // (1 if step % 3 else 64)
            b = m.malloc(n)
            if b is not None:
                mem.append((b, n))
                total += n
        elif action == "free":
            b, n = mem.pop(rng.randrange(0, len(mem)))
            total -= n
            m.free(b)
        else:
            m.empty_cache()
        if step % 50 == 0:
            _check(m)
    _check(m)
    assert m.num_alloc_retries > 0 and m.num_ooms > 0 and m.reserved <= 128 * MB
