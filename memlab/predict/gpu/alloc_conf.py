"""``PYTORCH_CUDA_ALLOC_CONF`` as a frozen dataclass, its parser, and the size rules of PyTorch's caching allocator.

Everything here is read from the source of torch 2.13 (the locked version) [pytorch-caching-allocator], in three places:

- the constants and the config's fields and defaults: the installed headers ``torch/include/c10/core/
  AllocatorConfig.h`` (``kSmallBuffer``, ``kMinBlockSize``, ``kSmallSize``, ``kMinLargeAlloc``, ``kRoundLarge``,
  ``AcceleratorAllocatorConfig::large_segment_size_`` = 20971520, ``max_split_size_`` = SIZE_MAX,
  ``garbage_collection_threshold_`` = 0, ``use_expandable_segments_`` = false) and ``c10/cuda/CUDAAllocatorConfig.h``
  (``getKeys``: the CUDA-only keys);
- the parser's rules: ``c10/core/AllocatorConfig.cpp`` (``AcceleratorAllocatorConfig::parseArgs`` and its
  ``parse*`` helpers), whose messages are in the installed ``torch/lib/libc10.so`` ("CachingAllocator option
  large_segment_size_mb must be > ", "max_split_size_mb too small, must be >= ", "garbage_collect_threshold is
  invalid, set it in (0.0, 1.0)", "For roundups, the divisions has to be power of 2 or 0 ...");
- the size rules: ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator::round_size``,
  ``roundup_power2_next_division``, ``get_allocation_size``), the same functions as
  ``c10/core/CachingDeviceAllocator.h`` (``get_round_size``, ``get_allocation_size``) in newer trees.

The expectations of PyTorch's own tests for these rules (``c10/test/core/AllocatorConfig_test.cpp``,
``test/test_cuda.py::TestCudaMallocAsync::test_allocator_settings``) are reproduced in
``tests/predict/gpu/test_allocator.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memlab.errors import MemlabError

MB = 1 << 20
"""kMB in c10/core/AllocatorConfig.cpp: the allocator's "MB" is a MiB."""
K_MIN_BLOCK_SIZE = 512
"""kMinBlockSize (AllocatorConfig.h): every block is rounded up to a multiple of 512 B."""
K_SMALL_SIZE = 1048576
"""kSmallSize (AllocatorConfig.h): the largest "small" request, 1 MiB; larger ones go to the large pool."""
K_SMALL_BUFFER = 2097152
"""kSmallBuffer (AllocatorConfig.h): small requests are packed in 2 MiB segments."""
K_MIN_LARGE_ALLOC = 10485760
"""kMinLargeAlloc (AllocatorConfig.h): requests under 10 MiB share a ``large_segment_size`` (20 MiB) segment."""
K_ROUND_LARGE = 2097152
"""kRoundLarge (AllocatorConfig.h): a request of 10 MiB or more gets its own segment, rounded up to 2 MiB."""
K_LARGE_BUFFER = 20971520
"""AcceleratorAllocatorConfig::large_segment_size_ default (AllocatorConfig.h, "20 MB by default"; kLargeBuffer in
CUDACachingAllocator.cpp before the key existed)."""
ROUNDUP_INTERVALS = 16
"""kRoundUpPowerOfTwoIntervals (AllocatorConfig.cpp): one division count per power of two from 1 MiB to 32 GiB
(``roundup_power2_divisions(size)``: index log2(size) - 20, clamped to 0..15)."""

_NO_MODEL_EFFECT = frozenset({
    "pinned_use_background_threads", "pinned_max_round_threshold_mb", "pinned_max_cached_size_mb",
    "release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "release_lock_on_hipmalloc",
    "pinned_use_hip_host_register", "graph_capture_record_stream_reuse", "pinned_reserve_segment_size_mb",
    "pinned_num_register_threads", "pinned_free_catch_all", "throw_on_cudamalloc_oom",
})
"""Keys torch 2.13 accepts that change nothing the model counts: the pinned host allocator's, the lock around
cudaMalloc, CUDA-graph capture, and throwing instead of retrying (the strings in libc10.so and
CUDAAllocatorConfig::getKeys)."""
KEYS = ("backend", "large_segment_size_mb", "max_split_size_mb", "max_non_split_rounding_mb",
        "garbage_collection_threshold", "roundup_power2_divisions", "expandable_segments",
        "per_process_memory_fraction", *sorted(_NO_MODEL_EFFECT))
"""Every key torch 2.13's parsers accept (AcceleratorAllocatorConfig::parseArgs, CUDAAllocatorConfig::getKeys)."""


@dataclass(frozen=True)
class AllocatorConfig:
    """The caching allocator's settings, one field per ``PYTORCH_CUDA_ALLOC_CONF`` key the model uses; defaults are
    torch 2.13's (module docstring). Sizes in MiB as the keys spell them; the ``*_bytes`` properties give bytes."""

    max_split_size_mb: int | None = None
    """Blocks of this size or more are never split, nor served to smaller requests; None: unlimited (SIZE_MAX)."""
    max_non_split_rounding_mb: int | None = None
    """A request >= max_split_size takes a cached block up to this much larger; None: ``large_segment_size_mb``."""
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    """Divisions per power-of-two interval from 1 MiB (index 0) to 32 GiB and above (index 15); 0 or 1: none."""
    garbage_collection_threshold: float = 0.0
    """Fraction of the allowed memory above which cached unsplit large blocks are released (0: off)."""
    expandable_segments: bool = False
    """One segment per pool that grows by pages (2 MiB small, ``large_segment_size`` large) instead of many."""
    large_segment_size_mb: int = K_LARGE_BUFFER // MB
    """The segment a 1-10 MiB request gets, and an expandable large segment's page."""
    per_process_memory_fraction: float = 1.0
    """Fraction of the device's memory the allocator may reserve (``set_per_process_memory_fraction``)."""

    @property
    def max_split_size_bytes(self) -> float:
        """``max_split_size`` in bytes; ``inf`` when unlimited."""
        return float("inf") if self.max_split_size_mb is None else self.max_split_size_mb * MB

    @property
    def max_non_split_rounding_bytes(self) -> int:
        """``max_non_split_rounding_size`` in bytes (defaults to ``large_segment_size``, AllocatorConfig.cpp)."""
        mb = self.max_non_split_rounding_mb if self.max_non_split_rounding_mb is not None \
            else self.large_segment_size_mb
        return mb * MB

    @property
    def large_segment_bytes(self) -> int:
        """``large_segment_size`` in bytes."""
        return self.large_segment_size_mb * MB

    def divisions(self, size: int) -> int:
        """``roundup_power2_divisions(size)`` (AllocatorConfig.cpp): the divisions of ``size``'s interval."""
        index = max(0, min(size.bit_length() - 1 - 20, ROUNDUP_INTERVALS - 1))
        return self.roundup_power2_divisions[index]


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """The next of ``divisions`` equal steps between the powers of two around ``size`` (bytes).

    Source: CUDACachingAllocator.cpp ``roundup_power2_next_division``: a power of two stays; else the step is
    ``floor_pow2(size) >> log2(divisions)`` (0 gives the next power of two) and ``size`` goes up to a multiple of it.
    Its comment's example: 1200 with 4 divisions gives 1280."""
    if _power_of_two(size):
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, config: AllocatorConfig | None = None) -> int:
    """The block size the allocator gives a request of ``size`` bytes.

    Source: CUDACachingAllocator.cpp ``round_size``: under 512 B, 512; else with ``d`` =
    ``roundup_power2_divisions(size)`` > 1 and ``size > 512 * d``, :func:`roundup_power2_next_division`; else up to
    a multiple of 512 B."""
    config = config or DEFAULT
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    d = config.divisions(size)
    if d > 1 and size > K_MIN_BLOCK_SIZE * d:
        return roundup_power2_next_division(size, d)
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def is_small(rounded: int) -> bool:
    """Whether a rounded request goes to the small pool: ``size <= kSmallSize`` (CUDACachingAllocator.cpp
    ``get_pool``)."""
    return rounded <= K_SMALL_SIZE


def allocation_size(rounded: int, config: AllocatorConfig | None = None) -> int:
    """The segment cudaMalloc'd for a rounded request no cached block serves (bytes).

    Source: CUDACachingAllocator.cpp ``get_allocation_size``: up to 1 MiB a 2 MiB small segment; under 10 MiB a
    ``large_segment_size`` (20 MiB) one; else the request rounded up to 2 MiB."""
    config = config or DEFAULT
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return config.large_segment_bytes
    return -(-rounded // K_ROUND_LARGE) * K_ROUND_LARGE


DEFAULT = AllocatorConfig()
"""torch 2.13's defaults (no ``PYTORCH_CUDA_ALLOC_CONF``)."""


# -- the parser --------------------------------------------------------------------------------------------------
def _tokens(text: str) -> list[str]:
    """ConfigTokenizer (AllocatorConfig.h): ``,`` ``:`` ``[`` ``]`` are tokens, whitespace is dropped."""
    out, buf = [], ""
    for ch in text:
        if ch in ",:[]":
            if buf:
                out.append(buf)
                buf = ""
            out.append(ch)
        elif not ch.isspace():
            buf += ch
    return out + ([buf] if buf else [])


def _bad(text: str, why: str) -> MemlabError:
    return MemlabError(f"PYTORCH_CUDA_ALLOC_CONF {text!r}: {why} (torch 2.13's parser refuses it too)")


def _int(text: str, key: str, value: str) -> int:
    if not value.isdigit():
        raise _bad(text, f"{key} needs a whole number, got {value!r}")
    return int(value)


def _divisions(text: str, values: list[tuple[str, str]]) -> tuple[int, ...]:
    """parseRoundUpPower2Divisions (AllocatorConfig.cpp): ``[64:8,256:4,>:1]`` sets the interval starting at each
    power-of-two MiB boundary (the first value also fills every interval below it; ``>`` every one after the last
    named); a single number sets all 16."""
    if len(values) == 1 and values[0][0] == "":
        d = _int(text, "roundup_power2_divisions", values[0][1])
        if not _power_of_two(d):
            raise _bad(text, "roundup_power2_divisions has to be a power of 2")
        return (d,) * ROUNDUP_INTERVALS
    out, last, first = [0] * ROUNDUP_INTERVALS, 0, True
    for bound, value in values:
        d = _int(text, "roundup_power2_divisions", value)
        if d != 0 and not _power_of_two(d):
            raise _bad(text, "roundup_power2_divisions values have to be a power of 2 or 0")
        if bound == ">":
            out[last + 1:] = [d] * (ROUNDUP_INTERVALS - last - 1)
            continue
        mb = _int(text, "roundup_power2_divisions", bound)
        if not _power_of_two(mb):
            raise _bad(text, "roundup_power2_divisions intervals have to be a power of 2 (MiB)")
        index = min(mb.bit_length() - 1, ROUNDUP_INTERVALS - 1)
        if first:
            out[:index] = [d] * index
            first = False
        out[index], last = d, index
    return tuple(out)


def _pairs(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """``key:value`` and ``key:[a:b,c:d]`` items, in order; a malformed string raises."""
    tok, i, out = _tokens(text), 0, []
    while i < len(tok):
        key = tok[i]
        if key in ",:[]":
            raise _bad(text, f"expected a key at {key!r}")
        if i + 2 >= len(tok) or tok[i + 1] != ":":
            raise _bad(text, f"{key} has no value (write {key}:<value>)")
        if tok[i + 2] != "[":
            out.append((key, [("", tok[i + 2])]))
            i += 3
        else:
            j, items = i + 3, []
            while j < len(tok) and tok[j] != "]":
                if j + 2 >= len(tok) or tok[j + 1] != ":" or (j + 3 < len(tok) and tok[j + 3] not in ",]"):
                    raise _bad(text, f"{key}'s list needs bound:value items, comma-separated, closed by ]")
                items.append((tok[j], tok[j + 2]))
                j += 4 if j + 3 < len(tok) and tok[j + 3] == "," else 3
            if j >= len(tok):
                raise _bad(text, f"{key}'s list has no closing ]")
            out.append((key, items))
            i = j + 1
        if i < len(tok):
            if tok[i] != ",":
                raise _bad(text, f"expected ',' after {key}'s value")
            i += 1
    return out


def _bool(text: str, key: str, value: str) -> bool:
    if value not in ("True", "False"):
        raise _bad(text, f"{key} takes True or False, got {value!r}")
    return value == "True"


def _float(text: str, key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise _bad(text, f"{key} needs a number, got {value!r}") from None


def _apply(text: str, config: AllocatorConfig, key: str, items: list[tuple[str, str]]) -> AllocatorConfig:
    """One key's value on ``config`` (AcceleratorAllocatorConfig::parse*, CUDAAllocatorConfig::parseArgs)."""
    value = items[0][1]
    if key == "roundup_power2_divisions":
        return replace(config, roundup_power2_divisions=_divisions(text, items))
    if len(items) != 1 or items[0][0]:
        raise _bad(text, f"{key} takes one value, not a list")
    if key == "backend":
        if value == "native":
            return config
        raise _bad(text, f"backend:{value} is not the caching allocator memlab models (backend:native is)")
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        n = _int(text, key, value)
        if n < config.large_segment_size_mb:
            raise _bad(text, f"{key} too small, must be >= {config.large_segment_size_mb} (large_segment_size_mb)")
        return replace(config, **{key: n})
    if key == "garbage_collection_threshold":
        t = _float(text, key, value)
        if not 0.0 < t < 1.0:
            raise _bad(text, "garbage_collection_threshold must be in (0.0, 1.0)")
        return replace(config, garbage_collection_threshold=t)
    if key == "expandable_segments":
        return replace(config, expandable_segments=_bool(text, key, value))
    if key == "per_process_memory_fraction":
        f = _float(text, key, value)
        if not 0.0 <= f <= 1.0:
            raise _bad(text, "per_process_memory_fraction must be in [0.0, 1.0]")
        return replace(config, per_process_memory_fraction=f)
    if key.endswith(("_mb", "_threads")) and key != "pinned_use_background_threads":
        _int(text, key, value)  # a size or a count: checked, then it changes nothing the model counts
    else:
        _bool(text, key, value)
    return config


def parse_alloc_conf(text: str | None) -> AllocatorConfig:
    """The :class:`AllocatorConfig` that ``PYTORCH_CUDA_ALLOC_CONF=text`` gives torch 2.13 (None or "": defaults).

    As AcceleratorAllocatorConfig::parseArgs: ``large_segment_size_mb`` is read first (it must be > 10, kMinLargeAlloc
    in MiB) and bounds ``max_split_size_mb`` and ``max_non_split_rounding_mb`` from below; keys are comma-separated
    ``key:value``, ``roundup_power2_divisions`` also takes a ``[bound:value,...,>:value]`` list. An unknown key or a
    value torch would refuse raises one :class:`~memlab.errors.MemlabError` naming it."""
    if not text:
        return DEFAULT
    if not isinstance(text, str):
        raise MemlabError(f"PYTORCH_CUDA_ALLOC_CONF must be a string, got {type(text).__name__}")
    pairs = _pairs(text)
    unknown = [k for k, _ in pairs if k not in KEYS]
    if unknown:
        raise _bad(text, f"unrecognized key {unknown[0]!r}; torch 2.13 knows {', '.join(KEYS)}")
    config = DEFAULT
    for key, items in pairs:
        if key == "large_segment_size_mb":
            n = _int(text, key, items[0][1])
            if n <= K_MIN_LARGE_ALLOC // MB:
                raise _bad(text, f"large_segment_size_mb must be > {K_MIN_LARGE_ALLOC // MB}")
            config = replace(config, large_segment_size_mb=n)
    for key, items in pairs:
        if key != "large_segment_size_mb":
            config = _apply(text, config, key, items)
    return config
