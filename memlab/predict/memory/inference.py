"""Inference terms: the KV cache, the prefill's transient, and quantised weights' group scales. Bytes; no torch.
"""

from __future__ import annotations

import math
from typing import Any

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


def prefill_transient_bytes(config: TransformerConfig, batch: Any, seq: Any, compute_bytes: float, tp: int,
                            fused_attention: bool) -> dict[str, Any]:
    """Candidates for the largest transient tensors of one full-prompt forward (inference), bytes per device.

    - ``logits``: batch x seq x vocab in fp32 (Hugging Face causal-LM heads upcast logits with ``.float()``);
      vocab-parallel over tp.
    - ``mlp``: the MLP's inner tensors alive together: up and activation output (gelu, 2 x b·s·f) or gate, up
      and their product (swiglu, 3 x b·s·f) in the compute dtype, split over tp.
    - ``attention_scores``: eager/math attention materialises scores and softmax (2 x b·a·s² in the compute
      dtype, heads split over tp); fused kernels (FlashAttention, Dao et al. 2022) keep none.
    The estimate counts the largest of these; weights and KV cache are counted separately.
    """
    mlp_factor = 3 if config.mlp == "swiglu" else 2
    scores = 0 if fused_attention else 2 * batch * math.ceil(config.n_heads / tp) * seq * seq * compute_bytes
    return {
        "logits": batch * seq * math.ceil(config.vocab_size / tp) * 4,
        "mlp": mlp_factor * batch * seq * math.ceil(config.ffn / tp) * compute_bytes,
        "attention_scores": scores,
    }


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
