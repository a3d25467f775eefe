"""Chapter 06's exercises (model parallelism: TP, SP, PP, CP, EP). Questions are the notebook's markdown cells."""

from __future__ import annotations

from typing import Any

from memlab.course.exercises import Numeric, When
from memlab.units import GiB


def _preset(name: str) -> Any:
    from memlab.predict.spec.model import preset

    return preset(name)


EP_TOKENS = 3 * 4096
"""Exercise 06.ep8-all-to-all-gib's micro-batch, 3 x 4096 tokens: three times the chapter's, so its table does not
show the answer."""


def _ep_gib(ep: int = 8, routing: str = "balanced", value_bytes: int = 2, passes: float = 1,
            tokens: int = EP_TOKENS) -> float:
    """GiB one rank sends by all-to-all per step, Mixtral-8x7B, ``tokens`` a micro-batch; ``passes`` < 1 counts a
    fraction of the four all-to-alls a layer runs."""
    from memlab.predict.parallel.communication import ep_sent_bytes

    m = _preset("mixtral-8x7b")
    return ep_sent_bytes(tokens, m.d_model, m.n_layers, m.top_k, ep, value_bytes, routing,
                         n_experts=m.n_experts) * passes / GiB


_PP_SETUP = dict(batch=1, seq=4096, precision="mixed-bf16", attention="flash")
"""Section 1's Llama-2-7B micro-batch (the layouts' table)."""


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


EXERCISES = (
    Numeric(
        "06.pp-first-stage-activations",
        "Rank 0's saved activations under PP 8 (1F1B, 8 micro-batches), as a fraction of one unsplit rank's, "
        "Llama-2-7B, micro-batch 1 x 4096",
        predict_first=True,
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
        "06.tp4-allreduce-gib",
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
        "06.ep8-all-to-all-gib",
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
)
