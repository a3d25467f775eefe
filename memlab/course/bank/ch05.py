"""Chapter 05's exercises (ZeRO and FSDP). Questions are the notebook's markdown cells."""

from __future__ import annotations

from typing import Any

from memlab.course.exercises import Numeric, When
from memlab.units import GiB, MiB


def _preset(name: str) -> Any:
    from memlab.predict.spec.model import preset

    return preset(name)


def _zero3_volume(psi: float) -> float:
    from memlab.predict.parallel.communication import zero_comm_bytes

    return sum(zero_comm_bytes(psi, 3).values())


def _ring_mib(model: Any, world_size: int) -> float:
    """MiB each rank sends per ZeRO-3 step over a ring, Ψ = the model's fp32 gradient bytes."""
    from memlab.predict.parallel.communication import ring_wire_bytes

    return ring_wire_bytes(_zero3_volume(4 * model.param_count()), world_size) / MiB


EP_TOKENS = 3 * 4096
"""Exercise 05.ep8-all-to-all-gib's micro-batch, 3 x 4096 tokens: three times the chapter's, so its table does not
show the answer."""


def _ep_gib(ep: int = 8, routing: str = "balanced", value_bytes: int = 2, passes: float = 1,
            tokens: int = EP_TOKENS) -> float:
    """GiB one rank sends by all-to-all per step, Mixtral-8x7B, ``tokens`` a micro-batch; ``passes`` < 1 counts a
    fraction of the four all-to-alls a layer runs."""
    from memlab.predict.parallel.communication import ep_sent_bytes

    m = _preset("mixtral-8x7b")
    return ep_sent_bytes(tokens, m.d_model, m.n_layers, m.top_k, ep, value_bytes, routing,
                         n_experts=m.n_experts) * passes / GiB


def _zero1_measured_psi(table: Any) -> float:
    """DDP + ZeroRedundancyOptimizer's measured traffic in Ψ, at the largest world size measured."""
    rows = table[table["strategy"] == "zero1"]
    return float(rows.loc[rows["world_size"].idxmax(), "measured / Ψ"])


EX5_MODEL = "llama-2-70b"
"""Exercise 5's model: not GPT-3, whose 3Ψ in bf16 section 4 prints (every ZeRO-3 step moves 1.05 TB)."""


def _zero1_tb(table: Any, key: str = EX5_MODEL) -> float:
    return _zero1_measured_psi(table) * 2 * _preset(key).param_count() / 1e12


def _llama70b_gib() -> float:
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.setup import Setup

    setup = Setup(precision="mixed-bf16", zero_stage=3, world_size=64, seq=1)
    return estimate(_preset("llama-2-70b"), setup).model_state_bytes() / GiB


def _gpt3_total(ranks: int) -> float:
    from memlab.predict.estimate import Overheads, estimate
    from memlab.predict.spec.setup import Setup

    setup = Setup(batch=1, seq=2048, precision="mixed-bf16", zero_stage=3, world_size=ranks, recompute="full")
    return estimate(_preset("gpt-3-175b"), setup, overheads=Overheads(gathered_layers=2)).total_bytes


_PP_SETUP = dict(batch=1, seq=4096, precision="mixed-bf16", attention="flash")
"""Section 7's Llama-2-7B micro-batch."""


def _pp_first_stage_ratio() -> float:
    """Rank 0's saved activations under PP 8, 1F1B, 8 micro-batches / one unsplit rank's, Llama-2-7B."""
    from memlab.predict.estimate import estimate
    from memlab.predict.parallel.pipeline import parallel_estimate
    from memlab.predict.spec.setup import Setup

    setup = Setup(**_PP_SETUP)
    staged = parallel_estimate(_preset("llama-2-7b"), setup.with_(pp=8, micro_batches=8, pp_schedule="1f1b"))
    return staged.rows[0].activations_bytes / estimate(_preset("llama-2-7b"), setup).activations_bytes


def _pp_in_flight() -> int:
    from memlab.predict.parallel.pipeline import in_flight

    return in_flight("1f1b", 8, 8, 0)[0]


def _tp_gib(tp: int = 4, value_bytes: int = 2) -> float:
    """GiB one rank sends in Llama-2-7B's block all-reduces, micro-batch 2 x 2048, one forward and backward."""
    from memlab.predict.parallel.communication import tp_sent_bytes

    m = _preset("llama-2-7b")
    return tp_sent_bytes(2 * 2048, m.d_model, m.n_layers, tp, value_bytes) / GiB


def _tp_buffer_gib() -> float:
    """One all-reduce buffer per call, 4 per block, no ring factor, in GiB."""
    m = _preset("llama-2-7b")
    return 4 * m.n_layers * 2 * 2048 * m.d_model * 2 / GiB


def _sample_comm() -> dict[str, Any]:
    import pandas as pd

    return {"table": pd.DataFrame({"strategy": ["ddp", "zero1", "zero1"], "world_size": [4, 2, 4],
                                   "measured / Ψ": [2.0, 3.0, 3.0]})}


EXERCISES = (
    Numeric(
        "05.zero3-ring-mib", "MiB each rank sends per step under the ZeRO paper's stage 3 over a ring of N ranks "
                             "(Ψ = fp32 gradients)",
        reference=_ring_mib, unit="MiB", rtol=0.01,
        hint="the paper's volume per rank is 3Ψ for ZeRO-3 (two all-gathers of the parameters, one reduce-scatter of "
             "the gradients); a ring collective sends (N − 1)/N of its volume on each rank's link",
        why=lambda model, world_size: (
            f"3Ψ = {_zero3_volume(4 * model.param_count()) / MiB:,.2f} MiB of volume, × ({world_size} − 1)/"
            f"{world_size} on the wire: a ring passes every chunk but the rank's own. FSDP2 moves less by default: "
            "it keeps the root module (here the tied embedding and head) gathered after the forward, so that part "
            "is not gathered again in backward, which is what the launch below measures (section 3's "
            "'measured / Ψ' for fsdp2-zero3)."),
        diagnoses={lambda model: _zero3_volume(4 * model.param_count()) / MiB:
                   "That is the paper's volume, 3Ψ; on a ring each rank sends (N − 1)/N of it.",
                   lambda model, world_size: (2 * 4 * model.param_count() * (world_size - 1) / world_size) / MiB:
                   "That is 2Ψ, DDP's (or ZeRO-2's) traffic; ZeRO-3 all-gathers the parameters again in backward.",
                   lambda model, world_size: _ring_mib(model, world_size) / 2:
                   "That counts Ψ in bf16 bytes; this run's gradients are fp32 (4 B each)."},
        sample=lambda: {"model": _preset("tiny-gpt"), "world_size": 4},
    ),
    Numeric(
        "05.llama70b-zero1-tb", "TB each rank moves per step: Llama-2-70B, bf16 gradients, DDP + "
                                "ZeroRedundancyOptimizer",
        reference=_zero1_tb, unit="TB", rtol=0.02,
        hint="take the Ψ-multiple that section 3 measured for DDP + ZeroRedundancyOptimizer (not the paper's), and "
             f"Ψ = 2 bytes × preset('{EX5_MODEL}').param_count()",
        why=lambda table: (
            f"{_zero1_measured_psi(table):.2f}Ψ measured × Ψ = {2 * _preset(EX5_MODEL).param_count() / 1e12:.3f} "
            "TB: torch's ZeroRedundancyOptimizer runs under DDP's full all-reduce (2Ψ) and then broadcasts every "
            "rank's updated partition (1Ψ); the volume per rank does not depend on N."),
        diagnoses={lambda: 2 * 2 * _preset(EX5_MODEL).param_count() / 1e12:
                   "That is the paper's 2Ψ for stage 1; section 3 measured what torch's implementation moves.",
                   lambda table: _zero1_measured_psi(table) * 4 * _preset(EX5_MODEL).param_count() / 1e12:
                   "That takes Ψ in fp32 bytes; the question says bf16 gradients (2 B each).",
                   lambda table: _zero1_tb(table, "gpt-3-175b"):
                   "That is GPT-3 175B's figure (section 4); this question is about Llama-2-70B's Ψ.",
                   When(lambda v: v > 1e6): "Far too large: is that in bytes? Write e.g. '1.2 TB'."},
        sample=_sample_comm,
    ),
    Numeric(
        "05.pp-first-stage-activations",
        "Rank 0's saved activations under PP 8 (1F1B, 8 micro-batches), as a fraction of one unsplit rank's, "
        "Llama-2-7B, micro-batch 1 x 4096",
        reference=_pp_first_stage_ratio, unit="", rtol=0.05,
        hint="1F1B's rank r runs p - r forwards before its first backward "
             "(memlab.predict.parallel.pipeline.in_flight), and "
             "keeps each one's saved tensors until its backward; rank 0 holds 4 of the 32 blocks of each of them",
        why=lambda: (f"{_pp_in_flight()} micro-batches in flight × 4 of 32 blocks = one micro-batch through all 32 "
                     f"blocks: {_pp_first_stage_ratio():.3f} (a little under 1: the final norm, LM head and loss "
                     "live on the last stage). 1F1B bounds a rank's activations by p micro-batches, not by m as "
                     "GPipe does, but does not divide them by p."),
        diagnoses={0.125: "That is one micro-batch through rank 0's 4 blocks; 1F1B starts rank 0's first backward "
                          "only after its p - r = 8 warm-up forwards, so 8 are in flight.",
                   1 / 64: "That divides by the 8 stages twice; rank 0 holds 8 micro-batches of 4 blocks.",
                   When(lambda v: v > 1.5): "More than one rank's: rank 0 holds at most p = 8 micro-batches of "
                                            "its 4 blocks, and 8 × 4 = 32 blocks."},
    ),
    Numeric(
        "05.tp4-allreduce-gib",
        "GiB each rank sends in Llama-2-7B's block all-reduces, TP 4, micro-batch 2 x 2048, bf16, forward + backward",
        reference=_tp_gib, unit="GiB", rtol=0.02,
        hint="Megatron's block has two all-reduces of the (b s, h) output in forward (after attention, after the "
             "MLP) and two in backward; a ring all-reduce sends 2(t - 1)/t of its buffer on each rank; "
             "h and the block count are preset('llama-2-7b').d_model and .n_layers",
        why=lambda: (f"4 × {_preset('llama-2-7b').n_layers} all-reduces × 2(4 − 1)/4 × (2 · 2048 · "
                     f"{_preset('llama-2-7b').d_model} · 2 B) = {_tp_gib():.2f} GiB: TP's traffic grows with the "
                     "tokens and the depth, not with the parameters."),
        diagnoses={lambda: _tp_gib() * 4 / 3: "That is the all-reduces' volume in ZeRO's convention (twice the "
                                                "buffer); on a ring each rank sends (t − 1)/t of it.",
                   lambda: _tp_gib() / 2: "That counts two all-reduces per block; there are two in forward and "
                                          "two more in backward.",
                   lambda: _tp_gib(value_bytes=4): "That takes 4-byte values; the all-reduces run in bf16 (2 B).",
                   lambda: _tp_gib(tp=8): "That is t = 8, the table's degree; the question has t = 4.",
                   _tp_buffer_gib: "That sends each buffer once; a ring all-reduce is a reduce-scatter then an "
                                   "all-gather, 2(t − 1)/t of the buffer per rank."},
    ),
    Numeric(
        "05.ep8-all-to-all-gib",
        "GiB each rank sends by all-to-all per step, Mixtral-8x7B, EP 8, micro-batch 3 x 4096, bf16, balanced routing",
        reference=_ep_gib, unit="GiB", rtol=0.02,
        hint="each MoE layer dispatches the rank's t x top_k (token, expert) pairs of d_model values and combines "
             "them back, in forward and again (their gradients) in backward; under balanced routing 1/ep of the "
             "pairs have their expert on the rank itself; sizes from preset('mixtral-8x7b')",
        why=lambda: (f"4 all-to-alls × {_preset('mixtral-8x7b').n_layers} layers × {EP_TOKENS} tokens × top-2 × "
                     f"{_preset('mixtral-8x7b').d_model} × 2 B × 7/8 remote = {_ep_gib():.2f} GiB "
                     "(memlab's all-to-all formula): EP's traffic grows with tokens x experts per token "
                     "and " "the depth, not with the experts' size."),
        diagnoses={lambda: _ep_gib(routing="worst"): "That sends every pair; under balanced routing the 1/8 whose "
                                                     "expert is on the rank itself stay there.",
                   lambda: _ep_gib(passes=0.5): "That counts the forward's dispatch and combine; backward sends "
                                               "their gradients by two more all-to-alls.",
                   lambda: _ep_gib(passes=0.25): "That counts one all-to-all a layer; there are four (dispatch and "
                                                "combine, forward and backward).",
                   lambda: _ep_gib(value_bytes=4): "That takes 4-byte values; the hidden states are bf16 (2 B).",
                   lambda: _ep_gib(tokens=4096): "That is the table's micro-batch of 1 x 4096; the question has "
                                                 "3 x 4096 tokens, and the traffic grows with them."},
    ),
    Numeric(
        "05.llama70b-zero3", "Llama-2-70B model states per rank, mixed-bf16 AdamW, ZeRO-3 over 64 ranks, GiB",
        reference=_llama70b_gib, unit="GiB", rtol=0.01,  # the nominal 70B lands 1.5 % off: a slip, not an answer
        hint="16 bytes per parameter (chapter 02) for preset('llama-2-70b').param_count() parameters, divided by 64; "
             "GiB = 2**30 bytes",
        why=lambda: (f"16 B × {_preset('llama-2-70b').param_count():,} / 64: ZeRO-3 shards parameters, gradients "
                     "and optimizer states alike."),
        diagnoses={lambda: 16 * 70e9 / 64 / GiB: "That uses the nominal 70B; count the parameters.",
                   lambda: 16 * _preset("llama-2-70b").param_count() / GiB:
                   "That is the whole model's states; ZeRO-3 divides all of them by the 64 ranks.",
                   lambda: (4 + 12 / 64) * _preset("llama-2-70b").param_count() / GiB:
                   "That shards only the optimizer (ZeRO-1); stage 3 shards parameters and gradients too."},
    ),
    Numeric(
        "05.zero3-floor", "Per-rank total at 512 ranks / at 1024 ranks, GPT-3 175B under ZeRO-3 (section 4's setup)",
        reference=lambda: _gpt3_total(512) / _gpt3_total(1024), unit="", rtol=0.02,
        hint="model states halve from 512 to 1024 ranks; the activations of one micro-batch and the gathered blocks "
             "do not: add them up at both N",
        why=lambda: (f"{_gpt3_total(512) / GiB:.2f} GiB / {_gpt3_total(1024) / GiB:.2f} GiB: past a few hundred "
                     "ranks the model states are the smallest term, so doubling N barely helps."),
        diagnoses={2: "Only the model states halve; activations and the gathered blocks stay per rank.",
                   When(lambda v: v < 1): "The total shrinks with more ranks: the ratio 512 / 1024 is at least 1."},
    ),
)
