"""Chapter 08's exercises (roofline and MFU). Questions are the notebook's markdown cells."""

from __future__ import annotations

from typing import Any

from memlab.course.exercises import Choice, Numeric, When

OPS = {"matmul": "a matmul (the MLP's up-projection)", "norm": "LayerNorm", "add": "the residual add"}
"""Exercise 1's options."""


def _shapes(model: Any, setup: Any) -> dict[str, tuple[str, list[Any], list[str]]]:
    """One op of each kind at the chapter's shapes, as torch.profiler records them: (op, input shapes, dtypes)."""
    t, h = setup.batch * setup.seq, model.d_model
    return {"matmul": ("aten::mm", [[t, h], [h, 4 * h]], ["float", "float"]),
            "norm": ("aten::native_layer_norm", [[t, h], [], [h], [h], []], ["float", "", "float", "float", ""]),
            "add": ("aten::add", [[t, h], [t, h], []], ["float", "float", ""])}


def _intensity(model: Any, setup: Any, kind: str) -> float:
    """FLOP per byte of one op of ``kind`` by memlab's counting (op_profile.op_cost), from its shapes."""
    from memlab.run import op_profile

    _, flops, nbytes = op_profile.op_cost(*_shapes(model, setup)[kind])
    return flops / nbytes


def _sample_model() -> dict[str, Any]:
    from memlab.predict.spec.model import preset
    from memlab.predict.spec.setup import Setup

    return {"model": preset("tiny-gpt"), "setup": Setup(batch=2, seq=32, precision="fp32")}


def _h100_mfu(useful_flop_s: float) -> float:
    from memlab.predict.hardware.gpus import gpu

    return 100 * useful_flop_s / gpu("h100-sxm").peak("bf16")


def _a100_mfu(useful_flop_s: float) -> float:
    from memlab.predict.hardware.gpus import gpu

    return 100 * useful_flop_s / gpu("a100-80gb-sxm").peak("bf16")


def _bubble(stages: int, micro_batches: int) -> float:
    from memlab.predict.parallel.efficiency import pipeline_bubble_fraction

    return 100 * pipeline_bubble_fraction(stages, micro_batches)


def _in_flight_1f1b(stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations the first stage holds at once under 1F1B: min(p, m) [narayanan2021]."""
    return min(stages, micro_batches)


EXERCISES = (
    Choice(
        "08.most-memory-bound", "The op with the lowest arithmetic intensity (FLOP per byte) at this model's shapes",
        reference=lambda model, setup: min(OPS, key=lambda kind: _intensity(model, setup, kind)),
        options=OPS,
        hint="a matmul reuses each operand many times; an element-wise op reads and writes each element once, so "
             "compare FLOPs per element against bytes per element: how many inputs does each read?",
        why=lambda model, setup: (
            "FLOP per byte: " + ", ".join(f"{kind} {_intensity(model, setup, kind):.3g}" for kind in OPS)
            + ". The add does one FLOP per element while moving two inputs and an output; LayerNorm does a few "
              "more FLOPs on one input; the matmul reuses each operand across a whole row or column."),
        diagnoses={"matmul": "A matmul does 2·k FLOPs per output element on operands it reuses: the highest "
                             "intensity of the three.",
                   "norm": "LayerNorm reads one input and does several FLOPs per element (mean, variance, scale); "
                           "the add reads two inputs for one FLOP."},
        sample=_sample_model,
    ),
    Numeric(
        "08.h100-mfu", "MFU of seed 001's useful FLOP/s on an H100 SXM, dense bf16 peak, %",
        reference=_h100_mfu, unit="%", rtol=0.02,
        hint="divide by the H100's dense bf16 peak: gpu('h100-sxm').peak('bf16')",
        why=lambda useful_flop_s: (f"{useful_flop_s / 1e12:.0f} TFLOP/s over the H100's dense bf16 "
                                   f"{useful_flop_s / _h100_mfu(useful_flop_s) * 100 / 1e12:,.0f} TFLOP/s: the same "
                                   "work is a smaller share of a faster card."),
        diagnoses={_a100_mfu:
                   "That divides by the A100's peak, the fallback that makes a faster GPU's MFU look high.",
                   lambda useful_flop_s: _h100_mfu(useful_flop_s) / 2:
                   "That divides by the sparse figure (twice the dense peak)."},
        sample=lambda: {"useful_flop_s": 160e12},
    ),
    Numeric(
        "08.bubble", "Pipeline bubble, %, for p stages and m micro-batches, no interleaving",
        reference=_bubble, unit="%", rtol=0.02,
        hint="the bubble is (p − 1) / (m + p − 1) of the iteration",
        why=lambda stages, micro_batches: (f"({stages} − 1) / ({micro_batches} + {stages} − 1): the first and last "
                                           "stages wait p − 1 slots while the pipeline fills and drains."),
        diagnoses={lambda stages, micro_batches: 100 * (stages - 1) / micro_batches:
                   "(p − 1)/m is the bubble's ratio to the useful time; as a share of the iteration it is "
                   "(p − 1)/(m + p − 1).",
                   When(lambda v: v < 1): "That looks like a fraction: the question asks for a percentage."},
        sample=lambda: {"stages": 16, "micro_batches": 48},
    ),
    Numeric(
        "08.in-flight-1f1b", "Micro-batches whose activations the first stage holds at once under 1F1B",
        reference=_in_flight_1f1b, unit="", rtol=0.001,
        hint="1F1B starts each micro-batch's backward as soon as the pipeline is full: the first stage runs p "
             "forwards, then alternates one forward and one backward",
        why=lambda stages, micro_batches: (
            f"min(p, m) = {_in_flight_1f1b(stages, micro_batches)}: the first stage keeps at most p micro-batches "
            f"in flight, where GPipe (all forwards, then all backwards) keeps all m = {micro_batches}. The bubble is "
            "the same; 1F1B's gain is memory."),
        diagnoses={lambda stages, micro_batches: micro_batches:
                   "That is GPipe's schedule, all m forwards before any backward; 1F1B caps the micro-batches in "
                   "flight at the number of stages.",
                   1: "One is the last stage, which runs each backward right after its forward; the first stage "
                      "waits for the pipeline to fill."},
        sample=lambda: {"stages": 8, "micro_batches": 64},
    ),
)
