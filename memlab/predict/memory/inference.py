"""Inference terms: the KV cache, the prefill's transient, and quantised weights' group scales. Bytes; no torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from memlab.errors import ConfigError, SetupError
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.precision import DTYPE_BYTES
from memlab.predict.spec.validate import canonical_choice, check_int, check_number, show

INT4_GROUP = 128
"""Weights per quantisation group for int4 (AWQ, Lin et al. 2023, and GPTQ, Frantar et al. 2022, "w4-g128")."""


def _check(config: object, dtype: str, tp: object) -> str:
    """The canonical KV-cache dtype name (any case), after checking the config and tp."""
    if not isinstance(config, TransformerConfig):
        raise ConfigError(f"config must be a TransformerConfig, got {type(config).__name__}")
    dtype = canonical_choice(dtype, DTYPE_BYTES)
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise SetupError(f"KV-cache dtype must be one of {', '.join(DTYPE_BYTES)}, got {show(dtype)}")
    check_int("tp", tp, err=SetupError)
    return dtype


def kv_cache_bytes(config: TransformerConfig, batch: Any, seq: Any, dtype: str, tp: int = 1) -> Any:
    """KV cache on one device: 2 (K and V) x n_layers x batch x seq x kv_dim x bytes(dtype), GQA-aware.

    kv_dim = n_kv_heads x head_dim (Ainslie et al. 2023, GQA); KV heads split over min(tp, n_kv_heads) ranks
    (Pope et al. 2022, "Efficiently Scaling Transformer Inference", Sec. 3.1). ``seq`` is the full cached context
    (prompt + generated tokens). Works on numpy arrays for batch/seq.
    """
    dtype = _check(config, dtype, tp)
    for name, v in (("batch", batch), ("seq", seq)):
        if not hasattr(v, "shape"):  # scalars are checked here; sweep_totals checks its arrays
            check_number(name, v, lo=1.0, err=SetupError)
    n_kv = int(config.n_kv_heads or config.n_heads)
    heads_per_rank = math.ceil(n_kv / min(tp, n_kv))
    return 2 * config.n_layers * batch * seq * heads_per_rank * config.head_dim * DTYPE_BYTES[dtype]


def prompt_tokens(seq: Any) -> Any:
    """The prompt a prefill runs: ``seq - 1`` tokens (the longest that leaves one token to generate, so the decode
    step reaches a context of ``seq``), at least 1. Works on numpy arrays."""
    return np.maximum(seq - 1, 1) if hasattr(seq, "shape") else max(seq - 1, 1)


def _streams(config: TransformerConfig) -> int:
    """Hidden-size tensors per token alive at a block's MLP, in the reference GPT's forward (memlab.model.gpt): the
    embedding (held by the model's forward), the block's input (held by the loop over blocks; the embedding itself
    in a one-block model), the block's stream after attention and the norm's output; a parallel block with its own
    second norm (GPT-NeoX) adds that norm's output."""
    blocks = 4 if config.n_layers > 1 else 3
    return blocks + (1 if config.impl.parallel_block and not config.impl.shared_norm else 0)


def _attention_moment(config: TransformerConfig, h: int, q_dim: int, kv_dim: int, cb: float,
                      unwritten: float = 0) -> float:
    """Bytes per token of the attention's largest moment in the reference GPT's forward (memlab.model.gpt), the
    streams but one (the embedding, the block's input, the norm's output) beside:

    - q, k and v when the cache takes the new keys and values;
    - with rotary positions, the rotation of q (then of k, q's rotated copy alive): the input upcast to fp32 (no
      copy in fp32), each half's two products and their combination, 8 bytes per rotated element at most;
    - at the output projection: q, the kernel's output (its (b, s, a x d) view: fused kernels write that layout)
      and the projection's output (k and v are the cache's from the append on).

    ``unwritten``: bytes per token of the layer's keys and values a growing cache has not taken yet when q and k
    rotate (a dynamic cache's last layer; the prefill counts the whole cache beside its moments). The fused
    kernel's own workspace is not counted (none on the CPU kernels traced)."""
    streams = (_streams(config) - 1) * h * cb
    moments = [streams + (q_dim + 2 * kv_dim) * cb, streams + (2 * q_dim + h) * cb]
    if config.positions == "rotary":
        up = 0 if cb == 4 else 4  # x.float() copies a 16-bit input
        moments += [streams + (q_dim + 2 * kv_dim) * cb + (up + 8) * q_dim - unwritten,
                    streams + (2 * q_dim + 2 * kv_dim) * cb + (up + 8) * kv_dim - unwritten]
    return max(moments)


def prefill_transient_bytes(config: TransformerConfig, batch: Any, seq: Any, compute_bytes: float, tp: int,
                            fused_attention: bool, keep: int = 0, unwritten: float = 0) -> dict[str, Any]:
    """The moments of one forward over a ``seq``-token prompt (no cache growth; the cache is counted apart), bytes
    per device, each the tensors alive together beyond the weights and the KV cache (memlab.model.gpt's forward,
    whose liveness mirrors transformers' decoder layers):

    - ``mlp``: the hidden-size streams alive at a block's MLP (:func:`_streams`) and the MLP's inner tensors: up and
      its activation (gelu, 2 x f) or the activated gate, up and their product (swiglu, 3 x f), f split over tp;
    - ``attention``: the largest of the attention's moments (:func:`_attention_moment`);
    - ``logits``: the final norm's output and the logits of the last ``keep`` positions (0: every position) in the
      compute dtype, with the kept positions' contiguous copy where the slice is no view (batch > 1, 1 < keep <
      seq, as :func:`memlab.predict.memory.loss.kept_copy`): transformers' causal LMs slice the final hidden
      states before the head (``slice_logits_to_keep``) and upcast to fp32 only in the loss [hf-transformers:
      loss/loss_utils.py]; vocab-parallel over tp;
    - ``attention_scores``: eager/math attention's scores and softmax (2 x b·a·s² in the compute dtype, heads split
      over tp; a lower bound of what eager keeps: memlab.predict.coverage); fused kernels (Dao et al. 2022) keep none.

    The estimate counts the largest. ``unwritten``: see :func:`_attention_moment`. Works on numpy arrays for batch
    and seq.
    """
    t = batch * seq
    h, ffn, cb = config.d_model, math.ceil(config.ffn / tp), compute_bytes
    q_dim = math.ceil(config.n_heads / tp) * config.head_dim
    kv_dim = math.ceil(int(config.n_kv_heads or config.n_heads) / tp) * config.head_dim
    mlp_factor = 3 if config.mlp == "swiglu" else 2
    kept = seq if not keep else np.minimum(keep, seq) if hasattr(seq, "shape") else min(keep, seq)
    copied = (kept != seq) * (batch != 1) * (kept != 1)
    scores = 0 if fused_attention else 2 * batch * math.ceil(config.n_heads / tp) * seq * seq * cb
    return {
        "mlp": (_streams(config) * h + mlp_factor * ffn) * t * cb,
        "attention": _attention_moment(config, h, q_dim, kv_dim, cb, unwritten) * t,
        "logits": (t * h + copied * batch * kept * h + batch * kept * math.ceil(config.vocab_size / tp)) * cb,
        "attention_scores": scores,
    }


def decode_transient_bytes(config: TransformerConfig, batch: Any, seq: Any, compute_bytes: float, tp: int,
                           fused_attention: bool, kv_dtype: str, cache: str) -> dict[str, Any]:
    """The moments of one decode step to a context of ``seq`` tokens beyond the weights and the whole cache of
    ``seq`` tokens, bytes per device: :func:`prefill_transient_bytes` over one token per sequence, plus

    - ``cache_growth`` (``cache='dynamic'``): transformers' ``DynamicLayer.update`` concatenates each layer's new
      keys, then its new values, onto the old ones with ``torch.cat`` [hf-transformers: cache_utils.py
      ``DynamicLayer.update``, lines 136-137 of transformers 5.25.0], so at the last layer's values the old values
      (``seq - 1`` tokens) coexist with the new: one layer's V of ``seq - 1`` tokens, beside the token's streams,
      q, k and v. ``static`` (``StaticLayer.update``: ``index_copy_`` into tensors preallocated to the maximum
      length, lines 487-488) writes in place: no such moment;
    - ``attention_scores`` (eager/math): one query row's scores over ``seq`` keys and the contiguous copy of one
      layer's K the score matmul reads (a lower bound, as in prefill: the softmax, the mask and V's copy are not
      counted).
    """
    h, cb = config.d_model, compute_bytes
    kv_heads = math.ceil(int(config.n_kv_heads or config.n_heads) / min(tp, int(config.n_kv_heads or config.n_heads)))
    layer_token = 2 * kv_heads * config.head_dim * DTYPE_BYTES[kv_dtype]  # one token's K and V in one layer
    one = prefill_transient_bytes(config, batch, 1, compute_bytes, tp, fused_attention, keep=1,
                                  unwritten=layer_token if cache == "dynamic" else 0)
    q_dim = math.ceil(config.n_heads / tp) * config.head_dim
    layer_v = batch * (seq - 1) * kv_heads * config.head_dim * DTYPE_BYTES[kv_dtype]
    growth = layer_v + ((_streams(config) - 1) * h + q_dim + 2 * kv_heads * config.head_dim) * batch * cb
    a = math.ceil(config.n_heads / tp)
    eager = batch * (a * seq + seq * kv_heads * config.head_dim) * cb
    return {**one, "cache_growth": growth if cache == "dynamic" else 0,
            "attention_scores": 0 if fused_attention else eager}


def quant_scale_bytes(rows: int, cols: int, weights: str) -> int:
    """Extra bytes of quantisation scales for one (rows=out, cols=in) weight.

    int8: one fp32 absmax per output row (LLM.int8() vector-wise quantisation, Dettmers et al. 2022;
    bitsandbytes ``SCB``). int4: per group of 128 input weights per output row one fp16 scale and one packed
    4-bit zero point (AWQ, Lin et al. 2023; GPTQ, Frantar et al. 2022, group size 128). Others: 0.
    """
    if weights == "int8":
        return 4 * rows
    if weights == "int4":
        groups = rows * math.ceil(cols / INT4_GROUP)
        return 2 * groups + math.ceil(groups / 2)
    return 0
