"""Accelerators: a sourced table of dense peaks, name resolution, and ``detect()`` for this process's device.

Conventions used in every row of :data:`GPUS`:

- ``peak_flops`` are **dense** peaks per dtype in FLOP/s (int8 in op/s). Vendors often print tensor-core
  figures "with sparsity" (2:4 structured sparsity doubles them); those are divided by 2 and the row's notes
  say so. ``None`` means the device has no such unit, or its vendor publishes no figure for it.
- ``memory_bytes`` is the datasheet capacity read in GiB (``N GB`` -> ``N * 2**30``): HBM and GDDR parts are
  built from power-of-two dies, and the totals PyTorch/NVML report sit 0.5-8 % *below* these figures (ECC,
  firmware reservations). :func:`resolve` allows for that gap.
- ``bandwidth_bytes_per_s`` is the vendor's decimal figure (``3.35 TB/s`` -> ``3.35e12``).

An unknown device is never given another device's peak: :func:`resolve` returns ``None`` and :func:`detect`
reports the peak as unknown with the reason. For a CPU the peak is measured (a short matmul benchmark),
cached as JSON and marked ``measured``. No torch import at module level; ``detect()`` imports it lazily.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from memlab.errors import MemlabError, UnknownNameError, unknown_name

if TYPE_CHECKING:
    import pandas as pd

PEAK_DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
"""The dtypes every peak table carries, in display order (int8 in integer op/s)."""

GIB = 2**30
T = 1e12  # tera (FLOP/s or bytes/s)


@dataclass(frozen=True)
class Accelerator:
    """One accelerator (or, for a measured CPU, the host processor) with its dense peaks and their source."""

    key: str
    """Canonical lookup key, e.g. ``"h100-sxm"``."""
    name: str
    """Marketing name."""
    vendor: str
    memory_bytes: int
    """Device memory in bytes (datasheet GB read as GiB, see the module docstring)."""
    bandwidth_bytes_per_s: float | None
    """Peak memory bandwidth in bytes/s (decimal); None only for a measured CPU row (not benchmarked)."""
    peak_flops: Mapping[str, float | None] = field(hash=False)
    """Dense peak FLOP/s per dtype in :data:`PEAK_DTYPES` (int8 in op/s); None = unsupported or unpublished."""
    form_factor: str
    """SXM, PCIe, NVL, OAM, TPU, consumer, Superchip or CPU."""
    source: str
    """Where the numbers come from (datasheet title and URL), or ``"measured: ..."`` for a CPU."""
    notes: str = ""
    unofficial: bool = False
    """True when the vendor publishes no datasheet figures and the row cites a third party."""
    measured: bool = False
    """True only for a CPU peak measured by :func:`detect`'s benchmark."""

    def __post_init__(self) -> None:
        unknown = set(self.peak_flops) - set(PEAK_DTYPES)
        if unknown:
            raise MemlabError(f"{self.key}: unknown peak dtypes {sorted(unknown)}; use {', '.join(PEAK_DTYPES)}")
        peaks = {d: self.peak_flops.get(d) for d in PEAK_DTYPES}
        for d, v in peaks.items():
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise MemlabError(f"{self.key}: peak for {d} must be a positive number or None, got {v!r}")
        if not isinstance(self.memory_bytes, int) or self.memory_bytes <= 0:
            raise MemlabError(f"{self.key}: memory_bytes must be a positive int, got {self.memory_bytes!r}")
        bw = self.bandwidth_bytes_per_s
        if bw is not None and not bw > 0:
            raise MemlabError(f"{self.key}: bandwidth_bytes_per_s must be positive or None, got {bw!r}")
        object.__setattr__(self, "peak_flops", MappingProxyType(peaks))

    @property
    def memory_gib(self) -> float:
        """Memory in GiB."""
        return self.memory_bytes / GIB

    @property
    def peak_source(self) -> str:
        """``"table: <source>"`` for a datasheet row, the measurement description for a measured one."""
        return self.source if self.measured else f"table: {self.source}"

    def peak(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for ``dtype`` (one of :data:`PEAK_DTYPES`), None when unsupported or unpublished."""
        if dtype not in PEAK_DTYPES:
            raise unknown_name("dtype", dtype, PEAK_DTYPES)
        return self.peak_flops[dtype]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready) of every field."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["peak_flops"] = dict(self.peak_flops)
        return out


def _row(key: str, name: str, vendor: str, form: str, mem_gib: float, bw: float,
         peaks: tuple[float | None, ...], source: str, notes: str = "", unofficial: bool = False) -> Accelerator:
    """A table row; ``peaks`` are dense, in :data:`PEAK_DTYPES` order, already in FLOP/s."""
    return Accelerator(key, name, vendor, round(mem_gib * GIB), bw, dict(zip(PEAK_DTYPES, peaks, strict=True)),
                       form, source, notes, unofficial)


_SPARSE = "datasheet prints tensor figures 'with sparsity'; dense = printed / 2"
_A100_SRC = ("NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
             "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): FP32 19.5, TF32 156 | 312*, BF16/FP16 312 | 624* "
             "TFLOPS, INT8 624 | 1,248* TOPS (* with sparsity); SXM and PCIe print the same peaks")
_A100_NOTE = "datasheet prints dense | sparse*; dense stored as printed; no fp8 on Ampere"
_H100_SRC = ("NVIDIA H100 Tensor Core GPU datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-"
             "datasheet; nvidia.com/en-us/data-center/h100/): SXM FP32 67, TF32 989*, BF16/FP16 1,979*, "
             "FP8/INT8 3,958*; PCIe FP32 51, TF32 756*, BF16/FP16 1,513*, FP8/INT8 3,026*; NVL FP32 60, TF32 835*, "
             "BF16/FP16 1,671*, FP8/INT8 3,341* TFLOPS (* with sparsity)")
_H200_SRC = ("NVIDIA H200 Tensor Core GPU product page (nvidia.com/en-us/data-center/h200/, 'preliminary "
             "specifications'): SXM FP32 67, TF32 989*, BF16/FP16 1,979*, FP8/INT8 3,958*; NVL FP32 60, TF32 835*, "
             "BF16/FP16 1,671*, FP8/INT8 3,341* TFLOPS (* with sparsity); both 141 GB HBM3e, 4.8 TB/s")
_BLACKWELL_SRC = ("NVIDIA Blackwell datasheet (nvdam.widen.net/s/wwnsxrhm2w/blackwell-datasheet-3384703), 'Individual "
                  "Blackwell GPU Specifications' (footnote: all Tensor Core numbers except FP64 with sparsity): ")
_MI200_DOC = ("; AMD ROCm docs 'AMD Instinct MI250 microarchitecture' (rocm.docs.amd.com/en/latest/conceptual/gpu-arch/"
              "mi250.html): two GCDs per package, 1.6 TB/s HBM2e per GCD")
_MI250_NOTE = ("per GCD = package / 2: one package holds 2 GCDs and PyTorch shows each as a device with 64 GB; "
               "fp32 is the matrix-core (and packed-FP32) rate, vector fp32 is half; no tf32/fp8, no sparsity "
               "(printed = dense)")
_TPU_NOTE = "per chip; MXUs compute bf16 (and int8); no published fp32/fp16 matmul peak; printed figures are dense"

GPUS: Mapping[str, Accelerator] = MappingProxyType({r.key: r for r in (
    _row("v100-sxm2-32gb", "NVIDIA V100 SXM2 32GB", "NVIDIA", "SXM", 32, 900e9,
         (15.7 * T, None, None, 125 * T, None, None),
         "NVIDIA Tesla V100 GPU datasheet (images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-"
         "update-us-1165301-r5.pdf): V100 SXM2 single precision 15.7 TFLOPS, tensor performance 125 TFLOPS, "
         "32/16 GB HBM2, 900 GB/sec",
         "Volta: no sparsity (printed = dense); no bf16, tf32 or fp8; fp16 is the FP16-input tensor (mixed "
         "precision) figure; the datasheet prints no int8 tensor figure"),
    _row("a100-40gb-sxm", "NVIDIA A100 40GB SXM4", "NVIDIA", "SXM", 40, 1555e9,
         (19.5 * T, 156 * T, 312 * T, 312 * T, None, 624 * T), _A100_SRC + "; 40GB HBM2 1,555 GB/s", _A100_NOTE),
    _row("a100-80gb-sxm", "NVIDIA A100 80GB SXM4", "NVIDIA", "SXM", 80, 2039e9,
         (19.5 * T, 156 * T, 312 * T, 312 * T, None, 624 * T), _A100_SRC + "; 80GB SXM HBM2e 2,039 GB/s",
         _A100_NOTE),
    _row("a100-40gb-pcie", "NVIDIA A100 40GB PCIe", "NVIDIA", "PCIe", 40, 1555e9,
         (19.5 * T, 156 * T, 312 * T, 312 * T, None, 624 * T), _A100_SRC + "; 40GB HBM2 1,555 GB/s", _A100_NOTE),
    _row("a100-80gb-pcie", "NVIDIA A100 80GB PCIe", "NVIDIA", "PCIe", 80, 1935e9,
         (19.5 * T, 156 * T, 312 * T, 312 * T, None, 624 * T), _A100_SRC + "; 80GB PCIe HBM2e 1,935 GB/s",
         _A100_NOTE),
    _row("a10g", "NVIDIA A10G (AWS G5)", "NVIDIA", "PCIe", 24, 600e9,
         (35 * T, 35 * T, 70 * T, 70 * T, None, 140 * T),
         "third party: Baseten, 'NVIDIA A10 vs A10G for ML model inference' (baseten.co/blog/nvidia-a10-vs-a10g-for-"
         "ml-model-inference/): 24 GB GDDR6, 600 GB/s, FP32 35, TF32 35, BF16/FP16 70 TFLOPS, INT8 140 TOPS; "
         "AWS G5 instances (aws.amazon.com/ec2/instance-types/g5/): A10G with 24 GB GDDR6, 600 GB/s",
         "unconfirmed: AWS-only variant of the A10 with no NVIDIA datasheet, so every peak is third-party "
         "(treated as dense: no sparsity figure is quoted); fp16/bf16 are FP32-accumulate rates (GeForce-style "
         "half rate, as on the RTX 3090); TechPowerUp's A10G page (techpowerup.com/gpu-specs/a10g.c3798) gives FP32 "
         "31.52 TFLOPS against Baseten's 35; NOT the A10 datasheet's 125 TFLOPS tensor figure; treat MFU on A10G "
         "as approximate", unofficial=True),
    _row("l4", "NVIDIA L4", "NVIDIA", "PCIe", 24, 300e9,
         (30.3 * T, 60 * T, 121 * T, 121 * T, 242.5 * T, 242.5 * T),
         "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4/): FP32 30.3, TF32 120*, BF16/FP16 "
         "242*, FP8 485* TFLOPS, INT8 485* TOPS (* with sparsity), 24 GB GDDR6, 300 GB/s",
         _SPARSE + "; the datasheet prints only the sparse tensor figures"),
    _row("l40s", "NVIDIA L40S", "NVIDIA", "PCIe", 48, 864e9,
         (91.6 * T, 183 * T, 362.05 * T, 362.05 * T, 733 * T, 733 * T),
         "NVIDIA L40S GPU datasheet (resources.nvidia.com/en-us-l40s/l40s-datasheet-28413; nvidia.com/en-us/data-"
         "center/l40s/): FP32 91.6, TF32 183 | 366*, BF16/FP16 362.05 | 733*, FP8 733 | 1,466* TFLOPS, INT8 "
         "733 | 1,466* TOPS (* with sparsity), 48 GB GDDR6, 864 GB/s",
         "datasheet prints dense | sparse*; dense stored as printed"),
    _row("t4", "NVIDIA T4", "NVIDIA", "PCIe", 16, 320e9,
         (8.1 * T, None, None, 65 * T, None, 130 * T),
         "NVIDIA T4 product page (nvidia.com/en-us/data-center/tesla-t4/): FP32 8.1, mixed precision FP16/FP32 65 "
         "TFLOPS, INT8 130 TOPS, 16 GB GDDR6, '320+ GB/s'; the T4 datasheet PDF (nvidia.com/content/dam/en-zz/"
         "Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf) prints the same peaks but '300 GB/sec'",
         "Turing: no sparsity (printed = dense), no bf16, tf32 or fp8; bandwidth is the product page's 320 GB/s "
         "(= 256-bit bus x 10 Gbps GDDR6); NVIDIA's own PDF datasheet says 300 GB/sec"),
    _row("h100-sxm", "NVIDIA H100 SXM5 80GB", "NVIDIA", "SXM", 80, 3.35e12,
         (67 * T, 494.5 * T, 989.5 * T, 989.5 * T, 1979 * T, 1979 * T), _H100_SRC + "; SXM 80 GB HBM3, 3.35 TB/s",
         _SPARSE + " (the Hopper whitepaper, resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper, gives "
         "dense bf16 989.4 TFLOP/s at boost clock)"),
    _row("h100-pcie", "NVIDIA H100 PCIe 80GB", "NVIDIA", "PCIe", 80, 2.0e12,
         (51 * T, 378 * T, 756.5 * T, 756.5 * T, 1513 * T, 1513 * T), _H100_SRC + "; PCIe 80 GB HBM2e, 2 TB/s",
         _SPARSE),
    _row("h100-nvl", "NVIDIA H100 NVL 94GB", "NVIDIA", "NVL", 94, 3.9e12,
         (60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 1670.5 * T, 1670.5 * T), _H100_SRC + "; NVL 94 GB HBM3, 3.9 TB/s",
         _SPARSE + "; per GPU (the 2023 datasheet printed a bridged pair: 188 GB, 7.8 TB/s)"),
    _row("h200-sxm", "NVIDIA H200 SXM 141GB", "NVIDIA", "SXM", 141, 4.8e12,
         (67 * T, 494.5 * T, 989.5 * T, 989.5 * T, 1979 * T, 1979 * T), _H200_SRC, _SPARSE),
    _row("h200-nvl", "NVIDIA H200 NVL 141GB", "NVIDIA", "NVL", 141, 4.8e12,
         (60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 1670.5 * T, 1670.5 * T), _H200_SRC, _SPARSE),
    _row("h20", "NVIDIA H20 96GB", "NVIDIA", "SXM", 96, 4.0e12,
         (44 * T, 74 * T, 148 * T, 148 * T, 296 * T, 296 * T),
         "third party: no public NVIDIA datasheet; figures as widely reported from partner spec sheets (e.g. "
         "willitrunai.com/gpus/h20-96gb): 96 GB HBM3, 4.0 TB/s, FP32 44, TF32 74, BF16/FP16 148 TFLOPS, FP8/INT8 "
         "296 dense",
         "unconfirmed: no NVIDIA datasheet; third-party figures, reported as dense; China-market Hopper with "
         "throttled tensor cores; not the H200", unofficial=True),
    _row("b200", "NVIDIA B200 (HGX/DGX B200)", "NVIDIA", "SXM", 180, 7.7e12,
         (75 * T, 1125 * T, 2250 * T, 2250 * T, 4500 * T, 4500 * T),
         _BLACKWELL_SRC + "HGX B200 per GPU FP32 75 TF, TF32 2.2 PF*, BF16/FP16 4.5 PF*, FP8 9 PF*, INT8 9 POPS*, "
         "180 GB HBM3E, 7.7 TB/s; NVIDIA HGX B200 page (nvidia.com/en-us/data-center/hgx/): per 8 GPUs TF32 18 PF*, "
         "BF16/FP16 36 PF*, FP8/INT8 72 PF*, FP32 600 TF",
         _SPARSE + "; tf32 = HGX 8-GPU 18 PF* / 8 / 2 (the per-GPU column rounds it to 2.2 PF*); bandwidth is the "
         "per-GPU 7.7 TB/s (the DGX B200 datasheet's 64 TB/s per 8 GPUs would give 8 TB/s)"),
    _row("gb200", "NVIDIA GB200 (one Blackwell GPU of a Grace Blackwell superchip)", "NVIDIA", "Superchip", 186,
         8e12, (80 * T, 1250 * T, 2500 * T, 2500 * T, 5000 * T, 5000 * T),
         _BLACKWELL_SRC + "GB200 NVL72 per GPU FP32 80 TF, TF32 2.5 PF*, BF16/FP16 5 PF*, FP8 10 PF*, INT8 10 POPS*, "
         "186 GB HBM3E, 8 TB/s; agrees with the GB200 NVL72 page (nvidia.com/en-us/data-center/gb200-nvl72/) per "
         "superchip (1 Grace + 2 GPUs): BF16/FP16 10 PF*, FP8 20 PF*",
         _SPARSE + "; per-GPU figures as printed (not superchip / 2); the earlier NVL72 page's FP32 180 TF per "
         "superchip (90 per GPU) is superseded by 80; clocked higher (up to 1,200 W) than the HGX B200"),
    _row("rtx-3090", "NVIDIA GeForce RTX 3090", "NVIDIA", "consumer", 24, 936e9,
         (35.6 * T, 35.6 * T, 71 * T, 71 * T, None, 284 * T),
         "NVIDIA Ampere GA102 GPU Architecture whitepaper (nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-"
         "architecture-whitepaper-v2.pdf), Appendix A (RTX 3090): FP32 35.6, TF32 35.6 | 71*, FP16/BF16 tensor with "
         "FP32 accumulate 71 | 142*, FP16 with FP16 accumulate 142 | 284*, INT8 284 | 568* TOPS (* with "
         "sparsity), 24 GB GDDR6X, 936 GB/s",
         "whitepaper prints dense | sparse*; dense stored; fp16/bf16 are the FP32-accumulate rates PyTorch matmuls "
         "use (GeForce halves them; FP16-accumulate fp16 is 142); no fp8 on Ampere"),
    _row("rtx-4090", "NVIDIA GeForce RTX 4090", "NVIDIA", "consumer", 24, 1008e9,
         (82.6 * T, 82.6 * T, 165.2 * T, 165.2 * T, 330.3 * T, 660.6 * T),
         "NVIDIA Ada GPU Architecture whitepaper (images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-"
         "architecture.pdf), Appendix A (RTX 4090): FP32 82.6, TF32 82.6 | 165.2*, FP16/BF16 FP32-accumulate "
         "165.2 | 330.4*, FP8 FP32-accumulate 330.3 | 660.6*, INT8 660.6 | 1,321.2* TOPS (* with sparsity), "
         "24 GB GDDR6X, 1,008 GB/s",
         "whitepaper prints dense | sparse*; dense stored; FP32-accumulate rates (FP16-accumulate fp16 is 330.3, "
         "fp8 660.6)"),
    _row("mi250x", "AMD Instinct MI250X (one GCD)", "AMD", "OAM", 64, 1.6384e12,
         (47.85 * T, None, 191.5 * T, 191.5 * T, None, 191.5 * T),
         "AMD Instinct MI250X accelerator page (amd.com/en/products/accelerators/instinct/mi200/mi250x.html): per "
         "package (220 CUs) FP32 vector 47.9, FP32 matrix 95.7, FP16/BF16 383 TFLOPS, INT8 383 TOPS, 128 GB HBM2e, "
         "3.2768 TB/s" + _MI200_DOC, _MI250_NOTE),
    _row("mi250", "AMD Instinct MI250 (one GCD)", "AMD", "OAM", 64, 1.6384e12,
         (45.25 * T, None, 181.05 * T, 181.05 * T, None, 181.05 * T),
         "AMD Instinct MI250 accelerator page (amd.com/en/products/accelerators/instinct/mi200/mi250.html): per "
         "package (208 CUs) FP32 vector 45.3, FP32 matrix 90.5, FP16/BF16 362.1 TFLOPS, INT8 362.1 TOPS, 128 GB "
         "HBM2e, 3.2768 TB/s" + _MI200_DOC, _MI250_NOTE),
    _row("mi300x", "AMD Instinct MI300X", "AMD", "OAM", 192, 5.3e12,
         (163.4 * T, 653.7 * T, 1307.4 * T, 1307.4 * T, 2614.9 * T, 2614.9 * T),
         "AMD Instinct MI300X accelerator page and data sheet (amd.com/en/products/accelerators/instinct/mi300/"
         "mi300x.html): FP32 163.4, TF32 653.7, FP16/BF16 1,307.4, FP8 2,614.9 TFLOPS, INT8 2,614.9 TOPS dense "
         "(2x 'with structured sparsity'), 192 GB HBM3, 5.3 TB/s",
         "AMD prints dense and 'with structured sparsity' (2x) figures; dense stored as printed"),
    _row("tpu-v4", "Google Cloud TPU v4 (per chip)", "Google", "TPU", 32, 1.2e12,
         (None, None, 275 * T, None, None, 275 * T),
         "Google Cloud TPU v4 documentation (cloud.google.com/tpu/docs/v4): peak compute per chip 275 teraflops "
         "(bf16 or int8), HBM2 32 GiB, 1200 GBps", _TPU_NOTE + "; the chip PaLM trained on (Chowdhery et al. 2022)"),
    _row("tpu-v5e", "Google Cloud TPU v5e (per chip)", "Google", "TPU", 16, 819e9,
         (None, None, 197 * T, None, None, 393 * T),
         "Google Cloud TPU v5e documentation (cloud.google.com/tpu/docs/v5e): peak compute per chip 197 TFLOPs "
         "(bf16), 393 TOPs (Int8), HBM2 16 GB, 819 GBps",
         _TPU_NOTE + "; a later revision of the page prints HBM bandwidth as 800 GiBps (859 GB/s); 819 GB/s kept"),
    _row("tpu-v5p", "Google Cloud TPU v5p (per chip)", "Google", "TPU", 95, 2765e9,
         (None, None, 459 * T, None, None, 918 * T),
         "Google Cloud TPU v5p documentation (cloud.google.com/tpu/docs/v5p): peak compute per chip 459 TFLOPs "
         "(bf16), HBM2e 95 GB, 2765 GBps; int8 918 TOPS from Google's v5p announcement (cloud.google.com/blog/"
         "products/ai-machine-learning/introducing-cloud-tpu-v5p-and-ai-hypercomputer)",
         _TPU_NOTE + "; unconfirmed: int8 918 is not in the docs table and was read only in secondary reports of "
         "the announcement"),
)})
"""The accelerator table, keyed by canonical key (read-only)."""

_ALIASES: Mapping[str, str | tuple[str, ...]] = MappingProxyType({
    # unambiguous alternative spellings
    "v100-sxm2": "v100-sxm2-32gb", "v100-32gb": "v100-sxm2-32gb", "v100-sxm2-32": "v100-sxm2-32gb",
    "a100-sxm4-40gb": "a100-40gb-sxm", "a100-40gb-sxm4": "a100-40gb-sxm",
    "a100-sxm4-80gb": "a100-80gb-sxm", "a100-80gb-sxm4": "a100-80gb-sxm", "a100-sxm-80gb": "a100-80gb-sxm",
    "a100-pcie-40gb": "a100-40gb-pcie", "a100-pcie-80gb": "a100-80gb-pcie",
    "h100-sxm5": "h100-sxm", "h100-80gb-hbm3": "h100-sxm", "h100-sxm5-80gb": "h100-sxm",
    "h100-80gb-pcie": "h100-pcie", "h200": ("h200-sxm", "h200-nvl"), "h200-sxm5": "h200-sxm",
    "h20-96gb": "h20", "rtx3090": "rtx-3090", "3090": "rtx-3090", "rtx4090": "rtx-4090", "4090": "rtx-4090",
    "mi250x-gcd": "mi250x", "mi250-gcd": "mi250", "mi300": "mi300x",
    "tpuv4": "tpu-v4", "v4": "tpu-v4", "tpuv5e": "tpu-v5e", "v5e": "tpu-v5e", "tpu-v5-lite": "tpu-v5e",
    "tpuv5p": "tpu-v5p", "v5p": "tpu-v5p",
    # names that cover several rows with different peaks: the caller must pick
    "v100": ("v100-sxm2-32gb",),
    "a100": ("a100-40gb-sxm", "a100-80gb-sxm", "a100-40gb-pcie", "a100-80gb-pcie"),
    "a100-sxm": ("a100-40gb-sxm", "a100-80gb-sxm"), "a100-sxm4": ("a100-40gb-sxm", "a100-80gb-sxm"),
    "a100-pcie": ("a100-40gb-pcie", "a100-80gb-pcie"),
    "a100-40gb": ("a100-40gb-sxm", "a100-40gb-pcie"), "a100-80gb": ("a100-80gb-sxm", "a100-80gb-pcie"),
    "h100": ("h100-sxm", "h100-pcie", "h100-nvl"), "h100-80gb": ("h100-sxm", "h100-pcie"),
    "mi250x-mi250": ("mi250x", "mi250"), "tpu": ("tpu-v4", "tpu-v5e", "tpu-v5p"),
})

_VENDOR_WORDS = ("nvidia", "amd", "instinct", "tesla", "geforce", "google", "cloud")


def _normalise(name: str, sep: str) -> str:
    """Lower case, separators (space, _, -, /) collapsed to ``sep``, vendor words and '(gfx...)' suffixes dropped."""
    text = re.sub(r"\(gfx[^)]*\)", "", name.strip().lower())
    words = [w for w in re.split(r"[\s_\-/]+", text) if w]
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    return sep.join(words)


def gpu(name: str) -> Accelerator:
    """The table row for ``name``: a key (``"h100-sxm"``), a spelling of it (``"H100 SXM"``, ``"h100_sxm"``), an
    alias, or a device name as torch reports it (``"NVIDIA H100 80GB HBM3"``).

    Raises :class:`UnknownNameError` for an unknown name and, for a name that covers several rows with different
    peaks (``"a100"``, ``"h100"``), an error listing the candidates to choose from.
    """
    if not isinstance(name, str) or not name.strip():
        raise unknown_name("GPU", str(name), list(GPUS))
    key = _normalise(name, "-")
    target = _ALIASES.get(key, key)
    if isinstance(target, tuple):
        raise UnknownNameError(
            f"GPU name {name!r} is ambiguous: its variants differ in memory or peak FLOP/s. memlab's table has "
            f"{', '.join(target)}; pass one of these keys"
        )
    if target in GPUS:
        return GPUS[target]
    found = resolve(name)
    if found is not None:
        return found
    raise unknown_name("GPU", name, list(GPUS))


def list_gpus() -> list[Accelerator]:
    """Every table row, in table order."""
    return list(GPUS.values())


def to_frame(rows: Iterable[Accelerator] | None = None) -> pd.DataFrame:
    """The table (or ``rows``) as a DataFrame: one row per accelerator, peaks as ``peak_<dtype>_flops`` columns."""
    import pandas as pd

    records = []
    for acc in list_gpus() if rows is None else rows:
        rec: dict[str, Any] = {
            "key": acc.key, "name": acc.name, "vendor": acc.vendor, "form_factor": acc.form_factor,
            "memory_bytes": acc.memory_bytes, "memory_gib": acc.memory_gib,
            "bandwidth_bytes_per_s": acc.bandwidth_bytes_per_s,
        }
        rec.update({f"peak_{d}_flops": acc.peak_flops[d] for d in PEAK_DTYPES})
        rec.update({"unofficial": acc.unofficial, "measured": acc.measured, "source": acc.source, "notes": acc.notes})
        records.append(rec)
    return pd.DataFrame.from_records(records)


# Device names as torch.cuda.get_device_name() / NVML / ROCm report them, normalised with spaces (see _normalise).
# Every pattern must match the whole name: MIG slices ("... MIG 1g.5gb"), other memory variants and unknown
# suffixes therefore resolve to None rather than to a near neighbour.
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"v100 sxm2 32gb", "v100-sxm2-32gb"),
    (r"a100 sxm4 40gb", "a100-40gb-sxm"),
    (r"a100 sxm4? 80gb", "a100-80gb-sxm"),
    (r"a100 (pcie 40gb|40gb pcie)", "a100-40gb-pcie"),
    (r"a100 (pcie 80gb|80gb pcie)", "a100-80gb-pcie"),
    (r"a10g", "a10g"),
    (r"l4", "l4"),
    (r"l40s", "l40s"),
    (r"t4", "t4"),
    (r"h100 (80gb hbm3|sxm5?( 80gb)?( hbm3)?)", "h100-sxm"),
    (r"h100 pcie( 80gb)?", "h100-pcie"),
    (r"h100 nvl", "h100-nvl"),
    (r"h200( sxm5?)?( 141gb)?( hbm3e)?", "h200-sxm"),
    (r"h200 nvl", "h200-nvl"),
    (r"h20", "h20"),
    (r"b200", "b200"),
    (r"gb200", "gb200"),
    (r"rtx 3090", "rtx-3090"),
    (r"rtx 4090", "rtx-4090"),
    (r"mi250x", "mi250x"),
    (r"mi250", "mi250"),
    (r"mi300x( vf)?", "mi300x"),
    (r"tpu v4", "tpu-v4"),
    (r"tpu v5e|tpu v5 lite", "tpu-v5e"),
    (r"tpu v5p", "tpu-v5p"),
)
_MI250_CUS = {110: "mi250x", 104: "mi250"}  # compute units per GCD (AMD CDNA2 whitepaper: 220 / 208 per package)
_MEMORY_TOLERANCE = (0.85, 1.02)  # reported / datasheet: ECC and reservations take up to ~8 % (T4 shows 15 of 16)


def resolve(device_name: str, total_memory_bytes: int | None = None, *,
            multiprocessor_count: int | None = None) -> Accelerator | None:
    """Map a device name from torch/NVML/ROCm (plus its total memory) to a table row, or None when unsure.

    The name must match one known form completely (``"NVIDIA H100 80GB HBM3"`` is the SXM part, ``"NVIDIA H100
    PCIe"`` and ``"NVIDIA H100 NVL"`` the others; ``"NVIDIA H20"`` is not ``"NVIDIA H200"``; ``"NVIDIA GB200"``
    not ``"NVIDIA B200"``; ``"NVIDIA GH200 480GB"`` is none of them). When ``total_memory_bytes`` is given it
    must lie within 85-102 % of the row's datasheet memory, else None. ROCm names both MI250X and MI250 GCDs
    ``"AMD Instinct MI250X/MI250"``: ``multiprocessor_count`` (compute units: 110 vs 104) decides, and without
    it the answer is None. None means MFU will be reported as unknown, never borrowed from another device.
    """
    if not isinstance(device_name, str):
        return None
    text = _normalise(device_name, " ")
    if text == "mi250x mi250":
        key = _MI250_CUS.get(multiprocessor_count) if multiprocessor_count is not None else None
    else:
        key = next((k for pattern, k in _DEVICE_PATTERNS if re.fullmatch(pattern, text)), None)
    if key is None:
        return None
    row = GPUS[key]
    if total_memory_bytes is not None:
        ratio = total_memory_bytes / row.memory_bytes
        if not _MEMORY_TOLERANCE[0] <= ratio <= _MEMORY_TOLERANCE[1]:
            return None
    return row


# --------------------------------------------------------------------------------------------------------------
# detect(): the device this process would use
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceInfo:
    """The device this process would use (``cuda:0`` when available, else the CPU) and its peak, if known."""

    kind: str
    """``"cuda"`` (also ROCm builds, which use the cuda API) or ``"cpu"``."""
    name: str
    """Device name as reported (GPU name, or the CPU model string)."""
    accelerator: Accelerator | None
    """The table row (GPU), the measured row (CPU), or None when the peak is unknown."""
    total_memory_bytes: int | None
    """Device memory as reported by torch (GPU) or host RAM (CPU)."""
    peak_flops: Mapping[str, float | None] = field(hash=False)
    """Dense peak FLOP/s per dtype; all None when unknown."""
    peak_source: str
    """``"table: <source>"``, ``"measured: <benchmark>"`` or ``"unknown"``."""
    peak_reason: str | None
    """Why the peak is unknown (None when known)."""
    torch_version: str | None
    cuda_version: str | None
    """CUDA (or ``"hip X"``) version torch was built with; None for a CPU-only build."""
    driver_version: str | None
    """NVIDIA driver version via NVML, None when NVML is unavailable."""
    cpu_count: int | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_flops", MappingProxyType({d: self.peak_flops.get(d) for d in PEAK_DTYPES}))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready); the accelerator row is nested as its own dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["peak_flops"] = dict(self.peak_flops)
        out["accelerator"] = self.accelerator.to_dict() if self.accelerator else None
        return out


def _driver_version() -> str | None:
    """NVIDIA driver version from NVML, or None when NVML (or a driver) is absent."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing, no driver, no permission: "unavailable", never a guess
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def _cpu_model() -> tuple[str, str]:
    """(model string, vendor) from /proc/cpuinfo, else from :mod:`platform`."""
    model = vendor = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "model name" and not model:
                model = v.strip()
            elif k.strip() == "vendor_id" and not vendor:
                vendor = v.strip()
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    return model, vendor or platform.machine() or "unknown"


def _host_memory_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None


def _best_matmul_s(torch: Any, dtype: Any, n: int, reps: int) -> float:
    """Best wall time of ``reps`` n x n x n matmuls after one warm-up (CPU matmuls are synchronous)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    torch.matmul(a, b)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return best


def _measure_cpu_peaks(torch: Any, threads: int) -> tuple[dict[str, float | None], str]:
    """Measured fp32 (and bf16 when it runs) matmul FLOP/s on this CPU, and the benchmark's description.

    fp32: best of 5 1024^3 matmuls (2 * 1024^3 FLOP each). bf16: the size is picked from a 256^3 probe so one
    matmul takes at most ~50 ms (CPUs without bf16 units emulate it slowly); best of 3. Total well under 1 s.
    """
    n32, reps32 = 1024, 5
    peaks: dict[str, float | None] = {"fp32": 2 * n32**3 / _best_matmul_s(torch, torch.float32, n32, reps32)}
    desc = f"best of {reps32} torch.matmul {n32}x{n32}x{n32} fp32"
    try:
        probe = _best_matmul_s(torch, torch.bfloat16, 256, 2)
        n16 = 1024 if probe * 64 < 0.05 else 512 if probe * 8 < 0.05 else 256
        peaks["bf16"] = 2 * n16**3 / _best_matmul_s(torch, torch.bfloat16, n16, 3)
        desc += f", best of 3 {n16}x{n16}x{n16} bf16"
    except RuntimeError:
        peaks["bf16"] = None
        desc += ", bf16 matmul unsupported"
    desc += f" on {threads} thread(s), FLOP/s = 2*n^3 / best time"
    return peaks, desc


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memlab"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) and isinstance(data.get("entries"), dict) else {"entries": {}}
    except (OSError, ValueError):
        return {"entries": {}}


def _write_cache(path: Path, data: dict[str, Any]) -> None:
    """Atomic write; an unwritable cache only costs a re-measurement next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass


CPU_CACHE_FILE = "cpu_peak.json"


def _valid_entry(entry: object) -> bool:
    """A cache entry with a benchmark description and positive-or-None peaks for known dtypes only."""
    if not isinstance(entry, dict) or not isinstance(entry.get("benchmark"), str):
        return False
    peaks = entry.get("peak_flops")
    if not isinstance(peaks, dict) or not peaks or set(peaks) - set(PEAK_DTYPES):
        return False
    return all(v is None or (isinstance(v, int | float) and math.isfinite(v) and v > 0) for v in peaks.values())


def _detect_cpu(torch: Any, measure: bool, cache_dir: Path | None, common: dict[str, Any]) -> DeviceInfo:
    model, vendor = _cpu_model()
    threads = int(torch.get_num_threads())
    cache_key = f"{model} | torch {torch.__version__} | {threads} threads"
    path = (cache_dir if cache_dir is not None else _default_cache_dir()) / CPU_CACHE_FILE
    cache = _read_cache(path)
    entry = cache["entries"].get(cache_key)
    if not _valid_entry(entry):
        entry = None
        if measure:
            peaks, desc = _measure_cpu_peaks(torch, threads)
            entry = {"peak_flops": peaks, "benchmark": desc, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            cache["entries"][cache_key] = entry
            _write_cache(path, cache)
    memory = _host_memory_bytes()
    if entry is None:
        return DeviceInfo("cpu", model, None, memory, {}, "unknown",
                          "CPU peak not measured (measure_cpu_peak=False and no cached measurement)", **common)
    source = f"measured: {entry['benchmark']} ({model})"
    row = None
    if memory:
        row = Accelerator("cpu", model, vendor, memory, None, entry["peak_flops"], "CPU", source,
                          "host CPU: peak measured by memlab.hardware.detect(), not a datasheet figure; "
                          "bandwidth not measured", measured=True)
    return DeviceInfo("cpu", model, row, memory, entry["peak_flops"], source, None, **common)


def detect(measure_cpu_peak: bool = True, cache_dir: Path | None = None, *, device: str | None = None) -> DeviceInfo:
    """Describe the device this process would use: ``cuda:0`` when available, else the CPU.

    GPU: name and total memory go through :func:`resolve`; a GPU missing from the table gets no peak, with the
    reason. CPU: the fp32 (and bf16) matmul peak is measured by a sub-second benchmark and cached as JSON in
    ``cache_dir`` (default ``$XDG_CACHE_HOME/memlab`` or ``~/.cache/memlab``), keyed by CPU model, torch version
    and thread count; later calls read the cache. ``measure_cpu_peak=False`` uses a cached value if present and
    never benchmarks. ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``; None or ``"auto"`` = the default above)
    picks another device. The function keeps no state between calls besides that file.
    """
    import torch

    hip = getattr(torch.version, "hip", None)
    common: dict[str, Any] = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or (f"hip {hip}" if hip else None),
        "driver_version": _driver_version(),
        "cpu_count": os.cpu_count(),
    }
    want = "auto" if device is None else str(device).strip().lower()
    match = re.fullmatch(r"auto|cpu|cuda(?::(\d+))?", want)
    if match is None:
        raise MemlabError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if want == "cpu" or (want == "auto" and not torch.cuda.is_available()):
        return _detect_cpu(torch, measure_cpu_peak, cache_dir, common)
    index = int(match.group(1) or 0)
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise MemlabError(f"device {device!r} is not available here (torch sees {torch.cuda.device_count()} CUDA "
                          "device(s)); use device='cpu' or 'auto'")
    props = torch.cuda.get_device_properties(index)
    name = torch.cuda.get_device_name(index)
    total = int(props.total_memory)
    row = resolve(name, total, multiprocessor_count=getattr(props, "multi_processor_count", None))
    if row is None:
        reason = (f"GPU {name!r} is not in memlab's table; MFU is reported as unknown rather than borrowing "
                  "another GPU's peak")
        return DeviceInfo("cuda", name, None, total, {}, "unknown", reason, **common)
    return DeviceInfo("cuda", name, row, total, row.peak_flops, row.peak_source, None, **common)


def describe(device: str | None = None, *, measure_cpu_peak: bool = True, cache_dir: Path | None = None
             ) -> dict[str, Any]:
    """Flat provenance of a device for reports: ``device``, ``device_kind``, ``peak_source``, ``peak_reason``,
    versions and the dense bf16/fp32 peaks (FLOP/s, None when unknown). Built from :func:`detect`."""
    info = detect(measure_cpu_peak, cache_dir, device=device)
    return {
        "device": info.name, "device_kind": info.kind,
        "accelerator": info.accelerator.key if info.accelerator else None,
        "peak_source": info.peak_source, "peak_reason": info.peak_reason,
        "peak_fp32_flops": info.peak_flops["fp32"], "peak_bf16_flops": info.peak_flops["bf16"],
        "total_memory_bytes": info.total_memory_bytes, "torch_version": info.torch_version,
        "cuda_version": info.cuda_version, "driver_version": info.driver_version, "cpu_count": info.cpu_count,
    }
