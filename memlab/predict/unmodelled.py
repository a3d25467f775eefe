"""What the estimate leaves out, named with its size: the terms a phase of :func:`memlab.predict.estimate.estimate`
may miss (:class:`NamedTerm`: at most how many bytes, on which phases, with which sign), so that a comparison with
a trace or a measurement can tell a named gap from a silently wrong number (:mod:`memlab.compare.agreement`).

Sizes are bytes on one rank; sources are the terms' own docstrings (FSDP2's moments: :mod:`memlab.predict.memory.fsdp`;
MoE routing; full recompute's bottom block and attention core; selective recompute's attention core in forward;
the top block under a non-plain loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from memlab.predict.estimate import MemoryBreakdown, estimate
from memlab.predict.memory.phases import layer_terms
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup

HF_TRANSIENTS = ("a Hugging Face family's own transients inside forward and backward (norm upcasts, its activation's "
                 "backward, the mask's expansion), where no t x V logits term hides them")
"""The name of the term :func:`unmodelled_term_list` gives an HF family under the plain loss."""


HF_RECOMPUTED_BLOCK = ("full recompute of a Hugging Face family: the bottom block's recomputed tensors, counted all at "
                       "once (its backward frees them op by op: an upper bound)")
"""The name of the term :func:`unmodelled_term_list` gives an HF family under full recompute."""
HF_BOTTOM_TEMPORARIES = ("a Hugging Face family's bottom block: its backward temporaries, counted all at once (its "
                         "block makes and frees them in its own order: an upper bound)")
"""The name of the term :func:`unmodelled_term_list` gives every HF family in training: ``layer_terms(...)["temp"]``
(:func:`memlab.predict.memory.phases.layer_terms`), backward, -."""


def top_block_bound_bytes(config: TransformerConfig, setup: Any, device_type: str = "cpu") -> float:
    """The most the estimate's top-block backward moment can exceed a real step (``StepInputs.top_layer``: under a
    chunked or fused loss or kept positions the top block's temporaries and its gradients are counted all at
    once): one block's backward temporaries plus its gradients on one tp rank, in bytes."""
    lt = layer_terms(config, setup, device_type)
    block = sum(math.prod(shape) for name, shape, _ in config.param_shapes() if name.startswith("blocks.0."))
    return lt["temp"] + block * setup.policy.grad_bytes / setup.tp



def attention_core_bound_bytes(config: TransformerConfig, setup: Any) -> float:
    """The most eager or math (unfused) attention's core holds inside one block's forward beyond its inputs, on one
    tp rank, in bytes: its s x s tensors (scores, mask sum, softmax, dropout) and a few t x h ones, at most
    ``12 S + 4 b s^2 + 22 t h + 4 t`` with ``S = b heads s^2`` (fitted on memlab's trace of the reference GPT, dense
    attention, fp32 and bf16, eager and math, under full and selective recompute; checked by
    ``tests/studies/test_setup_draws.py`` on generated setups)."""
    b, s_, t = setup.batch, setup.seq, setup.batch * setup.seq
    return (12 * b * config.n_heads * s_ * s_ + 4 * b * s_ * s_ + 22 * t * config.d_model + 4 * t) / setup.tp


@dataclass(frozen=True)
class NamedTerm:
    """A term the estimate leaves out, named with its size: at most ``bytes`` on the phases ``phases`` (their base
    names: ``forward`` also covers ``forward (accumulating)``), with ``sign`` +1 where the real step may hold up to
    that much MORE than the estimate and -1 where it may hold up to that much LESS."""

    name: str
    bytes: int
    phases: tuple[str, ...]
    sign: int
    exact: bool = False
    """Match ``phases`` by the whole name: ``backward`` then leaves ``backward (accumulating)`` out."""

    def applies(self, phase: str) -> bool:
        """True when this term can change ``phase`` (``forward``, ``backward (accumulating)``, ...)."""
        return phase in self.phases or (not self.exact and phase.split(" (")[0] in self.phases)


def unmodelled_term_list(config: TransformerConfig | int, setup: Setup, bd: MemoryBreakdown,
                         device_type: str = "cpu") -> list[NamedTerm]:
    """The terms ``bd`` (the estimate of ``config`` under ``setup`` for ``device_type``, whose widths size the terms)
    names in its assumptions as left out, each with
    the most it can add or take away, in bytes, the phases it applies to and its sign (:class:`NamedTerm`):
    FSDP2's moments outside the phase model (:func:`memlab.predict.memory.fsdp.unmodelled`: forward or backward, +), and
    for a mixture of experts the routing (the estimate counts one dense MLP per token: ``top_k`` routed copies of
    its saved tensors and the router's, ``top_k`` x the MLP term as without recompute, since the copies exist
    inside a block's forward under any recompute; forward and backward, +) and the experts no token chose (no
    gradient, so no optimizer state, in a real step: up to every expert's gradients and moments; every phase,
    since the steady step's forward holds the states too, -; under FSDP2 also a gathered block's unsharded expert
    gradients in backward, -; neither for grouped 3-D experts, ``impl.grouped_experts``, whose routing is counted
    exactly and whose two tensors per layer always get a gradient), under full recompute, a chunked or fused loss,
    kept positions or activation offload (for a Hugging Face family always) the bottom block's moment
    (:func:`_bottom_block_terms`; for a Hugging Face family also its backward temporaries,
    :data:`HF_BOTTOM_TEMPORARIES`, backward, -), under eager or
    math attention the core's s x s tensors inside a block's forward (full recompute: forward +, backward -;
    selective recompute with a chunked or fused loss or kept positions, and activation offload: forward +;
    :func:`attention_core_bound_bytes`), under
    activation offload with the plain loss the LM head's weight copied back at its backward (+), and under a chunked or
    fused loss or kept positions the top block's backward moment, an upper bound (backward, -); under activation
    offload without full recompute the bottom block's saved tensors, counted on the device at once (backward, -);
    for a Hugging Face family under full recompute the bottom block's recomputed tensors, counted at once
    (:data:`HF_RECOMPUTED_BLOCK`, one block's saved bytes as without recompute; backward, -), and under the plain
    loss its own in-phase transients (:data:`HF_TRANSIENTS`, at most
    :func:`top_block_bound_bytes`; forward and backward, +). (A for-loop Adam/AdamW step's moment is counted in
    the family's own parameter order, :mod:`memlab.predict.families.order`: no term.)
    Empty when the estimate claims everything it counts."""
    from memlab.predict.memory.fsdp import plan_of, unmodelled

    out: list[NamedTerm] = []
    if not isinstance(config, TransformerConfig) or setup.mode != "train":
        return out
    fsdp = plan_of(config, setup)
    if fsdp is not None:
        out += [NamedTerm(k, math.ceil(v), phases, +1) for k, (v, phases) in unmodelled(fsdp, fsdp.grad_bytes).items()
                if v]
    # without full recompute a t x V term at the start of backward hides the reference GPT's bottom block's moment,
    # except under a chunked or fused loss, kept positions or activation offload; a Hugging Face family's need not
    # hide (measured: OPT, one layer, V = 96 beside d_ff and s x s scores, the estimate's bottom moment above its
    # start of backward, the real one below it), so its bottom-block terms are always named
    hf = config.impl.family != "reference"
    if hf or setup.recompute == "full" or setup.loss != "plain" or setup.logits_to_keep or setup.offload_activations:
        out += _bottom_block_terms(config, setup, fsdp)
    if hf:
        # the bottom-block moment counts the block's backward temporaries (the d_ff-wide or s x s gradients and
        # three h-wide ones) all at once, beside all its saved tensors but the MLP's; transformers' block makes and
        # frees them in its own order, and the real moment holds at least its saved tensors and no temporary
        out.append(NamedTerm(HF_BOTTOM_TEMPORARIES, math.ceil(layer_terms(config, setup, device_type)["temp"]),
                             ("backward",), -1))
    if setup.recompute == "full" and hf:
        # transformers' layers under torch.utils.checkpoint (non-reentrant) free the recomputed block's tensors op by
        # op as its backward consumes them, while the bottom-block moment counts them all at once: measured up to
        # 0.8 x this term below the estimate (memlab.studies.hf_draws, seed 0, 1,140 draws: under bf16 autocast)
        out.append(NamedTerm(HF_RECOMPUTED_BLOCK, math.ceil(layer_terms(config, setup, device_type)["layer"]),
                             ("backward",), -1))
    if setup.recompute == "full" and not setup.fused_attention:
        # the attention core's s x s tensors (scores, softmax, dropout) alive inside a block's recomputed forward
        # and backward: the block-forward moment counts the MLP, not them
        name = f"full recompute with {setup.attention} attention: the attention core's s x s tensors inside a " \
               "recomputed block's "
        core = math.ceil(attention_core_bound_bytes(config, setup))
        out.append(NamedTerm(name + "forward", core, ("forward",), +1))
        out.append(NamedTerm(name + "backward, counted with the bottom block", core, ("backward",), -1))
    if setup.recompute != "full" and not setup.fused_attention and (
            (setup.recompute == "selective" and (setup.loss != "plain" or setup.logits_to_keep))
            or setup.offload_activations):
        # selective recompute saves no s x s tensor and activation offload moves the saved ones to the host, but a
        # block's core still makes them in forward; with no t x V logits at the end of forward (chunked or fused
        # loss, kept positions, offload) that moment can be the forward's peak, which the estimate (the end of
        # forward) does not count
        why = "selective recompute" if setup.recompute == "selective" else "activation offload"
        out.append(NamedTerm(f"{why} with {setup.attention} attention: the attention core's s x s tensors inside a "
                             "block's forward (not held on the device after it)",
                             math.ceil(attention_core_bound_bytes(config, setup)), ("forward",), +1))
    if setup.offload_activations and setup.loss == "plain":
        # save_on_cpu copies the weight a matmul saves too: at the LM head's backward its weight comes back to the
        # device as a new tensor, beside the head's weight gradient and the logits' gradient, a moment the estimate's
        # start of backward (the two t x V gradients) does not count (traced: fp32 math attention, 1.2 MB of 62 MB)
        saved = 2 if setup.policy.autocast else setup.policy.param_bytes
        out.append(NamedTerm("activation offload: the LM head's saved weight copied back to the device at its "
                             "backward, beside its gradient",
                             math.ceil(config.vocab_size * config.d_model * saved / setup.tp), ("backward",), +1))
    if (setup.loss != "plain" or setup.logits_to_keep) and not setup.offload_activations \
            and setup.recompute != "full":
        out.append(NamedTerm("the top block's backward moment under a chunked or fused loss or kept positions, "
                             "counted all at once (an upper bound)",
                             math.ceil(top_block_bound_bytes(config, setup, device_type)), ("backward",), -1))
    if config.impl.family != "reference" and setup.loss == "plain" and not setup.logits_to_keep \
            and not setup.offload_activations:
        # a Hugging Face family's own in-phase ops (its norms' fp32 upcasts, a composed activation's backward, the
        # attention mask's expansion, the loss's label shift) are counted as the reference GPT's: the phase model's
        # t x V logits terms hide them only where the vocabulary is large against the widths (measured on real steps
        # of drawn configs, memlab.studies.hf_draws: within 0.1 % at V = 4096, up to several per cent below it at
        # V = 96-512); bounded by one block's backward temporaries and gradients (top_block_bound_bytes)
        out.append(NamedTerm(HF_TRANSIENTS, math.ceil(top_block_bound_bytes(config, setup, device_type)),
                             ("forward", "backward"), +1))
    if setup.offload_activations and setup.recompute != "full":  # (full recompute's are recomputed on the device)
        out.append(NamedTerm("activation offload: the bottom block's saved tensors, counted on the device at once at "
                             "its backward (they come back from the host one op at a time: an upper bound)",
                             math.ceil(layer_terms(config, setup, device_type)["layer"]), ("backward",), -1))
    if config.is_moe and not config.impl.grouped_experts:  # grouped 3-D experts (Mixtral): counted exactly
        mlp = bd.activation_detail.get("mlp", 0)
        if setup.recompute != "none":  # the routed copies still exist while a block's forward runs
            plain = estimate(config, setup.with_(recompute="none"), device_type=device_type)
            mlp = plain.activation_detail.get("mlp", 0)
        out.append(NamedTerm("MoE routing (top_k routed copies, router)", math.ceil(config.top_k * mlp),
                             ("forward", "backward"), +1))
        expert = sum(math.prod(shape) for name, shape, _ in config.param_shapes() if ".experts." in name)
        share = expert / max(1, bd.param_count)
        out.append(NamedTerm("MoE experts no token chose (no gradient, no optimizer state)",
                             math.ceil(share * (bd.grads_bytes + bd.optimizer_bytes)),
                             ("forward", "backward", "optimizer step", "zero_grad"), -1))
        if fsdp is not None:  # a gathered block's unsharded gradients: none for an expert no token chose
            block_experts = sum(math.prod(shape) for name, shape, _ in config.param_shapes()
                                if name.startswith("blocks.0.") and ".experts." in name)
            out.append(NamedTerm("MoE experts no token chose: a block's unsharded expert gradients (FSDP2)",
                                 math.ceil(block_experts * fsdp.grad_bytes), ("backward",), -1))
    return out


def _bottom_block_terms(config: TransformerConfig, setup: Setup, fsdp: Any) -> list[NamedTerm]:
    """Under full recompute (and under a chunked or fused loss, kept positions or activation offload, where no t x V
    gradient dominates the start of backward) the backward peak is often the bottom block's backward, which the
    estimate takes as one moment: every gradient but the bottom block's, beside its recomputed tensors and
    temporaries. Inside the block's backward its own gradients appear one module at a time (up to the block's
    gradients more: +), and the embeddings' gradients (positions; tokens when untied: a tied one comes from the head)
    are produced only after it, in a first micro-step whose gradients start as None (the estimate counts them: up to
    their bytes less: -). Sizes on one rank: under FSDP2 the unsharded gradients (the gathered dtype), else
    ``grad_bytes / tp`` (ZeRO-2/3 without FSDP2 does not reach here: FSDP2 applies to every sharded draw)."""
    gb = fsdp.grad_bytes if fsdp is not None else setup.policy.grad_bytes / setup.tp
    block = sum(math.prod(shape) for name, shape, _ in config.param_shapes() if name.startswith("blocks.0."))
    emb = sum(math.prod(shape) for name, shape, _ in config.param_shapes()
              if name.startswith("pos_emb.") or (name.startswith("tok_emb.") and not config.tied_embeddings))
    pol = setup.policy
    why = "full recompute" if setup.recompute == "full" else "the bottom block's moment"
    out = [NamedTerm(f"{why}: the bottom block's own gradients inside its backward", math.ceil(block * gb),
                     ("backward",), +1)]
    if emb and setup.zero_grad_to_none and not (pol.master_bytes and pol.grad_bytes == 4):
        out.append(NamedTerm(f"{why}: the embeddings' gradients, produced after the bottom block's backward",
                             math.ceil(emb * gb), ("backward",), -1, exact=True))
    return out


def unmodelled_terms(config: TransformerConfig | int, setup: Setup, bd: MemoryBreakdown) -> dict[str, int]:
    """:func:`unmodelled_term_list` as name -> the most it can add or take away (bytes)."""
    return {t.name: t.bytes for t in unmodelled_term_list(config, setup, bd)}


@dataclass(frozen=True)
class PeakRange:
    """Where the real peak of a step lies, given the terms an estimate names (:func:`peak_range`), in bytes: at
    least ``low`` and at most ``high``; ``peak`` is the estimate's own. ``terms`` are the named terms behind the
    range (empty: the estimate claims its peak, and ``low == peak == high``)."""

    peak: int
    low: int
    high: int
    terms: tuple[NamedTerm, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``: the three bounds and each term's name, bytes, sign and phases."""
        return {"peak": self.peak, "low": self.low, "high": self.high,
                "terms": [{"name": t.name, "bytes": t.bytes, "sign": "+" if t.sign > 0 else "-",
                           "phases": list(t.phases)} for t in self.terms]}


def peak_range(config: TransformerConfig | int, setup: Setup, bd: MemoryBreakdown,
               device_type: str = "cpu", step: str | None = None) -> PeakRange:
    """The real peak's range from the estimate's phases and the terms it names (:func:`unmodelled_term_list`):
    each phase holds at most its estimate plus the terms that may add to it and at least its estimate less those
    that may take away, so the real peak (the largest phase) is at most the largest of the upper ends and at least
    the largest of the lower ends. Bytes; exact (``low == high``) where nothing is named. ``step``: ``first`` or
    ``steady`` for that step's peak only (default: the estimate's peak, over both)."""
    terms = unmodelled_term_list(config, setup, bd, device_type)
    rows = [r for r in bd.phases if step is None or r.step == step]
    peak = max((r.held_bytes for r in rows), default=bd.peak_bytes) if step is not None else bd.peak_bytes
    if not terms or not rows:
        return PeakRange(int(peak), int(peak), int(peak), ())
    high = low = 0
    for row in rows:
        more = sum(t.bytes for t in terms if t.sign > 0 and t.applies(row.phase))
        less = sum(t.bytes for t in terms if t.sign < 0 and t.applies(row.phase))
        high, low = max(high, row.held_bytes + more), max(low, row.held_bytes - less)
    return PeakRange(int(peak), int(min(low, peak)), int(max(high, peak)), tuple(terms))
