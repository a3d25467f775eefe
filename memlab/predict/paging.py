"""KV-cache reservation policies and their waste: contiguous per-request slots vs paged blocks [kwon2023].

A serving engine that keeps each request's KV cache in one contiguous slot must reserve the slot before it knows
how long the request will grow. The vLLM paper (Kwon et al. 2023, Sec. 3 and Sec. 6) compares:

- ``max``: every request reserves ``max_len`` tokens (Orca (Max));
- ``pow2``: the final length rounded up to a power of two (Orca (Pow2), a generous oracle about the length);
- ``oracle``: exactly the final length (Orca (Oracle), unrealisable: the output length is not known up front);
- ``paged``: blocks of ``block_tokens`` tokens allocated as the sequence grows (PagedAttention): only the last
  block of each request is partly empty, so the waste is under ``block_tokens`` tokens per request.

Everything is in tokens; multiply by :func:`memlab.predict.memory.inference.kv_cache_bytes` of one token for bytes.
:func:`vllm_kv_blocks` is a serving engine's budget: the KV blocks vLLM allocates from ``gpu_memory_utilization``
and ``block_size``. No torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from memlab.errors import SetupError

POLICIES = ("max", "pow2", "oracle", "paged")


def synthetic_request_lengths(n: int, seed: int, *, mean_prompt: float = 160.0, mean_output: float = 340.0,
                              sigma: float = 1.0, max_len: int = 2048) -> dict[str, np.ndarray]:
    """Seeded synthetic request lengths: prompt and output tokens, each lognormal with the given mean.

    Heavy-tailed like chat traces (the vLLM paper's ShareGPT workload has long outputs and a long tail); the
    defaults are chosen to resemble it, not taken from it. ``prompt + output`` is clipped to ``max_len``.
    Returns ``{"prompt": ..., "output": ..., "total": ...}`` as integer arrays.
    """
    if not isinstance(n, int) or n <= 0:
        raise SetupError(f"n must be a positive integer, got {n!r}")
    if mean_prompt <= 0 or mean_output <= 0 or sigma <= 0 or max_len < 2:
        raise SetupError("mean_prompt, mean_output and sigma must be positive and max_len at least 2")
    rng = np.random.default_rng(seed)
    mu = np.log([mean_prompt, mean_output]) - sigma**2 / 2  # lognormal mean = exp(mu + sigma^2 / 2)
    prompt = np.maximum(1, np.rint(rng.lognormal(mu[0], sigma, n))).astype(np.int64)
    output = np.maximum(1, np.rint(rng.lognormal(mu[1], sigma, n))).astype(np.int64)
    prompt = np.minimum(prompt, max_len - 1)
    output = np.minimum(output, max_len - prompt)
    return {"prompt": prompt, "output": output, "total": prompt + output}


def reserved_tokens(lengths: Any, policy: str, *, max_len: int = 2048, block_tokens: int = 16) -> np.ndarray:
    """Tokens of KV cache each request holds at its longest under ``policy`` (see the module docstring)."""
    n = np.asarray(lengths, dtype=np.int64)
    if n.size == 0 or n.min() < 1:
        raise SetupError("lengths must be a non-empty array of positive token counts")
    if n.max() > max_len:
        raise SetupError(f"a request of {int(n.max())} tokens exceeds max_len={max_len}: raise max_len")
    if not isinstance(block_tokens, int) or block_tokens < 1:
        raise SetupError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    if policy == "max":
        return np.full_like(n, max_len)
    if policy == "pow2":
        return np.minimum(2 ** np.ceil(np.log2(n)).astype(np.int64), max_len)
    if policy == "oracle":
        return n.copy()
    if policy == "paged":
        return block_tokens * ((n + block_tokens - 1) // block_tokens)
    raise SetupError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")


def kv_waste(lengths: Any, *, max_len: int = 2048, block_tokens: int = 16) -> list[dict[str, Any]]:
    """One row per policy: tokens used, reserved, the wasted fraction of the reservation and the used share.

    ``used_share`` is the fraction of reserved KV memory holding real tokens once every request has reached its
    final length: the over-reservation only. The vLLM paper's measure (its Fig. 2: 20.4 %-38.2 % for the existing
    systems it profiled, about 96 % for vLLM) is the occupancy *during* serving, lower for every contiguous
    policy (``memlab.labs.inference.serving_occupancy`` computes it).
    """
    n = np.asarray(lengths, dtype=np.int64)
    used = int(n.sum())
    rows = []
    for policy in POLICIES:
        res = int(reserved_tokens(n, policy, max_len=max_len, block_tokens=block_tokens).sum())
        rows.append({"policy": policy, "requests": int(n.size), "used_tokens": used, "reserved_tokens": res,
                     "wasted_fraction": (res - used) / res, "used_share": used / res})
    return rows


def max_sequences(config: Any, capacity_bytes: int, context: int, *, weights: str = "bf16", kv_dtype: str = "bf16",
                  tp: int = 1) -> int:
    """Sequences of ``context`` tokens whose KV cache fits next to the weights in ``capacity_bytes`` (decode-time
    memory: weights + KV cache, no activations, no allocator margin), on one of ``tp`` tensor-parallel devices.

    This is the serving engines' view, an upper bound: they size the KV pool from what the weights leave [kwon2023],
    so the prefill's largest moment (what :func:`memlab.predict.fit.max_batch` adds to weights + KV) is left out
    here; :func:`vllm_kv_blocks` takes out the profiled peak and vLLM's margin as vLLM does.
    """
    from memlab.predict.estimate import estimate
    from memlab.predict.memory.inference import kv_cache_bytes
    from memlab.predict.spec.setup import Setup

    if not isinstance(context, int) or context <= 0:
        raise SetupError(f"context must be a positive integer, got {context!r}")
    w = estimate(config, Setup(mode="inference", batch=1, seq=1, inference_weights=weights, kv_cache_dtype=kv_dtype,
                               tp=tp)).params_bytes
    per_seq = kv_cache_bytes(config, 1, context, kv_dtype, tp)
    return max(0, int((capacity_bytes - w) // per_seq))


# -- a serving engine's budget: vLLM's KV pool ----------------------------------------------------------------------
VLLM_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``gpu_memory_utilization``: the share of the device's memory the engine may use [vllm-engine-args]."""
VLLM_BLOCK_SIZE = 16
"""vLLM's default ``block_size`` on CUDA: tokens per KV block [vllm-engine-args] (PagedAttention's blocks,
[kwon2023])."""


@dataclass(frozen=True)
class VllmBudget:
    """vLLM's KV pool on one device, in bytes and blocks (:func:`vllm_kv_blocks`)."""

    capacity_bytes: int
    utilization: float
    weights_bytes: int
    activation_peak_bytes: int
    block_size: int
    block_bytes: int
    """One block: ``block_size`` tokens of every layer's K and V."""
    pool_bytes: int
    """``utilization x capacity - weights - activation peak`` (0 when that is negative)."""
    blocks: int

    @property
    def tokens(self) -> int:
        """Tokens the pool holds: blocks x block_size."""
        return self.blocks * self.block_size

    def sequences(self, context: int) -> int:
        """Sequences of ``context`` tokens the pool holds at once, each in whole blocks (its last one partly
        empty)."""
        if not isinstance(context, int) or isinstance(context, bool) or context <= 0:
            raise SetupError(f"context must be a positive integer, got {context!r}")
        return self.blocks // -(-context // self.block_size)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields and the tokens."""
        return {**asdict(self), "tokens": self.tokens}


def vllm_kv_blocks(capacity_bytes: int, weights_bytes: int, activation_peak_bytes: int, kv_bytes_per_token: int, *,
                   utilization: float = VLLM_GPU_MEMORY_UTILIZATION, block_size: int = VLLM_BLOCK_SIZE) -> VllmBudget:
    """The KV blocks vLLM allocates on one device: ``(utilization x capacity - weights - the profiled activation
    peak) // (block_size x per-token KV bytes)``, at least 0.

    vLLM runs a profiling forward at start-up, takes the device memory it then holds (the weights and that
    forward's activation peak) and gives what ``utilization`` of the device's memory leaves to KV blocks
    [vllm-worker: ``Worker.determine_num_available_blocks``, ``num_gpu_blocks = int((total_gpu_memory *
    gpu_memory_utilization - peak_memory) // cache_block_size)``], a block being ``block_size`` tokens of every
    layer's keys and values [vllm-worker: ``CacheEngine.get_cache_block_size``: layers x block_size x 2 x KV heads
    x head_size x dtype bytes]. ``kv_bytes_per_token`` is that per token
    (:func:`memlab.predict.memory.inference.kv_cache_bytes` of one token). Bytes; a pure function of its inputs
    (the profiled peak is vLLM's own measurement: pass the estimate of the forward it profiles)."""
    for name, v in (("capacity_bytes", capacity_bytes), ("weights_bytes", weights_bytes),
                    ("activation_peak_bytes", activation_peak_bytes), ("kv_bytes_per_token", kv_bytes_per_token),
                    ("block_size", block_size)):
        if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < (1 if name in (
                "capacity_bytes", "kv_bytes_per_token", "block_size") else 0):
            raise SetupError(f"{name} must be a whole number of bytes (tokens for block_size), got {v!r}")
    if isinstance(utilization, bool) or not isinstance(utilization, int | float) or not 0 < utilization <= 1:
        raise SetupError(f"utilization must be a share of the device's memory in (0, 1], got {utilization!r}")
    pool = max(0, int(utilization * capacity_bytes) - weights_bytes - activation_peak_bytes)
    block = block_size * int(kv_bytes_per_token)
    return VllmBudget(int(capacity_bytes), float(utilization), int(weights_bytes), int(activation_peak_bytes),
                      int(block_size), block, pool, pool // block)
