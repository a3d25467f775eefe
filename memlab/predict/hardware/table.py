"""The accelerator table: one sourced row per device (dense peaks per dtype, memory, bandwidth).

Data only; looking names up and resolving a detected device to a row is :mod:`memlab.predict.hardware.gpus`. The
conventions every row follows are in that module's docstring. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from memlab.errors import MemlabError, unknown_name
from memlab.predict.spec.frozen import FrozenDict
from memlab.predict.spec.validate import LIMITS, StrictInit, canonical_choice, check_fields, check_number, show

PEAK_DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
"""The dtypes every peak table carries, in display order (int8 in integer op/s)."""

GIB = 2**30
T = 1e12  # tera (FLOP/s or bytes/s)


@dataclass(frozen=True)
class Accelerator(StrictInit):
    """One accelerator (or, for a measured CPU, the host processor) with its dense peaks and their source."""

    key: str
    """Canonical lookup key, e.g. ``"h100-sxm"``."""
    name: str
    """Marketing name."""
    vendor: str
    memory_bytes: int = field(metadata={"max": 2**50, "why": "a pebibyte, over 1000x any accelerator's memory"})
    """Device memory in bytes (datasheet GB read as GiB, see the module docstring)."""
    bandwidth_bytes_per_s: float | None = field(metadata={"min": 1.0, "max": 1e16,
                                                          "why": "10 PB/s, over 1000x any HBM stack's bandwidth"})
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
    """True only for a CPU peak measured by :func:`memlab.measure.machine.detect`'s benchmark."""
    printed_sparse_flops: Mapping[str, float] = field(default_factory=dict, hash=False)
    """The datasheet's "with sparsity" (2:4) figures per dtype, as printed, where the row's source prints them.
    Not always 2 x dense: the L40S datasheet prints 362.05 dense and 733 sparse bf16 TFLOP/s. Empty otherwise."""

    def __post_init__(self) -> None:
        check_fields(self, MemlabError)  # types and ranges from the annotations (memlab.predict.spec.validate)
        if not isinstance(self.peak_flops, Mapping):
            raise MemlabError(f"{self.key}: peak_flops must be a mapping dtype -> FLOP/s, got {show(self.peak_flops)}")
        unknown = set(self.peak_flops) - set(PEAK_DTYPES)
        if unknown:
            raise MemlabError(f"{self.key}: unknown peak dtypes {sorted(map(str, unknown))}; use "
                              f"{', '.join(PEAK_DTYPES)}")
        peaks = {d: self.peak_flops.get(d) for d in PEAK_DTYPES}
        for d, v in peaks.items():
            if v is not None:
                check_number(f"peak_flops[{d!r}]", v, lo=0.0, lo_open=True, hi=LIMITS["peak_flops"].max,
                             why=LIMITS["peak_flops"].why, owner=f"Accelerator {self.key!r}", err=MemlabError)
        object.__setattr__(self, "peak_flops", FrozenDict(peaks))
        if not isinstance(self.printed_sparse_flops, Mapping):
            raise MemlabError(f"{self.key}: printed_sparse_flops must be a mapping dtype -> FLOP/s, got "
                              f"{show(self.printed_sparse_flops)}")
        sparse = dict(self.printed_sparse_flops)
        for d, v in sparse.items():
            if d not in PEAK_DTYPES:
                raise MemlabError(f"{self.key}: printed sparse figure for {show(d)}: not one of "
                                  f"{', '.join(PEAK_DTYPES)}")
            check_number(f"printed_sparse_flops[{d!r}]", v, lo=0.0, lo_open=True, hi=2 * LIMITS["peak_flops"].max,
                         why=LIMITS["peak_flops"].why, owner=f"Accelerator {self.key!r}", err=MemlabError)
        object.__setattr__(self, "printed_sparse_flops", FrozenDict(sparse))

    @property
    def memory_gib(self) -> float:
        """Memory in GiB."""
        return self.memory_bytes / GIB

    @property
    def peak_source(self) -> str:
        """``"table: <source>"`` for a datasheet row, the measurement description for a measured one."""
        return self.source if self.measured else f"table: {self.source}"

    def peak(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for ``dtype`` (one of :data:`PEAK_DTYPES`, any case), None when unsupported or
        unpublished."""
        dtype = canonical_choice(dtype, PEAK_DTYPES)
        if dtype not in PEAK_DTYPES:
            raise unknown_name("dtype", dtype, PEAK_DTYPES)
        return self.peak_flops[dtype]

    def sparse_peak(self, dtype: str) -> float | None:
        """The datasheet's printed "with sparsity" FLOP/s for ``dtype``; None where the source prints none."""
        dtype = canonical_choice(dtype, PEAK_DTYPES)
        if dtype not in PEAK_DTYPES:
            raise unknown_name("dtype", dtype, PEAK_DTYPES)
        return self.printed_sparse_flops.get(dtype)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready) of every field."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["peak_flops"] = dict(self.peak_flops)
        out["printed_sparse_flops"] = dict(self.printed_sparse_flops)
        return out


def _row(key: str, name: str, vendor: str, form: str, mem_gib: float, bw: float,
         peaks: tuple[float | None, ...], source: str, notes: str = "", unofficial: bool = False,
         sparse: Mapping[str, float] | None = None) -> Accelerator:
    """A table row; ``peaks`` are dense, in :data:`PEAK_DTYPES` order, already in FLOP/s; ``sparse`` the printed
    "with sparsity" figures (FLOP/s) by dtype, where the source prints them."""
    return Accelerator(key, name, vendor, round(mem_gib * GIB), bw, dict(zip(PEAK_DTYPES, peaks, strict=True)),
                       form, source, notes, unofficial, printed_sparse_flops=dict(sparse or {}))


def _printed(tf32: float, bf16: float, fp8: float | None, int8: float) -> dict[str, float]:
    """Printed sparse TFLOP/s (fp16 = bf16) as FLOP/s."""
    out = {"tf32": tf32 * T, "bf16": bf16 * T, "fp16": bf16 * T, "int8": int8 * T}
    return out | ({"fp8": fp8 * T} if fp8 else {})


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
    _row("v100-sxm2-16gb", "NVIDIA V100 SXM2 16GB", "NVIDIA", "SXM", 16, 900e9,
         (15.7 * T, None, None, 125 * T, None, None),
         "NVIDIA Tesla V100 GPU datasheet (images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-"
         "update-us-1165301-r5.pdf): V100 SXM2 single precision 15.7 TFLOPS, tensor performance 125 TFLOPS, "
         "32/16 GB HBM2, 900 GB/sec",
         "the 16 GB variant of the same datasheet row; Volta: no sparsity (printed = dense); no bf16, tf32 or fp8"),
    _row("a100-40gb-sxm", "NVIDIA A100 40GB SXM4", "NVIDIA", "SXM", 40, 1555e9,
         (19.5 * T, 156 * T, 312 * T, 312 * T, None, 624 * T), _A100_SRC + "; 40GB HBM2 1,555 GB/s", _A100_NOTE),
    _row("a100-80gb-sxm", "NVIDIA A100 80GB SXM4", "NVIDIA", "SXM", 80, 2039e9,
         (19.5 * T, 156 * T, 312 * T, 312 * T, None, 624 * T), _A100_SRC + "; 80GB SXM HBM2e 2,039 GB/s",
         _A100_NOTE, sparse=_printed(312, 624, None, 1248)),
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
         "datasheet prints dense | sparse*; dense stored as printed", sparse=_printed(366, 733, 1466, 1466)),
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
         "dense bf16 989.4 TFLOP/s at boost clock)", sparse=_printed(989, 1979, 3958, 3958)),
    _row("h100-pcie", "NVIDIA H100 PCIe 80GB", "NVIDIA", "PCIe", 80, 2.0e12,
         (51 * T, 378 * T, 756.5 * T, 756.5 * T, 1513 * T, 1513 * T), _H100_SRC + "; PCIe 80 GB HBM2e, 2 TB/s",
         _SPARSE),
    _row("h100-nvl", "NVIDIA H100 NVL 94GB", "NVIDIA", "NVL", 94, 3.9e12,
         (60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 1670.5 * T, 1670.5 * T), _H100_SRC + "; NVL 94 GB HBM3, 3.9 TB/s",
         _SPARSE + "; per GPU (the 2023 datasheet printed a bridged pair: 188 GB, 7.8 TB/s)"),
    _row("gh200-96gb", "NVIDIA GH200 96GB HBM3", "NVIDIA", "Superchip", 96, 4.0e12,
         (67 * T, 494.5 * T, 989.5 * T, 989.5 * T, 1979 * T, 1979 * T),
         "third party: spheron.network/blog/nvidia-gh200-guide and the Hopper (microarchitecture) encyclopedia "
         "page (GH200: an H100 GPU with 96 GB HBM3, or 144 GB HBM3e, beside a 72-core Grace CPU with 480 GB "
         "LPDDR5X); NVIDIA's GH200 datasheet was not read for this row",
         "unconfirmed: the dense peaks are the H100 SXM row's and the 4 TB/s bandwidth is the superchip's "
         "marketing figure, not read from NVIDIA's datasheet; the memory (96 GB HBM3, the GPU side only: the "
         "LPDDR5X is host memory) is what a --gpu verdict uses", unofficial=True),
    _row("h200-sxm", "NVIDIA H200 SXM 141GB", "NVIDIA", "SXM", 141, 4.8e12,
         (67 * T, 494.5 * T, 989.5 * T, 989.5 * T, 1979 * T, 1979 * T), _H200_SRC, _SPARSE,
         sparse=_printed(989, 1979, 3958, 3958)),
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
         "per-GPU 7.7 TB/s (the DGX B200 datasheet's 64 TB/s per 8 GPUs would give 8 TB/s)",
         sparse=_printed(2200, 4500, 9000, 9000)),
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

ALIASES: Mapping[str, str | tuple[str, ...]] = MappingProxyType({
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
    "v100": ("v100-sxm2-32gb", "v100-sxm2-16gb"), "v100-16gb": "v100-sxm2-16gb", "v100-sxm2-16": "v100-sxm2-16gb",
    "gh200": "gh200-96gb", "gh200-96": "gh200-96gb",
    "a100": ("a100-40gb-sxm", "a100-80gb-sxm", "a100-40gb-pcie", "a100-80gb-pcie"),
    "a100-sxm": ("a100-40gb-sxm", "a100-80gb-sxm"), "a100-sxm4": ("a100-40gb-sxm", "a100-80gb-sxm"),
    "a100-pcie": ("a100-40gb-pcie", "a100-80gb-pcie"),
    "a100-40gb": ("a100-40gb-sxm", "a100-40gb-pcie"), "a100-80gb": ("a100-80gb-sxm", "a100-80gb-pcie"),
    "h100": ("h100-sxm", "h100-pcie", "h100-nvl"), "h100-80gb": ("h100-sxm", "h100-pcie"),
    "mi250x-mi250": ("mi250x", "mi250"), "tpu": ("tpu-v4", "tpu-v5e", "tpu-v5p"),
})

