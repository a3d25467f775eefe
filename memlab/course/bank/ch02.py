"""Chapter 02's exercises (bytes per parameter). Questions are the notebook's markdown cells."""

from __future__ import annotations

from typing import Any

from memlab.course.exercises import Numeric, When
from memlab.units import GiB, MiB

_N = 10**9


def bytes_per_param(policy: str, optimizer: str = "adamw") -> float:
    """Model-state bytes per parameter that memlab predicts (step counters excluded), as chapter 02's table."""
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.setup import Setup

    return estimate(_N, Setup(precision=policy, optimizer=optimizer)).model_state_bytes(step_counters=False) / _N


def _states_mib(model: Any) -> float:
    return bytes_per_param("amp-bf16") * model.param_count() / MiB


EX2_MODEL = "mistral-7b"
"""Exercise 2's model: not chapter 01's Llama-2-7B, whose mixed-bf16 states chapter 01 section 7 prints."""


def _states_gib(key: str = EX2_MODEL) -> float:
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.model import preset
    from memlab.predict.spec.setup import Setup

    parts = estimate(preset(key), Setup(precision="mixed-bf16", seq=1)).components()
    return sum(parts[c] for c in ("params", "grads", "optimizer")) / GiB


def _count(key: str = EX2_MODEL) -> int:
    from memlab.predict.spec.model import preset

    return preset(key).param_count()


def _billions_fit(capacity_gib: float) -> float:
    return capacity_gib * GiB / bytes_per_param("bf16", "sgd") / 1e9


EXERCISES = (
    Numeric(
        "02.amp-run-mib", "Model states (no step counters) of the amp-bf16 + AdamW run, MiB",
        predict_first=True,
        reference=_states_mib, unit="MiB", rtol=0.01,
        hint="autocast changes the dtype of the matmuls' inputs, not of the stored weights, gradients or moments: "
             "count the bytes per parameter that stay in storage, times model.param_count()",
        why=lambda model: (f"{bytes_per_param('amp-bf16'):.0f} B/param (fp32 weights 4, fp32 gradients 4, two fp32 "
                           f"moments 8) × {model.param_count():,} parameters. Autocast's bf16 copies live only from "
                           "the forward to the backward (chapter 03)."),
        diagnoses={lambda model: 12 * model.param_count() / MiB:
                   "That is 12 B/param, seed 004's 14 + 14 + 56 GB for 7B: 16-bit weights and gradients and Adam's "
                   "moments without fp32 weights. AMP stores fp32 weights.",
                   lambda model: 18 * model.param_count() / MiB:
                   "That is 18 B/param, Hugging Face's count of AMP: it counts autocast's 16-bit weight copy as "
                   "stored. The copies are transient "
                   "(made in the forward, freed after the backward), not model states.",
                   lambda model: 20 * model.param_count() / MiB:
                   "That is 20 B/param, 16-bit weights and gradients plus fp32 copies of both; AMP keeps one fp32 "
                   "copy of each and no 16-bit one in storage.",
                   lambda model: 16 * model.param_count() / 1e6:
                   "That is in decimal MB; the question asks for MiB (2**20 bytes)."},
        sample=lambda: {"model": __import__("memlab.predict.spec.model", fromlist=["preset"]).preset("tiny-gpt")},
    ),
    Numeric(
        "02.mistral7b-states", "Mistral-7B model states, mixed-bf16 + AdamW, in GiB",
        reference=_states_gib, unit="GiB", rtol=0.01,
        hint="multiply the parameter count (preset('mistral-7b').param_count()) by mixed-bf16 + AdamW's bytes per "
             "parameter from section 1, then divide by 2**30 (answer in GiB: a bare number is read as GiB)",
        why=lambda: (f"{bytes_per_param('mixed-bf16'):.0f} B/param × {_count():,} parameters: bf16 weights "
                     "and gradients (2 + 2), an fp32 master copy (4) and two fp32 moments (8)."),
        diagnoses={lambda: 16 * 7e9 / GiB: "That uses the nominal 7B; preset('mistral-7b').param_count() is the exact "
                                           "count.",
                   lambda: 84e9 / GiB: "That is seed 004's 84 GB (14 + 14 + 56) for a 7B model: 12 B/param, without "
                                       "the fp32 master weights, and for 7 billion parameters rather than this "
                                       "model's count.",
                   lambda: 84.0: "84 is seed 004's 7B budget in GB (14 + 14 + 56): 12 B/param, without the fp32 "
                                 "master weights (chapter 01 section 7), and in GB, where the question asks GiB.",
                   lambda: _states_gib("llama-2-7b"): "That is Llama-2-7B's figure (chapter 01 section 7); Mistral-7B "
                                                       "has a wider MLP and fewer key/value heads, so another count: "
                                                       "use preset('mistral-7b').param_count().",
                   lambda: 12 * _count() / GiB: "12 B/param leaves out the fp32 master weights.",
                   lambda: 16 * _count() / 1e9: "That is in decimal GB; the question asks for GiB."},
    ),
    Numeric(
        "02.lion-bytes", "Model-state bytes per parameter of mixed-bf16 with Lion (one fp32 momentum buffer)",
        reference=lambda: bytes_per_param("mixed-bf16", "sgd-momentum"), unit="", rtol=0.01,
        hint="split mixed-bf16 + AdamW's 16 B/param into its terms (weights, gradients, master copy, moments) and "
             "replace Adam's two moments by Lion's one; the optimizer's state lives beside the fp32 master, in fp32",
        why=lambda: (f"{bytes_per_param('mixed-bf16', 'sgd-momentum'):g} B/param: bf16 weights 2 + bf16 gradients 2 + "
                     "fp32 master 4 + one fp32 momentum 4, the layout of SGD with momentum in section 1's table. "
                     "Lion saves Adam's second moment, 4 B/param, not half the states."),
        diagnoses={lambda: bytes_per_param("mixed-bf16"): "That is AdamW's two moments; Lion keeps one.",
                   lambda: bytes_per_param("mixed-bf16", "sgd"): "That leaves out one 4-byte fp32 term: "
                                                                 "mixed-bf16 keeps an fp32 master copy, and Lion "
                                                                 "an fp32 momentum buffer, both.",
                   lambda: bytes_per_param("mixed-bf16", "sgd-momentum") - 2: "That keeps the momentum in bf16 (2 B); "
                                                                              "beside an fp32 master it is fp32."},
    ),
    Numeric(
        "02.bf16-sgd-fit", "Largest parameter count, in billions, whose bf16 + plain-SGD model states fit the capacity",
        reference=_billions_fit, unit="", rtol=0.01,
        hint="divide the capacity in bytes (GiB × 2**30) by the bytes per parameter of bf16 weights and bf16 "
             "gradients with an optimizer that keeps no state",
        why=lambda capacity_gib: (f"{capacity_gib:g} × 2**30 B over {bytes_per_param('bf16', 'sgd'):g} B/param "
                                  "(bf16 weights 2 + bf16 gradients 2, plain SGD keeps nothing)."),
        diagnoses={lambda capacity_gib: capacity_gib * 1e9 / bytes_per_param("bf16", "sgd") / 1e9:
                   "That reads the capacity as decimal GB; it is GiB (2**30 bytes each).",
                   lambda capacity_gib: capacity_gib * GiB / bytes_per_param("fp32") / 1e9:
                   "That is fp32 + AdamW's 16 B/param.",
                   lambda capacity_gib: capacity_gib * GiB / bytes_per_param("bf16", "sgd-momentum") / 1e9:
                   "That adds a momentum buffer; plain SGD keeps none.",
                   When(lambda v: v > 1e6): "Give the count in billions (e.g. 7 for 7e9)."},
        sample=lambda: {"capacity_gib": 80},
    ),
)
