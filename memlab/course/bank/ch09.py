"""Chapter 09's exercises (what nvidia-smi's numbers mean). Questions are the notebook's markdown cells."""

from __future__ import annotations

from typing import Any

from memlab.course.exercises import Choice, Numeric, When
from memlab.units import GB, GiB

JAX_PREALLOCATE = 0.75
"""JAX's default preallocated fraction of GPU memory at the first operation [jax-gpu-memory]."""
VLLM_FRACTION = 0.90
"""vLLM's default ``gpu_memory_utilization`` [vllm-engine-args]."""
SAME_WITHIN = 1.25
"""Exercise 1's "about the same": the highest CPU % within this factor of the lowest."""


def _card_bytes(card: str) -> int:
    from memlab.predict.hardware.gpus import gpu

    return gpu(card).memory_bytes


def _h200_bytes() -> int:
    return _card_bytes("h200-sxm")


def _highest_cpu(table: Any) -> str:
    pct = table["cpu_pct"]
    if pct.max() <= SAME_WITHIN * pct.min():
        return "same"
    return str(table.loc[pct.idxmax(), "loop"]).split()[0]  # "matmul (fp32)" -> the option "matmul"


def _sample_busy() -> dict[str, Any]:
    import pandas as pd

    return {"table": pd.DataFrame({"loop": ["busy loop (Python)", "copy (memory-bound)", "matmul (fp32)"],
                                   "cpu_pct": [99.0, 97.0, 60.5]})}


def _u_eff_vllm(used_gib: float) -> float:
    return 100 * used_gib * GiB / (VLLM_FRACTION * _h200_bytes())


EXERCISES = (
    Choice(
        "09.cpu-percent", "Which loop reads the highest CPU %",
        predict_first=True,
        reference=_highest_cpu,
        options={"busy": "the Python busy loop", "copy": "the copy", "matmul": "the matmul",
                 "same": f"about the same, within {SAME_WITHIN - 1:.0%} of each other"},
        hint="CPU % counts time on a core, not what the core computed",
        why=lambda table: ("CPU % per loop: " + ", ".join(f"{r.loop} {r.cpu_pct:.0f} %" for r in table.itertuples())
                           + ". Each loop keeps its thread on a core the whole time, whatever it computes: busy "
                             "is not useful, just as GPU-Util counts time with a kernel running."),
        diagnoses={"matmul": "The matmul does by far the most useful work, but CPU % counts time on a core, not "
                             "FLOPs.",
                   "busy": "The busy loop does no floating-point work at all; its CPU % is still full."},
        sample=_sample_busy,
    ),
    Numeric(
        "09.u-eff-vllm", "U_eff, %, of a vLLM server on an H200 SXM whose weights + KV in use are given in GiB",
        reference=_u_eff_vllm, unit="%", rtol=0.02,
        hint="U_eff divides what the workload uses by what the process holds: vLLM holds "
             "gpu_memory_utilization (0.9 by default) of the card's memory_bytes",
        why=lambda used_gib: (f"{used_gib:g} GiB over 0.9 × {_h200_bytes() / GiB:.0f} GiB = "
                              f"{VLLM_FRACTION * _h200_bytes() / GiB:.1f} GiB held: nvidia-smi shows the "
                              "reservation, and the workload's share of it is U_eff."),
        diagnoses={lambda used_gib: 100 * used_gib * GiB / _h200_bytes():
                   "That divides by the whole card (U_cap's denominator); U_eff divides by what the process "
                   "holds, vLLM's reservation.",
                   lambda: 100 * VLLM_FRACTION: "That is U_cap, what nvidia-smi shows: the reservation, not the "
                                                "workload.",
                   lambda used_gib: 100 * used_gib * 1e9 / (VLLM_FRACTION * _h200_bytes()):
                   "That reads the workload's GiB as decimal GB."},
        sample=lambda: {"used_gib": 40},
    ),
    Numeric(
        "09.jax-l4-gib", "GiB nvidia-smi shows for a small JAX job on a given card right after its first operation",
        reference=lambda need_gib, card: JAX_PREALLOCATE * _card_bytes(card) / GiB, unit="GiB", rtol=0.01,
        hint="JAX preallocates a fixed share of the card at its first operation, whatever the job needs: that share "
             "of gpu(card).memory_bytes, in GiB",
        why=lambda need_gib, card: (
            f"JAX reserves {JAX_PREALLOCATE:.0%} of the card's {_card_bytes(card) / GiB:.0f} GiB at its first "
            f"operation (XLA_PYTHON_CLIENT_PREALLOCATE): {JAX_PREALLOCATE * _card_bytes(card) / GiB:.1f} GiB for a "
            f"{need_gib:g}-GiB job. The number is the framework's policy, not the job's need. memlab's table holds "
            "the card's nominal capacity; JAX takes its share of the total the driver reports, which nvidia-smi "
            "shows and which is a little lower on a real card (ECC and the driver reserve part of it), so a real "
            "reading is a little lower too."),
        diagnoses={lambda need_gib: need_gib: "That is what the job needs; nvidia-smi shows what JAX preallocated.",
                   lambda card: VLLM_FRACTION * _card_bytes(card) / GiB: "That is vLLM's 0.9, not JAX's default.",
                   lambda card: JAX_PREALLOCATE * _card_bytes(card) / GB:
                   "That is in decimal GB; nvidia-smi's MiB are binary: give GiB.",
                   lambda: 100 * JAX_PREALLOCATE: "That is the share in %; the question asks for GiB."},
        sample=lambda: {"need_gib": 6, "card": "l4"},
    ),
    Numeric(
        "09.printed-gb", "Decimal GB of a figure that seed 004's script prints as 'GB' (bytes / 1024**3)",
        reference=lambda printed: printed * GiB / GB, unit="GB", rtol=0.005,
        hint="the script divides bytes by 1024**3, so its 'GB' are GiB; decimal GB are bytes / 10**9",
        why=lambda printed: (f"{printed:g} × 2**30 B = {printed * GiB:,.0f} B = {printed * GiB / GB:.2f} × 10**9 B: "
                             f"GiB are {GiB / GB - 1:.1%} larger than GB."),
        diagnoses={lambda printed: printed * GB / GiB: "That converts the other way: the printed figure is in GiB, "
                                                       "which are larger than GB.",
                   lambda printed: printed: "The label says GB, but the script divided by 1024**3: the figure is "
                                            "GiB.",
                   When(lambda v: v > 1e6): "Give the answer in GB (10^9 bytes), not bytes."},
        sample=lambda: {"printed": 45.0},
    ),
)
