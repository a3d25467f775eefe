"""The accelerator table, name resolution and detect()."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.errors import MemlabError, UnknownNameError
from memlab.predict.hardware import gpus as hw

GIB = 2**30
MIB = 2**20

REQUIRED_KEYS = (
    "v100-sxm2-32gb", "a100-40gb-sxm", "a100-80gb-sxm", "a100-40gb-pcie", "a100-80gb-pcie", "a10g", "l4", "l40s",
    "t4", "h100-sxm", "h100-pcie", "h100-nvl", "h200-sxm", "h20", "b200", "gb200", "rtx-3090", "rtx-4090", "mi250x",
    "mi300x", "tpu-v4", "tpu-v5e", "tpu-v5p",
)


# -- the table ---------------------------------------------------------------------------------------------------
def test_table_has_every_required_accelerator():
    assert set(REQUIRED_KEYS) <= set(hw.GPUS)
    assert [a.key for a in hw.list_gpus()] == list(hw.GPUS)


@pytest.mark.parametrize("acc", hw.list_gpus(), ids=lambda a: a.key)
def test_every_row_has_source_positive_memory_and_bandwidth(acc):
    assert len(acc.source) > 20 and acc.source != "unknown"
    assert isinstance(acc.memory_bytes, int) and acc.memory_bytes > 0
    assert acc.bandwidth_bytes_per_s is not None and acc.bandwidth_bytes_per_s > 0
    assert tuple(acc.peak_flops) == hw.PEAK_DTYPES
    assert any(v is not None for v in acc.peak_flops.values())
    assert all(v is None or v > 0 for v in acc.peak_flops.values())
    assert not acc.measured
    # Tensor-core low precision is never slower than fp32 on the same part.
    known = {d: v for d, v in acc.peak_flops.items() if v is not None}
    if "fp32" in known and "bf16" in known:
        assert known["bf16"] >= known["fp32"]


# Figures as vendors print them, with the document; "sparse" ones are printed with 2:4 sparsity.
PRINTED = [
    # NVIDIA H100 Tensor Core GPU datasheet: H100 SXM BF16 Tensor Core 1,979 TFLOPS* (*with sparsity)
    ("h100-sxm", "bf16", 1979e12, "sparse"),
    # same datasheet, H100 PCIe: 1,513 TFLOPS*; FP8 3,026*; H100 NVL: BF16 1,671*, TF32 835*
    ("h100-pcie", "bf16", 1513e12, "sparse"),
    ("h100-pcie", "fp8", 3026e12, "sparse"),
    ("h100-nvl", "bf16", 1671e12, "sparse"),
    ("h100-nvl", "tf32", 835e12, "sparse"),
    # NVIDIA H200 product page: NVL FP8 3,341 TFLOPS*
    ("h200-nvl", "fp8", 3341e12, "sparse"),
    # NVIDIA L4 datasheet: BF16 242 TFLOPS* (sparsity only printed)
    ("l4", "bf16", 242e12, "sparse"),
    # NVIDIA L40S datasheet: BF16 362.05 | 733* (dense printed)
    ("l40s", "bf16", 362.05e12, "dense"),
    # NVIDIA HGX B200 page: FP16/BF16 36 PFLOPS* for 8 GPUs; Blackwell datasheet per GPU: 4.5 PFLOPS*
    ("b200", "bf16", 36e15 / 8, "sparse"),
    ("b200", "bf16", 4.5e15, "sparse"),
    # HGX B200 page: TF32 18 PFLOPS* for 8 GPUs (the per-GPU column rounds 2.25 to 2.2)
    ("b200", "tf32", 18e15 / 8, "sparse"),
    # NVIDIA Blackwell datasheet, GB200 NVL72 column, per GPU: FP16/BF16 5 PFLOPS*, FP8 10 PFLOPS*
    ("gb200", "bf16", 5e15, "sparse"),
    ("gb200", "fp8", 10e15, "sparse"),
    # NVIDIA A100 datasheet: BF16 312 TFLOPS dense (624* sparse)
    ("a100-80gb-sxm", "bf16", 312e12, "dense"),
    # GA102 whitepaper, RTX 3090: FP16 tensor with FP32 accumulate 71 | 142*
    ("rtx-3090", "bf16", 71e12, "dense"),
    # Ada whitepaper, RTX 4090: FP8 with FP32 accumulate 330.3 | 660.6*
    ("rtx-4090", "fp8", 330.3e12, "dense"),
    # Google Cloud TPU v4 docs: 275 TFLOPS bf16 per chip (the peak PaLM's MFU uses)
    ("tpu-v4", "bf16", 275e12, "dense"),
    # Google Cloud TPU v5e docs: 197 TFLOPs bf16, 393 TOPs int8 per chip
    ("tpu-v5e", "int8", 393e12, "dense"),
    # Google Cloud TPU v5p docs: 459 TFLOPs bf16 per chip
    ("tpu-v5p", "bf16", 459e12, "dense"),
    # AMD MI250X / MI250: 383 / 362.1 TFLOPS FP16/BF16 per package = 2 GCDs
    ("mi250x", "bf16", 383e12 / 2, "dense"),
    ("mi250", "bf16", 362.1e12 / 2, "dense"),
    # AMD MI300X datasheet: 1,307.4 TFLOPS FP16/BF16 dense
    ("mi300x", "bf16", 1307.4e12, "dense"),
]


@pytest.mark.parametrize(("key", "dtype", "printed", "kind"), PRINTED)
def test_stored_peaks_are_dense_not_the_printed_sparse_figure(key, dtype, printed, kind):
    stored = hw.gpu(key).peak(dtype)
    assert stored <= printed
    assert stored == pytest.approx(printed / 2 if kind == "sparse" else printed, rel=1e-9)


# Memory, bandwidth and fp32 as the cited documents print them (corrected in the datasheet audit).
@pytest.mark.parametrize(("key", "field", "value"), [
    ("b200", "bandwidth_bytes_per_s", 7.7e12),  # Blackwell datasheet, HGX B200 per GPU: 180 GB | 7.7 TB/s
    ("b200", "memory_bytes", 180 * GIB),
    ("gb200", "bandwidth_bytes_per_s", 8e12),  # Blackwell datasheet, GB200 NVL72 per GPU: 186 GB | 8 TB/s
    ("gb200", "memory_bytes", 186 * GIB),
    ("t4", "bandwidth_bytes_per_s", 320e9),  # T4 product page "320+ GB/s" (the PDF datasheet says 300)
    ("h100-nvl", "bandwidth_bytes_per_s", 3.9e12),  # H100 datasheet, NVL: 94 GB, 3.9 TB/s
    ("tpu-v4", "bandwidth_bytes_per_s", 1.2e12),  # TPU v4 docs: 32 GiB, 1200 GBps
])
def test_memory_and_bandwidth_match_the_cited_document(key, field, value):
    assert getattr(hw.gpu(key), field) == pytest.approx(value, rel=1e-12)


def test_fp32_is_the_per_gpu_datasheet_figure_not_a_derived_one():
    # Blackwell datasheet per GPU: GB200 80 TFLOPS, HGX B200 75 TFLOPS (the old NVL72 page's 180 TF / 2 = 90 is stale)
    assert hw.gpu("gb200").peak("fp32") == 80e12
    assert hw.gpu("b200").peak("fp32") == 75e12 == 600e12 / 8  # HGX B200 page: FP32 600 TFLOPS for 8 GPUs


@pytest.mark.parametrize("acc", hw.list_gpus(), ids=lambda a: a.key)
def test_tensor_rates_double_with_each_halving_of_precision(acc):
    # A mistyped row (a sparse figure left undivided, a digit dropped) breaks these ratios.
    p = acc.peak_flops
    if p["fp16"] is not None and p["bf16"] is not None:
        assert p["fp16"] == p["bf16"]
    if p["tf32"] is not None and p["bf16"] is not None:
        assert p["bf16"] / p["tf32"] == pytest.approx(2, rel=0.02)
    if p["bf16"] is not None and p["fp8"] is not None:
        assert p["fp8"] / p["bf16"] == pytest.approx(2, rel=0.02)
    half = p["bf16"] or p["fp16"]
    if half is not None and p["int8"] is not None:
        assert p["int8"] >= half


@pytest.mark.parametrize("acc", hw.list_gpus(), ids=lambda a: a.key)
def test_every_row_says_how_its_dense_figures_were_obtained(acc):
    assert "dense" in acc.notes
    if "*" in acc.source:  # the document prints some figures "with sparsity"
        assert "dense = " in acc.notes or "dense stored" in acc.notes
    if acc.unofficial:
        assert "unconfirmed" in acc.notes and acc.source.startswith("third party")


def test_per_gcd_rows_are_half_the_package():
    # AMD MI250X page: 95.7 TFLOPS FP32 matrix, 383 TOPS INT8, 128 GB, 3.2768 TB/s per package of 2 GCDs
    acc = hw.gpu("mi250x")
    assert (acc.peak("fp32"), acc.peak("int8")) == (pytest.approx(95.7e12 / 2), pytest.approx(383e12 / 2))
    assert acc.memory_bytes == 128 * GIB // 2 and acc.bandwidth_bytes_per_s == pytest.approx(3.2768e12 / 2)
    assert "per GCD = package / 2" in acc.notes


def test_h100_sxm_dense_bf16_is_about_989_tflops():
    # Hopper whitepaper: 989.4 dense bf16 TFLOP/s at boost clock; the datasheet's 1,979* halves to 989.5.
    assert hw.gpu("h100-sxm").peak("bf16") == pytest.approx(989.4e12, rel=2e-4)
    assert "sparsity" in hw.gpu("h100-sxm").notes


def test_memory_is_the_datasheet_capacity_in_gib():
    assert hw.gpu("h100-sxm").memory_bytes == 80 * GIB
    assert hw.gpu("h100-nvl").memory_bytes == 94 * GIB
    assert hw.gpu("mi250x").memory_bytes == 64 * GIB  # one GCD: half the 128 GB package
    assert hw.gpu("mi250x").memory_gib == 64


def test_unofficial_rows_are_marked():
    assert hw.gpu("a10g").unofficial and "no NVIDIA datasheet" in hw.gpu("a10g").notes
    assert hw.gpu("h20").unofficial
    assert not hw.gpu("h100-sxm").unofficial


def test_unsupported_dtypes_are_none():
    assert hw.gpu("v100-sxm2-32gb").peak("bf16") is None
    assert hw.gpu("t4").peak("fp8") is None
    assert hw.gpu("tpu-v4").peak("fp32") is None


def test_peak_rejects_an_unknown_dtype_and_rows_are_read_only():
    with pytest.raises(UnknownNameError, match="fp64"):
        hw.gpu("l4").peak("fp64")
    with pytest.raises(TypeError):
        hw.gpu("l4").peak_flops["bf16"] = 1.0  # type: ignore[index]
    with pytest.raises(MemlabError, match="positive"):
        hw.Accelerator("x", "x", "x", 1, 1.0, {"bf16": -1.0}, "PCIe", "src")


def test_rows_pickle_and_deep_copy_and_stay_read_only():
    import copy
    import dataclasses
    import pickle

    for row in hw.list_gpus():
        for twin in (pickle.loads(pickle.dumps(row)), copy.deepcopy(row)):
            assert twin == row and hash(twin) == hash(row) and twin.peak("bf16") == row.peak("bf16")
            assert twin.printed_sparse_flops == row.printed_sparse_flops
            with pytest.raises(TypeError):
                twin.peak_flops["bf16"] = 1.0  # type: ignore[index]
            with pytest.raises(TypeError):
                twin.printed_sparse_flops["bf16"] = 1.0  # type: ignore[index]
            with pytest.raises(dataclasses.FrozenInstanceError):
                twin.memory_bytes = 1  # type: ignore[misc]
    info = hw.DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", hw.gpu("h100-sxm"), 80 * 2**30, {"bf16": 1e15},
                         "table: x", None, None, None, None, 1)
    assert pickle.loads(pickle.dumps(info)) == info == copy.deepcopy(info)
    with pytest.raises(TypeError):
        copy.deepcopy(info).peak_flops["bf16"] = 0.0  # type: ignore[index]


def test_to_frame_has_one_row_per_gpu_and_peak_columns():
    df = hw.to_frame()
    assert len(df) == len(hw.GPUS) and df["key"].is_unique
    assert {f"peak_{d}_flops" for d in hw.PEAK_DTYPES} <= set(df.columns)
    assert df.set_index("key").loc["tpu-v4", "peak_bf16_flops"] == 275e12
    assert json.dumps(hw.gpu("h100-sxm").to_dict())


# -- gpu(): lookup by key, spelling, alias ----------------------------------------------------------------------
@pytest.mark.parametrize(("name", "key"), [
    ("h100-sxm", "h100-sxm"), ("H100 SXM", "h100-sxm"), ("h100_sxm", "h100-sxm"), ("NVIDIA H100 SXM5", "h100-sxm"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("a100-sxm4-80gb", "a100-80gb-sxm"), ("A100 80GB PCIe", "a100-80gb-pcie"),
    ("RTX 4090", "rtx-4090"), ("TPU v4", "tpu-v4"), ("MI300X", "mi300x"), ("Tesla T4", "t4"), ("H20", "h20"),
])
def test_gpu_accepts_keys_spellings_and_device_names(name, key):
    assert hw.gpu(name).key == key


@pytest.mark.parametrize(("name", "candidates"), [
    ("a100", ["a100-40gb-sxm", "a100-80gb-sxm", "a100-40gb-pcie", "a100-80gb-pcie"]),
    ("H100", ["h100-sxm", "h100-pcie", "h100-nvl"]),
    ("h200", ["h200-sxm", "h200-nvl"]),
    ("AMD Instinct MI250X/MI250", ["mi250x", "mi250"]),
])
def test_gpu_refuses_ambiguous_names_and_lists_candidates(name, candidates):
    with pytest.raises(UnknownNameError, match="ambiguous") as err:
        hw.gpu(name)
    for c in candidates:
        assert c in str(err.value)


def test_gpu_unknown_name_suggests_close_names():
    with pytest.raises(UnknownNameError, match="unknown GPU 'a10'") as err:
        hw.gpu("a10")  # the A10 is not the A10G: different tensor throughput
    assert "a10g" in str(err.value)
    assert isinstance(err.value, MemlabError)


# -- resolve(): torch/NVML device names -------------------------------------------------------------------------
# Totals are what torch/NVML report on these parts (nvidia-smi MiB figures), a little below the datasheet.
@pytest.mark.parametrize(("name", "total", "key"), [
    ("NVIDIA H100 80GB HBM3", 81559 * MIB, "h100-sxm"),
    ("NVIDIA H100 PCIe", 81559 * MIB, "h100-pcie"),
    ("NVIDIA H100 NVL", 95830 * MIB, "h100-nvl"),
    ("NVIDIA H200", 143771 * MIB, "h200-sxm"),
    ("NVIDIA H200 NVL", 143771 * MIB, "h200-nvl"),
    ("NVIDIA H20", 97871 * MIB, "h20"),
    ("NVIDIA A100-SXM4-80GB", 81251 * MIB, "a100-80gb-sxm"),
    ("NVIDIA A100-SXM4-40GB", 40536 * MIB, "a100-40gb-sxm"),
    ("NVIDIA A100-PCIE-40GB", 40536 * MIB, "a100-40gb-pcie"),
    ("NVIDIA A100 80GB PCIe", 81251 * MIB, "a100-80gb-pcie"),
    ("NVIDIA B200", 183359 * MIB, "b200"),
    ("NVIDIA GB200", 189471 * MIB, "gb200"),
    ("Tesla T4", 15109 * MIB, "t4"),
    ("Tesla V100-SXM2-32GB", 32510 * MIB, "v100-sxm2-32gb"),
    ("NVIDIA L4", 23034 * MIB, "l4"),
    ("NVIDIA L40S", 46068 * MIB, "l40s"),
    ("NVIDIA A10G", 23028 * MIB, "a10g"),
    ("NVIDIA GeForce RTX 4090", 24564 * MIB, "rtx-4090"),
    ("NVIDIA GeForce RTX 3090", 24268 * MIB, "rtx-3090"),
    ("AMD Instinct MI300X", 196288 * MIB, "mi300x"),
    ("NVIDIA H100 80GB HBM3", None, "h100-sxm"),
])
def test_resolve_maps_device_names_with_memory(name, total, key):
    acc = hw.resolve(name, total)
    assert acc is not None and acc.key == key


def test_resolve_tells_h200_from_h20_and_gb200_from_b200():
    assert hw.resolve("NVIDIA H20").key == "h20"
    assert hw.resolve("NVIDIA H200").key == "h200-sxm"
    assert hw.resolve("NVIDIA H20").peak("bf16") < hw.resolve("NVIDIA H200").peak("bf16") / 5
    assert hw.resolve("NVIDIA GB200").key == "gb200"
    assert hw.resolve("NVIDIA B200").key == "b200"


def test_resolve_needs_compute_units_to_split_mi250x_from_mi250():
    name = "AMD Instinct MI250X/MI250"
    assert hw.resolve(name, 64 * GIB) is None
    assert hw.resolve(name, 64 * GIB, multiprocessor_count=110).key == "mi250x"
    assert hw.resolve(name, 64 * GIB, multiprocessor_count=104).key == "mi250"
    assert hw.resolve(name, 64 * GIB, multiprocessor_count=96) is None


@pytest.mark.parametrize(("name", "total"), [
    ("NVIDIA A10", None),  # not the A10G
    ("NVIDIA H800", None),
    ("NVIDIA GH200 480GB", None),  # contains "h200" but is a Grace Hopper superchip
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864 * MIB),  # a MIG slice has a fraction of the peak
    ("NVIDIA GeForce RTX 3090 Ti", None),
    ("NVIDIA L40", None),
    ("NVIDIA H100 80GB HBM3", 94 * GIB),  # name says 80 GB, memory disagrees
    ("NVIDIA H20", 141 * GIB),  # the HBM3e H20 variant is another part
    ("Some Future Accelerator", 80 * GIB),
    ("", None),
])
def test_resolve_returns_none_for_anything_unrecognised(name, total):
    assert hw.resolve(name, total) is None


# -- detect() -----------------------------------------------------------------------------------------------------


def test_printed_sparse_figures_are_kept_as_printed_beside_unchanged_dense_peaks() -> None:
    l40s = hw.gpu("l40s")
    assert l40s.peak("bf16") == pytest.approx(362.05e12), "dense stays as the datasheet prints it"
    assert l40s.sparse_peak("bf16") == pytest.approx(733e12) != pytest.approx(2 * l40s.peak("bf16"))
    for key in ("a100-80gb-sxm", "h100-sxm", "h200-sxm", "l40s", "b200"):
        row = hw.gpu(key)
        for dtype, sparse in row.printed_sparse_flops.items():
            assert 1.9 < sparse / row.peak(dtype) < 2.1, (key, dtype)
    assert hw.gpu("mi300x").sparse_peak("bf16") is None, "no printed figure in the row's source"
    assert hw.gpu("l40s").to_dict()["printed_sparse_flops"]["fp8"] == pytest.approx(1466e12)


@pytest.mark.parametrize("sparse", [{"bf17": 1e12}, {"bf16": -1.0}, {"bf16": float("nan")}, {"bf16": "733"}])
def test_bad_printed_sparse_figures_are_refused(sparse: dict) -> None:
    from dataclasses import replace

    with pytest.raises(MemlabError, match="sparse"):
        replace(hw.gpu("l40s"), printed_sparse_flops=sparse)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70000), st.integers(1, 70000), st.integers(1, 200), st.sampled_from([64, 128, 256]))
def test_tile_waves_cover_the_output_and_never_exceed_a_whole_slot(m: int, n: int, sms: int, tile: int) -> None:
    from memlab.predict.hardware.gpus import tile_waves

    w = tile_waves(m, n, sms, tile)
    assert w["tiles"] * tile * tile >= m * n  # the tiles cover the output
    assert (w["waves"] - 1) * sms < w["tiles"] <= w["waves"] * sms  # the last wave is the only partial one
    assert 0 < w["useful share of SM-tile slots (%)"] <= w["tile fill (%)"] <= 100
    assert 0 < w["last wave's SMs busy (%)"] <= 100
    if m % tile == 0 and n % tile == 0:
        assert w["tile fill (%)"] == 100


def test_tile_waves_on_an_h100_wave_of_132_tiles() -> None:
    from memlab.predict.hardware.gpus import tile_waves

    one = tile_waves(1536, 1408, 132)  # 12 x 11 tiles: one full wave
    assert (one["tiles"], one["waves"], one["useful share of SM-tile slots (%)"]) == (132, 1, 100)
    two = tile_waves(1536, 1420, 132)  # 12 x 12 = 144 tiles: a second wave with 12 of 132 SMs busy
    assert (two["tiles"], two["waves"]) == (144, 2) and two["last wave's SMs busy (%)"] == pytest.approx(1200 / 132)
