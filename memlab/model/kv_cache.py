"""The reference GPT's KV caches for inference, the two transformers' ``generate()`` runs.

:class:`KVCache` holds ``2 * n_layers * batch * max_len * n_kv_heads * head_dim`` elements allocated up front
(the bytes :func:`memlab.predict.memory.inference.kv_cache_bytes` predicts), so decoding never grows it; each layer
writes into its slice through a :class:`LayerCache`: serving engines' and transformers' ``StaticCache``.
:class:`DynamicKVCache` grows each layer's keys and values by ``torch.cat`` at every forward, as transformers'
``DynamicCache`` (generate()'s default) does, so a layer's old and new tensors coexist for a moment.
"""

from __future__ import annotations

import torch

from memlab.predict.spec.model import TransformerConfig


class LayerCache:
    """One layer's slice of a :class:`KVCache`: writes new keys/values at ``start`` and returns all so far."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        self.k, self.v, self.start = k, v, start

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.start + k.shape[1]
        self.k[:, self.start : end] = k
        self.v[:, self.start : end] = v
        return self.k[:, :end], self.v[:, :end]


class KVCache:
    """Preallocated keys and values for every layer, each (batch, max_len, n_kv_heads, head_dim).

    Its size is 2 * n_layers * batch * max_len * n_kv_heads * head_dim * element size bytes, allocated up
    front as serving engines do, so its memory does not grow during decoding.
    """

    def __init__(
        self,
        config: TransformerConfig,
        batch: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (batch, max_len, config.n_kv_heads or config.n_heads, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layers)]
        self.length = 0

    def layer(self, i: int) -> LayerCache:
        """Layer ``i``'s cache, positioned at the current length."""
        return LayerCache(self.k[i], self.v[i], self.length)

    def nbytes(self) -> int:
        """Bytes of all cache tensors."""
        return sum(t.untyped_storage().nbytes() for t in self.k + self.v)


class DynamicLayerCache:
    """One layer of a :class:`DynamicKVCache`: ``append`` concatenates the new keys, then the new values, onto the
    layer's tensors and drops the old ones, as transformers' ``DynamicLayer.update`` does [hf-transformers:
    cache_utils.py ``DynamicLayer.update``: ``self.keys = torch.cat([self.keys, key_states], dim=-2)``, then the
    values]."""

    def __init__(self, cache: DynamicKVCache, i: int) -> None:
        self.cache, self.i, self.start = cache, i, cache.length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, i = self.cache, self.i
        c.k[i] = torch.cat([c.k[i], k], dim=1)
        c.v[i] = torch.cat([c.v[i], v], dim=1)
        return c.k[i], c.v[i]


class DynamicKVCache:
    """Keys and values per layer, each (batch, length, n_kv_heads, head_dim), grown by ``torch.cat`` at every
    forward: empty until the prefill writes the prompt (transformers' ``DynamicLayer.lazy_initialization`` starts
    from an empty tensor too). Same interface as :class:`KVCache`."""

    def __init__(self, config: TransformerConfig, batch: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        shape = (batch, 0, config.n_kv_heads or config.n_heads, config.head_dim)
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layers)]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layers)]
        self.length = 0

    def layer(self, i: int) -> DynamicLayerCache:
        """Layer ``i``'s cache, positioned at the current length."""
        return DynamicLayerCache(self, i)

    def nbytes(self) -> int:
        """Bytes of all cache tensors."""
        return sum(t.untyped_storage().nbytes() for t in self.k + self.v)
