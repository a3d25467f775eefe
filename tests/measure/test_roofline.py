"""Matmul and bandwidth microbenchmarks: tidy rows, honest 'unsupported' rows, arithmetic that is exact."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import MemlabError, UnknownNameError
from memlab.measure.roofline import (
    bandwidth_bytes_per_s,
    default_shapes,
    default_sizes,
    matmul_flops_per_s,
    resolve_scale,
    torch_dtype,
)
from memlab.measure.timing import time_fn
from memlab.predict.spec.precision import DTYPE_BYTES

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: this machine's torch sees none")
cpu_only = pytest.mark.skipif(CUDA, reason="checks the CPU behaviour; this machine has CUDA")
TINY = dict(device="cpu", scale="ci", repeats=3, warmup=1)


def test_torch_dtype_maps_memlab_names_and_element_sizes_agree() -> None:
    for name in ("fp32", "tf32", "bf16", "fp16", "fp8", "int8"):
        dtype = torch_dtype(name)
        assert torch.empty(0, dtype=dtype).element_size() == DTYPE_BYTES[name]
    with pytest.raises(UnknownNameError, match="fp7"):
        torch_dtype("fp7")
    with pytest.raises(MemlabError, match="no dense torch"):
        torch_dtype("int4")


def test_matmul_rows_are_positive_and_the_arithmetic_is_exact() -> None:
    df = matmul_flops_per_s(shapes=[(8, 16, 32), (1, 64, 64)], dtypes=("fp32", "bf16"), **TINY)
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    assert (df["flops_per_s"] > 0).all() and (df["median_s"] >= df["min_s"]).all()
    row = df[(df["dtype"] == "fp32") & (df["m"] == 8)].iloc[0]
    assert row["flops"] == 2 * 8 * 16 * 32
    assert row["bytes_moved"] == (8 * 32 + 32 * 16 + 8 * 16) * 4
    assert row["arithmetic_intensity"] == pytest.approx(row["flops"] / row["bytes_moved"])
    assert row["flops_per_s"] == pytest.approx(row["flops"] / row["median_s"])
    bf16 = df[(df["dtype"] == "bf16") & (df["m"] == 8)].iloc[0]
    assert bf16["bytes_moved"] * 2 == row["bytes_moved"]  # half the bytes, same FLOPs
    assert (df["device"] == "cpu").all() and (df["repeats"] == 3).all()


def test_matmul_shape_and_dtype_filters_are_honoured() -> None:
    df = matmul_flops_per_s(shapes=[(4, 4, 4)], dtypes=("fp16",), **TINY)
    assert list(df["dtype"]) == ["fp16"]
    assert list(zip(df["m"], df["n"], df["k"], strict=True)) == [(4, 4, 4)]
    single = matmul_flops_per_s(shapes=[(4, 4, 4)], dtypes="fp32", **TINY)
    assert list(single["dtype"]) == ["fp32"]


def test_a_dtype_the_device_cannot_run_gives_a_reason_row() -> None:
    df = matmul_flops_per_s(shapes=[(4, 4, 4), (8, 8, 8)], dtypes=("fp32", "int4"), **TINY)
    bad = df[df["dtype"] == "int4"]
    assert len(bad) == 1  # one reason row per dtype, not per shape
    assert bad.iloc[0]["status"] == "unsupported" and "int4" in bad.iloc[0]["reason"]
    assert bad[["m", "flops", "flops_per_s"]].isna().all(axis=None)
    assert (df[df["dtype"] == "fp32"]["status"] == "ok").all()


@cpu_only
def test_tf32_on_cpu_is_reported_unsupported_not_measured_as_fp32() -> None:
    df = matmul_flops_per_s(shapes=[(4, 4, 4)], dtypes=("tf32",), **TINY)
    assert list(df["status"]) == ["unsupported"] and "CUDA" in df.iloc[0]["reason"]


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(UnknownNameError, match="fp7"):
        matmul_flops_per_s(shapes=[(4, 4, 4)], dtypes=("fp7",), **TINY)
    with pytest.raises(MemlabError, match="shape"):
        matmul_flops_per_s(shapes=[(4, 4)], **TINY)
    with pytest.raises(MemlabError, match="shape"):
        matmul_flops_per_s(shapes=[(4, 0, 4)], **TINY)
    with pytest.raises(MemlabError, match="scale must be one of"):
        default_shapes("cpu", "huge")
    with pytest.raises(UnknownNameError, match="bandwidth kind"):
        bandwidth_bytes_per_s(sizes=[4096], kinds=("scale",), **TINY)
    with pytest.raises(MemlabError, match="sizes"):
        bandwidth_bytes_per_s(sizes=[2], **TINY)
    with pytest.raises(MemlabError, match="repeats"):
        time_fn(lambda: None, device="cpu", repeats=0)


@cpu_only
def test_asking_for_cuda_without_cuda_is_an_error() -> None:
    with pytest.raises(MemlabError, match="CUDA"):
        matmul_flops_per_s(shapes=[(4, 4, 4)], device="cuda")


def test_scales_pick_small_work_on_cpu_and_grow_with_full() -> None:
    assert resolve_scale("ci", "cpu") == "ci" and resolve_scale("full", "cpu") == "full"
    if not CUDA:
        assert resolve_scale("auto") == "ci"
    ci, full = default_shapes("cpu", "ci"), default_shapes("cpu", "full")
    assert max(m * n * k for m, n, k in ci) < max(m * n * k for m, n, k in full)
    assert any(m == 1 for m, _, _ in ci)  # a GEMV-like, bandwidth-bound point
    # given caches (a 32 MiB last level): this machine's own can put both scales at the 1/16-of-free-RAM cap
    caches = {"L2": 2 * 2**20, "last_level": 32 * 2**20, "last_level_total": 32 * 2**20}
    assert max(default_sizes("cpu", "ci", caches)) < max(default_sizes("cpu", "full", caches))


def test_bandwidth_rows_count_stream_bytes_exactly() -> None:
    df = bandwidth_bytes_per_s(sizes=[64 * 1024, 256 * 1024], **TINY)
    assert len(df) == 4 and set(df["kind"]) == {"copy", "triad"} and set(df["status"]) == {"ok"}
    assert (df["bytes_per_s"] > 0).all()
    for _, row in df.iterrows():
        n = row["array_bytes"] // 4
        assert row["n_elements"] == n
        assert row["bytes_moved"] == {"copy": 2, "triad": 3}[row["kind"]] * n * 4
        assert row["bytes_per_s"] == pytest.approx(row["bytes_moved"] / row["median_s"])


def test_bandwidth_kind_filter_and_dtype() -> None:
    df = bandwidth_bytes_per_s(sizes=[4096], kinds=("triad",), dtype="bf16", **TINY)
    assert list(df["kind"]) == ["triad"] and list(df["dtype"]) == ["bf16"]
    assert df.iloc[0]["bytes_moved"] == 3 * 2048 * 2
    bad = bandwidth_bytes_per_s(sizes=[4096], dtype="int4", **TINY)
    assert set(bad["status"]) == {"unsupported"} and len(bad) == 2


def test_time_fn_runs_warmup_plus_repeats_and_times_only_the_repeats() -> None:
    calls = []
    times = time_fn(lambda: calls.append(1), device="cpu", repeats=4, warmup=2)
    assert len(times) == 4 and len(calls) == 6 and all(t >= 0 for t in times)


# --- GPU ----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_cuda_matmul_and_bandwidth_rows() -> None:
    df = matmul_flops_per_s(shapes=[(1024, 1024, 1024)], dtypes=("fp32", "tf32", "bf16", "fp16"), device="cuda",
                            scale="ci", repeats=5, warmup=2)
    ok = df[df["status"] == "ok"]
    assert {"fp32", "bf16"} <= set(ok["dtype"])
    assert (ok["flops_per_s"] > 0).all() and (ok["l2_flush_bytes"] >= 256 * 2**20).all()
    fp32 = ok[ok["dtype"] == "fp32"].iloc[0]["flops_per_s"]
    bf16 = ok[ok["dtype"] == "bf16"].iloc[0]["flops_per_s"]
    assert bf16 > fp32  # tensor cores: on any GPU with bf16 support this holds by a wide margin
    bw = bandwidth_bytes_per_s(sizes=[256 * 2**20], device="cuda", scale="ci", repeats=5, warmup=2)
    assert set(bw["status"]) == {"ok"} and (bw["bytes_per_s"] > 0).all()


# --- cache sizes and the bandwidth array sizes they choose ---------------------------------------------------

def _fake_sysfs(root, cpus: int, l3_groups: list[str]) -> None:
    """cpu0..cpuN-1 each with L1d 48K, L1i 32K, L2 1024K (private) and an L3 of 32 MiB shared per group."""
    for cpu in range(cpus):
        for i, (level, kind, size, shared) in enumerate([
            ("1", "Data", "48K", str(cpu)), ("1", "Instruction", "32K", str(cpu)), ("2", "Unified", "1024K", str(cpu)),
            ("3", "Unified", "32768K", next(g for g in l3_groups if str(cpu) in g.split(","))),
        ]):
            index = root / f"cpu{cpu}" / "cache" / f"index{i}"
            index.mkdir(parents=True)
            for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
                (index / name).write_text(value + "\n")


@pytest.mark.parametrize(("cpus", "groups", "total_mib"), [(2, ["0,1"], 32), (4, ["0,1", "2,3"], 64)])
def test_cache_bytes_reads_sysfs_and_sums_last_level_instances(tmp_path, monkeypatch, cpus, groups,
                                                               total_mib) -> None:
    from memlab.measure import cpu, roofline

    _fake_sysfs(tmp_path, cpus, groups)
    monkeypatch.setattr(cpu, "CPU_CACHE_DIR", tmp_path)
    caches = roofline.cache_bytes("cpu")
    assert caches["L1d"] == 48 * 2**10 and caches["L2"] == 2**20 and caches["L3"] == 32 * 2**20
    assert "L1i" not in caches and caches["last_level"] == 32 * 2**20
    assert caches["last_level_total"] == total_mib * 2**20


def test_cache_bytes_of_this_machine_are_plausible() -> None:
    from memlab.measure.roofline import cache_bytes

    caches = cache_bytes("cpu")
    if not caches:
        pytest.skip("this machine reports no cache sizes (no sysfs cache directory, no lscpu)")
    assert 0 < caches["last_level"] <= caches["last_level_total"]


@pytest.mark.parametrize("caches", [
    {"L2": 2**20, "L3": 32 * 2**20, "last_level": 32 * 2**20, "last_level_total": 32 * 2**20},  # this VM
    {"L2": 2 * 2**20, "L3": 32 * 2**20, "last_level": 32 * 2**20, "last_level_total": 480 * 2**20},  # a server
    {},  # unknown
])
@pytest.mark.parametrize("scale", ["ci", "full"])
def test_bandwidth_sizes_span_a_cache_resident_and_a_dram_array(caches: dict, scale: str) -> None:
    from memlab.measure.roofline import default_sizes

    sizes = default_sizes("cpu", scale, caches=caches)
    llc = caches.get("last_level_total", 512 * 2**20)
    assert min(sizes) <= caches.get("L2", 2**20) / 2 or min(sizes) == 64 * 2**10
    import psutil

    cap = psutil.virtual_memory().available / 16
    assert max(sizes) >= 2 * llc or max(sizes) >= cap - 2**20, "one array is beyond the whole last-level cache"
