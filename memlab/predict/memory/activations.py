"""Activation memory: bytes saved for backward by one micro-batch on one device, term by term.

The starting point is Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), Section 4 and Table 2: per layer ``s*b*h*(34 + 5*a*s/h)`` bytes for 16-bit training with
dropout. That count is a sum of tensors, and this module keeps it as a sum of named tensors so it can be
generalised honestly and checked tensor by tensor against :class:`memlab.model.gpt.GPT`:

- any precision policy: fp32, autocast (fp32 residual stream, 16-bit matmul inputs, 16-bit *copies* of every
  matmul weight kept for backward) or pure 16-bit weights;
- d_ff != 4h, SwiGLU (four f-wide tensors instead of two), GQA (K and V are ``n_kv_heads*head_dim`` wide),
  RMSNorm, no dropout (the masks disappear);
- the attention kernel: ``eager`` keeps the softmax probabilities (b*a*s^2 elements); SDPA ``math`` upcasts
  16-bit inputs to fp32 (``allow_fp16_bf16_reduction_math_sdp`` is False by default) and repeats K/V for GQA;
  fused kernels (flash, efficient, cudnn) keep q, k, v, their output and a fp32 log-sum-exp per row, no s^2 term;
- recompute ``none``, ``selective`` (the attention core is recomputed: Korthikanti Section 5) or ``full``
  (only each block's input is kept); ``full`` with ``recompute_every=k`` checkpoints every k-th block only
  (torchtitan's layer policy, :func:`memlab.predict.spec.setup.checkpointed_blocks`): those keep their input, the
  others what they keep without recompute (:func:`every_k_rows`);
- tensor parallelism ``tp`` and sequence parallelism ``sp`` as in Korthikanti Table 2 (:func:`row_divisor`: the
  token ids and the loss's scalar stay whole on every rank under sp);
- the model-level tensors the paper leaves out: token ids and targets, the final norm, the LM-head input and
  the fp32 log-softmax of the logits (Korthikanti Section 4.3 notes it is large: s*b*V*4 bytes).

How a model is *written* changes the list too: ``config.impl`` (:class:`memlab.predict.spec.traits.Implementation`)
names each such choice (composed ``gelu_new``, ReLU, a parallel block and shared norm, ``repeat_kv``, fp32
softmax, RMSNorm upcasts, per-forward rotary tables, SDPA output copies, a q that is a view of a fused QKV buffer)
and the terms below count each one; the defaults are the reference GPT's. With the traits
:func:`memlab.predict.families.reader.from_hf` sets, the count equals what Hugging Face models save, byte for byte, on
the families and runs of ``tests/run/test_hf.py`` and ``benchmarks/hf_activation_errors.py``.

Two facts depend on the device, because PyTorch's autocast op lists differ (torch/include/ATen/autocast_mode.h,
``AT_FORALL_FP32_SET_OPT_DTYPE`` applies to CUDA; the CPU lists in aten/src/ATen/autocast_mode.cpp do not list
softmax) and so do the norm kernels:

- under CUDA autocast softmax returns fp32, so eager attention keeps fp32 probabilities *and* the 16-bit copy the
  attention x V matmul saves (6 bytes per score instead of 2); on CPU the probabilities stay 16-bit;
- CUDA's layer_norm keeps fp32 mean/rstd for 16-bit inputs; the CPU kernel keeps them in the input dtype.

This module is pure arithmetic on ints or numpy arrays (batch and seq may be arrays) and imports no torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from memlab.errors import ConfigError, SetupError
from memlab.predict.compute.flops import block_projections, op_policy_kept
from memlab.predict.memory.family_terms import (
    check_call,
    check_family_setup,
    checkpoint_mask_rows,
    grouped_expert_rows,
    log_softmax_bytes,
    padded_sdpa_rows,
    qk_norm_rows,
    rotated_k_is_fp32,
)
from memlab.predict.memory.finetune import finetune_rows
from memlab.predict.memory.loss import hf_kept_labels, kept_copy, kept_positions, targets_saved
from memlab.predict.memory.rows import RowName
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.precision import precision_policy
from memlab.predict.spec.setup import CHECKPOINTED, Setup, SetupView, checkpointed_blocks
from memlab.predict.spec.traits import REFERENCE, Implementation

CATEGORIES = (
    "token ids",
    "embeddings",
    "norms",
    "attention",
    "attention scores",
    "mlp",
    "block inputs (recompute)",
    "head & loss",
    "autocast weight copies",
    "lora",
)
"""Names shared with :mod:`memlab.model.gpt`'s saved-tensor categories, in display order."""

INT64 = 8
FP32 = 4


@dataclass(frozen=True)
class ActivationTerm:
    """One kind of saved tensor: ``count`` elements over all layers, ``width`` bytes each.

    ``sharded`` is True when tensor parallelism splits it (divided by tp); replicated terms are divided by tp
    only under sequence parallelism. ``count`` may be a numpy array when batch or seq are arrays.
    """

    name: str
    category: str
    count: Any
    width: float
    sharded: bool
    note: str = ""

    def bytes(self, tp: int = 1, sp: bool = False) -> Any:
        """Bytes on one tensor-parallel rank."""
        return self.count * self.width / row_divisor((self.name, self.category, 0, 0, self.sharded), tp, sp)


SP_WHOLE = (RowName.LOSS_NORMALISER,)
"""Rows sequence parallelism leaves whole besides the token ids (category ``token ids``: the embedding and the loss
read all of them on every rank): only per-token tensors of the SP regions are split [korthikanti2022, Sec. 4.2.2]
(checked against DTensor SP traces, tests/studies/test_parallel_traces.py)."""


def row_divisor(row: tuple, tp: int, sp: bool) -> int:
    """A :data:`TermRow`'s divisor on one tensor-parallel rank: ``tp`` if sharded, or split by sp (not the token
    ids nor :data:`SP_WHOLE`), else 1."""
    return tp if row[4] or (sp and row[1] != "token ids" and row[0] not in SP_WHOLE) else 1


TermRow = tuple
"""An :class:`ActivationTerm`'s fields as a plain tuple, in order: ``(name, category, count, width, sharded[,
note])``."""


@functools.lru_cache(maxsize=256)
def _matmul_params(config: TransformerConfig) -> int:
    """``config.matmul_param_count()``, cached: configs are frozen, and sweeps ask for it per setup."""
    return config.matmul_param_count()


def widths(setup: Setup, device_type: str = "cuda") -> dict[str, float]:
    """Bytes per element of the tensors a policy produces.

    ``compute``: matmul inputs/outputs; ``residual``: the residual stream and norm inputs; ``stats``: layernorm
    mean/rstd; ``probs``: what the softmax keeps; ``probs_copy``: the 16-bit cast of the probabilities that the
    attention x V matmul keeps under CUDA autocast (0 when there is none).
    """
    return dict(shared_widths(setup.policy.name, device_type))


@functools.lru_cache(maxsize=64)
def shared_widths(precision: str, device_type: str = "cuda") -> dict[str, float]:
    """:func:`widths` of the precision policy named ``precision`` (a Setup's canonical name), cached (a handful of
    policies x two device types): one dict shared by every caller, so read it, never change it (the estimator's
    :func:`term_rows` and :func:`memlab.predict.memory.phases.layer_terms` read it per estimate)."""
    policy = precision_policy(precision)
    compute = 4 if policy.compute_dtype == "fp32" else 2
    residual = 4 if (policy.compute_dtype == "fp32" or policy.autocast) else 2
    stats = residual if device_type == "cpu" else 4
    if policy.autocast and device_type == "cuda" and compute == 2:
        probs, probs_copy = 4, 2
    else:
        probs, probs_copy = compute, 0
    # CUDA's fused native_dropout keeps a bool mask; elsewhere dropout multiplies by a noise tensor of the
    # input's dtype (aten/src/ATen/native/Dropout.cpp, is_fused_kernel_acceptable).
    mask = 1 if device_type == "cuda" else compute
    return {
        "compute": compute,
        "residual": residual,
        "stats": stats,
        "probs": probs,
        "probs_copy": probs_copy,
        "mask": mask,
        "probs_mask": 1 if device_type == "cuda" else probs,
    }


def _norm_terms(
    config: TransformerConfig, tokens: Any, n: int, w: dict[str, float], where: str, n_inputs: Any = None
) -> list[TermRow]:
    """``n`` norms keep their input and statistics (``n_inputs`` distinct inputs, ``n`` unless a parallel block's
    two norms read one tensor). RMSNorm as written by the model (``config.impl.rmsnorm``): the reference
    keeps x, rstd and x * rstd in the residual dtype; ``fp32-input`` the fp32 x, fp32 rstd and x * rstd cast back;
    ``fp32`` the fp32 x, rstd, x * rstd and ``1 + weight``."""
    h, kind = config.d_model, config.impl.rmsnorm
    n_in = n if n_inputs is None else n_inputs
    if config.norm == "layernorm":
        return [
            (f"{where} input", "norms", n_in * tokens * h, w["residual"], False),
            (f"{where} mean and rstd", "norms", n * 2 * tokens, w["stats"], False),
        ]
    if kind == "reference":
        return [
            (f"{where} input", "norms", n_in * tokens * h, w["residual"], False),
            (f"{where} rstd", "norms", n * tokens, w["residual"], False),
            (f"{where} x*rstd", "norms", n * tokens * h, w["residual"], False),
        ]
    # An fp32 upcast of a 16-bit input is a new tensor per norm; of an fp32 input it is the input itself.
    up_in = n_in if w["residual"] == FP32 else n
    out = [
        (f"{where} input, fp32", "norms", up_in * tokens * h, FP32, False, "x.to(float32)"),
        (f"{where} rstd, fp32", "norms", n * tokens, FP32, False),
    ]
    if kind == "fp32-input":
        out.append((f"{where} x*rstd cast back", "norms", n * tokens * h, w["residual"], False))
    else:
        out.append((f"{where} x*rstd, fp32", "norms", n * tokens * h, FP32, False))
        if kind == "fp32":
            out.append((f"{where} 1 + weight, fp32", "norms", n * h, FP32, False))
    return out


def _core_terms(config: TransformerConfig, setup: Setup, b: Any, s: Any, w: dict[str, float],
                recompute: str) -> list[TermRow]:
    """What the attention core (QK^T, softmax, dropout, x V) keeps, for all layers, under ``recompute``."""
    L, h, a, im = config.n_layers, config.q_dim, config.n_heads, config.impl
    kv = config.kv_dim
    if im.kv_broadcast and kv != config.head_dim:  # Falcon: repeat_kv before every kernel (no enable_gqa with a mask)
        kv = h
    t = b * s
    scores = L * b * a * s * s
    drop = im.attention_dropout_or(config.dropout) > 0
    if recompute == "selective":
        return [
            ("q, k, v kept to recompute the core", "attention", L * t * (h + 2 * kv), w["compute"], True)
        ]
    if setup.attention == "eager":
        # repeat_kv: K and V at full query width, unless one KV head at batch 1 (an expanded view matmul accepts)
        grouped = im.eager_repeat_kv and kv != h
        repeat = 0 if not grouped else (1 if kv != config.head_dim else (b != 1))
        kw = kv + repeat * (h - kv)
        # ... but under autocast QK^T's cast of a rotated fp32 k copies it at query width
        k_w = kv + (1 if grouped and rotated_k_is_fp32(config, setup) else repeat) * (h - kv)
        # GPT-2 at batch 1: q is a view of the fused QKV output, and QK^T keeps that whole buffer
        qw = h + (b == 1) * 2 * kv if im.q_view_of_fused_qkv else h
        promoted = im.autocast_mask_promotes_scores and setup.policy.autocast
        if (im.softmax_fp32 or promoted or im.eager_qk_fp32) and w["compute"] == 2:
            w = {**w, "probs": FP32, "probs_copy": 2}
        # GPT-J: query.to(float32), key.to(float32); under autocast the matmul keeps its own 16-bit casts
        qk = FP32 if im.eager_qk_fp32 and not setup.policy.autocast else w["compute"]
        out = [
            ("q (contiguous for QK^T)", "attention", L * t * qw, qk, True),
            ("k^T (contiguous for QK^T)", "attention", L * t * k_w, qk, True),
            ("v (contiguous for PV)", "attention", L * t * kw, w["compute"], True),
            ("softmax probabilities", "attention scores", scores, w["probs"], True),
        ]
        if im.attn_softcap:  # tanh(scores / cap) * cap: tanh keeps its output
            out.append(("tanh of the capped scores", "attention scores", scores, w["compute"], True))
        if drop:
            out.append(("attention dropout mask", "attention scores", scores, w["probs_mask"], True))
            if not w["probs_copy"]:
                out.append(("dropped probabilities", "attention scores", scores, w["probs"], True))
        if w["probs_copy"]:
            out.append(
                ("16-bit copy of probabilities for PV", "attention scores", scores, w["probs_copy"], True)
            )
        return out
    if setup.attention == "math":
        out = [
            ("q scaled, fp32", "attention", L * t * h, FP32, True, "math SDPA upcasts 16-bit inputs"),
            ("k scaled, fp32 (GQA: repeated)", "attention", L * t * h, FP32, True),
            ("v, fp32 (GQA: repeated)", "attention", L * t * h, FP32, True),
            ("softmax probabilities, fp32", "attention scores", scores, FP32, True),
        ]
        if drop:
            out.append(("attention dropout mask", "attention scores", scores, w["mask"] and 4, True))
            out.append(("dropped probabilities, fp32", "attention scores", scores, FP32, True))
        return out
    rows = s if setup.attention != "efficient" else 32 * ((s + 31) // 32)
    out = [
        # The kernel's output is laid out (b, s, a, d): the output projection's input is that same storage.
        ("q, k, v (fused kernel inputs)", "attention", L * t * (h + 2 * kv), w["compute"], True),
        ("log-sum-exp per row, fp32", "attention", L * b * a * rows, FP32, True),
    ]
    if im.q_view_of_fused_qkv:
        out.append(("rest of the fused QKV buffer q is a view of", "attention", L * t * 2 * kv,
                    w["compute"], True))
    if im.copies_sdpa_output(setup.attention):
        out.append(("kernel output (b, a, s, d) before the copy", "attention", L * t * h,
                    w["compute"], True))
    if im.sdpa_keeps_mask:
        out.append(("4-D causal mask each layer's SDPA keeps", "attention", L * b * s * s, w["compute"], False))
    return out


def activation_terms(config: TransformerConfig, setup: Setup, *, device_type: str = "cuda") -> list[ActivationTerm]:
    """Every tensor the reference model keeps for backward, as :class:`ActivationTerm` rows.

    ``device_type`` ("cuda" or "cpu") selects the autocast and norm-kernel behaviour described in the module
    docstring. Inference (``setup.mode == 'inference'``) keeps nothing for backward: the list is empty.
    """
    _check(config, setup)
    return [ActivationTerm(*row) for row in term_rows(config, setup, device_type=device_type)]


def _check(config: object, setup: object) -> None:
    if not isinstance(config, TransformerConfig):
        raise ConfigError(f"config must be a TransformerConfig, got {type(config).__name__}")
    if not isinstance(setup, Setup | SetupView):
        raise SetupError(f"setup must be a memlab.predict.spec.setup.Setup, got {type(setup).__name__}")
    check_family_setup(config, setup)


def term_rows(config: TransformerConfig, setup: Setup, *, device_type: str = "cuda",
              recompute: str | None = None, model_level: bool = True) -> list[TermRow]:
    """:func:`activation_terms` as plain tuples of the :class:`ActivationTerm` fields in order, ``(name, category,
    count, width, sharded[, note])``, without building the records: the estimator's path (a frozen record costs
    more to build than its arithmetic). ``recompute`` replaces the setup's own (:mod:`memlab.predict.memory.phases`
    counts one block as without recompute); ``model_level=False`` leaves out the token ids, the final norm and the
    LM head's and loss's rows (what is not per block). The arguments are not checked here;
    :func:`activation_terms` checks.
    """
    recompute = setup.recompute if recompute is None else recompute
    if setup.mode == "inference":
        return []
    if recompute == "full" and setup.recompute_every > 1:
        return every_k_rows(config, setup, device_type=device_type, model_level=model_level)
    b, s = setup.batch, setup.seq
    t = b * s
    L, h, f, V = config.n_layers, config.d_model, config.ffn, config.vocab_size
    w = shared_widths(setup.policy.name, device_type)
    autocast = setup.policy.autocast
    drop = config.dropout > 0
    im = config.impl
    terms: list[TermRow] = [
        (RowName.INPUT_IDS, "token ids", t, INT64, False),
        _target_row(setup, t, b, im.loss_labels_padded and setup.loss_call == "labels"),  # manual: its own targets
    ] if model_level else []
    if config.positions == "learned":
        if model_level:
            terms.append((RowName.POSITION_IDS, "token ids", t if im.position_ids_per_token else s, INT64, False))
    elif im.rotary_tables_per_forward and recompute not in CHECKPOINTED:  # checkpointed layers get them by keyword
        rot = int(config.head_dim * im.rotary_fraction)
        terms.append((RowName.ROTARY, "attention",
                      2 * s * rot * im.rotary_table_pairs, FP32 if im.rotary_tables_fp32 else w["residual"], False))
    if im.rotary_tables_per_use and recompute not in CHECKPOINTED and config.positions == "rotary":
        rot = int(config.head_dim * im.rotary_fraction)
        terms.append(("rotary cos and sin (a pair per rotation, q and k, every layer)", "attention",
                      L * 4 * s * rot, w["residual"], False))  # the table is cast to the hidden state's dtype
    if im.embedding_dropout > 0:
        # the embeddings are in the model's dtype (fp32 under autocast); off CUDA the mask is a noise tensor of it
        terms.append((RowName.EMBEDDING_DROPOUT, "embeddings", t * h, w["mask"] if w["mask"] == 1
                      else w["residual"], False))
    if recompute in CHECKPOINTED:
        terms.append(("block input", "block inputs (recompute)", L * t * h, w["residual"], False))
        terms += checkpoint_mask_rows(config, setup, b, s, w["residual"])
        if recompute == "op":
            terms += op_policy_rows(config, setup, w, device_type)
    else:
        # Under autocast each projection casts its (fp32) input itself: q, k and v make three 16-bit copies.
        # A parallel block's two norms read one input; a shared norm (Phi) feeds the MLP the attention's input.
        n_attn_in = 3 if autocast and not im.fused_qkv else 1  # a fused QKV projection casts its input once
        n_mlp_in = (2 if config.mlp == "swiglu" and not im.fused_gate_up and not im.grouped_experts else 1) \
            if autocast else (0 if im.shared_norm else 1)  # fused gate_up (Phi-3), MoE router: one cast
        n_norms = L if im.shared_norm else (4 if im.norm_placement == "sandwich" else 2) * L
        terms += _norm_terms(config, t, n_norms, w, "block norm", L if im.parallel_block else n_norms)
        terms.append(("q/k/v projection input", "attention", n_attn_in * L * t * h, w["compute"], False))
        if im.qk_norm != "none" and recompute != "selective":
            terms += qk_norm_rows(config, t, w["compute"])
        terms += _core_terms(config, setup, b, s, w, recompute)
        terms += padded_sdpa_rows(config, setup, b, s, w["compute"])
        terms.append(("output projection input", "attention", L * t * config.q_dim, w["compute"], True))
        if drop:
            terms.append(("attention output dropout mask", "attention", L * t * h, w["mask"], False))
        terms.append(("MLP input", "mlp", n_mlp_in * L * t * h, w["compute"], False))
        n_f = im.mlp_saved_tensors(config.mlp)  # gelu: its input, down's input; swiglu: gate, silu, up, down input
        act = im.act(config.mlp)
        if im.grouped_experts:  # the router's and the experts' tensors, per (token, choice) pair (Mixtral)
            terms += grouped_expert_rows(config, t, w, n_f, autocast and device_type == "cuda", autocast)
        else:
            terms.append((f"MLP {config.mlp}/{act} tensors (d_ff wide)", "mlp", n_f * L * t * f, w["compute"], True))
        if drop:
            terms.append(("MLP output dropout mask", "mlp", L * t * h, w["mask"], False))
        if autocast:
            blocks = _matmul_params(config) - V * h - config.grouped_expert_params()  # dense layers: not L equal
            terms.append(
                ("16-bit copies of block weights", "autocast weight copies", blocks, 2, True)
            )
    if not model_level:
        return terms if setup.finetune == "full" else finetune_rows(config, setup, w, terms, device_type, recompute)
    terms += _norm_terms(config, t, 1, w, "final norm")
    terms += loss_rows(config, setup, w)
    if setup.finetune != "full":  # a frozen base with adapters (memlab.predict.memory.finetune)
        return finetune_rows(config, setup, w, terms, device_type, recompute)
    return terms


def split_by_checkpoint(config: TransformerConfig, setup: Setup) -> tuple[TransformerConfig | None,
                                                                          TransformerConfig | None]:
    """``(plain, checkpointed)``: ``config`` with as many blocks as ``setup``'s recompute runs without and with a
    checkpoint (None for none of them): full recompute over every ``recompute_every``-th block
    (:func:`memlab.predict.spec.setup.checkpointed_blocks`). The blocks must be alike (no ``impl.dense_layers``:
    :mod:`memlab.predict.coverage` refuses those)."""
    L = config.n_layers
    if setup.recompute not in CHECKPOINTED:
        return config, None
    n_ck = len(checkpointed_blocks(L, setup.recompute_every))
    if n_ck in (0, L):
        return (config, None) if n_ck == 0 else (None, config)
    return config.with_(n_layers=L - n_ck), config.with_(n_layers=n_ck)


def op_policy_rows(config: TransformerConfig, setup: Setup, w: dict[str, float], device_type: str) -> list[TermRow]:
    """What torchtitan's per-op policy keeps inside each checkpointed block beside its input
    (:mod:`memlab.model.policies`): the outputs of the 1st, 3rd, ... ``aten.mm`` (the unbiased projections, counted
    in call order; a biased one is ``aten.addmm``, not on the list, and not counted), in the compute dtype, and on
    CUDA the fused attention kernel's outputs (flash or memory-efficient: the output and its fp32 log-sum-exp; CPU's
    flash kernel, cuDNN's and eager's matmuls are not on the list). [pytorch/torchtitan@9a8cb98
    torchtitan/models/llama3/infra/parallelize.py lines 230-240, 291-313]"""
    L, b, s = config.n_layers, setup.batch, setup.seq
    t, kept = b * s, op_policy_kept(config)
    rows: list[TermRow] = [(f"{name} projection output (op policy: aten.mm kept)", "block inputs (recompute)",
                            L * t * width, w["compute"], False)
                           for name, _, width, _ in block_projections(config) if name in kept]
    if device_type == "cuda" and setup.attention in ("flash", "efficient"):
        lse = s if setup.attention == "flash" else 32 * ((s + 31) // 32)
        rows += [("fused attention output (op policy: kept)", "block inputs (recompute)", L * t * config.q_dim,
                  w["compute"], False),
                 ("fused attention log-sum-exp, fp32 (op policy: kept)", "block inputs (recompute)",
                  L * b * config.n_heads * lse, FP32, False)]
    return rows


def every_k_rows(config: TransformerConfig, setup: Setup, *, device_type: str = "cuda",
                 model_level: bool = True) -> list[TermRow]:
    """:func:`term_rows` under full recompute of every ``setup.recompute_every``-th block: the other blocks' rows as
    without recompute (with the model-level rows and what a forward keeps once: rotary tables, embedding dropout)
    and the checkpointed blocks' inputs (with a family's checkpointed mask). A checkpointed block's ops save
    nothing in forward (non-reentrant ``torch.utils.checkpoint`` keeps its inputs only)."""
    plain, ck = split_by_checkpoint(config, setup)
    every_one = SetupView(setup, recompute_every=1)  # each part is a plain or a fully checkpointed model
    if plain is None:
        return term_rows(config, every_one, device_type=device_type, recompute="full", model_level=model_level)
    rows = term_rows(plain, every_one, device_type=device_type, recompute="none", model_level=model_level)
    if ck is not None:
        rows += [r for r in term_rows(ck, every_one, device_type=device_type, recompute="full", model_level=False)
                 if r[1] == "block inputs (recompute)"]
    return rows


def _target_row(setup: Setup, t: Any, b: Any, padded: bool) -> TermRow:
    """The step's target ids as saved: padded by one at batch 1 when the model pads its labels (HF); under HF's
    own loss on kept positions, its padded copy of the last k labels
    (:func:`memlab.predict.memory.loss.hf_kept_labels`);
    none where no op saves them (:func:`memlab.predict.memory.loss.targets_saved`)."""
    if setup.loss == "plain" and not setup.logits_to_keep:
        return (RowName.TARGET_IDS, "token ids", t + (b == 1) * padded, INT64, False)
    hf, k = hf_kept_labels(setup, padded), kept_positions(setup)
    count = (t + (b == 1) * padded) * targets_saved(setup, padded) + hf * (b * k + (b == 1))
    # memlab's chunked loss over HF's shifted labels at k = 1 < seq, batch > 1: its checkpoints keep views of the
    # whole padded labels, b (s + 1) ids
    count = count + padded * (setup.loss == "chunked") * (k == 1) * (k != setup.seq) * (b != 1) * b
    return (RowName.TARGET_IDS, "token ids", count, INT64, False)


def loss_rows(config: TransformerConfig, setup: Setup, w: dict[str, float]) -> list[TermRow]:
    """What the LM head and the loss keep for backward under ``setup.loss`` and ``setup.logits_to_keep``
    (:mod:`memlab.predict.memory.loss`; ``w``: :func:`shared_widths`). Plain and chunked keep the head's input: with
    ``logits_to_keep`` shorter than seq at batch > 1 the last positions are not contiguous, and the head's matmul
    keeps both the whole hidden state and its contiguous copy (and the loss a copy of the targets' slice)."""
    b, s = setup.batch, setup.seq
    t, h, V = b * s, config.d_model, config.vocab_size
    kind = setup.loss
    if kind == "plain" and not setup.logits_to_keep:  # the default, listed without the general case's arithmetic
        lsm = log_softmax_bytes(setup, w["compute"])  # a hand-written loss on 16-bit logits: not upcast
        rows: list[TermRow] = [(RowName.HEAD_INPUT, "head & loss", t * h, w["compute"], False),
                               ("log-softmax of logits" + (", fp32" if lsm == FP32 else " (not upcast)"),
                                "head & loss", t * V, lsm, True),
                               (RowName.LOSS_NORMALISER, "head & loss", 1, lsm, False)]
        if config.impl.final_softcap:
            rows.append(("tanh of the capped logits", "head & loss", t * V, w["compute"], True))
        if setup.policy.autocast:
            rows.append((RowName.HEAD_COPY, "autocast weight copies", V * h, 2, True))
        return rows
    tk = b * kept_positions(setup)
    copied = kept_copy(setup)  # a batch > 1 slice of the last 1 < k < s positions: reshape copies it
    if kind == "fused":
        rows = [("gradient of the LM-head input (fused loss)", "head & loss", tk * h, w["residual"],
                                False, "computed in forward [liger2024]"),
                               ("gradient of the LM-head weight (fused loss)", "head & loss", V * h,
                                setup.policy.param_bytes, True)]
        if config.impl.head_bias and not config.tied_embeddings:
            rows.append(("gradient of the LM-head bias (fused loss)", "head & loss", V, setup.policy.param_bytes, True))
        return rows
    # a copy of the kept positions is kept instead of the whole hidden state. The chunked loss's checkpoints keep
    # their input as it is, the hidden state (fp32 under autocast), not the head's 16-bit cast of it
    hw = w["residual"] if kind == "chunked" else w["compute"]
    rows = [(RowName.HEAD_INPUT, "head & loss", (t - copied * t) * h, hw, False)]
    if isinstance(copied, np.ndarray) or copied:
        rows.append(("contiguous copy of the kept positions", "head & loss", copied * tk * h, hw, False))
        not_hf = 1 - hf_kept_labels(setup, config.impl.loss_labels_padded)  # HF's own copy is the target row
        rows.append(("copy of the kept targets", "head & loss", copied * not_hf * tk, INT64, False))
    if kind == "chunked" and config.impl.loss_labels_padded:  # HF labels: the mean divides by a count tensor
        rows.append(("count of targets not ignored (the mean's divisor)", "head & loss", 1, INT64, False))
    if kind == "plain":
        rows.append((RowName.LOG_SOFTMAX, "head & loss", tk * V, FP32, True))
        if config.impl.final_softcap:
            rows.append(("tanh of the capped logits", "head & loss", tk * V, w["compute"], True))
        rows.append((RowName.LOSS_NORMALISER, "head & loss", 1, FP32, False))
        if setup.policy.autocast:
            rows.append((RowName.HEAD_COPY, "autocast weight copies", V * h, 2, True))
    return rows


def autocast_block_copy_bytes(config: TransformerConfig, tp: int = 1) -> float:
    """Bytes of autocast's 16-bit copies of every block's matmul weights on one tp rank: what the
    "16-bit copies of block weights" term saves for backward, and what autocast's cast cache holds until the
    autocast region ends (the whole forward) when full recompute saves none of them [pytorch-amp]. Grouped 3-D
    experts are not cast: CPU autocast has no rule for ``grouped_mm`` (measured, tests/run/test_hf.py)."""
    return (_matmul_params(config) - config.vocab_size * config.d_model - config.grouped_expert_params()) * 2 / tp


@functools.lru_cache(maxsize=256)
def autocast_bias_copy_bytes(config: TransformerConfig, tp: int = 1) -> float:
    """Bytes of autocast's 16-bit copies of every block's linear biases on one tp rank (``2 x`` their elements; the
    norms' biases are not cast): no op saves them for backward (a bias gradient needs no bias), but the cast
    cache holds them until the autocast region, the forward, ends [pytorch-amp]; as traced (memlab.studies.setup_draws).
    Divided by ``tp`` like the weights (an upper bound for row-parallel biases, which are replicated)."""
    return sum(math.prod(shape) for name, shape, cat in config.param_shapes()
               if name.startswith("blocks.") and name.endswith(".bias") and cat != "norms") * 2 / tp


def activation_bytes(config: TransformerConfig, setup: Setup, *, device_type: str = "cuda") -> dict[str, Any]:
    """Bytes saved for backward on one device for one micro-batch, by category (see :data:`CATEGORIES`).

    The sum over categories is the activation memory the estimator reports. Values are ints for scalar
    inputs and numpy arrays when ``setup`` was built with array-valued batch/seq by a vectorised sweep.
    """
    _check(config, setup)
    check_call(setup, device_type)
    return bytes_by_category(term_rows(config, setup, device_type=device_type), setup.tp, setup.sp)


def bytes_by_category(rows: list[TermRow], tp: int = 1, sp: bool = False) -> dict[str, Any]:
    """Bytes on one tensor-parallel rank of :func:`term_rows`' rows (as :meth:`ActivationTerm.bytes` computes them)
    summed by category, in first-seen order, whole floats as ints: :func:`activation_bytes` of rows already listed
    (the estimator lists them once per estimate)."""
    out: dict[str, Any] = {}
    get = out.get
    for row in rows:
        category = row[1]
        out[category] = get(category, 0) + row[2] * row[3] / row_divisor(row, tp, sp)
    return {k: (int(v) if isinstance(v, float) and v.is_integer() else v) for k, v in out.items()}


def reference_activation_bytes(config: TransformerConfig, setup: Setup, *, device_type: str = "cuda") -> float:
    """Activation bytes (saved for backward, one device, one micro-batch) of ``config``'s sizes counted as memlab's
    reference GPT is written: every implementation trait at :data:`memlab.predict.spec.traits.REFERENCE`. The "reference
    formula" a family's real saved bytes differ from by what its modelling code does (:func:`trait_effects`)."""
    return float(sum(activation_bytes(config.with_(impl=REFERENCE), setup, device_type=device_type).values()))


def trait_effects(config: TransformerConfig, setup: Setup, *, device_type: str = "cuda") -> dict[str, float]:
    """Bytes each implementation trait adds to the activations of ``config`` under ``setup``: the prediction with
    the trait minus the prediction with that one trait set back to the reference GPT's value (largest first,
    zero effects left out). It names the operation behind a residual between the reference formula and a model
    (what :func:`memlab.measure.by_op.layer_listing` then shows tensor by tensor)."""
    def total(cfg: TransformerConfig) -> float:
        return float(sum(activation_bytes(cfg, setup, device_type=device_type).values()))

    ref, base = Implementation(), total(config)
    out: dict[str, float] = {}
    for name in config.impl.differs():
        changes: dict[str, object] = {name: getattr(ref, name)}
        if name == "parallel_block":  # a shared norm only exists in a parallel block
            changes["shared_norm"] = False
        off = config.with_(impl=replace(config.impl, **changes))
        if (delta := base - total(off)) != 0:
            out[name] = delta
    return dict(sorted(out.items(), key=lambda kv: -abs(kv[1])))
