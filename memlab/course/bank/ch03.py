"""Chapter 03's exercises (mixed precision). Questions are the notebook's markdown cells."""

from __future__ import annotations

import math

from memlab.course.exercises import Numeric, When
from memlab.units import GiB


def _llama():
    from memlab.predict.spec.model import preset

    return preset("llama-2-7b")


def _copies_gib() -> float:
    """Autocast's bf16 weight copies of Llama-2-7B (amp-bf16, on CUDA), in GiB, as memlab's estimate counts them."""
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.setup import Setup

    b = estimate(_llama(), Setup(batch=1, seq=512, precision="amp-bf16"), device_type="cuda")
    return b.activation_detail["autocast weight copies"] / GiB


def _scaler_defaults() -> dict[str, float]:
    """torch.amp.GradScaler's defaults (init_scale, growth_factor, backoff_factor, growth_interval), read from torch."""
    import inspect

    import torch

    params = inspect.signature(torch.amp.GradScaler).parameters
    return {k: params[k].default for k in ("init_scale", "growth_factor", "backoff_factor", "growth_interval")}


def _scaler_scale(clean_steps: int, overflows: int) -> float:
    """The scale after ``clean_steps`` steps without inf/NaN, then ``overflows`` steps with one, from the defaults."""
    d = _scaler_defaults()
    growths = clean_steps // d["growth_interval"]
    return d["init_scale"] * d["growth_factor"] ** growths * d["backoff_factor"] ** overflows


def _fp16_smallest_normal() -> float:
    import torch

    return float(torch.finfo(torch.float16).smallest_normal)


def _scale_exponent(gradient_exponent: int) -> float:
    """The smallest k such that 2**gradient_exponent × 2**k is a normal fp16 number."""
    return math.ceil(math.log2(_fp16_smallest_normal()) - gradient_exponent)


def _fp16_smallest_subnormal_exponent() -> float:
    import torch

    return math.log2(torch.finfo(torch.float16).smallest_normal * torch.finfo(torch.float16).eps)


def _bf16_update(update_exponent: int) -> float:
    """1.0 + 2**update_exponent computed and stored in bf16, as pure-bf16 training updates a weight."""
    import torch

    one = torch.tensor(1.0, dtype=torch.bfloat16)
    return float(one + torch.tensor(2.0**update_exponent, dtype=torch.bfloat16))


def _bf16_spacing_exponent() -> int:
    import torch

    return round(math.log2(torch.finfo(torch.bfloat16).eps))


EXERCISES = (
    Numeric(
        "03.llama-copies", "GiB of autocast's bf16 weight copies for Llama-2-7B under amp-bf16 on a GPU",
        reference=_copies_gib, unit="GiB", rtol=0.01,
        hint="2 bytes for every parameter that feeds a matmul: preset('llama-2-7b').matmul_param_count(); Llama's "
             "input embedding is not tied to its LM head",
        why=lambda: (f"2 B × {_llama().matmul_param_count():,} matmul parameters. Llama's input embedding "
                     f"({_llama().param_count() - _llama().matmul_param_count():,} parameters with the norms) is a "
                     "lookup, not a matmul: autocast copies the blocks' matmul weights and the LM head, not the "
                     "embedding."),
        diagnoses={lambda: 2 * _llama().param_count() / GiB:
                   "That copies every parameter; the input embedding is a lookup (and the norms are not matmuls), so "
                   "autocast makes no bf16 copy of them.",
                   lambda: 2 * 7e9 / GiB: "That uses the nominal 7B; count the matmul parameters.",
                   lambda: 4 * _llama().matmul_param_count() / GiB: "The copies are bf16: 2 bytes each, not 4.",
                   lambda: 2 * _llama().matmul_param_count() / 1e9: "That is in decimal GB; the question asks for "
                                                                    "GiB."},
    ),
    Numeric(
        "03.scaler-scale", "torch's GradScaler scale, from its defaults, after clean steps then overflowing steps",
        reference=_scaler_scale, unit="", rtol=0.001,
        hint="the scale starts at init_scale, is multiplied by growth_factor after every growth_interval clean steps "
             "in a row and by backoff_factor at every step with an inf/NaN gradient (that step is skipped); the "
             "defaults are in inspect.signature(torch.amp.GradScaler)",
        why=lambda clean_steps, overflows: (
            f"{_scaler_defaults()['init_scale']:,.0f} × {_scaler_defaults()['growth_factor']:g}^"
            f"{clean_steps // _scaler_defaults()['growth_interval']} (one growth per "
            f"{_scaler_defaults()['growth_interval']:,} clean steps) × {_scaler_defaults()['backoff_factor']:g}^"
            f"{overflows} = {_scaler_scale(clean_steps, overflows):,.0f}: the scaler searches for the largest scale "
            "that does not overflow, at run time."),
        diagnoses={lambda clean_steps, overflows: _scaler_scale(clean_steps, 0):
                   "That leaves out the overflowing steps: each one multiplies the scale by backoff_factor.",
                   lambda overflows: _scaler_defaults()["init_scale"] * _scaler_defaults()["backoff_factor"]
                   ** overflows: "That leaves out the growth: the scale doubles after each growth_interval clean "
                                 "steps in a row.",
                   lambda: _scaler_defaults()["init_scale"]: "That is the initial scale; it changes as the steps run.",
                   When(lambda v: v > 1e12): "The scale grows once per growth_interval clean steps, not every step."},
        sample=lambda: {"clean_steps": 6000, "overflows": 1},
    ),
    Numeric(
        "03.scale-exponent", "Smallest k such that a gradient of 2**e times a loss scale 2**k is a normal fp16 number",
        reference=_scale_exponent, unit="", rtol=0.001,
        hint="fp16's smallest normal number is torch.finfo(torch.float16).smallest_normal = 2**-14: solve "
             "e + k ≥ -14 for the smallest whole k",
        why=lambda gradient_exponent: (
            f"2**{gradient_exponent} × 2**{_scale_exponent(gradient_exponent):.0f} = 2**-14, fp16's smallest normal "
            "number. A smaller scale leaves the value subnormal (fewer mantissa bits) or flushed to zero."),
        diagnoses={lambda gradient_exponent: _fp16_smallest_subnormal_exponent() - gradient_exponent:
                   "That only reaches fp16's smallest *subnormal*, 2**-24: the value survives, with one bit of "
                   "precision. The question asks for a normal number (2**-14).",
                   lambda gradient_exponent: -126 - gradient_exponent:
                   "That is bf16's (and fp32's) smallest normal exponent, -126; fp16's is -14.",
                   When(lambda v: v != round(v)): "k is a whole number (the scale is a power of two)."},
        sample=lambda: {"gradient_exponent": -30},
    ),
    Numeric(
        "03.bf16-update", "A bf16 weight of 1.0 after adding an update of 2**u, stored in bf16",
        reference=_bf16_update, unit="", rtol=1e-4,
        hint="bf16 keeps 8 significant bits: the gap between 1.0 and the next bf16 number is "
             "torch.finfo(torch.bfloat16).eps; an update under half that gap rounds away",
        why=lambda update_exponent: (
            f"next to 1.0, bf16 numbers are 2**{_bf16_spacing_exponent()} apart, so 1 + 2**{update_exponent} rounds to "
            f"{_bf16_update(update_exponent):g}. Small updates vanish in pure bf16: that is why mixed precision "
            "keeps an fp32 master copy of the weights."),
        diagnoses={lambda update_exponent: 1.0 + 2.0**update_exponent:
                   "That is the exact (fp32) sum. Stored in bf16 the weight keeps 8 significant bits: check the "
                   "gap between 1.0 and the next bf16 number."},
        sample=lambda: {"update_exponent": -9},
    ),
)
