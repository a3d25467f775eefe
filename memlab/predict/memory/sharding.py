"""How parameters split over ranks: ZeRO stage divisors [rajbhandari2019], tensor-parallel shard shapes
[shoeybi2019], and the per-rank parameter statistics the estimator needs. Elements and bytes; no torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from memlab.errors import SetupError
from memlab.predict.families.order import registration_order
from memlab.predict.memory.inference import quant_scale_bytes
from memlab.predict.memory.states import (
    ADAM_8BIT_MIN_SIZE,
    ADAM_8BIT_QMAP_BYTES,
    adafactor_tensor_elements,
    adam8bit_tensor_bytes,
)
from memlab.predict.spec.model import TransformerConfig


def zero_divisors(stage: int, ranks: int) -> tuple[int, int, int]:
    """How many ranks share (parameters, gradients, optimizer states) under ZeRO stage 0-3.

    Rajbhandari et al. 2019, Sec. 5: P_os (stage 1) partitions optimizer states, P_os+g (2) also gradients,
    P_os+g+p (3) also parameters. FSDP FULL_SHARD is stage 3, SHARD_GRAD_OP stage 2 (PyTorch FSDP docs).
    """
    return (ranks if stage >= 3 else 1, ranks if stage >= 2 else 1, ranks if stage >= 1 else 1)


def tp_shard_shape(name: str, shape: tuple[int, ...], config: TransformerConfig, tp: int) -> tuple[int, ...]:
    """Shape of one parameter on one tensor-parallel rank (Megatron-LM, Shoeybi et al. 2019, Sec. 3).

    Column-parallel q, k, v, up, gate split their output rows (and biases); row-parallel o and down split their
    input columns and replicate their biases; the embedding is vocab-parallel and the LM head column-parallel
    (rows split); norms and learned positions are replicated. K/V split over min(tp, n_kv_heads) ranks: a KV
    head is replicated when tp exceeds the number of KV heads. Uneven splits round up.
    """
    if tp == 1:
        return shape
    kind = name.split(".")[-2]
    kv_tp = min(tp, int(config.n_kv_heads or config.n_heads))
    if kind in ("q", "up", "gate", "tok_emb", "head"):
        return (math.ceil(shape[0] / tp), *shape[1:])
    if kind in ("k", "v"):
        return (math.ceil(shape[0] / kv_tp), *shape[1:])
    if kind in ("o", "down") and len(shape) == 2:
        return (shape[0], math.ceil(shape[1] / tp))
    return shape


@dataclass(frozen=True)
class ShapeSummary:
    """Parameter statistics of ONE tensor-parallel rank, computed from exact shapes (counts of elements/bytes)."""

    param_count: int
    """The whole model's parameter count (all ranks; tied embeddings once)."""
    elements: int
    tensors: int
    quantizable_elements: int
    """2-D block weights (what int8/int4 inference quantises; embeddings, head, norms stay 16-bit)."""
    layer_elements: int
    """One transformer block's parameters (what FSDP gathers per wrapped block)."""
    adafactor_elements: int
    largest_elements: int = 0
    """The largest single tensor (a for-loop optimizer's temporaries are this size)."""
    embedding_elements: int = 0
    """Token and position embeddings (their gradients appear last in backward)."""
    loop_peak_elements: int = 0
    """max over parameters, in the order the model registers them
    (:func:`memlab.predict.families.order.registration_order`: a Hugging Face family's own), of 2 x this tensor
    + the previous one: a for-loop Adam step keeps the previous tensor's ``denom`` alive (a loop variable) while
    making this one's ``sqrt`` and division."""
    adam8bit_bytes: int = 0
    """bitsandbytes 8-bit AdamW's state: per tensor plus the two shared quantisation maps once
    (:func:`memlab.predict.memory.states.adam8bit_bytes`)."""
    int8_scale_bytes: int = 0
    int4_scale_bytes: int = 0


def check_tp(config: TransformerConfig, tp: int) -> None:
    """Raise :class:`SetupError` unless ``tp`` splits heads, KV heads and the MLP evenly (as Megatron requires)."""
    n_kv = int(config.n_kv_heads or config.n_heads)
    if config.n_heads % tp or config.ffn % tp:
        raise SetupError(f"tp={tp} must divide n_heads={config.n_heads} and d_ff={config.ffn}: pick a divisor")
    if (tp % n_kv) if tp > n_kv else (n_kv % tp):
        raise SetupError(f"tp={tp} and n_kv_heads={n_kv} must divide one another: pick tp accordingly")


@functools.lru_cache(maxsize=128)
def shape_summary(config: TransformerConfig, tp: int = 1) -> ShapeSummary:
    """:class:`ShapeSummary` of ``config`` on one of ``tp`` tensor-parallel ranks (cached: configs are frozen)."""
    check_tp(config, tp)
    s = {k: 0 for k in ShapeSummary.__dataclass_fields__}
    for name, shape, comp in config.param_shapes():
        shard = tp_shard_shape(name, shape, config, tp)
        n = math.prod(shard)
        s["param_count"] += math.prod(shape)
        s["elements"] += n
        s["tensors"] += 1
        s["adafactor_elements"] += adafactor_tensor_elements(shard)
        s["adam8bit_bytes"] += adam8bit_tensor_bytes(n)
        s["largest_elements"] = max(s["largest_elements"], n)
        if name in ("tok_emb.weight", "pos_emb.weight"):
            s["embedding_elements"] += n
        if name.startswith("blocks.0."):
            s["layer_elements"] += n
        if len(shard) == 2 and comp in ("attention", "mlp"):
            s["quantizable_elements"] += n
            s["int8_scale_bytes"] += quant_scale_bytes(*shard, "int8")
            s["int4_scale_bytes"] += quant_scale_bytes(*shard, "int4")
    prev = 0
    for name, shape, _ in registration_order(config):  # the order model.parameters() yields, so the loop steps
        n = math.prod(tp_shard_shape(name, shape, config, tp))
        s["loop_peak_elements"] = max(s["loop_peak_elements"], 2 * n + prev)
        prev = n
    if s["largest_elements"] >= ADAM_8BIT_MIN_SIZE:  # the quantisation maps the 8-bit tensors share
        s["adam8bit_bytes"] += ADAM_8BIT_QMAP_BYTES
    return ShapeSummary(**s)
