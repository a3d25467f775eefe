"""OOM messages of several torch versions parse into exact bytes; catching an OOM leaves nothing behind.

Every message below is quoted verbatim from a public report; the comment above it names where it came from.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from memlab.errors import MemlabError
from memlab.measure.oom import (
    OomInfo,
    catch_oom,
    clean_allocator,
    is_oom_error,
    parse_oom_message,
    run_catching_oom,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: this machine's torch sees none")


def approx(value: float) -> int:
    """Bytes of a size printed with two decimals, rounded as the parser does."""
    return round(value)


# --- torch <= 1.3: "... F free; C cached)" ----------------------------------------------------------------------

# pytorch/pytorch#16417 (issue title, 2019)
MSG_CACHED = (
    "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
    "8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)"
)
# pytorch/examples#621 (2019; the reporter says torch 1.2.0+cu92). Note "1024.00 MiB total capacity".
MSG_CACHED_1GB = (
    "RuntimeError: CUDA out of memory. Tried to allocate 26.00 MiB (GPU 0; 1024.00 MiB total capacity; "
    "435.61 MiB already allocated; 24.17 MiB free; 26.39 MiB cached)"
)
# shllln/GenerativeGraph#5 (2019): a KiB-sized request
MSG_CACHED_KIB = (
    "RuntimeError: CUDA out of memory. Tried to allocate 1024.00 KiB (GPU 0; 11.17 GiB total capacity; "
    "10.90 GiB already allocated; 576.00 KiB free; 30.96 MiB cached)"
)

# --- torch 1.4 - 2.0: "... F free; R reserved in total by PyTorch)" -------------------------------------------

# 2KangHo/vdsr_pytorch#2 (2020)
MSG_RESERVED = (
    "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 15.90 GiB total capacity; "
    "13.13 GiB already allocated; 415.88 MiB free; 14.80 GiB reserved in total by PyTorch)"
)
# RistoranteRist/FastFlow#4 (2022): with the max_split_size_mb hint
MSG_RESERVED_HINT = (
    "RuntimeError: CUDA out of memory. Tried to allocate 74.00 MiB (GPU 0; 11.91 GiB total capacity; "
    "10.79 GiB already allocated; 12.94 MiB free; 11.21 GiB reserved in total by PyTorch) If reserved memory is "
    ">> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory "
    "Management and PYTORCH_CUDA_ALLOC_CONF"
)
# YingqianWang/iPASSR#9 (2024, torch.cuda.OutOfMemoryError of torch 2.0): "0 bytes free"
MSG_RESERVED_ZERO_FREE = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.73 GiB (GPU 0; 8.00 GiB total "
    "capacity; 17.20 GiB already allocated; 0 bytes free; 19.15 GiB reserved in total by PyTorch) If reserved "
    "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for "
    "Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)

# --- torch 2.1 ("total capacty") and later: sentences ---------------------------------------------------------

# Synthintel0/MyGirlGPT#11 (2023-12): "this process has"
MSG_CAPACTY_THIS_PROCESS = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacty of "
    "4.00 GiB of which 41.56 MiB is free. Including non-PyTorch memory, this process has 3.44 GiB memory in use. "
    "Of the allocated memory 2.58 GiB is allocated by PyTorch, and 1.90 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF."
)
# FoundationVision/GenerateU#10 (2024-05): "Process N has" (PID not matched, e.g. in a container)
MSG_CAPACTY_PID = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 496.00 MiB. GPU 0 has a total capacty of "
    "14.75 GiB of which 235.06 MiB is free. Process 20398 has 14.52 GiB memory in use. Of the allocated memory "
    "14.06 GiB is allocated by PyTorch, and 330.42 MiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for "
    "Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
# carolchenyx/MGFN.#35 (2023-11): no process sentence at all, "0 bytes is free"
MSG_CAPACTY_NO_PROCESS = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty of "
    "6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is "
    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
# A public markdown note found by exact-string search of the code corpus (its repository was not named by the
# index): two processes on GPU 1 of an H100 pair.
MSG_TWO_PROCESSES = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 1 has a total capacty of "
    "79.10 GiB of which 364.31 MiB is free. Process 175080 has 1.46 GiB memory in use. Process 175356 has 77.26 "
    "GiB memory in use. Of the allocated memory 72.12 GiB is allocated by PyTorch, and 3.78 GiB is reserved by "
    "PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
# pytorch/pytorch#16417, comment of 2024-03-13 (torch 2.2+: "capacity", expandable_segments hint)
MSG_SENTENCES = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of "
    "23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. "
    "Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# murong-xu/CADS#4 (torch.OutOfMemoryError, the top-level name of torch 2.5+)
MSG_TOP_LEVEL_NAME = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity of "
    "31.47 GiB of which 12.73 GiB is free. Including non-PyTorch memory, this process has 18.73 GiB memory in use. "
    "Of the allocated memory 9.08 GiB is allocated by PyTorch, and 9.35 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# lllyasviel/Fooocus#1902 (2024-01): the message alone, without the exception class
MSG_BARE = (
    "CUDA out of memory. Tried to allocate 10.00 MiB. GPU 0 has a total capacty of 6.00 GiB of which 1.57 GiB is "
    "free. Of the allocated memory 3.24 GiB is allocated by PyTorch, and 154.45 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)

# --- CPU allocator and other backends -------------------------------------------------------------------------

# lllyasviel/Fooocus#237 (Windows)
MSG_CPU_WINDOWS = (
    "RuntimeError: [enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough "
    "memory: you tried to allocate 26214400 bytes."
)
# mxfold/mxfold2#20 (Linux)
MSG_CPU_LINUX = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: you "
    "tried to allocate 132426121216 bytes. Error code 12 (Cannot allocate memory)"
)
# pytorch/android-demo-app#114 (older CPUAllocator.cpp)
MSG_CPU_OLD = (
    "RuntimeError: [enforce fail at CPUAllocator.cpp:73] data. DefaultCPUAllocator: not enough memory: you tried "
    "to allocate 473909280 bytes. Buy new RAM!"
)
# Comfy-Org/ComfyUI#7372 (MPS, older "MB/GB" labels)
MSG_MPS = (
    "MPS backend out of memory (MPS allocated: 17.68 GB, other allocations: 3.95 MB, max allowed: 18.13 GB). "
    "Tried to allocate 1024.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper "
    "limit for memory allocations (may cause system failure)."
)
# taohan10200/IIM#28 (a driver-level error: no sizes stated)
MSG_CUDA_ERROR = (
    "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other "
    "API call,so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1."
)


def test_oldest_cached_format_maps_cached_to_reserved_unallocated() -> None:
    info = parse_oom_message(MSG_CACHED)
    assert info.message_format == "cuda-cached"
    assert (info.device_type, info.device_index) == ("cuda", 0)
    assert info.tried_to_allocate_bytes == approx(12.5 * MiB)
    assert info.total_capacity_bytes == approx(10.92 * GiB)
    assert info.allocated_by_pytorch_bytes == approx(8.57 * MiB)
    assert info.free_bytes == approx(9.28 * GiB)
    assert info.reserved_unallocated_bytes == approx(4.68 * MiB)
    assert info.reserved_by_pytorch_bytes is None
    assert info.reserved_total_bytes == approx(8.57 * MiB) + approx(4.68 * MiB)
    assert info.process_in_use_bytes is None


def test_cached_format_with_mib_capacity_and_kib_request() -> None:
    one_gb = parse_oom_message(MSG_CACHED_1GB)
    assert one_gb.total_capacity_bytes == 1024 * MiB
    assert one_gb.reserved_unallocated_bytes == approx(26.39 * MiB)
    kib = parse_oom_message(MSG_CACHED_KIB)
    assert kib.tried_to_allocate_bytes == 1024 * KiB
    assert kib.free_bytes == 576 * KiB


def test_reserved_in_total_format() -> None:
    info = parse_oom_message(MSG_RESERVED)
    assert info.message_format == "cuda-reserved"
    assert info.tried_to_allocate_bytes == 512 * MiB
    assert info.total_capacity_bytes == approx(15.90 * GiB)
    assert info.allocated_by_pytorch_bytes == approx(13.13 * GiB)
    assert info.free_bytes == approx(415.88 * MiB)
    assert info.reserved_by_pytorch_bytes == approx(14.80 * GiB)
    assert info.reserved_unallocated_bytes is None
    assert info.reserved_total_bytes == approx(14.80 * GiB)


def test_reserved_format_with_hint_and_zero_free() -> None:
    hint = parse_oom_message(MSG_RESERVED_HINT)
    assert hint.tried_to_allocate_bytes == 74 * MiB
    assert hint.reserved_by_pytorch_bytes == approx(11.21 * GiB)
    zero = parse_oom_message(MSG_RESERVED_ZERO_FREE)
    assert zero.free_bytes == 0
    assert zero.tried_to_allocate_bytes == approx(10.73 * GiB)
    assert zero.total_capacity_bytes == 8 * GiB


def test_capacty_spelling_of_torch_2_1_with_this_process() -> None:
    info = parse_oom_message(MSG_CAPACTY_THIS_PROCESS)
    assert info.message_format == "cuda-sentences"
    assert info.tried_to_allocate_bytes == 32 * MiB
    assert info.total_capacity_bytes == 4 * GiB
    assert info.free_bytes == approx(41.56 * MiB)
    assert info.process_in_use_bytes == approx(3.44 * GiB)
    assert info.other_processes == ()
    assert info.allocated_by_pytorch_bytes == approx(2.58 * GiB)
    assert info.reserved_unallocated_bytes == approx(1.90 * MiB)
    assert info.reserved_by_pytorch_bytes is None


def test_process_with_pid_is_listed_not_claimed_as_this_process() -> None:
    info = parse_oom_message(MSG_CAPACTY_PID)
    assert info.process_in_use_bytes is None
    assert info.other_processes == ((20398, approx(14.52 * GiB)),)
    assert info.total_capacity_bytes == approx(14.75 * GiB)
    assert info.reserved_total_bytes == approx(14.06 * GiB) + approx(330.42 * MiB)


def test_two_processes_on_gpu_1() -> None:
    info = parse_oom_message(MSG_TWO_PROCESSES)
    assert info.device_index == 1
    assert info.other_processes == ((175080, approx(1.46 * GiB)), (175356, approx(77.26 * GiB)))
    assert info.tried_to_allocate_bytes == 448 * MiB
    assert info.to_dict()["other_processes"] == [[175080, approx(1.46 * GiB)], [175356, approx(77.26 * GiB)]]


def test_sentences_without_a_process_sentence() -> None:
    info = parse_oom_message(MSG_CAPACTY_NO_PROCESS)
    assert info.free_bytes == 0
    assert info.process_in_use_bytes is None and info.other_processes == ()
    assert info.reserved_unallocated_bytes == approx(2.30 * GiB)


@pytest.mark.parametrize("msg", [MSG_SENTENCES, MSG_TOP_LEVEL_NAME])
def test_current_sentences_format(msg: str) -> None:
    info = parse_oom_message(msg)
    assert info.message_format == "cuda-sentences"
    assert info.device_index == 0
    fields = (info.tried_to_allocate_bytes, info.total_capacity_bytes, info.free_bytes, info.process_in_use_bytes,
              info.allocated_by_pytorch_bytes, info.reserved_unallocated_bytes)
    assert all(isinstance(v, int) and v >= 0 for v in fields)
    if msg is MSG_SENTENCES:
        assert fields == (22 * MiB, approx(23.65 * GiB), approx(11.06 * MiB), approx(23.60 * GiB),
                          approx(22.90 * GiB), approx(194.87 * MiB))
    else:
        assert info.tried_to_allocate_bytes == approx(22.78 * GiB)
        assert info.reserved_unallocated_bytes == approx(9.35 * GiB)


def test_private_pool_bytes_are_read_and_absent_when_torch_omits_them() -> None:
    # the sentence shape with its optional clause (c10/cuda/CUDACachingAllocator.cpp prints it when P > 0)
    msg = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has a total capacity of "
           "79.19 GiB of which 140.38 MiB is free. Including non-PyTorch memory, this process has 79.04 GiB memory "
           "in use. Of the allocated memory 72.36 GiB is allocated by PyTorch, with 436.00 MiB allocated in private "
           "pools (e.g., CUDA Graphs), and 797.79 MiB is reserved by PyTorch but unallocated.")
    info = parse_oom_message(msg)
    assert info.private_pool_bytes == 436 * MiB
    assert info.allocated_by_pytorch_bytes == approx(72.36 * GiB)
    assert info.reserved_unallocated_bytes == approx(797.79 * MiB)
    assert parse_oom_message(MSG_SENTENCES).private_pool_bytes is None


def test_bare_message_without_exception_class() -> None:
    info = parse_oom_message(MSG_BARE)
    assert info.tried_to_allocate_bytes == 10 * MiB
    assert info.free_bytes == approx(1.57 * GiB)


def test_line_wrapped_message_parses_like_the_original() -> None:
    wrapped = MSG_SENTENCES.replace(" is allocated by PyTorch, and ", " is\nallocated by PyTorch, and\n")
    assert parse_oom_message(wrapped).to_dict() | {"raw": None} == parse_oom_message(MSG_SENTENCES).to_dict() | {
        "raw": None
    }


@pytest.mark.parametrize(
    ("msg", "tried"), [(MSG_CPU_WINDOWS, 26214400), (MSG_CPU_LINUX, 132426121216), (MSG_CPU_OLD, 473909280)]
)
def test_cpu_allocator_messages(msg: str, tried: int) -> None:
    info = parse_oom_message(msg)
    assert (info.message_format, info.device_type, info.tried_to_allocate_bytes) == ("cpu-allocator", "cpu", tried)
    assert info.total_capacity_bytes is None and info.free_bytes is None


def test_mps_message_reads_request_allocated_and_limit() -> None:
    info = parse_oom_message(MSG_MPS)
    assert (info.message_format, info.device_type) == ("mps", "mps")
    assert info.tried_to_allocate_bytes == GiB
    assert info.allocated_by_pytorch_bytes == approx(17.68 * GiB)
    assert info.allowed_bytes == approx(18.13 * GiB)


def test_cuda_driver_error_is_recognised_without_sizes() -> None:
    info = parse_oom_message(MSG_CUDA_ERROR)
    assert (info.message_format, info.device_type) == ("cuda-other", "cuda")
    assert info.tried_to_allocate_bytes is None and info.total_capacity_bytes is None


@pytest.mark.parametrize("msg", ["mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)", "", "CUDA"])
def test_unreadable_message_gives_raw_and_nothing_else(msg: str) -> None:
    info = parse_oom_message(msg)
    assert info == OomInfo(raw=msg)
    assert all(v in (None, [], msg) for v in info.to_dict().values())


def test_is_oom_error_knows_the_types_and_old_runtime_errors() -> None:
    assert is_oom_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom_error(RuntimeError(MSG_RESERVED))
    assert is_oom_error(RuntimeError(MSG_CPU_LINUX))
    assert not is_oom_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_oom_error(ValueError("out of memory"))  # only RuntimeError carries torch's OOMs


def test_run_catching_oom_returns_the_result_when_nothing_fails() -> None:
    assert run_catching_oom(lambda x, y=1: x + y, 2, y=3) == (5, None)


def test_run_catching_oom_records_a_constructed_out_of_memory_error() -> None:
    def step() -> None:
        raise torch.OutOfMemoryError(MSG_SENTENCES)

    result, info = run_catching_oom(step)
    assert result is None
    assert info is not None and info.tried_to_allocate_bytes == 22 * MiB


def test_run_catching_oom_lets_other_errors_through() -> None:
    def step() -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        run_catching_oom(step)


def test_a_real_cpu_allocation_failure_is_caught() -> None:
    # 2**62 bytes exceeds any address space: malloc refuses at once, nothing is touched.
    result, info = run_catching_oom(torch.empty, 2**62, dtype=torch.uint8)
    assert result is None
    assert info is not None and info.device_type == "cpu"
    assert info.tried_to_allocate_bytes == 2**62


def test_catching_an_oom_releases_the_attempts_tensors() -> None:
    refs: list[weakref.ref] = []

    def step() -> None:
        held = torch.ones(1024, 1024)  # 4 MiB that must not outlive the failed attempt
        refs.append(weakref.ref(held))
        raise torch.OutOfMemoryError(MSG_SENTENCES)

    _, info = run_catching_oom(step)
    assert info is not None
    assert refs[0]() is None


def test_catch_oom_block_records_and_clears_nested_frames() -> None:
    refs: list[weakref.ref] = []

    def inner() -> None:
        held = torch.ones(256, 256)
        refs.append(weakref.ref(held))
        raise RuntimeError(MSG_CPU_LINUX)

    with catch_oom() as caught:
        inner()
    assert caught.oom and caught.info is not None
    assert caught.info.tried_to_allocate_bytes == 132426121216
    gc.collect()
    assert refs[0]() is None


def test_catch_oom_block_without_error_records_nothing() -> None:
    with catch_oom() as caught:
        torch.ones(4)
    assert not caught.oom and caught.info is None


def test_catch_oom_reraises_other_errors() -> None:
    with pytest.raises(KeyError), catch_oom():
        raise KeyError("not memory")


@pytest.mark.skipif(CUDA, reason="checks the CPU behaviour; this machine has CUDA")
def test_clean_allocator_on_cpu_reports_cuda_unavailable() -> None:
    stats = clean_allocator()
    assert not stats.available and stats.reason


# --- GPU ------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_real_cuda_oom_is_parsed_and_allocator_left_clean() -> None:
    from memlab.measure.cuda import cuda_memory_stats

    clean_allocator()
    before = cuda_memory_stats()
    total = before.total_bytes
    assert total is not None

    def step() -> None:
        keep = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")  # noqa: F841 (released with the frame)
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")

    result, info = run_catching_oom(step)
    assert result is None and info is not None
    assert info.device_type == "cuda" and info.message_format == "cuda-sentences"
    assert abs(info.tried_to_allocate_bytes - 2 * total) <= 0.005 * GiB
    assert abs(info.total_capacity_bytes - total) <= 0.01 * GiB  # cudaMemGetInfo vs device properties
    after = cuda_memory_stats()
    assert after.allocated_bytes == before.allocated_bytes  # the 256 MiB tensor is gone
    assert after.reserved_bytes <= before.reserved_bytes  # empty_cache returned the cache
    assert after.peak_allocated_bytes == after.allocated_bytes  # peaks were reset
    assert after.num_ooms == before.num_ooms + 1


@pytest.mark.gpu
@needs_cuda
def test_emulated_small_gpu_runs_out_at_the_emulated_size() -> None:
    from memlab.measure.cuda import emulate_smaller_gpu

    clean_allocator()
    with emulate_smaller_gpu(2 * GiB) as small:
        assert small.fraction == pytest.approx(2 * GiB / small.total_bytes)
        fits, fits_info = run_catching_oom(lambda: torch.empty(GiB, dtype=torch.uint8, device="cuda").numel())
        assert fits == GiB and fits_info is None
        _, info = run_catching_oom(lambda: torch.empty(3 * GiB, dtype=torch.uint8, device="cuda").numel())
        assert info is not None and info.tried_to_allocate_bytes == 3 * GiB
    restored, restored_info = run_catching_oom(lambda: torch.empty(3 * GiB, dtype=torch.uint8, device="cuda").numel())
    assert restored == 3 * GiB and restored_info is None
    clean_allocator()


@pytest.mark.gpu
@needs_cuda
def test_emulate_smaller_gpu_rejects_a_capacity_beyond_the_device() -> None:
    from memlab.measure.cuda import cuda_memory_stats, emulate_smaller_gpu

    total = cuda_memory_stats().total_bytes
    with pytest.raises(MemlabError, match="cannot emulate"):
        emulate_smaller_gpu(total + GiB)
