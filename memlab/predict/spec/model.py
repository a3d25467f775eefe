"""Transformer configurations, exact parameter counts and presets.

A :class:`TransformerConfig` describes a decoder-only transformer precisely enough that memlab can count its
parameters exactly, predict its memory and FLOPs, and build the same model in torch (:mod:`memlab.model.gpt`), whose
parameter count equals :meth:`TransformerConfig.param_count` for every preset.

Layout counted here (per layer; h = d_model, f = d_ff, k = n_kv_heads * head_dim):

- attention: W_q h*h, W_k h*k, W_v h*k, W_o h*h (+ biases h, k, k, h when ``bias``)
- MLP gelu: W_up h*f, W_down f*h (+ f, h); swiglu: W_gate, W_up h*f and W_down f*h (+ f, f, h)
- two norms per layer and one final norm: layernorm has weight (+ bias when ``bias``), rmsnorm a weight only
- embeddings vocab*h, learned positions max_seq*h, LM head vocab*h unless tied (never a bias)

This module imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Literal, get_args

from memlab.errors import ConfigError, SetupError, unknown_name
from memlab.predict.spec.traits import REFERENCE, Implementation
from memlab.predict.spec.validate import LIMITS, StrictInit, check_fields

MlpKind = Literal["gelu", "swiglu"]
PositionKind = Literal["learned", "rotary"]
NormKind = Literal["layernorm", "rmsnorm"]
MLPS: tuple[str, ...] = get_args(MlpKind)
POSITIONS: tuple[str, ...] = get_args(PositionKind)
NORMS: tuple[str, ...] = get_args(NormKind)


def swiglu_hidden(d_model: int, multiple_of: int = 256) -> int:
    """Default SwiGLU width: 2/3 of 4h rounded up to ``multiple_of`` (the Llama rule, Touvron et al. 2023)."""
    raw = int(2 * 4 * d_model / 3)
    return multiple_of * math.ceil(raw / multiple_of)


@dataclass(frozen=True, kw_only=True)
class TransformerConfig(StrictInit):
    """A decoder-only transformer, sized exactly.

    Fields are model hyper-parameters; the batch, sequence length, precision and parallelism of a run live
    in :class:`memlab.predict.spec.setup.Setup`, so one config serves many experiments.
    """

    _error = ConfigError  # what StrictInit raises for an unknown or missing field (a class attribute, not a field)

    d_model: int = field(metadata=LIMITS["d_model"].meta())
    """Hidden size h."""
    n_layers: int = field(metadata=LIMITS["layers"].meta())
    """Number of transformer blocks L."""
    n_heads: int = field(metadata={"max": LIMITS["d_model"].max, "why": "at most one head per hidden unit"})
    """Query heads a; head_dim = d_model / n_heads."""
    n_kv_heads: int | None = field(default=None, metadata={"max": LIMITS["d_model"].max, "why": "at most n_heads"})
    """Key/value heads (GQA when < n_heads, MQA when 1); None means n_heads (multi-head attention)."""
    d_ff: int | None = field(default=None, metadata=LIMITS["d_ff"].meta())
    """MLP inner width; None means 4h for gelu and the Llama rule for swiglu."""
    vocab_size: int = field(default=50257, metadata=LIMITS["vocab"].meta())
    """Vocabulary size V (rows of the embedding and the LM head)."""
    max_seq: int = field(default=1024, metadata=LIMITS["seq"].meta())
    """Longest sequence the model accepts; learned position tables have this many rows."""
    mlp: MlpKind = "gelu"
    """gelu: up, GELU, down. swiglu: down(silu(gate(x)) * up(x))."""
    positions: PositionKind = "learned"
    """learned absolute position table, or rotary embeddings (no parameters)."""
    norm: NormKind = "layernorm"
    """layernorm (weight and, with ``bias``, a bias) or rmsnorm (weight only)."""
    bias: bool = True
    """Biases on linear layers and layernorms (GPT-2: yes; Llama: no); ``impl`` can override per projection. The
    LM head has one only with ``impl.head_bias``."""
    tied_embeddings: bool = True
    """Whether the LM head reuses the token embedding matrix."""
    dropout: float = field(default=0.0, metadata={"max": 1.0, "max_open": True, "why": "a probability below 1"})
    """Dropout probability after attention softmax, attention output and MLP (0 for modern LLMs)."""
    name: str = "custom"
    """A label for tables and plots."""
    n_experts: int = 1
    """Routed MLP experts per layer (mixture of experts when > 1; [shazeer2017], [fedus2021]). Each
    expert is a full MLP of width d_ff; a bias-free router (n_experts x h) picks ``top_k`` of them per token."""
    top_k: int = 1
    """Routed experts each token runs through (Mixtral: 2 of 8)."""
    n_shared_experts: int = 0
    """Experts every token runs through besides the routed ones (DeepSeekMoE shared experts [dai2024])."""
    attn_head_dim: int | None = None
    """Per-head width when it is not d_model / n_heads (Gemma-7B: 16 heads of 256 on d_model 3072); None derives it."""
    impl: Implementation = REFERENCE
    """How the model is written (:class:`memlab.predict.spec.traits.Implementation`); the default is the reference
    GPT."""

    def __post_init__(self) -> None:
        # Types, ranges and Literal choices from the annotations and metadata above (memlab.predict.spec.validate): a
        # bool
        # is no size, 'no' is no bool (it would build a tied model), '0.1' is no dropout, 'relu' no mlp kind.
        check_fields(self, ConfigError)
        if isinstance(self.impl, dict):  # from to_dict() or a JSON line
            object.__setattr__(self, "impl", Implementation.from_dict(self.impl))
        if not isinstance(self.impl, Implementation):
            raise ConfigError(f"impl must be a memlab.predict.spec.traits.Implementation, got "
                              f"{type(self.impl).__name__}")
        if self.attn_head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} must divide d_model={self.d_model}: pick a d_model that is a multiple "
                f"of n_heads (e.g. {self.n_heads * max(1, round(self.d_model / self.n_heads))})"
            )
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        if self.n_heads % kv:
            raise ConfigError(
                f"n_kv_heads={kv} must divide n_heads={self.n_heads} (each KV head serves a whole group of "
                "query heads): use a divisor of n_heads"
            )
        object.__setattr__(self, "n_kv_heads", kv)
        if self.d_ff is None:
            d_ff = 4 * self.d_model if self.mlp == "gelu" else swiglu_hidden(self.d_model)
            object.__setattr__(self, "d_ff", d_ff)
        if self.positions == "rotary" and self.head_dim % 2:
            raise ConfigError(f"rotary positions need an even head_dim, got {self.head_dim}: change n_heads")
        self._check_moe()

    def modelled_seq(self, seq: int) -> int:
        """The longest sequence up to ``seq`` tokens that the estimate models for this model: at most its context
        ``max_seq``, and one token short of its sliding window where it has one (:meth:`check_seq` refuses more)."""
        window = self.impl.sliding_window
        return min(seq, self.max_seq, window - 1 if window else seq)

    def check_seq(self, seq: float) -> None:
        """Raise :class:`SetupError` when ``seq`` tokens do not fit a model with learned positions (its position
        table has ``max_seq`` rows); rotary models run any length. The estimator and ``mfu`` share this check."""
        if self.positions == "learned" and seq > self.max_seq:
            raise SetupError(
                f"seq={int(seq)} exceeds max_seq={self.max_seq} of a model with learned positions: lower seq or "
                "raise max_seq (config.with_(max_seq=N); on the command line explicit dimensions with --max-seq N)"
            )


    def _check_moe(self) -> None:
        if self.top_k > self.n_experts:
            raise ConfigError(f"top_k={self.top_k} cannot exceed n_experts={self.n_experts}: lower top_k")
        if self.n_shared_experts and not self.is_moe:
            raise ConfigError("n_shared_experts needs a mixture of experts: set n_experts > 1 (or use a wider d_ff)")
        dense = self.impl.dense_layers
        if dense and (max(dense) >= self.n_layers or len(dense) >= self.n_layers):
            raise ConfigError(f"impl.dense_layers {list(dense)[:8]} must name some, not all, of the "
                              f"{self.n_layers} layers")

    @property
    def moe_layers(self) -> int:
        """Layers with a mixture-of-experts block: every layer but ``impl.dense_layers`` (0 for a dense model)."""
        return self.n_layers - len(self.impl.dense_layers) if self.is_moe else 0

    @property
    def is_moe(self) -> bool:
        """True when the MLP is a mixture of experts (more than one routed expert)."""
        return self.n_experts > 1

    @property
    def active_experts(self) -> int:
        """MLPs one token runs through: top_k routed + shared (1 for a dense model)."""
        return (self.top_k if self.is_moe else 1) + self.n_shared_experts

    # -- derived sizes -------------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """d_model / n_heads, or ``attn_head_dim`` when given."""
        return self.attn_head_dim if self.attn_head_dim is not None else self.d_model // self.n_heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection and the attention output: n_heads * head_dim (d_model unless overridden)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the K (or V) projection: n_kv_heads * head_dim."""
        assert self.n_kv_heads is not None
        return self.n_kv_heads * self.head_dim

    @property
    def ffn(self) -> int:
        """d_ff as a plain int (resolved in ``__post_init__``)."""
        assert self.d_ff is not None
        return self.d_ff

    # -- parameter shapes and counts ----------------------------------------------------------------------
    def param_shapes(self) -> list[tuple[str, tuple[int, ...], str]]:
        """Every parameter as ``(name, shape, component)``, in :mod:`memlab.model.gpt`'s naming.

        ``component`` is one of embeddings, positions, attention, mlp, norms, head. Used for exact counts,
        for shape-dependent optimizer state (Adafactor) and to check the torch model against the config.
        """
        h, f, k, b, im = self.d_model, self.ffn, self.kv_dim, self.bias, self.impl
        qd = self.q_dim
        qkv_b, o_b, mlp_b = (b if x is None else x for x in (im.qkv_bias, im.o_bias, im.mlp_bias))
        out: list[tuple[str, tuple[int, ...], str]] = [("tok_emb.weight", (self.vocab_size, h), "embeddings")]
        if self.positions == "learned":
            out.append(("pos_emb.weight", (self.max_seq + im.position_offset, h), "positions"))

        def norm(prefix: str) -> list[tuple[str, tuple[int, ...], str]]:
            rows = [(f"{prefix}.weight", (h,), "norms")]
            if self.norm == "layernorm" and b:
                rows.append((f"{prefix}.bias", (h,), "norms"))
            return rows

        def linear(prefix: str, n_in: int, n_out: int, comp: str, bias: bool) -> list[tuple[str, tuple[int, ...], str]]:
            rows = [(f"{prefix}.weight", (n_out, n_in), comp)]
            if bias:
                rows.append((f"{prefix}.bias", (n_out,), comp))
            return rows

        def mlp(prefix: str, f: int = f) -> list[tuple[str, tuple[int, ...], str]]:
            if self.mlp == "gelu":
                rows = linear(f"{prefix}.up", h, f, "mlp", mlp_b)
            elif im.fused_gate_up:  # Phi-3: one (2 d_ff, h) projection
                rows = linear(f"{prefix}.gate_up", h, 2 * f, "mlp", mlp_b)
            else:
                rows = linear(f"{prefix}.gate", h, f, "mlp", mlp_b) + linear(f"{prefix}.up", h, f, "mlp", mlp_b)
            return rows + linear(f"{prefix}.down", f, h, "mlp", mlp_b)

        for i in range(self.n_layers):
            p = f"blocks.{i}"
            out += norm(f"{p}.norm1")
            if im.fused_qkv:  # one tensor (and one optimizer step counter) for Q, K and V
                out += linear(f"{p}.attn.qkv", h, qd + 2 * k, "attention", qkv_b)
            else:
                out += linear(f"{p}.attn.q", h, qd, "attention", qkv_b)
                out += linear(f"{p}.attn.k", h, k, "attention", qkv_b)
                out += linear(f"{p}.attn.v", h, k, "attention", qkv_b)
            if im.qk_norm != "none":  # RMSNorm weights on q and k: per head (Qwen3, Gemma 3) or whole (OLMo 2)
                full = im.qk_norm == "full"
                out += [(f"{p}.attn.q_norm.weight", (qd if full else self.head_dim,), "norms"),
                        (f"{p}.attn.k_norm.weight", (k if full else self.head_dim,), "norms")]
            out += linear(f"{p}.attn.o", qd, h, "attention", o_b)
            if not im.shared_norm:
                out += norm(f"{p}.norm2")
            if im.norm_placement == "sandwich":  # Gemma 2/3: the sublayers' outputs are normed too
                out += norm(f"{p}.norm3") + norm(f"{p}.norm4")
            if not self.is_moe:
                out += mlp(f"{p}.mlp")
                continue
            if i in im.dense_layers:  # Qwen2-MoE mlp_only_layers / decoder_sparse_step: a dense MLP here
                out += mlp(f"{p}.mlp", im.dense_ff)
                continue
            out.append((f"{p}.mlp.router.weight", (self.n_experts, h), "mlp"))
            if im.grouped_experts:  # two 3-D tensors hold every expert (transformers 5 MixtralExperts)
                out += [(f"{p}.mlp.experts.gate_up", (self.n_experts, 2 * f, h), "mlp"),
                        (f"{p}.mlp.experts.down", (self.n_experts, h, f), "mlp")]
                if im.shared_expert_ff:  # Qwen2-MoE: a gated MLP every token runs through, scaled by a sigmoid
                    sf = im.shared_expert_ff
                    out += [(f"{p}.mlp.shared_expert.{n}.weight", shape, "mlp") for n, shape in
                            (("gate", (sf, h)), ("up", (sf, h)), ("down", (h, sf)))]
                    out.append((f"{p}.mlp.shared_expert_gate.weight", (1, h), "mlp"))
                continue
            for e in range(self.n_experts):
                out += mlp(f"{p}.mlp.experts.{e}")
            for e in range(self.n_shared_experts):
                out += mlp(f"{p}.mlp.shared.{e}")
        out += norm("norm_f")
        if not self.tied_embeddings:
            out.append(("head.weight", (self.vocab_size, h), "head"))
        if im.head_bias:
            out.append(("head.bias", (self.vocab_size,), "head"))
        return out

    def param_breakdown(self) -> dict[str, int]:
        """Parameter count per component (embeddings, positions, attention, mlp, norms, head), exact."""
        parts = {"embeddings": 0, "positions": 0, "attention": 0, "mlp": 0, "norms": 0, "head": 0}
        for _, shape, comp in self.param_shapes():
            parts[comp] += math.prod(shape)
        return parts

    def param_count(self) -> int:
        """Total number of parameters, counting tied embeddings once."""
        return sum(self.param_breakdown().values())

    def matmul_param_count(self) -> int:
        """Parameters that take part in matrix multiplies: every 2-D (or 3-D grouped expert) weight in the blocks
        and the LM head.

        These are the weights autocast copies to 16 bits; the embedding table is looked up, not multiplied,
        unless it is tied to the head.
        """
        n = sum(math.prod(s) for name, s, comp in self.param_shapes() if len(s) >= 2 and comp in ("attention", "mlp"))
        return n + self.vocab_size * self.d_model

    def grouped_expert_params(self) -> int:
        """Parameters in 3-D grouped expert tensors (``impl.grouped_experts``; 0 otherwise): multiplied by
        ``grouped_mm``, which autocast does not copy to 16 bits."""
        return sum(math.prod(s) for _, s, _ in self.param_shapes() if len(s) == 3)

    def active_param_count(self) -> int:
        """Parameters one token's forward multiplies or looks up: every parameter except the routed experts it
        does not visit (top_k of n_experts per layer). Equals :meth:`param_count` for a dense model.

        Memory follows :meth:`param_count` (every expert is resident); FLOPs follow this count.
        """
        return self.param_count() - self.inactive_expert_params()

    def inactive_expert_params(self, *, matmul_only: bool = False) -> int:
        """Parameters of the routed experts one token skips: the MoE layers (:attr:`moe_layers`) x (n_experts -
        top_k) x one expert's MLP
        (``matmul_only``: its weight matrices only, the twin of :meth:`matmul_param_count`). One expert's MLP is a
        layer's routed experts' parameters / n_experts, whether they are one tensor per expert or 3-D
        (``impl.grouped_experts``)."""
        if not self.is_moe:
            return 0
        first = next(i for i in range(self.n_layers) if i not in self.impl.dense_layers)
        routed = sum(math.prod(s) for n, s, _ in self.param_shapes()
                     if n.startswith(f"blocks.{first}.mlp.experts.") and (len(s) >= 2 or not matmul_only))
        return self.moe_layers * (self.n_experts - self.top_k) * (routed // self.n_experts)

    def to_dict(self) -> dict[str, object]:
        """Plain dict of the fields (for JSON and DataFrames)."""
        return asdict(self)

    def with_(self, **changes: object) -> TransformerConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Preset:
    """A named configuration with the publication or model card its sizes come from."""

    config: TransformerConfig
    source: str
    note: str = ""


_GPT2 = {"vocab_size": 50257, "max_seq": 1024}  # GPT-2 layout: learned positions, layernorm, biases, tied head
_LLAMA = {"mlp": "swiglu", "positions": "rotary", "norm": "rmsnorm", "bias": False, "tied_embeddings": False}
_GPT2_SRC = ("Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners', Table 2; sizes as released "
             "in the openai-community/{} config.json")
_LLAMA2 = "Touvron et al. 2023, 'Llama 2: Open Foundation and Fine-Tuned Chat Models', Table 1; meta-llama config.json"
_LLAMA3 = "Meta 2024, 'The Llama 3 Herd of Models' (Dubey et al.), Table 3; meta-llama config.json"
_CPU_LAB = "memlab CPU-lab preset ({}, scaled down)"
# Tiny models for CPU labs: small enough that a training step takes well under a second on 2 cores.
_TINY = {"vocab_size": 512, "max_seq": 256}

_C = TransformerConfig
PRESETS: dict[str, Preset] = {p.config.name: p for p in (
    # One keyword line per model; the comment is its exact param_count().
    Preset(_C(name="gpt2", d_model=768, n_layers=12, n_heads=12, **_GPT2),  # 124,439,808
           _GPT2_SRC.format("gpt2"), "124M; tied embeddings, learned positions"),
    Preset(_C(name="gpt2-medium", d_model=1024, n_layers=24, n_heads=16, **_GPT2),  # 354,823,168
           _GPT2_SRC.format("gpt2-medium"), "355M"),
    Preset(_C(name="gpt2-large", d_model=1280, n_layers=36, n_heads=20, **_GPT2),  # 774,030,080
           _GPT2_SRC.format("gpt2-large"), "774M"),
    Preset(_C(name="gpt2-xl", d_model=1600, n_layers=48, n_heads=25, **_GPT2),  # 1,557,611,200
           _GPT2_SRC.format("gpt2-xl"), "1.5B"),
    Preset(_C(name="llama-2-7b", d_model=4096, n_layers=32, n_heads=32, d_ff=11008, vocab_size=32000, max_seq=4096,
              **_LLAMA), _LLAMA2),  # 6,738,415,616
    Preset(_C(name="llama-2-13b", d_model=5120, n_layers=40, n_heads=40, d_ff=13824, vocab_size=32000, max_seq=4096,
              **_LLAMA), _LLAMA2),  # 13,015,864,320
    Preset(_C(name="llama-2-70b", d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672, vocab_size=32000,
              max_seq=4096, **_LLAMA), _LLAMA2),  # 68,976,648,192
    Preset(_C(name="llama-3-8b", d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, vocab_size=128256,
              max_seq=8192, **_LLAMA), _LLAMA3),  # 8,030,261,248
    Preset(_C(name="llama-3-70b", d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672, vocab_size=128256,
              max_seq=8192, **_LLAMA), _LLAMA3),  # 70,553,706,496
    Preset(_C(name="mistral-7b", d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, vocab_size=32000,
              max_seq=32768, **_LLAMA),  # 7,241,732,096
           "Jiang et al. 2023, 'Mistral 7B', Table 1; mistralai/Mistral-7B-v0.1 config.json"),
    Preset(_C(name="opt-13b", d_model=5120, n_layers=40, n_heads=40, d_ff=20480, vocab_size=50272, max_seq=2048),
           "Zhang et al. 2022, 'OPT: Open Pre-trained Transformer Language Models', Table 1; facebook/opt-13b config",
           "OPT's position table has 2 extra offset rows (10,240 parameters) not modelled here"),  # 12,853,463,040
    Preset(_C(name="gpt-3-175b", d_model=12288, n_layers=96, n_heads=96, vocab_size=50257, max_seq=2048),
           "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1",
           "the paper reports 175.0B; this layout (GPT-2 style, tied) counts 174.6B"),  # 174,604,259,328
    Preset(_C(name="mixtral-8x7b", d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, vocab_size=32000,
              max_seq=32768, n_experts=8, top_k=2, **_LLAMA),  # 46,702,792,704 (12,879,925,248 active)
           "Jiang et al. 2024, 'Mixtral of Experts', Sec. 2 and Table 1; mistralai/Mixtral-8x7B-v0.1 config.json",
           "46.7B parameters, 12.9B active per token (the paper's numbers)"),
    Preset(_C(name="tiny-gpt", d_model=64, n_layers=2, n_heads=4, **_TINY),  # 149,248
           _CPU_LAB.format("GPT-2 layout")),
    Preset(_C(name="small-gpt", d_model=128, n_layers=4, n_heads=4, vocab_size=2048, max_seq=512),  # 1,121,024
           _CPU_LAB.format("GPT-2 layout")),
    Preset(_C(name="tiny-llama", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=176, **_TINY, **_LLAMA),
           _CPU_LAB.format("Llama layout with GQA")),  # 158,016
    Preset(_C(name="tiny-moe", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, n_experts=8, top_k=2,
              n_shared_experts=1, **_TINY, **_LLAMA),  # 533,824 (238,912 active)
           "memlab CPU-lab preset (tiny-llama layout with 8 routed experts, top-2, one shared expert)"),
)}
"""The named models, in table order: sizes from the publication or model card each :attr:`Preset.source` names."""

ALIASES: dict[str, str] = {
    "gpt2-small": "gpt2",
    "gpt2-124m": "gpt2",
    "gpt2-355m": "gpt2-medium",
    "gpt2-774m": "gpt2-large",
    "gpt2-1.5b": "gpt2-xl",
    "gpt3": "gpt-3-175b",
    "gpt-3": "gpt-3-175b",
    "llama2-7b": "llama-2-7b",
    "llama2-13b": "llama-2-13b",
    "llama2-70b": "llama-2-70b",
    "llama3-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b",
}


def preset_names() -> list[str]:
    """Canonical preset names, in table order."""
    return list(PRESETS)


def preset(name: str) -> TransformerConfig:
    """The :class:`TransformerConfig` of a named preset (case-insensitive; a few aliases accepted): always the
    **reference GPT** (:mod:`memlab.model.gpt`) with these sizes, also for a name of a published model. The published
    model as its code runs it is :func:`memlab.predict.families.resolve` of its name (``memlab.resolve("llama-2-7b")``,
    what ``memlab estimate --preset llama-2-7b`` or ``--model llama-2-7b`` gives; ``ref:llama-2-7b`` is this config).

    Raises :class:`memlab.errors.UnknownNameError` listing the closest names when ``name`` is unknown.
    """
    if not isinstance(name, str):
        raise unknown_name("preset", repr(name), preset_names())
    key = name.strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        raise unknown_name("preset", name, preset_names())
    return PRESETS[key].config
