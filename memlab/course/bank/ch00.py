"""Chapter 00's exercises (your machine: peaks, bandwidth, units). Questions are the notebook's markdown cells."""

from __future__ import annotations

from memlab.course.exercises import Numeric, When
from memlab.predict.hardware.gpus import gpu
from memlab.units import MiB

SEED_001_USEFUL_FLOP_S = 160e12
"""Seed article 001's "about 160 TFLOPS" of useful bf16 work on an A100 (its 312 TFLOPS GPU) [seed-001]."""


def _fp32_intensity(shape: tuple[int, int, int]) -> float:
    """FLOP per byte of an fp32 (m, n, k) matmul: 2·m·n·k over 4 B × (m·k + k·n + m·n), each operand moved once."""
    m, n, k = shape
    return 2 * m * n * k / (4 * (m * k + k * n + m * n))


def _elements_intensity(shape: tuple[int, int, int]) -> float:
    m, n, k = shape
    return 2 * m * n * k / (m * k + k * n + m * n)


NVIDIA_SMI_H100_TOTAL_MIB = 81_559
"""The total nvidia-smi prints for an H100 80GB HBM3 (``61440MiB / 81559MiB``; ``nvidia-smi -q``: "FB Memory Usage
Total : 81559 MiB, Reserved : 454 MiB"), driver 565.57.01, in the captured output of thamada/nvidia-smi,
``nvsim/H100SXMx8_smi.py`` (commit 03fbe6e); many public logs of the card print the same total."""


def _ucap(used_mib: float, total_mib: float, card: str) -> float:
    """U_cap in %: memory in use over the total nvidia-smi reports, both in MiB."""
    return 100 * used_mib / total_mib


def _ucap_table(used_mib: float, total_mib: float, card: str) -> float:
    """Over memlab's table row (the marketed 80 GB read as 80 GiB), not the total the tool reports."""
    return 100 * used_mib * MiB / gpu(card).memory_bytes


def _ucap_mixed(used_mib: float, total_mib: float, card: str) -> float:
    """The seed's trap: MiB in use over the marketed GB times 1000."""
    return 100 * used_mib / (gpu(card).memory_gib * 1000)


def _read_all_ms(card: str) -> float:
    spec = gpu(card)
    return 1e3 * spec.memory_bytes / spec.bandwidth_bytes_per_s


EXERCISES = (
    Numeric(
        "00.gemv-intensity", "Arithmetic intensity of the fp32 GEMV-like matmul, FLOP/byte",
        predict_first=True,
        reference=_fp32_intensity, unit="", rtol=0.02,
        hint="bytes = 4 × (m·k + k·n + m·n) for fp32 (each operand read once, the result written once); with m = 1 "
             "the k × n matrix dominates",
        why=lambda shape: (f"2·m·n·k = {2 * shape[0] * shape[1] * shape[2]:,} FLOP over 4 × (m·k + k·n + m·n) = "
                           f"{2 * shape[0] * shape[1] * shape[2] / _fp32_intensity(shape):,.0f}"
                           " B: with m = 1 every matrix element is read once for one multiply-add (2 FLOP, 4 B), so "
                           "a GEMV sits far below any ridge point: memory-bound."),
        diagnoses={_elements_intensity: "That counts elements, not bytes: an fp32 element is 4 bytes.",
                   lambda shape: _fp32_intensity(shape) / 2: "A multiply-add is 2 FLOPs (2·m·n·k), not 1."},
        sample=lambda: {"shape": (1, 256, 256)},
    ),
    Numeric(
        "00.ucap-units", "U_cap in % for memory in use over the total, both as nvidia-smi prints them (MiB)",
        reference=_ucap, unit="%", rtol=0.002,
        hint="the used and total figures nvidia-smi prints are in one unit already (MiB): divide them",
        why=lambda used_mib, total_mib, card: (
            f"{used_mib:,.0f} MiB over the {total_mib:,.0f} MiB nvidia-smi reports as the total: a ratio is "
            "unit-free once both sides share a unit, and the total to divide by is the one the tool reports, not "
            f"the marketed {gpu(card).memory_gib:,.0f} GB (= {gpu(card).memory_bytes / MiB:,.0f} MiB read as GiB)."),
        diagnoses={_ucap_mixed: "That divides MiB by the marketed GB × 1000: each GiB is 1,024 MiB, not 1,000, and "
                                "the reported total is not the marketed figure, so the ratio comes out too high.",
                   _ucap_table: "That divides by memlab's table row (the marketed 80 GB read as 80 GiB = "
                                f"{gpu('h100-sxm').memory_bytes / MiB:,.0f} MiB); nvidia-smi's own total, the one "
                                "beside the used figure, is smaller.",
                   When(lambda v: v < 1): "That looks like a fraction: the question asks for a percentage."},
        sample=lambda: {"used_mib": 61_440, "total_mib": NVIDIA_SMI_H100_TOTAL_MIB, "card": "h100-sxm"},
    ),
    Numeric(
        "00.a100-sparse-mfu", "MFU of seed 001's 160 TFLOP/s against the A100's bf16 figure with sparsity, %",
        reference=lambda: 100 * SEED_001_USEFUL_FLOP_S / gpu("a100-80gb-sxm").sparse_peak("bf16"), unit="%",
        rtol=0.02,
        hint="divide the useful FLOP/s by the A100's 'with 2:4 sparsity' bf16 figure (section 4's table)",
        why=lambda: (f"160 TFLOP/s over the sparse {gpu('a100-80gb-sxm').sparse_peak('bf16') / 1e12:,.0f} TFLOP/s: "
                     "half the MFU against the dense peak, because dense training never runs at the 2:4-sparse "
                     "rate."),
        diagnoses={lambda: 100 * SEED_001_USEFUL_FLOP_S / gpu("a100-80gb-sxm").peak("bf16"):
                   "That is the MFU against the dense peak, the right one; the question asks what the sparse figure "
                   "gives."},
    ),
    Numeric(
        "00.h200-read-all", "Time to read all of an H200 SXM's memory once at its peak bandwidth, ms",
        reference=lambda: _read_all_ms("h200-sxm"), unit="ms", rtol=0.03,
        hint="time = bytes / (bytes per second), with gpu('h200-sxm').memory_bytes and .bandwidth_bytes_per_s",
        why=lambda: (f"{gpu('h200-sxm').memory_bytes:,} B over {gpu('h200-sxm').bandwidth_bytes_per_s / 1e12:.1f} "
                     "TB/s: the floor for one decoding step of a model that fills the card."),
        diagnoses={lambda: 1e3 * gpu("h200-sxm").memory_gib * 1e9 / gpu("h200-sxm").bandwidth_bytes_per_s:
                   "That reads the memory as decimal GB; memlab's table reads the datasheet's 'GB' as GiB (section "
                   "5), so memory_bytes is that many × 2**30.",
                   When(lambda v: v < 1): "Far too small: the answer is in milliseconds (1 s = 1000 ms)."},
    ),
)
