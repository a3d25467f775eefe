"""Chapter 01's exercises (anatomy of an OOM). Questions are the notebook's markdown cells."""

from __future__ import annotations

from functools import cache
from typing import Any

from memlab.course.exercises import Choice, Numeric, When
from memlab.units import GiB


def _sample_fit() -> dict[str, Any]:
    import dataclasses

    from memlab.predict.estimate import estimate
    from memlab.predict.hardware.gpus import gpu
    from memlab.predict.spec.model import preset
    from memlab.predict.spec.setup import Setup

    model, setup = preset("tiny-gpt"), Setup(batch=4, seq=64, precision="fp32", optimizer="adamw")
    budget = estimate(model, setup.with_(batch=6)).total_bytes
    return {"model": model, "setup": setup,
            "card": dataclasses.replace(gpu("t4"), key="budget", name="a budget", memory_bytes=budget)}


def _largest_batch(model: Any, setup: Any, card: Any) -> int:
    """memlab's fit search on the chapter's card: a budget (key ``budget``) caps the step's tensors, so it decides
    on them alone (``ALLOCATED_ONLY``); a card emulated with ``set_per_process_memory_fraction`` caps the
    allocator's reserved bytes, so the reserve and workspaces count and the CUDA context does not. The value that
    fits for certain."""
    from memlab.predict.fit import ALLOCATED_ONLY, max_batch
    from memlab.predict.gpu.device import DeviceOverheads

    terms = ALLOCATED_ONLY if card.key == "budget" else DeviceOverheads(cuda_context_bytes=0)
    return max_batch(model, setup, card, device=terms).value


def _largest_by_sum(model: Any, setup: Any, card: Any) -> int:
    """The largest batch whose sum of components (states + activations) fits: the trap the fit search avoids."""
    from memlab.predict.estimate import estimate

    batch = 0
    while estimate(model, setup.with_(batch=batch + 1)).total_bytes <= card.memory_bytes and batch < 4096:
        batch += 1
    return batch


def _fragmented() -> Any:
    from memlab.measure.oom import parse_oom_message
    from memlab.measure.oom_examples import RECORDED_OOM_MESSAGES

    return parse_oom_message(next(r.message for r in RECORDED_OOM_MESSAGES if r.key == "fragmented-2.5"))


def _short_gib() -> float:
    """How far the fragmented-2.5 request stays above free + reserved-but-unallocated memory, in GiB."""
    i = _fragmented()
    return (i.tried_to_allocate_bytes - i.free_bytes - i.reserved_unallocated_bytes) / GiB


def _leak(table: Any, case: str) -> float:
    return float(table.query(f"case == '{case}' and not fixed")["bytes per iteration"].item())


def _cuda_block(table: Any) -> int:
    """The CUDA allocator block one kept loss occupies (its measured bytes rounded up to 512 B)."""
    from memlab.labs.allocator import rounded_size

    return rounded_size(round(_leak(table, "keep-loss")))


def _sample_growth() -> dict[str, Any]:
    import pandas as pd

    return {"table": pd.DataFrame({"case": ["keep-loss", "keep-loss", "eval-grad", "eval-grad"],
                                   "fixed": [False, True, False, True],
                                   "bytes per iteration": [4.0, 0.0, 756_736.0, 0.0]}),
            "iterations": 1000}


def _reserved_gib(trace: Any, conf: str = "") -> float:
    """The step's peak reserved bytes replayed through the allocator model under ``conf``
    (``PYTORCH_CUDA_ALLOC_CONF``; "" is torch's defaults), GiB."""
    return trace.replay(conf).total.reserved_bytes / GiB


def _requested_gib(trace: Any) -> float:
    return trace.replay().total.requested_bytes / GiB


@cache
def _sample_trace() -> dict[str, Any]:
    from memlab.predict.spec.model import preset
    from memlab.predict.spec.setup import Setup
    from memlab.tracing.gpt import trace_gpt

    return {"trace": trace_gpt(preset("tiny-gpt"), Setup(batch=4, seq=64, precision="fp32", optimizer="adamw"))}


EXPANDABLE = "expandable_segments:True"


EXERCISES = (
    Numeric(
        "01.largest-batch", "Largest batch that fits the card (memlab's fit search, max_batch)",
        predict_first=True,
        reference=_largest_batch, unit="", rtol=0.01,
        hint="model states are fixed and activations grow with the batch, but a batch fits only if the peak of every "
             "phase fits: compare estimate(model, setup.with_(batch=b)).peak_bytes, not .total_bytes (the sum of "
             "components), with the card's memory_bytes",
        why=lambda model, setup, card: (
            f"batch {_largest_batch(model, setup, card)} is the largest whose phase-aware peak fits "
            f"{card.memory_bytes:,} B. The sum of components admits batch {_largest_by_sum(model, setup, card)}, but "
            "the peak is above that sum: in the backward pass the logits' gradient is live next to the saved "
            "activations."),
        diagnoses={_largest_by_sum: "That batch fits the sum of components (model states + activations), but the "
                                    "peak of the backward pass is higher: it also holds the logits' gradient. The fit "
                                    "search checks each phase's peak.",
                   When(lambda v: v != round(v)): "A batch is a whole number of sequences."},
        sample=_sample_fit,
    ),
    Choice(
        "01.fragmentation-field", "The OOM message field that measures the allocator's cache and fragmentation",
        reference=lambda: "d",
        options={"a": "Tried to allocate", "b": "of which ... is free", "c": "allocated by PyTorch",
                 "d": "reserved by PyTorch but unallocated"},
        hint="the bytes the caching allocator holds that no tensor uses",
        why=lambda: ("the allocator keeps freed blocks cached for reuse, and this field is that cache. A large "
                     "value is a candidate for fragmentation, not a diagnosis: it is fragmentation only when the "
                     "request is at most free + reserved but unallocated (section 1's test). Above that sum no "
                     "layout of the cache fits the request, as in the fragmented-2.5 message, whose "
                     f"{_fragmented().reserved_unallocated_bytes / GiB:.2f} GiB cache still leaves it too big."),
        diagnoses={"a": "That is the request: it says how big, not why it failed.",
                   "c": "That is what live tensors hold: the workload, not the cache.",
                   "b": "That is what the driver has left, outside this process's allocator."},
    ),
    Numeric(
        "01.kept-losses-cuda", "Growth of torch.cuda.memory_allocated() from the kept losses after the given number "
        "of iterations of section 6's keep-loss bug, B",
        reference=lambda table, iterations: iterations * _cuda_block(table), unit="B", rtol=0.02,
        hint="backward frees the graph's saved tensors, so each kept loss holds only its own storage (section 6's "
             "bytes per iteration); on CUDA every storage is one allocator block: round it as section 4's rules do",
        why=lambda table, iterations: (
            f"{iterations:,} kept losses × {_cuda_block(table):,} B: each holds {_leak(table, 'keep-loss'):,.0f} B "
            "of tensor data, but the caching allocator rounds every request up to a multiple of 512 B "
            "(section 4's rules), and memory_allocated counts blocks."),
        diagnoses={lambda table, iterations: iterations * _leak(table, "keep-loss"):
                   "That is the tensor data (what a CPU count sees); on CUDA each kept scalar occupies a whole "
                   "512 B allocator block.",
                   lambda table, iterations: iterations * _leak(table, "eval-grad"):
                   "That is the eval-grad leak: without backward the graph and its activations stay; after backward "
                   "they are freed and only the scalar stays.",
                   When(lambda v: v in (2 * 2**20, 4 * 2**20)): "That is memory_reserved (whole 2 MiB small-pool "
                                                              "segments); the question asks memory_allocated.",
                   When(lambda v: v == 0): "The kept losses are tensors: each one holds its block until the list "
                                           "is cleared."},
        sample=_sample_growth,
    ),
    Numeric(
        "01.fragmented-short", "GiB by which the fragmented-2.5 request exceeds free plus reserved-but-unallocated",
        predict_first=True,
        reference=_short_gib, unit="GiB", rtol=0.02,
        hint="the most the request could get is what the driver has free plus every reserved-but-unallocated byte "
             "the allocator could hand out with expandable_segments; subtract that from the request",
        why=lambda: (f"{_fragmented().tried_to_allocate_bytes / GiB:.2f} GiB requested against "
                     f"{_fragmented().free_bytes / GiB:.2f} GiB free + "
                     f"{_fragmented().reserved_unallocated_bytes / GiB:.2f} GiB reserved but unallocated: even a "
                     "perfectly defragmented cache leaves the request short, so this OOM is a too-large request."),
        diagnoses={lambda: (_fragmented().tried_to_allocate_bytes - _fragmented().free_bytes) / GiB:
                   "That leaves out the reserved-but-unallocated bytes, which expandable_segments could reuse.",
                   lambda: (_fragmented().tried_to_allocate_bytes - _fragmented().reserved_unallocated_bytes) / GiB:
                   "That leaves out the memory the driver still has free.",
                   When(lambda v: v <= 0): "Add free and reserved-but-unallocated and compare with the request: "
                                           "it does not fit even then."},
    ),
    Numeric(
        "01.expandable-reserved", "Peak reserved bytes of the chapter's step with expandable_segments:True, "
        "replayed through the caching allocator model, GiB",
        predict_first=True,
        reference=lambda trace: _reserved_gib(trace, EXPANDABLE), unit="GiB", rtol=0.02,
        hint="with expandable segments each pool is one segment that grows by pages (2 MiB in the small pool, "
             "20 MiB in the large one) and a freed page can be reused by any later request, so the reserve is "
             "the requested peak plus at most the holes between live blocks and part of a page per pool; start "
             "from the requested peak in the table above, not from the defaults' reserved",
        why=lambda trace: (
            f"the replay reserves {_reserved_gib(trace, EXPANDABLE):.3f} GiB with expandable segments against "
            f"{_reserved_gib(trace):.3f} GiB with torch's defaults, for a requested peak of "
            f"{_requested_gib(trace):.3f} GiB. With the defaults the reserve above that peak is holes in "
            "fixed-size segments that only a request of the right size can fill; with expandable segments it is "
            "the unfilled part of the last mapped page of each pool and the holes between live blocks, which any "
            "later request can reuse. Which is smaller depends on the step's sizes. A model of "
            "CUDACachingAllocator's rules (torch 2.13), not a GPU measurement."),
        diagnoses={lambda trace: _reserved_gib(trace): "That is the reserved peak with torch's defaults: the "
                                                       "question asks what expandable segments change.",
                   lambda trace: _requested_gib(trace): "That is the requested peak (the live tensors): the "
                                                        "allocator always reserves at least whole pages above it.",
                   When(lambda v: v <= 0): "Reserved bytes are positive: the step's tensors live in them."},
        sample=_sample_trace,
    ),
)
