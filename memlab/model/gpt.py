"""The reference GPT: a decoder-only transformer built from a :class:`~memlab.predict.spec.model.TransformerConfig`.

It exists so that every prediction of :mod:`memlab.predict.estimate` can be checked by a measurement of the *same*
model: its parameter names and shapes are exactly :meth:`TransformerConfig.param_shapes`, and what it saves for
backward is what :mod:`memlab.predict.memory.activations` predicts, term by term. The code is written for that
accountability, not for speed: each choice that changes saved memory is stated where it is made.

Attention implementations (``attention=``):

- ``eager``: softmax(QK^T / sqrt(d)) V written out; keeps the b x a x s x s probabilities for backward.
- ``math``, ``flash``, ``efficient``, ``cudnn``: ``torch.nn.functional.scaled_dot_product_attention`` pinned to
  that SDPA backend. Which backends run depends on the device and torch build; an unavailable one gets a
  :class:`~memlab.errors.SetupError` naming the ones that work (on CPU with torch 2.13: math and flash).

Recompute policies (``recompute=``), following Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", Sections 4-5):

- ``none``: everything the backward needs is kept.
- ``selective``: the attention core (QK^T, mask, softmax, dropout, attention x V) is recomputed in backward; the
  projection matmuls' inputs and outputs are kept. This removes the O(s^2) term, which is the paper's selective
  recomputation.
- ``full``: each block is recomputed from its input (``torch.utils.checkpoint``, non-reentrant); only block
  inputs are kept. With ``recompute_every=k`` only blocks ``i`` (from 0) with ``(i + 1) % k == 0`` are checkpointed
  and the others keep everything, torchtitan's layer policy (``selective_ac_option="k"``;
  :func:`memlab.predict.spec.setup.checkpointed_blocks` cites its line).
- ``op``: every block checkpointed under torchtitan's per-op policy (:mod:`memlab.model.policies`): the block's
  input and the outputs of its odd-numbered ``aten.mm`` calls (and of CUDA's fused attention) are kept.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from memlab.errors import SetupError
from memlab.model.kv_cache import DynamicKVCache, KVCache, LayerCache
from memlab.model.loss import LossOptions, lm_loss, logits_loss
from memlab.model.policies import torchtitan_op_context
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import KERNELS, RECOMPUTE, checkpointed_blocks
from memlab.predict.spec.validate import canonical_choice

_SDPA_BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                  "cudnn": "CUDNN_ATTENTION"}


def sdpa_backend(name: str) -> object:
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, _SDPA_BACKENDS[name])


def available_attention(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> list[str]:
    """Attention implementations that actually run on ``device`` for ``dtype`` (probed with a tiny call)."""
    device = torch.device(device)
    out = ["eager"]
    q = torch.randn(1, 2, 8, 16, device=device, dtype=dtype, requires_grad=True)
    for name in _SDPA_BACKENDS:
        try:
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(sdpa_backend(name)):
                F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            out.append(name)
        except (RuntimeError, NotImplementedError):
            continue
    return out


class Norm(nn.Module):
    """LayerNorm (with or without bias) or RMSNorm, as the config says."""

    def __init__(self, config: TransformerConfig, device: torch.device | None, dtype: torch.dtype | None) -> None:
        super().__init__()
        h = config.d_model
        self.kind = config.norm
        self.weight = nn.Parameter(torch.ones(h, device=device, dtype=dtype))
        has_bias = config.norm == "layernorm" and config.bias
        self.bias = nn.Parameter(torch.zeros(h, device=device, dtype=dtype)) if has_bias else None
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        # Written out (not F.rms_norm) so every device keeps the same tensors: x, rstd and x * rstd.
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * rstd) * self.weight


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021, RoFormer) in the half-split form used by Llama/GPT-NeoX.

    cos and sin are fp32 non-persistent buffers shared by every layer. The rotation is done in fp32 and cast
    back, so whatever the precision it saves only those buffers for backward (the input's gradient needs cos
    and sin, not the input): rotary adds no activations.
    """

    def __init__(self, config: TransformerConfig, device: torch.device | None) -> None:
        super().__init__()
        d = config.head_dim
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        t = torch.arange(config.max_seq, device=device, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (max_seq, d/2)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Rotate ``x`` of shape (batch, seq, heads, head_dim) whose first position is ``start``."""
        s, half = x.shape[1], x.shape[-1] // 2
        cos, sin = self.cos[start : start + s, None, :], self.sin[start : start + s, None, :]
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def _linear(n_in: int, n_out: int, bias: bool, device: torch.device | None, dtype: torch.dtype | None) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=bias, device=device, dtype=dtype)


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh GELU written out elementwise, as HF's NewGELUActivation: it keeps x, tanh(.), 0.5 x and
    1 + tanh(.) for backward where the fused ``F.gelu(x, approximate="tanh")`` keeps x alone."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_fast(x: torch.Tensor) -> torch.Tensor:
    """The tanh GELU as HF's FastGELUActivation writes it: ``0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 *
    x * x)))``; its products of two tensors keep seven d_ff-wide tensors for backward (0.044715 x and x, x *
    0.797... and 1 + 0.044715 x^2, tanh(.), 0.5 x and 1 + tanh(.))."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


ACTIVATIONS = {"gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu, "gelu_new": gelu_new,
               "gelu_fast": gelu_fast, "relu": F.relu, "silu": F.silu}
REFERENCE_TRAITS = ("activation", "parallel_block", "shared_norm", "qkv_bias", "o_bias", "mlp_bias", "head_bias")
"""The :class:`~memlab.predict.spec.traits.Implementation` traits this GPT implements; the others describe HF code."""


def _biases(config: TransformerConfig) -> tuple[bool, bool, bool]:
    im = config.impl
    return tuple(config.bias if x is None else x for x in (im.qkv_bias, im.o_bias, im.mlp_bias))  # type: ignore


class ScoreSoftmax(nn.Module):
    """Softmax over the attention scores, then attention dropout: where the O(s^2) tensors are kept."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores, dim=-1)
        return F.dropout(probs, p=self.dropout) if self.training and self.dropout > 0 else probs


class AttentionCore(nn.Module):
    """softmax(QK^T / sqrt(d) + causal mask) V, the part selective recompute recomputes. No parameters."""

    def __init__(self, config: TransformerConfig, attention: str) -> None:
        super().__init__()
        self.n_kv_heads = config.n_kv_heads or config.n_heads
        self.attention = attention
        self.dropout = config.dropout
        self.softmax = ScoreSoftmax(config.dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (b, s, a, d) and k, v (b, T, kv, d) to the attended values (b, s, a*d).

        The s queries are the last s of the T positions (T > s when decoding with a KV cache).
        """
        b, s, a, d = q.shape
        T = k.shape[1]
        kv = self.n_kv_heads
        g = a // kv
        drop = self.dropout if self.training else 0.0
        if self.attention == "eager":
            # The g query heads that share a KV head become extra rows, so K and V are never repeated:
            # q -> (b, kv, g*s, d). The contiguous copies are the ones matmul would make (and save) anyway.
            qg = q.view(b, s, kv, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv, g * s, d)
            kt = k.permute(0, 2, 3, 1).contiguous()  # (b, kv, d, T)
            vv = v.transpose(1, 2).contiguous()  # (b, kv, T, d)
            # Scaling by a Python number and adding a mask save nothing for backward.
            scores = torch.matmul(qg, kt) * (1.0 / math.sqrt(d))
            mask = torch.full((s, T), float("-inf"), device=q.device).triu(T - s + 1).to(scores.dtype)
            probs = self.softmax(scores.view(b, kv, g, s, T) + mask)
            out = torch.matmul(probs.view(b, kv, g * s, T), vv)  # (b, kv, g*s, d)
            return out.view(b, kv, g, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, a * d)
        from torch.nn.attention import sdpa_kernel

        if s != T and s != 1:
            raise SetupError("SDPA attention with a KV cache supports a prefill from position 0 or one-token decode")
        try:
            with sdpa_kernel(sdpa_backend(self.attention)):
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2),
                    k.transpose(1, 2),
                    v.transpose(1, 2),
                    dropout_p=drop,
                    is_causal=s == T,
                    enable_gqa=g > 1,
                )
        except RuntimeError as exc:
            if "No available kernel" not in str(exc) and "No viable backend" not in str(exc):
                raise
            works = available_attention(q.device, q.dtype)
            raise SetupError(
                f"SDPA backend {self.attention!r} cannot run this call on {q.device.type} "
                f"(dtype {str(q.dtype).removeprefix('torch.')}, dropout {drop}, head_dim {d}); "
                f"attention that works here: {', '.join(works)}"
            ) from None
        return out.transpose(1, 2).reshape(b, s, a * d)


class Attention(nn.Module):
    """Multi-head / grouped-query attention with separate q, k, v, o projections."""

    def __init__(
        self,
        config: TransformerConfig,
        attention: str,
        recompute: str,
        device: torch.device | None,
        dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        h, k, qd = config.d_model, config.kv_dim, config.q_dim
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.n_kv_heads = config.n_kv_heads or config.n_heads
        qkv_b, o_b, _ = _biases(config)
        self.q = _linear(h, qd, qkv_b, device, dtype)
        self.k = _linear(h, k, qkv_b, device, dtype)
        self.v = _linear(h, k, qkv_b, device, dtype)
        self.o = _linear(qd, h, o_b, device, dtype)
        self.core = AttentionCore(config, attention)
        self.recompute_core = recompute == "selective"
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor, rotary: Rotary | None, kv: LayerCache | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        start = kv.start if kv is not None else 0
        q = self.q(x).view(b, s, self.n_heads, self.head_dim)
        k = self.k(x).view(b, s, self.n_kv_heads, self.head_dim)
        v = self.v(x).view(b, s, self.n_kv_heads, self.head_dim)
        if rotary is not None:
            q, k = rotary(q, start), rotary(k, start)
        if kv is not None:
            k, v = kv.append(k, v)
        if self.recompute_core and torch.is_grad_enabled():
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
        out = self.o(y)
        return F.dropout(out, p=self.dropout) if self.training and self.dropout > 0 else out


class MLP(nn.Module):
    """down(act(up(x))) or, gated (``mlp="swiglu"``, Shazeer 2020), down(act(gate(x)) * up(x)); the activation is
    ``config.impl.act(mlp)``: fused tanh GELU / SiLU by default, or ``gelu_new``, exact ``gelu``, ``relu``."""

    def __init__(self, config: TransformerConfig, device: torch.device | None, dtype: torch.dtype | None) -> None:
        super().__init__()
        h, f, b = config.d_model, config.ffn, _biases(config)[2]
        self.kind, self.act = config.mlp, ACTIVATIONS[config.impl.act(config.mlp)]
        if self.kind == "swiglu":
            self.gate = _linear(h, f, b, device, dtype)
        self.up = _linear(h, f, b, device, dtype)
        self.down = _linear(f, h, b, device, dtype)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.act(self.up(x)) if self.kind == "gelu" else self.act(self.gate(x)) * self.up(x)
        out = self.down(u)
        return F.dropout(out, p=self.dropout) if self.training and self.dropout > 0 else out


class Block(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then + mlp(norm2(.)); parallel (``impl.parallel_block``, GPT-NeoX):
    x + attn(norm1(x)) + mlp(norm2(x)), with ``impl.shared_norm`` (Phi) one norm for both."""

    def __init__(
        self,
        config: TransformerConfig,
        attention: str,
        recompute: str,
        device: torch.device | None,
        dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        self.norm1 = Norm(config, device, dtype)
        self.attn = Attention(config, attention, recompute, device, dtype)
        self.norm2 = None if config.impl.shared_norm else Norm(config, device, dtype)
        self.mlp: nn.Module = MoEMLP(config, device, dtype) if config.is_moe else MLP(config, device, dtype)
        self.recompute_full = recompute in ("full", "op")
        self.op_policy = recompute == "op"  # torchtitan's per-op policy inside the checkpoint
        self.parallel = config.impl.parallel_block

    def _forward(self, x: torch.Tensor, rotary: Rotary | None, kv: LayerCache | None = None) -> torch.Tensor:
        if self.parallel:
            n = self.norm1(x)
            return x + self.attn(n, rotary, kv) + self.mlp(n if self.norm2 is None else self.norm2(x))
        x = x + self.attn(self.norm1(x), rotary, kv)
        return x + self.mlp(self.norm2(x))  # type: ignore[misc]

    def forward(self, x: torch.Tensor, rotary: Rotary | None, kv: LayerCache | None = None) -> torch.Tensor:
        if self.recompute_full and torch.is_grad_enabled():
            # Only x is kept (op: and what the policy saves); the rotary module is passed through, its fp32 tables
            # are module buffers.
            if self.op_policy:
                return checkpoint(self._forward, x, rotary, use_reentrant=False, context_fn=torchtitan_op_context)
            return checkpoint(self._forward, x, rotary, use_reentrant=False)
        return self._forward(x, rotary, kv)


class GPT(nn.Module):
    """The reference decoder-only transformer.

    ``forward(idx, targets)`` returns the mean cross-entropy loss when ``targets`` is given (computed by
    :func:`memlab.model.loss.lm_loss` as ``loss`` says: by default the logits cast to fp32 before the loss, as
    mixed-precision recipes do), else the logits. Parameter names match
    :meth:`TransformerConfig.param_shapes`; ``GPT(cfg, device="meta")`` builds any preset without memory.
    """

    def __init__(
        self,
        config: TransformerConfig,
        *,
        attention: str = "eager",
        recompute: str = "none",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        loss: LossOptions | None = None,
        recompute_every: int = 1,
    ) -> None:
        super().__init__()
        self.loss = loss if loss is not None else LossOptions()
        attention, recompute = canonical_choice(attention, KERNELS), canonical_choice(recompute, RECOMPUTE)
        if attention not in KERNELS:
            raise SetupError(f"attention must be one of {', '.join(KERNELS)}, got {attention!r} (resolve 'auto' "
                             "first: memlab.predict.spec.kernels.resolved)")
        if recompute not in RECOMPUTE:
            raise SetupError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        if type(recompute_every) is not int or recompute_every < 1 or (recompute_every > 1 and recompute != "full"):
            raise SetupError(f"recompute_every must be an int >= 1, above 1 only with recompute='full'; got "
                             f"{recompute_every!r} with recompute={recompute!r}")
        other = sorted(set(config.impl.differs()) - set(REFERENCE_TRAITS))
        if other or (config.impl.head_bias and config.tied_embeddings):
            raise SetupError(f"the reference GPT implements the traits {', '.join(REFERENCE_TRAITS)} (head_bias only "
                             f"untied), not {other or ['head_bias with tied embeddings']}: those describe HF code; "
                             "build the HF model (memlab.run.hf) to measure them")
        dev = torch.device(device) if device is not None else None
        self.config, self.attention, self.recompute = config, attention, recompute
        h = config.d_model
        self.tok_emb = nn.Embedding(config.vocab_size, h, device=dev, dtype=dtype)
        self.pos_emb = (
            nn.Embedding(config.max_seq, h, device=dev, dtype=dtype) if config.positions == "learned" else None
        )
        self.rotary = Rotary(config, dev) if config.positions == "rotary" else None
        kept = set(checkpointed_blocks(config.n_layers, recompute_every)) if recompute == "full" else set()
        self.blocks = nn.ModuleList(Block(config, attention, "full" if i in kept else
                                          ("none" if recompute == "full" else recompute), dev, dtype)
                                    for i in range(config.n_layers))
        self.recompute_every = recompute_every
        self.norm_f = Norm(config, dev, dtype)
        self.head = (
            None if config.tied_embeddings
            else nn.Linear(h, config.vocab_size, bias=config.impl.head_bias, device=dev, dtype=dtype)
        )
        if dev is None or dev.type != "meta":
            self.apply(_init_weights)

    @property
    def head_weight(self) -> nn.Parameter:
        """The LM-head matrix (the token embedding when tied)."""
        return self.tok_emb.weight if self.head is None else self.head.weight

    def num_params(self) -> int:
        """Parameters counted once per storage (tied embeddings once), like ``config.param_count()``."""
        seen, n = set(), 0
        for p in self.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n

    def run_blocks(self, x: torch.Tensor, cache: KVCache | DynamicKVCache | None = None) -> torch.Tensor:
        """The residual stream through every block (memlab.labs.checkpointing overrides it to checkpoint groups)."""
        for i, block in enumerate(self.blocks):
            x = block(x, self.rotary, cache.layer(i) if cache is not None else None)
        return x

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, *, cache: KVCache | DynamicKVCache | None = None,
        logits_to_keep: int = 0,
    ) -> torch.Tensor:
        """Loss (with ``targets``) or logits for token ids ``idx`` (batch, seq).

        With a :class:`KVCache` (or a ``DynamicKVCache``) the tokens continue the cached sequence (inference:
        prefill, then decode). ``logits_to_keep`` > 0 (without targets): logits of the last that many positions
        only, the final norm's output sliced before the head, as transformers' causal LMs do
        (``slice_logits_to_keep``) and ``generate()`` asks with 1.
        """
        s = idx.shape[1]
        start = cache.length if cache is not None else 0
        if start + s > self.config.max_seq:
            raise SetupError(
                f"sequence length {start + s} exceeds max_seq={self.config.max_seq} of {self.config.name}"
            )
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + s, device=idx.device))
        x = self.run_blocks(x, cache)
        if cache is not None:
            cache.length += s
        x = self.norm_f(x)
        if targets is None and logits_to_keep:
            x = x[:, -logits_to_keep:]
        if targets is None or (self.loss.kind == "plain" and not self.loss.keep):
            # The head runs as a module when untied (FSDP2 hooks a wrapped head's forward); tied, it is the embedding
            logits = F.linear(x, self.tok_emb.weight) if self.head is None else self.head(x)
            return logits if targets is None else logits_loss(logits, targets)
        bias = None if self.head is None else self.head.bias
        return lm_loss(x, self.head_weight, bias, targets, self.loss)


def _init_weights(module: nn.Module) -> None:
    """GPT-2 style initialisation (normal 0.02, zero biases); the values do not affect memory."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


class MoEMLP(nn.Module):
    """A mixture-of-experts MLP (``TransformerConfig.n_experts > 1``): router + routed experts + shared experts;
    forward maps (b, s, h) to (b, s, h).

    Top-k token-choice routing as in Mixtral [jiang2024, Sec. 2]: a bias-free router scores the
    ``n_experts`` experts per token, the top ``top_k`` are kept and their softmax-renormalised weights scale the
    experts' outputs; ``n_shared_experts`` MLPs run on every token (DeepSeekMoE [dai2024]). Each expert is a
    :class:`MLP`, so parameter names are ``mlp.router.weight``, ``mlp.experts.<e>.*`` and
    ``mlp.shared.<e>.*``, exactly :meth:`TransformerConfig.param_shapes`.

    Memory and work part ways here: every expert's weights are resident (built, moved, sharded alike), while each
    token is multiplied only by its top_k experts' weights (plus the shared ones). The loop gathers each expert's
    tokens and runs the expert on those rows only, so FLOP counters see the active work. No capacity factor, no
    token dropping, no load-balancing loss: this model exists to be measured, not trained well.
    """

    def __init__(self, config: TransformerConfig, device: torch.device | None, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.top_k = config.top_k
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False, device=device, dtype=dtype)
        self.experts = nn.ModuleList(MLP(config, device, dtype) for _ in range(config.n_experts))
        self.shared = nn.ModuleList(MLP(config, device, dtype) for _ in range(config.n_shared_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        weights, chosen = torch.topk(self.router(flat).float().softmax(-1), self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        for expert in self.shared:
            out = out + expert(flat)
        return out.view(b, s, h)
