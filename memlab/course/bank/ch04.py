"""Chapter 04's exercises (activations and checkpointing). Questions are the notebook's markdown cells."""

from __future__ import annotations

from functools import cache
from typing import Any

from memlab.course.exercises import Numeric, When


@cache
def _kept_fraction(model: Any, batch: int, seq: int, device: str) -> float:
    """Measured: bytes checkpoint_sequential(segments=2) keeps after the forward over no checkpointing's."""
    from memlab.labs import checkpointing

    def saved(strategy: str, **kw: Any) -> float:
        return checkpointing.measure_checkpointing(model, strategy, batch=batch, seq=seq, device=device,
                                                   with_counted_flops=False, timing_repeats=1, **kw).saved_bytes

    return saved("sequential", segments=2) / saved("none")


def _sequential_2(model: Any, batch: int, seq: int, device: Any) -> float:
    return _kept_fraction(model, batch, seq, str(device))


def _preset(name: str) -> Any:
    from memlab.predict.spec.model import preset

    return preset(name)


def _block_bytes(model_name: str, seq: int, recompute: str) -> float:
    """Bytes one block saves for backward (bf16, b = 1), by memlab's own terms as chapter 04 section 1 sums them:
    every term but the token ids, the head and loss, and the final norm."""
    from memlab.predict.memory.activations import activation_terms
    from memlab.predict.spec.setup import Setup

    model = _preset(model_name)
    terms = activation_terms(model, Setup(batch=1, seq=seq, precision="bf16", recompute=recompute))
    return sum(t.bytes() for t in terms if t.category not in ("token ids", "head & loss")
               and "final norm" not in t.name) / model.n_layers


def _selective_share(model_name: str, seq: int) -> float:
    """Share of a block's saved bytes that selective recomputation removes, by memlab's terms (the model's own
    layout: no dropout, its MLP), not the paper's formula, which assumes dropout and a GELU MLP."""
    return 1 - _block_bytes(model_name, seq, "selective") / _block_bytes(model_name, seq, "none")


def _paper_share(model_name: str, seq: int) -> float:
    """Korthikanti et al.'s 5as/h / (34 + 5as/h): dropout and a GELU MLP assumed."""
    from memlab.predict.memory.korthikanti import attention_score_share

    return attention_score_share(_preset(model_name), seq)


def _recompute_ratio() -> float:
    from memlab.predict.compute.flops import megatron_iteration_flops

    gpt3 = _preset("gpt-3-175b")
    return megatron_iteration_flops(gpt3, 1, 2048, "full") / megatron_iteration_flops(gpt3, 1, 2048, "none")


EX4_SEQ = 1024
"""Exercise 4's sequence length: at s = 512 Llama-2-7B's crossover is batch 8, the number section 5 prints for its
small model, so a copied answer would pass; at 1024 the two differ."""


def _phases(batch: int) -> Any:
    from memlab.predict.estimate import estimate
    from memlab.predict.spec.setup import Setup

    setup = Setup(batch=batch, seq=EX4_SEQ, precision="fp32", optimizer="adamw", optimizer_impl="foreach",
                  attention="eager")
    return estimate(_preset("llama-2-7b"), setup)


def _phase_peak(batch: int, phase: str) -> int:
    return max(row.peak_bytes for row in _phases(batch).phases if row.phase == phase)


def _crossover_batch() -> int:
    """The smallest batch at which Llama-2-7B's backward pass, not the foreach optimizer step, holds the peak."""
    batch = 1
    while _phases(batch).peak_phase != "backward":
        batch += 1
        if batch > 4096:
            raise ValueError("no crossover below batch 4096")
    return batch


def _policy_ratio(recompute: str) -> float:
    """FLOPs of one training step of Llama-3-8B at b=1, s=4096 under ``recompute`` over none's (the fused attention
    kernel's output kept under ``op``, as torchtitan runs it on CUDA)."""
    from memlab.predict.compute.flops import megatron_iteration_flops

    llama = _preset("llama-3-8b")
    return megatron_iteration_flops(llama, 1, 4096, recompute) / megatron_iteration_flops(llama, 1, 4096, "none")


def _sample_deep() -> dict[str, Any]:
    return {"model": _preset("tiny-gpt").with_(n_layers=2), "batch": 1, "seq": 8, "device": "cpu"}


EXERCISES = (
    Numeric(
        "04.sequential-2", "Fraction of activation bytes checkpoint_sequential(segments=2) keeps (16 blocks)",
        reference=_sequential_2, unit="", rtol=0.1,
        hint="torch leaves the last of the two segments un-checkpointed: its blocks keep everything they would "
             "without checkpointing; the first segment keeps only its input",
        why=lambda model, batch, seq, device: (
            f"measured: {_sequential_2(model, batch, seq, device):.3f} of the bytes. Half the blocks (the last "
            "segment) keep all their activations, the other half only the first segment's input: about half, "
            "not the 1/segments that the seed's line suggests."),
        diagnoses={When(lambda v: v < 0.2): "That is what full checkpointing would keep. checkpoint_sequential "
                                            "runs its last segment normally.",
                   When(lambda v: v > 1): "A fraction of what no checkpointing keeps: at most 1.",
                   When(lambda v: abs(v - 0.5) > 0.1): "Count per block: how many of the 16 blocks keep everything, "
                                                        "and what do the others keep?"},
        sample=_sample_deep,
    ),
    Numeric(
        "04.selective-share", "Share of a layer's activation bytes that selective recomputation removes (memlab's "
                              "per-layer terms, bf16, b = 1)",
        reference=_selective_share, unit="", rtol=0.02,
        hint="as section 1 does for GPT-3: sum one block's terms of memlab.predict.memory.activations."
             "activation_terms(model, Setup(batch=1, seq=s, precision='bf16', recompute=r)) for r = 'none' and "
             "'selective' (leave out the token ids, the head and loss, and the final norm; divide by n_layers); "
             "the share removed is 1 - selective / none",
        why=lambda model_name, seq: (
            f"per layer {_block_bytes(model_name, seq, 'none') / 2**20:,.0f} MiB without recompute, "
            f"{_block_bytes(model_name, seq, 'selective') / 2**20:,.0f} MiB with selective: "
            f"{_selective_share(model_name, seq):.3f} removed (the s × s softmax probabilities). The paper's "
            f"5as/h / (34 + 5as/h) gives {_paper_share(model_name, seq):.3f} here, because it also counts dropout's "
            "mask and dropped probabilities and a GELU MLP's tensors; this model has no dropout and a SwiGLU MLP, "
            "so its own terms give another share."),
        diagnoses={_paper_share:
                   "That is Korthikanti et al.'s formula, 5as/h / (34 + 5as/h): it assumes dropout (a mask and the "
                   "dropped probabilities beside each score) and a GELU MLP. This model has neither: sum its own "
                   "terms, as section 1 does.",
                   lambda model_name: _selective_share("gpt-3-175b", 2048):
                   "That is GPT-3's share at s = 2048 (section 1); compute it for this model and sequence.",
                   lambda model_name, seq: 1 - _selective_share(model_name, seq):
                   "That is the share that stays (selective / none), not the share removed.",
                   When(lambda v: v > 1): "A share of the layer's bytes: between 0 and 1."},
        sample=lambda: {"model_name": "llama-2-7b", "seq": 4096},
    ),
    Numeric(
        "04.full-recompute-flops", "FLOPs ratio, full recompute / none, GPT-3 at b=1, s=2048",
        reference=_recompute_ratio, unit="x", rtol=0.01,
        hint="without recompute a step is 3F (forward + a backward twice as costly); full recompute adds one more "
             "forward of the blocks, F_blocks, which is a little less than F (the LM head is not recomputed)",
        why=lambda: (f"(3F + F_blocks) / 3F = {_recompute_ratio():.4f}: just under 4/3, because the LM head's "
                     "forward is not recomputed."),
        diagnoses={2: "The forward runs twice, but the backward (2F) once: the step is 3F + F_blocks, not 2 × 3F.",
                   1.5: "That counts the step as forward + backward = 2F; the backward costs 2F, so a step is 3F."},
    ),
    Numeric(
        "04.op-policy-flops", "FLOPs ratio, torchtitan's per-op policy / none, Llama-3-8B at b=1, s=4096",
        reference=lambda: _policy_ratio("op"), unit="x", rtol=0.01,
        hint="the policy keeps the outputs of the 1st, 3rd, 5th and 7th aten.mm of each block (q, v, gate, down) and "
             "the flash kernel's; backward re-runs the others (k, o, up), a 2·t·n_in·n_out FLOPs forward each: add "
             "them over the 32 layers to 3F (memlab.predict.compute.flops.recomputed_flops)",
        why=lambda: (f"(3F + F_k,o,up) / 3F = {_policy_ratio('op'):.4f} against full recompute's "
                     f"{_policy_ratio('full'):.4f}: the recomputed matmuls are the cheap half of the block's "
                     "(k is GQA-narrow), and the attention kernel is not re-run."),
        diagnoses={When(lambda v: abs(v - _policy_ratio("full")) < 0.005):
                   "That is full recompute: every block's forward again. The op policy keeps every other matmul.",
                   When(lambda v: v <= 1): "Recompute adds FLOPs: the ratio is above 1."},
    ),
    Numeric(
        "04.crossover-batch", "Smallest batch at which Llama-2-7B's backward pass holds the peak (fp32, foreach "
                              f"AdamW, s={EX4_SEQ}, memlab's estimate)",
        reference=_crossover_batch, unit="", rtol=0.001,
        hint="the foreach step's scratch does not grow with the batch, the activations do: find the first b at which "
             f"estimate(preset('llama-2-7b'), Setup(batch=b, seq={EX4_SEQ}, precision='fp32', "
             "optimizer_impl='foreach'))"
             ".peak_phase is 'backward'",
        why=lambda: (f"below batch {_crossover_batch()} the foreach step's scratch (sized like all parameters, "
                     f"{(_phase_peak(1, 'optimizer step') - _phase_peak(1, 'backward')) / 2**30:,.1f} GiB above the "
                     "backward at batch 1) holds the peak; activations grow with the batch and overtake "
                     "it there. Checkpointing cannot lower a peak that the optimizer step holds."),
        diagnoses={When(lambda v: v == 1): "At batch 1 the optimizer step holds the peak, as in section 5.",
                   When(lambda v: v != round(v)): "A batch is a whole number of sequences."},
    ),
)
