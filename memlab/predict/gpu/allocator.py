"""PyTorch's CUDA caching allocator, replayed: what a step's allocations and frees reserve on a GPU.

A model of ``DeviceCachingAllocator`` in ``c10/cuda/CUDACachingAllocator.cpp`` [pytorch-caching-allocator] (torch
2.13; the same functions live in ``c10/core/CachingDeviceAllocator.h`` in newer trees), function by function, for one
device and **one stream** (the allocator keeps per-stream pools, ``BlockComparatorSize`` orders by stream first; a
training step's tensors are made on the default stream, and cross-stream ``record_stream`` events are not modelled).
No CUDA graph private pools, no free-memory callbacks. The rules (sources per method below):

- every request is rounded (``round_size``: 512 B, ``roundup_power2_divisions``) and goes to the small pool
  (<= 1 MiB) or the large pool (``get_pool``);
- a cached free block is looked for, best fit (``get_free_block``: the smallest block of the pool at least as
  large; blocks of ``max_split_size`` or more are not given to smaller requests, and a request of that size or more
  takes one at most ``max_non_split_rounding_size`` larger);
- else a segment is cudaMalloc'd (``alloc_block``: 2 MiB small, 20 MiB for 1-10 MiB, else the request rounded to
  2 MiB, ``get_allocation_size``); if that would pass the capacity, the cached oversize blocks are released and it
  retries (``release_available_cached_blocks``), then every unsplit cached block (``release_cached_blocks``) and it
  retries again; then it is an OOM. With a capacity and ``garbage_collection_threshold``, cached unsplit large
  blocks older than the average are released first (``garbage_collect_cached_blocks``);
- the block found is split when the rest is worth keeping (``should_split``: >= 512 B in the small pool or with
  expandable segments, else > 1 MiB and only for requests under ``max_split_size``);
- a freed block merges with free neighbours of its segment (``free_block``, ``try_merge_blocks``);
- with ``expandable_segments``, each pool has one segment that maps pages (2 MiB small, 20 MiB large) at its end
  as it grows and unmaps free pages on a retry (``try_allocate_expandable_block``, ``map_block``, ``unmap_block``).

What a replay gives (:class:`memlab.predict.gpu.replay.Replay`): peak reserved
(``memory_stats()["reserved_bytes.all.peak"]``), peak active (the rounded blocks in use, ``active_bytes``; torch's
``allocated_bytes`` counts the same rounded sizes on one stream, ``alloc_found_block``), peak requested (the bytes
asked for, ``requested_bytes``: what memlab's trace counts), and at the moment the requested bytes peak, the reserved
bytes, the fragmentation (reserved - requested) and the largest free cached block; the same per phase. Input: an
ordered list of events, ``(key, nbytes)`` an allocation and ``(key,)`` its free (:class:`AllocationLog`, which the
fake-tensor tracer records; :func:`memlab.predict.gpu.replay.replay`). The model is the allocator's rules; it is not
a GPU measurement.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from memlab.predict.gpu.alloc_conf import (
    DEFAULT,
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorConfig,
    allocation_size,
    is_small,
    round_size,
)

Event = tuple[int, int] | tuple[int]
"""``(key, nbytes)``: an allocation of ``nbytes`` under ``key``; ``(key,)``: the free of ``key``'s allocation."""

NO_CAPACITY_VA = 1 << 48
"""Address space an expandable segment reserves when no capacity is given (the real one reserves 1 1/8 of the
device's memory, ``find_expandable_block``); only where it ends matters, and here it never does."""


@dataclass(frozen=True)
class AllocationLog:
    """A step's allocations and frees in order, with phase marks: what the allocator would be asked.

    ``events``: :data:`Event` tuples. ``phases``: ``(step, phase, start, end)``, the events ``start <= i < end``
    inside the phase. ``source``: where the log came from (a trace, a snapshot)."""

    events: tuple[Event, ...] = ()
    phases: tuple[tuple[str, str, int, int], ...] = ()
    source: str = ""

    def __len__(self) -> int:
        return len(self.events)


@dataclass(eq=False, slots=True)
class Block:
    """One block of a segment (CUDACachingAllocator.cpp ``struct Block``): address, size, neighbours."""

    addr: int
    size: int
    small: bool
    base: int
    """The address of the segment's start (page arithmetic of expandable segments)."""
    expandable: bool = False
    mapped: bool = True
    allocated: bool = False
    requested: int = 0
    prev: Block | None = None
    next: Block | None = None
    gc_base: int = 0

    def is_split(self) -> bool:
        """``Block::is_split``: a neighbour exists (it came from splitting a segment)."""
        return self.prev is not None or self.next is not None


class _Pool:
    """``BlockPool``: the free mapped blocks ordered by (size, address) (``BlockComparatorSize`` for one stream),
    the unmapped ones of expandable segments by address, and ``get_free_blocks_call_count`` for the GC."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], Block] = {}
        self.unmapped: dict[int, Block] = {}
        self.calls = 0

    def insert(self, b: Block) -> None:
        """``insert_into_blocks``: also stamps the block's GC age base."""
        b.gc_base = self.calls
        insort(self.keys, (b.size, b.addr))
        self.blocks[(b.size, b.addr)] = b

    def remove(self, b: Block) -> None:
        key = (b.size, b.addr)
        del self.keys[bisect_left(self.keys, key)]
        del self.blocks[key]

    def at(self, i: int) -> Block:
        return self.blocks[self.keys[i]]

    def largest(self) -> int:
        return self.keys[-1][0] if self.keys else 0


def _splice(b: Block, before: Block | None, after: Block | None) -> None:
    """``Block::splice``: put ``b`` between ``before`` and ``after``."""
    if before is not None:
        before.next = b
    b.prev = before
    if after is not None:
        after.prev = b
    b.next = after


def _try_merge(dst: Block, src: Block | None, pool: _Pool) -> int:
    """``try_merge_blocks``: fold a free neighbour ``src`` (same mapped state) into ``dst``; the bytes taken."""
    if src is None or src.allocated or src.mapped != dst.mapped:
        return 0
    if dst.prev is src:
        dst.addr, dst.prev = src.addr, src.prev
        if dst.prev is not None:
            dst.prev.next = dst
    else:
        dst.next = src.next
        if dst.next is not None:
            dst.next.prev = dst
    if src.mapped:
        pool.remove(src)
    else:
        del pool.unmapped[src.addr]
    dst.size += src.size
    return src.size


class CachingAllocatorModel:
    """The allocator's state for one device and one stream (module docstring); ``malloc``/``free`` as torch's.

    ``capacity_bytes``: the device's memory (None: unlimited); the allocator may reserve
    ``config.per_process_memory_fraction`` of it (``setMemoryFraction``: ``allowed_memory_maximum``), and with a
    capacity the garbage collection of ``garbage_collection_threshold`` runs (it needs ``set_fraction``)."""

    def __init__(self, config: AllocatorConfig | None = None, capacity_bytes: int | None = None) -> None:
        self.config = config or DEFAULT
        self.capacity = capacity_bytes
        self.allowed = None if capacity_bytes is None else int(capacity_bytes * self.config.per_process_memory_fraction)
        self.pools = {True: _Pool(True), False: _Pool(False)}
        self.reserved = self.active = self.requested = 0
        self.num_alloc_retries = self.num_ooms = self.num_device_alloc = self.num_device_free = 0
        self.segment_log: list[tuple[str, int]] = []
        self.active_blocks: set[Block] = set()
        """The blocks in use (``active_blocks``)."""
        self._va = 0

    # -- finding a block ---------------------------------------------------------------------------------------
    def _gc_on(self) -> bool:
        return self.allowed is not None and self.config.garbage_collection_threshold > 0.0

    def _get_free_block(self, pool: _Pool, size: int) -> Block | None:
        """``get_free_block``: the best-fit cached block for a rounded ``size``, taken out of the pool, or None."""
        if self._gc_on():
            pool.calls += 1
        i = bisect_left(pool.keys, (size, -1))
        if i == len(pool.keys):
            return None
        if pool.at(i).expandable:
            if self.config.expandable_segments:  # prefer the block that can grow least past its mapped size
                grow = self._expandable_size
                while pool.at(i).expandable and i + 1 < len(pool.keys) and grow(pool.at(i + 1)) < grow(pool.at(i)):
                    i += 1
            else:
                i += 1
                while i < len(pool.keys) and pool.at(i).expandable:
                    i += 1
                if i == len(pool.keys):
                    return None
        b, split_max = pool.at(i), self.config.max_split_size_bytes
        if size < split_max <= b.size:
            return None  # "Do not return an oversized block for a large request"
        if size >= split_max and b.size >= size + self.config.max_non_split_rounding_bytes:
            return None  # "Allow oversized block size to be rounded up but within a limit"
        pool.remove(b)
        return b

    @staticmethod
    def _expandable_size(b: Block) -> int:
        return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

    def _should_split(self, b: Block, size: int) -> bool:
        """``should_split``: keep the rest as a free block when it is worth it."""
        remaining = b.size - size
        if b.small or self.config.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.config.max_split_size_bytes and remaining > K_SMALL_SIZE

    # -- getting memory from the device ------------------------------------------------------------------------
    def _new_va(self, size: int) -> int:
        addr = self._va
        self._va += -(-size // K_SMALL_BUFFER) * K_SMALL_BUFFER + K_SMALL_BUFFER
        return addr

    def _alloc_block(self, pool: _Pool, size: int, alloc: int, retry: bool = False) -> Block | None:
        """``alloc_block``: a new segment of ``alloc`` bytes (cudaMalloc) or, with expandable segments, pages
        mapped onto the pool's segment; None where the allowed memory would be passed (checked on ``alloc``, the
        cudaMalloc size, in both cases, as the source does)."""
        if retry:
            self.num_alloc_retries += 1
        if self.allowed is not None and self.reserved + alloc > self.allowed:
            return None
        if self.config.expandable_segments:
            return self._try_allocate_expandable(pool, size)
        b = Block(self._new_va(alloc), alloc, pool.small, 0)
        b.base = b.addr
        self.reserved += alloc
        self.num_device_alloc += 1
        self.segment_log.append(("segment_alloc", alloc))
        return b

    def _release_block(self, b: Block, pool: _Pool) -> None:
        """``release_block``: cudaFree a whole cached segment."""
        pool.remove(b)
        self.reserved -= b.size
        self.num_device_free += 1
        self.segment_log.append(("segment_free", b.size))

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, free one cached oversize block at least
        ``max(size, max_split_size)`` large, else the largest oversize ones until that much is freed."""
        split_max = self.config.max_split_size_bytes
        if split_max == float("inf"):
            return False
        key = max(size, int(split_max))
        i = bisect_left(pool.keys, (key, -1))
        if i < len(pool.keys) and not pool.at(i).expandable and not pool.at(i).is_split():
            self._release_block(pool.at(i), pool)
            return True
        released, i = 0, i - 1
        while released < key and i >= 0 and pool.at(i).size >= split_max:
            b = pool.at(i)
            if not b.expandable and not b.is_split():  # an oversize block is a whole segment (never split)
                released += b.size
                self._release_block(b, pool)
            i -= 1
        return released >= key

    def _release_cached_blocks(self) -> bool:
        """``release_cached_blocks`` (also ``emptyCache``): free every cached unsplit segment of both pools and
        unmap the free pages of expandable segments."""
        for small in (False, True):
            pool = self.pools[small]
            blocks = [pool.blocks[k] for k in list(pool.keys)]
            for b in blocks:
                if not b.expandable and not b.is_split():
                    self._release_block(b, pool)
            for b in (b for b in blocks if b.expandable):
                self._unmap_block(b, pool)
                if not b.mapped and b.prev is None and b.next is None:
                    del pool.unmapped[b.addr]  # release_expandable_segment: its address space goes back
        return True

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: ``emptyCache`` is ``release_cached_blocks``."""
        self._release_cached_blocks()

    def _garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: above ``garbage_collection_threshold`` of the allowed memory, release
        cached unsplit large blocks whose age (``get_free_block`` calls since they were cached) is at least the
        average, repeatedly, until the excess is reclaimed."""
        threshold = int(self.config.garbage_collection_threshold * self.allowed)
        if self.reserved <= threshold:
            return
        target, pool, reclaimed = self.reserved - threshold, self.pools[False], 0
        ages = [pool.calls - b.gc_base for b in pool.blocks.values() if not b.is_split()]
        total_age, count, freed = sum(ages), len(ages), True
        while reclaimed < target and freed and count > 0:
            age_threshold, freed = total_age / count, False
            for b in [pool.blocks[k] for k in list(pool.keys)]:
                age = pool.calls - b.gc_base
                if not b.is_split() and not b.expandable and age >= age_threshold:
                    freed, reclaimed, total_age, count = True, reclaimed + b.size, total_age - age, count - 1
                    self._release_block(b, pool)

    # -- expandable segments -----------------------------------------------------------------------------------
    def _page(self, pool: _Pool) -> int:
        return K_SMALL_BUFFER if pool.small else self.config.large_segment_bytes

    def _find_expandable_block(self, pool: _Pool, size: int) -> Block:
        """``find_expandable_block``: the lowest-address unmapped range (with the free block before it) that has
        ``size`` bytes of free or unmapped space, else a new segment's whole address space, unmapped."""
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated

        for c in sorted(pool.unmapped.values(), key=lambda b: b.addr):
            if allocatable(c.prev):
                c = c.prev
            total, b = 0, c
            while total < size and allocatable(b):
                total, b = total + b.size, b.next
            if total >= size:
                return c
        page = self._page(pool)
        va = NO_CAPACITY_VA if self.capacity is None else self.capacity + self.capacity // 8
        va = -(-va // page) * page
        c = Block(0, va, pool.small, 0, expandable=True, mapped=False)
        c.addr = c.base = self._new_va(va)
        pool.unmapped[c.addr] = c
        return c

    def _map_block(self, to_map: Block, size: int, pool: _Pool) -> Block:
        """``map_block``: map whole pages for ``size`` bytes at the start of an unmapped block, keep the rest
        unmapped, merge with free mapped neighbours; the merged free block is returned (in the pool)."""
        page = self._page(pool)
        mapped = min(to_map.size, -(-size // page) * page)
        del pool.unmapped[to_map.addr]
        to_map.mapped = True
        if mapped < to_map.size:
            rest = Block(to_map.addr + mapped, to_map.size - mapped, pool.small, to_map.base, expandable=True,
                         mapped=False)
            _splice(rest, to_map, to_map.next)
            pool.unmapped[rest.addr] = rest
            to_map.size = mapped
        _try_merge(to_map, to_map.prev, pool)
        _try_merge(to_map, to_map.next, pool)
        pool.insert(to_map)
        self.reserved += mapped
        self.num_device_alloc += 1
        self.segment_log.append(("segment_map", mapped))
        return to_map

    def _try_allocate_expandable(self, pool: _Pool, size: int) -> Block:
        """``try_allocate_expandable_block``: map pages until one free block holds ``size``, take it out."""
        c = self._find_expandable_block(pool, size)
        if not c.mapped:
            c = self._map_block(c, min(c.size, size), pool)
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped
            c = self._map_block(nxt, min(size - c.size, nxt.size), pool)
        pool.remove(c)
        return c

    def _unmap_block(self, b: Block, pool: _Pool) -> None:
        """``unmap_block``: give back the whole pages inside a free block of an expandable segment."""
        page = self._page(pool)
        begin = b.base + -(-(b.addr - b.base) // page) * page
        end = b.base + (b.addr + b.size - b.base) // page * page
        if begin >= end:
            return
        pool.remove(b)
        if begin > b.addr:
            before = Block(b.addr, begin - b.addr, pool.small, b.base, expandable=True)
            _splice(before, b.prev, b)
            pool.insert(before)
        if b.addr + b.size > end:
            after = Block(end, b.addr + b.size - end, pool.small, b.base, expandable=True)
            _splice(after, b, b.next)
            pool.insert(after)
        b.addr, b.size, b.mapped = begin, end - begin, False
        _try_merge(b, b.prev, pool)
        _try_merge(b, b.next, pool)
        pool.unmapped[b.addr] = b
        self.reserved -= end - begin
        self.num_device_free += 1
        self.segment_log.append(("segment_unmap", end - begin))

    # -- the public calls --------------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block | None:
        """``DeviceCachingAllocator::malloc``: the block for ``nbytes`` (> 0), or None for an OOM."""
        cfg = self.config
        size = round_size(nbytes, cfg)
        pool = self.pools[is_small(size)]
        alloc = allocation_size(size, cfg)
        b = self._get_free_block(pool, size)
        if b is None:
            if self._gc_on():
                self._garbage_collect()
            b = self._alloc_block(pool, size, alloc)
            if b is None and self._release_available_cached_blocks(pool, size):
                b = self._alloc_block(pool, size, alloc)
            if b is None and self._release_cached_blocks():
                b = self._alloc_block(pool, size, alloc, retry=True)
        if b is None:
            self.num_ooms += 1
            return None
        return self._alloc_found_block(b, pool, size, nbytes)

    def _alloc_found_block(self, b: Block, pool: _Pool, size: int, nbytes: int) -> Block:
        """``alloc_found_block``: split off the rest when :meth:`_should_split`, mark the block in use."""
        if self._should_split(b, size):
            rest = b
            b = Block(rest.addr, size, pool.small, rest.base, expandable=rest.expandable)
            _splice(b, rest.prev, rest)
            rest.addr += size
            rest.size -= size
            pool.insert(rest)
        b.allocated, b.requested = True, nbytes
        self.active_blocks.add(b)
        self.active += b.size
        self.requested += nbytes
        return b

    def free(self, b: Block) -> None:
        """``free`` / ``free_block``: the block goes back to its pool, merged with free neighbours."""
        b.allocated = False
        self.active_blocks.discard(b)
        self.active -= b.size
        self.requested -= b.requested
        pool = self.pools[b.small]
        _try_merge(b, b.prev, pool)
        _try_merge(b, b.next, pool)
        pool.insert(b)

    def largest_free(self) -> int:
        """The largest cached free block of either pool (``cacheInfo``), bytes."""
        return max(self.pools[True].largest(), self.pools[False].largest())

    def segments(self) -> list[list[tuple[int, bool]]]:
        """The segments (mapped ranges of expandable ones), each its blocks' (size, allocated) in address order:
        what ``torch.cuda.memory._snapshot()["segments"]`` lists."""
        return _segments(self)


def _segments(model: CachingAllocatorModel) -> list[list[tuple[int, bool]]]:
    heads: dict[int, Block] = {}
    for pool in model.pools.values():
        for b in list(pool.blocks.values()) + list(pool.unmapped.values()):
            heads.setdefault(b.base, b)
    for b in model.active_blocks:
        heads.setdefault(b.base, b)
    out = []
    for b in sorted(heads.values(), key=lambda b: b.base):
        while b.prev is not None:
            b = b.prev
        run: list[tuple[int, bool]] = []
        while b is not None:
            if b.mapped:
                run.append((b.size, b.allocated))
            elif run:
                out.append(run)
                run = []
            b = b.next
        if run:
            out.append(run)
    return out
