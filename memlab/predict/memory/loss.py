"""The LM head and loss at large vocabularies: what each way of computing the loss keeps and holds for a moment.

``t`` tokens per micro-batch (batch x seq), ``t'`` the tokens the loss reads (``b x logits_to_keep``, or ``t``), ``V``
the vocabulary on this rank, ``h`` the width, ``c`` tokens per chunk. Three ways (``Setup.loss``; the torch twin is
:mod:`memlab.model.loss`):

- ``plain`` (transformers' ``ForCausalLMLoss`` upcasts the logits, ``logits.float()``, before the cross-entropy;
  the reference GPT does the same): keeps the head's input and the fp32 log-softmax (``4 t' V`` bytes, Korthikanti
  et al. 2022 Sec. 4.3 [korthikanti2022]); at the end of forward the fp32 logits are alive (4, 6 or 8 bytes per
  logit: :func:`memlab.predict.memory.phases.step_constants`), at the start of backward two fp32 gradients (8 per
  logit). - ``chunked``: the head and the loss of ``c`` tokens at a time under non-reentrant checkpointing: keeps the
  head's
  input only; one chunk's fp32 logits and log-softmax exist at a time in forward (8 bytes per chunk logit) and,
  recomputed, beside their gradients in backward.
- ``fused`` (Liger-Kernel's fused linear + cross-entropy [liger2024]): the gradients of the head's input (``t' h``,
  activation dtype) and weight (``V h``, parameter dtype) are computed in forward and are what backward keeps;
  one chunk's logits exist at a time. Liger's Triton kernel holds a chunk's logits in the compute dtype (its
  gradient is written over them); memlab's pure-torch reference (:class:`memlab.model.loss.FusedLinearCrossEntropy`,
  which runs on a CPU and on fake tensors) upcasts the chunk: 8 bytes per chunk logit, as ``chunked``.

The chunk is Liger's by default: ``next_pow2(ceil(t' / ceil(V / h)))`` tokens, at most ``t'``, so one chunk's logits
are about the size of the head's input. Pure arithmetic on ints or numpy arrays; no torch. Units: bytes, tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FP32 = 4
INT64 = 8


def kept_positions(setup: Any) -> Any:
    """Positions per sequence the loss reads: ``logits_to_keep`` when set and shorter than ``seq``, else ``seq``."""
    keep, s = setup.logits_to_keep, setup.seq
    if not keep:
        return s
    return np.minimum(keep, s) if isinstance(s, np.ndarray) else min(keep, s)


def chunk_tokens(tokens: Any, vocab: int, width: int, chunk: int = 0) -> Any:
    """Tokens per loss chunk: ``chunk`` (at most ``tokens``), or Liger's rule [liger2024]
    ``next_pow2(ceil(tokens / ceil(V / h)))``, at most ``tokens``. Elementwise on arrays."""
    if chunk:
        return np.minimum(chunk, tokens) if isinstance(tokens, np.ndarray) else min(chunk, tokens)
    inc = -(-vocab // width)
    per = -(-np.asarray(tokens) // inc) if isinstance(tokens, np.ndarray) else -(-tokens // inc)
    if isinstance(per, np.ndarray):
        pow2 = np.left_shift(1, np.ceil(np.log2(np.maximum(per, 1))).astype(np.int64))
        return np.minimum(pow2, tokens)
    return min(1 << max(per - 1, 0).bit_length(), tokens)


def kept_copy(setup: Any) -> Any:
    """1 where the last ``logits_to_keep`` positions are copied to be contiguous (batch > 1 and 1 < k < seq: the
    slice is no view of ``(b k, h)``), else 0. The copy is what the head keeps; the whole hidden state is alive
    only while the loss runs. Elementwise on arrays."""
    k, s, b = kept_positions(setup), setup.seq, setup.batch
    return (k != s) * (b != 1) * (k != 1)


def hf_kept_labels(setup: Any, padded: bool) -> Any:
    """1 where Hugging Face's own loss reads kept positions (``padded``: the model pads its labels,
    ``ForCausalLMLoss``; plain loss; ``logits_to_keep`` < seq): it pads the last k labels into a new tensor and
    keeps that (``b k + 1`` ids at batch 1, a ``b k`` contiguous copy otherwise), not the step's labels."""
    return padded * (setup.loss == "plain") * (kept_positions(setup) != setup.seq)


def targets_saved(setup: Any, padded: bool = False) -> Any:
    """1 where the step's target ids are saved for backward (by the loss, or by the chunked loss's checkpoints),
    0 where nothing saves them: the fused loss, kept positions that are copied (their copy is saved instead) and
    Hugging Face's padded kept labels (:func:`hf_kept_labels`). The training loop holds them either way."""
    return (setup.loss != "fused") * (1 - kept_copy(setup)) * (1 - hf_kept_labels(setup, padded))
