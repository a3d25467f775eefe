"""Implementation traits: the choices inside a model's code that change what it saves for backward.

Two models with the same sizes can save different tensors: GPT-2 builds ``gelu_new`` out of five elementwise ops
where a fused GELU keeps one tensor; GPT-NeoX and Phi run attention and the MLP in parallel from one input; Llama's
eager attention repeats K and V to full width for grouped-query attention. :class:`Implementation` names each such
choice as a field, and :mod:`memlab.predict.memory.activations` counts each one term by term. The defaults describe
memlab's reference GPT (:mod:`memlab.model.gpt`), so a :class:`~memlab.predict.spec.model.TransformerConfig` without an
``impl`` predicts exactly what it predicted before.

Every field's docstring names the code that causes it (the Hugging Face ``transformers`` modelling file and the
function, as of transformers 5.x, ``[hf-transformers]``); :func:`memlab.predict.families.reader.from_hf` sets them per
family and records that source in :attr:`Implementation.sources`. This module imports no torch.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, get_args

import numpy as np

from memlab.errors import ConfigError, SetupError
from memlab.predict.spec.validate import StrictInit, check_fields

Activation = Literal["default", "gelu_tanh", "gelu", "gelu_new", "gelu_fast", "relu", "silu"]
RmsNormKind = Literal["reference", "fp32-input", "fp32-product", "fp32"]
QkNormKind = Literal["none", "head", "full"]
NormPlacement = Literal["pre", "sandwich", "post"]

ACTIVATIONS: tuple[str, ...] = get_args(Activation)
RMSNORMS: tuple[str, ...] = get_args(RmsNormKind)
_PROBABILITY = {"max": 1.0, "max_open": True, "why": "a dropout probability below 1"}

ACT_SAVED_BEFORE_OUTPUT = {"gelu_tanh": 1, "gelu": 1, "silu": 1, "relu": 0, "gelu_new": 4, "gelu_fast": 7}
"""d_ff-wide tensors an activation keeps besides its output: a fused GELU or SiLU keeps its input; ReLU keeps only
its output (``threshold_backward`` needs the result, not the input); ``gelu_new`` written as
``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`` keeps x (for ``pow``), tanh's output, ``0.5 * x`` and
``1 + tanh(...)`` (the last multiply keeps both operands) [hf-transformers: activations.py, NewGELUActivation];
``gelu_fast``, ``0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))``, keeps seven: ``0.044715 * x``
and x (their product), ``x * 0.797...`` and ``1 + 0.044715 x^2`` (theirs), tanh's output, ``0.5 * x`` and
``1 + tanh(...)`` [hf-transformers: activations.py, FastGELUActivation]."""


TRAIT_GROUPS: dict[str, tuple[str, ...]] = {
    "block": ("activation", "parallel_block", "shared_norm", "norm_placement", "fused_qkv", "fused_gate_up"),
    "attention": ("eager_repeat_kv", "softmax_fp32", "autocast_mask_promotes_scores", "eager_qk_fp32", "kv_broadcast",
                  "sdpa_keeps_mask", "sdpa_output_copy", "q_view_of_fused_qkv", "qk_norm", "attn_softcap",
                  "sliding_window", "checkpoint_keeps_mask", "supports_sdpa"),
    "norms": ("rmsnorm",),
    "rotary": ("rotary_tables_per_forward", "rotary_tables_fp32", "rotary_tables_per_use", "rotary_table_pairs",
               "rotary_fraction", "position_offset", "position_ids_per_token"),
    "bias": ("qkv_bias", "o_bias", "mlp_bias", "head_bias"),
    "dropout": ("attention_dropout", "embedding_dropout"),
    "head and loss": ("loss_labels_padded", "final_softcap"),
    "experts": ("grouped_experts", "moe_topk_renorm", "moe_weights_fp32", "shared_expert_ff", "dense_layers",
                "dense_ff"),
    "provenance": ("family", "sources"),
}
"""The implementation traits by concern, each in one group (:meth:`Implementation.group` reads one): a new trait
joins the group whose rows it changes."""


@dataclass(frozen=True, kw_only=True)
class Implementation(StrictInit):
    """How a transformer is written, as far as memory cares. Defaults: memlab's reference GPT."""

    _error = ConfigError  # what StrictInit raises for an unknown field (a class attribute, not a field)

    activation: Activation = "default"
    """MLP nonlinearity and how it is built: ``default`` is the reference GPT's (fused tanh GELU for a gelu MLP,
    SiLU for swiglu); ``gelu_new`` the composed tanh GELU of GPT-2 and Phi [hf-transformers: activations.py,
    NewGELUActivation]; ``gelu`` exact fused GELU (GPT-NeoX, GELUActivation); ``relu`` (OPT); ``gelu_tanh`` fused
    (Gemma's GeGLU, GELUTanh)."""
    parallel_block: bool = False
    """Attention and MLP both read the block input, ``x + attn(n1(x)) + mlp(n2(x))`` (GPT-NeoX with
    ``use_parallel_residual``, Phi) [hf-transformers: modeling_gpt_neox.py GPTNeoXLayer.forward,
    modeling_phi.py PhiDecoderLayer.forward]. The second norm's input is the first's: stored once."""
    shared_norm: bool = False
    """One norm feeds both branches of a parallel block (Phi: ``input_layernorm`` only): no second norm, and the
    MLP's input is the attention's input [hf-transformers: modeling_phi.py PhiDecoderLayer]."""
    fused_qkv: bool = False
    """Q, K and V come from one projection (GPT-2 ``c_attn``, GPT-NeoX ``query_key_value``). Same parameters and,
    in eager attention, the same saved bytes; recorded for the layout [modeling_gpt2.py GPT2Attention]."""
    fused_gate_up: bool = False
    """A gated MLP's gate and up projections are one ``gate_up_proj`` whose output is chunked in two (Phi-3): one
    parameter tensor (one optimizer step counter) and the same saved bytes (the chunks are views of one buffer,
    kept once) [hf-transformers: modeling_phi3.py Phi3MLP.forward]."""
    eager_repeat_kv: bool = False
    """Eager attention materialises K and V at full query width for grouped-query attention
    (``repeat_kv``: ``expand`` then ``reshape``, a copy; with one KV head and batch 1 the expanded view stays a view
    that ``matmul`` accepts) [hf-transformers: modeling_llama.py repeat_kv, eager_attention_forward]."""
    softmax_fp32: bool = False
    """Eager attention runs softmax in fp32 and casts back: in 16 bits it keeps the fp32 probabilities and their
    16-bit copy (6 B per score) [hf-transformers: modeling_llama.py eager_attention_forward,
    ``softmax(..., dtype=torch.float32).to(query.dtype)``]."""
    autocast_mask_promotes_scores: bool = False
    """Under autocast (an fp32 model), eager attention adds the fp32 causal mask to the 16-bit scores, which
    promotes them to fp32: softmax keeps fp32 probabilities and the matmul with V their 16-bit cast, as with
    ``softmax_fp32`` (GPT-2) [hf-transformers: modeling_gpt2.py eager_attention_forward, ``attn_weights +
    causal_mask`` then ``.type(value.dtype)``]."""
    rmsnorm: RmsNormKind = "reference"
    """How RMSNorm is written: ``reference`` keeps x, rstd and x*rstd in the residual dtype (memlab.model.gpt.Norm);
    ``fp32-input`` upcasts x to fp32 (keeps the fp32 x, fp32 rstd, and the normalised x cast back for the weight:
    LlamaRMSNorm, Qwen2RMSNorm, MistralRMSNorm); ``fp32`` computes everything in fp32 including ``1 + weight``
    (GemmaRMSNorm); ``fp32-product`` multiplies the weight in fp32 and casts the product back, so it keeps the fp32
    x, rstd and x*rstd, without ``1 + weight`` (Olmo2RMSNorm) [hf-transformers: modeling_llama.py
    LlamaRMSNorm.forward, modeling_gemma.py GemmaRMSNorm, modeling_olmo2.py Olmo2RMSNorm]."""
    rotary_tables_per_forward: bool = False
    """cos and sin are computed each forward in the activations' dtype (one (s, rotary_dim) pair shared by all
    layers, saved by the rotation's multiplies) instead of being module buffers [hf-transformers:
    modeling_llama.py LlamaRotaryEmbedding.forward, apply_rotary_pos_emb]."""
    rotary_tables_fp32: bool = False
    """The per-forward cos and sin stay fp32 whatever the model's dtype (OLMo 2's rotary embedding returns them
    uncast; its ``apply_rotary_pos_emb`` casts the rotated q and k back) [modeling_olmo2.py
    Olmo2RotaryEmbedding.forward]."""
    rotary_tables_per_use: bool = False
    """Each rotation builds its own cos and sin (GPT-J: ``repeat_interleave`` of a gathered sinusoid table inside
    ``apply_rotary_pos_emb``, called for q and for k in every layer): two (s, rotary_dim) tables per call, kept by
    the rotation's multiplies, in the compute dtype [modeling_gptj.py apply_rotary_pos_emb]."""
    eager_qk_fp32: bool = False
    """Eager attention upcasts q and k to fp32 before QK^T (so in 16 bits it keeps fp32 q and k) and runs the softmax
    on the fp32 scores, keeping fp32 probabilities and their cast to the value dtype (GPT-J) [modeling_gptj.py
    eager_attention_forward, ``query.to(torch.float32)``]."""
    kv_broadcast: bool = False
    """K and V reach every attention kernel repeated to the query width (``repeat_kv``, a copy; with one K/V head
    its reshape stays a view): the family always hands SDPA an explicit mask, so transformers never uses SDPA's
    ``enable_gqa`` (Falcon: transformers 5.25's ``FalconAttention`` takes K and V as views of the fused QKV output,
    and its causal mask is always materialised) [modeling_falcon.py FalconAttention.forward, FalconModel.forward
    ``allow_is_causal_skip=False``; integrations/sdpa_attention.py use_gqa_in_sdpa, repeat_kv]."""
    supports_sdpa: bool = True
    """transformers builds the family with SDPA attention when the caller names none (``_supports_sdpa``); False:
    eager (Gemma 2: ``_supports_sdpa = False``, soft-capped scores) [modeling_utils.py
    _check_and_adjust_attn_implementation]. What ``attention='auto'`` starts from (memlab.predict.spec.kernels)."""
    sdpa_keeps_mask: bool = False
    """SDPA gets an explicit 4-D causal mask (b, 1, s, s) in the compute dtype instead of ``is_causal``, and each
    layer's kernel keeps one for backward (Falcon) [modeling_falcon.py FalconAttention.forward,
    ``attn_mask=attention_mask``]."""
    rotary_table_pairs: int = 1
    """How many (cos, sin) pairs one forward computes with ``rotary_tables_per_forward``: one per rope kind the layers
    use (Gemma 3: local and global rope, ``set(layer_types)``) [modeling_gemma3.py Gemma3TextModel.forward]."""
    rotary_fraction: float = field(default=1.0, metadata={"min_open": True, "max": 1.0, "why": "a share of head_dim"})
    """Share of head_dim that is rotated (GPT-NeoX ``rotary_pct``, Phi ``partial_rotary_factor``)."""
    sdpa_output_copy: bool = False
    """Under SDPA the attention output is laid out (b, a, s, d), so ``transpose(1, 2).reshape`` copies it and the
    output projection keeps the copy too. Happens when partial rotary rebuilds q with ``torch.cat`` (contiguous in
    (b, a, s, d)), under the kernels that lay their output out as q (flash, cuDNN; not the memory-efficient one:
    :meth:`copies_sdpa_output`) [hf-transformers: modeling_gpt_neox.py apply_rotary_pos_emb, modeling_phi.py
    PhiAttention]."""
    qkv_bias: bool | None = None
    """Biases on the Q, K, V projections; None follows ``TransformerConfig.bias`` (Qwen2: True with bias False)."""
    o_bias: bool | None = None
    """Bias on the attention output projection; None follows ``TransformerConfig.bias``."""
    mlp_bias: bool | None = None
    """Biases on the MLP projections; None follows ``TransformerConfig.bias``."""
    head_bias: bool = False
    """A bias on the LM head (Phi's ``lm_head`` has one) [hf-transformers: modeling_phi.py PhiForCausalLM]."""
    position_offset: int = 0
    """Extra rows of a learned position table (OPT: 2) [hf-transformers: modeling_opt.py
    OPTLearnedPositionalEmbedding]."""
    position_ids_per_token: bool = False
    """Learned position ids are (batch, seq), computed from the attention mask (OPT), not (1, seq) (GPT-2)."""
    q_view_of_fused_qkv: bool = False
    """q is a strided view of the fused QKV output, so whatever keeps q keeps the whole (h + 2 kv)-wide buffer:
    SDPA always (k and v are copied), eager attention at batch 1 (at batch > 1 ``matmul`` copies q) (GPT-2)
    [hf-transformers: modeling_gpt2.py GPT2Attention.forward, ``c_attn(...).split``]."""
    loss_labels_padded: bool = False
    """The loss pads the labels by one column and shifts (``pad(labels, (0, 1))[..., 1:]``): at batch 1 the
    shifted targets are a view of the (s + 1)-long padded row, 8 bytes more [hf-transformers:
    loss/loss_utils.py ForCausalLMLoss]."""
    attention_dropout: float | None = field(default=None, metadata=_PROBABILITY)
    """Dropout on the attention probabilities when it differs from ``TransformerConfig.dropout`` (the residual
    dropout): GPT-2 ``attn_pdrop``, OPT/NeoX/Phi/Llama ``attention_dropout``. None: the same as ``dropout``."""
    embedding_dropout: float = field(default=0.0, metadata=_PROBABILITY)
    """Dropout on the embeddings' output (GPT-2 and Phi ``embd_pdrop``, GPT-NeoX ``hidden_dropout``): one more
    mask of width d_model per token [hf-transformers: modeling_gpt2.py GPT2Model.drop, modeling_gpt_neox.py
    GPTNeoXModel.emb_dropout]."""
    checkpoint_keeps_mask: bool = False
    """Under gradient checkpointing, each checkpointed layer keeps the 4-D attention mask (batch, 1, s, s) it is
    passed positionally in eager attention (GPT-2); other families pass it, and the rotary cos/sin, as keyword
    arguments, which the checkpoint holds by reference instead of saving [hf-transformers: modeling_layers.py
    GradientCheckpointingLayer.__call__]."""
    qk_norm: QkNormKind = "none"
    """An RMSNorm (of kind ``rmsnorm``) on the queries and keys before the rotary rotation: ``head`` normalises each
    head's ``head_dim`` with one shared weight (Qwen3 ``q_norm``/``k_norm``, Gemma 3) [hf-transformers:
    modeling_qwen3.py Qwen3Attention.forward, modeling_gemma3.py Gemma3Attention.forward]; ``full`` normalises the
    whole q and k projections (``q_dim`` and ``kv_dim`` wide weights: OLMo 2) [modeling_olmo2.py
    Olmo2Attention.forward]. Each keeps its fp32 input, fp32 rstd and the normalised tensor, like a block norm."""
    norm_placement: NormPlacement = "pre"
    """Where the block norms sit: ``pre`` (norm, sublayer, add); ``sandwich`` norms each sublayer's input and output,
    four norms a layer (Gemma 2 and 3: ``post_attention_layernorm``, ``pre_feedforward_layernorm``,
    ``post_feedforward_layernorm``) [modeling_gemma2.py Gemma2DecoderLayer.forward]; ``post`` norms only each
    sublayer's output before the residual add (OLMo 2) [modeling_olmo2.py Olmo2DecoderLayer.forward]: two norms a
    layer, whose saved bytes equal a pre-norm block's (one distinct input per norm, and the projections read a
    distinct residual instead of a norm's output)."""
    attn_softcap: bool = False
    """Eager attention caps the scores, ``tanh(scores / cap) * cap``, before the softmax: ``tanh`` keeps its output,
    one more (b, a, s, s) tensor in the compute dtype (Gemma 2 ``attn_logit_softcapping``) [modeling_gemma2.py
    eager_attention_forward]."""
    final_softcap: bool = False
    """The LM head's logits are capped the same way (``final_logit_softcapping``): ``tanh`` keeps one more (b s, V)
    tensor in the compute dtype [modeling_gemma2.py Gemma2ForCausalLM.forward]."""
    sliding_window: int | None = None
    """The shortest attention window any layer uses (Mistral, Starcoder2, Gemma 2 and 3 ``sliding_window``), tokens;
    None: every layer attends to the whole causal prefix. Eager attention keeps the same tensors with or without a
    window; a fused or math kernel is modelled only while ``seq`` is shorter than the window (the mask is then the
    plain causal one, which transformers skips for SDPA), and refused from ``seq >= window`` on
    (:meth:`check_window`), never counted as full attention."""
    grouped_experts: bool = False
    """A mixture of experts written as transformers 5 writes Mixtral: each layer's experts are two 3-D parameters
    (``gate_up_proj`` (E, 2 d_ff, h), ``down_proj`` (E, h, d_ff): two tensors, two optimizer step counters, every
    expert's gradient whatever the routing), a router whose softmax and top-k run in fp32, and the experts run by
    ``grouped_mm`` on the (token, choice) pairs sorted by expert, so every saved tensor is sized by tokens x top_k
    or by the expert count, never by how many tokens an expert got [hf-transformers: modeling_mixtral.py
    MixtralExperts, MixtralTopKRouter; integrations/moe.py grouped_mm_experts_forward]."""
    moe_topk_renorm: bool = True
    """With ``grouped_experts``: the router divides the top-k probabilities by their sum (Mixtral always; Qwen3-MoE
    with ``norm_topk_prob``), which keeps the fp32 top-k values and their sum [modeling_qwen3_moe.py
    Qwen3MoeTopKRouter.forward]."""
    moe_weights_fp32: bool = True
    """With ``grouped_experts``: the routing weights stay fp32 (Mixtral); False: cast to the router logits' dtype
    (Qwen3-MoE ``router_top_value.to(router_logits.dtype)``), so the per-pair weights are kept in that dtype."""
    shared_expert_ff: int = 0
    """With ``grouped_experts``: the width of a gated MLP every token runs through besides its routed experts, 0:
    none (Qwen2-MoE ``shared_expert``, ``shared_expert_intermediate_size`` wide; its output is scaled by
    ``sigmoid(shared_expert_gate(x))``, a bias-free (1, h) linear), three 2-D weights and the gate's (1, h) a layer
    [hf-transformers: modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock.forward]."""
    dense_layers: tuple[int, ...] = ()
    """With ``grouped_experts``: the layers (0-based) whose MLP is a dense gated MLP ``dense_ff`` wide instead of
    the sparse MoE block (Qwen2-MoE ``mlp_only_layers``, and each layer ``i`` with ``(i + 1) %
    decoder_sparse_step != 0``) [hf-transformers: modeling_qwen2_moe.py Qwen2MoeDecoderLayer.__init__]."""
    dense_ff: int = 0
    """The width of the ``dense_layers``' MLPs (Qwen2-MoE ``intermediate_size``); 0 without dense layers."""
    family: str = "reference"
    """Which code this describes: ``reference`` (memlab.model.gpt) or an HF ``model_type``."""
    sources: tuple[tuple[str, str], ...] = ()
    """(trait, where in the modelling code it comes from) for the traits a family sets."""

    def __post_init__(self) -> None:
        # Types, ranges and Literal choices from the annotations and metadata above (memlab.predict.spec.validate):
        # 'yes' is no trait flag, 1.5 no rotary fraction, -1 no position offset. Cross-field rules after.
        check_fields(self, ConfigError)
        if self.shared_norm and not self.parallel_block:
            raise ConfigError("Implementation.shared_norm needs parallel_block=True (one norm feeds both branches)")
        if not isinstance(self.dense_layers, tuple) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.dense_layers) \
                or len(set(self.dense_layers)) != len(self.dense_layers):
            raise ConfigError(f"Implementation.dense_layers must be a tuple of distinct layer indices >= 0, got "
                              f"{self.dense_layers!r:.60}")
        if bool(self.dense_layers) != bool(self.dense_ff) or (self.dense_layers and not self.grouped_experts):
            raise ConfigError("Implementation.dense_layers and dense_ff go together, with grouped_experts (dense "
                              "layers among a grouped mixture of experts' layers)")

    def check_window(self, seq: object, attention: str) -> None:
        """Raise :class:`~memlab.errors.SetupError` when ``seq`` (an int or an array of them) is not shorter than
        :attr:`sliding_window` and ``attention`` is a fused or math kernel. Eager attention adds the windowed mask to
        the full (s, s) scores, so it keeps what it keeps without a window (measured exact, tests/run/test_hf.py);
        SDPA then gets an explicit mask (transformers skips it only while ``seq < window``: masking_utils.py
        ``_ignore_causal_mask_sdpa``) and keeps other tensors, which memlab does not model."""
        if (self.sliding_window is not None and attention != "eager"
                and bool(np.any(np.asarray(seq) >= self.sliding_window))):
            raise SetupError(f"{self.family}: seq={int(np.max(np.asarray(seq)))} reaches its sliding_window="
                             f"{self.sliding_window}; with {attention} attention memlab models the window only while "
                             "seq < window (eager attention: any seq)")

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Implementation:
        """Inverse of :meth:`to_dict` (also accepts ``dataclasses.asdict`` output and JSON's lists)."""
        d = dict(data)
        src = d.get("sources", ())
        pairs = src.items() if isinstance(src, dict) else src
        d["sources"] = tuple((str(k), str(v)) for k, v in pairs)  # type: ignore[union-attr]
        if isinstance(d.get("dense_layers"), list):  # JSON's list
            d["dense_layers"] = tuple(d["dense_layers"])  # type: ignore[arg-type]
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown Implementation fields {unknown}; known: {', '.join(sorted(known))}")
        return cls(**d)  # type: ignore[arg-type]

    def attention_dropout_or(self, dropout: float) -> float:
        """The dropout on attention probabilities, given the config's (residual) ``dropout``."""
        return dropout if self.attention_dropout is None else float(self.attention_dropout)

    def copies_sdpa_output(self, attention: str) -> bool:
        """Whether the output projection reads a copy of the fused kernel's output (``sdpa_output_copy``), so that
        both are kept: the flash and cuDNN kernels allocate their output in q's layout, (b, a, s, d) once partial
        rotary's ``torch.cat`` rebuilt q, and transformers' ``transpose(1, 2).reshape`` copies it; the
        memory-efficient kernel always allocates (b, s, a, d), so the transpose back is contiguous and the reshape
        a view [torch/_meta_registrations.py meta__scaled_dot_product_flash_attention (``empty_like(query)``),
        meta__scaled_dot_product_cudnn_attention (``alloc_with_matching_layout``),
        meta__scaled_dot_product_efficient_attention (``empty(B, M, num_heads, Kv)``); aten/src/ATen/native/
        transformers/cuda/attention.cu _efficient_attention_forward]."""
        return self.sdpa_output_copy and attention in ("flash", "cudnn")

    def act(self, mlp: str) -> str:
        """The activation actually used by an MLP of kind ``mlp`` ('gelu' or 'swiglu')."""
        if self.activation != "default":
            return self.activation
        return "gelu_tanh" if mlp == "gelu" else "silu"

    def mlp_saved_tensors(self, mlp: str, *, gate_up_one_tensor: bool | None = None) -> int:
        """d_ff-wide tensors one MLP keeps: the activation's, then its output (the down projection's input), and
        for a gated MLP also the up projection's output and the product (Shazeer 2020, GLU variants). Where gate and
        up are the two halves of one tensor (``gate_up_one_tensor``; by default ``fused_gate_up``, Phi-3; a grouped
        MoE's experts, transformers' ``_default_apply_gate``), the product keeps the up half and with it the whole
        storage, so the gate half stays whatever the activation keeps: ReLU then keeps one more than with separate
        projections [hf-transformers: integrations/moe.py _default_apply_gate; modeling_phi3.py Phi3MLP]."""
        before = ACT_SAVED_BEFORE_OUTPUT[self.act(mlp)]
        if mlp == "swiglu" and (self.fused_gate_up if gate_up_one_tensor is None else gate_up_one_tensor):
            before = max(before, 1)
        return before + (3 if mlp == "swiglu" else 1)

    def differs(self) -> dict[str, object]:
        """The traits that differ from the reference GPT (without ``family`` and ``sources``)."""
        ref = Implementation()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("family", "sources") and getattr(self, f.name) != getattr(ref, f.name)}

    def group(self, name: str) -> dict[str, object]:
        """The traits of one :data:`TRAIT_GROUPS` group and their values (``impl.group("rotary")``)."""
        if name not in TRAIT_GROUPS:
            raise ConfigError(f"no trait group {name!r}: the groups are {', '.join(TRAIT_GROUPS)}")
        return {trait: getattr(self, trait) for trait in TRAIT_GROUPS[name]}

    def to_dict(self) -> dict[str, object]:
        """Plain dict of the fields (``sources`` as a dict)."""
        out = asdict(self)
        out["sources"] = dict(self.sources)
        return out


REFERENCE = Implementation()
"""The reference GPT's traits (every default)."""


@functools.cache
def trait_meanings() -> dict[str, str]:
    """Each :class:`Implementation` field's meaning in one sentence: the first sentence of the docstring written
    under the field in this module, without its citations (read from the source, so the table a chapter shows and
    the code cannot part)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(Implementation))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            text = " ".join(after.value.value.split())
            text = re.sub(r"\s*\[(?=[A-Za-z])[^\[\]]*\]", "", text)  # citations stay in the source
            out[node.target.id] = text.split(". ")[0].rstrip(".").replace("``", "") + "."
    return out
