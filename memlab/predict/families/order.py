"""The order a Hugging Face family registers its parameters in: the order ``model.parameters()`` yields them, so
the order ``torch.optim.AdamW(model.parameters())`` steps them, one tensor after another, in its for-loop
implementation (the CPU default).

The for-loop step's worst moment is ``2 x a tensor + the one before it`` (:mod:`memlab.predict.memory.phases`): which
tensor comes before the largest one is a fact of the modelling code, not of the shapes. memlab's own naming
(:meth:`memlab.predict.spec.model.TransformerConfig.param_shapes`) follows :mod:`memlab.model.gpt` (norm, attention,
norm, MLP); transformers registers a module's children in the order its ``__init__`` assigns them, so a Llama
block yields attention, MLP, then its two norms, and the first attention weight follows the embedding directly
(``LlamaModel.__init__``: ``embed_tokens``, ``layers``, ``norm``). Each family's order below is read from its
``modeling_<family>.py`` (transformers 5.x) and checked against ``named_parameters()`` of the real model, on the
shipped tiny configs and on drawn ones, by ``tests/predict/test_hf_order.py``. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from memlab.errors import ConfigError
from memlab.predict.spec.model import TransformerConfig

_LLAMA = ("attn.q.", "attn.k.", "attn.v.", "attn.qkv.", "attn.o.", "attn.q_norm", "attn.k_norm", "mlp.", "norm")
"""``LlamaDecoderLayer.__init__``: ``self_attn`` (q, k, v, o, then Qwen3's / OLMo 2's q_norm, k_norm), ``mlp``, the
norms (input, post-attention; Gemma 2/3's pre- and post-feedforward)."""

BLOCK_ORDER: Mapping[str, tuple[str, ...]] = {
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo2", "stablelm",
                     "starcoder2", "mixtral", "qwen2_moe"), _LLAMA),
    # Qwen3MoeSparseMoeBlock.__init__ assigns the experts before the router (``gate``)
    "qwen3_moe": ("attn.q.", "attn.k.", "attn.v.", "attn.o.", "attn.q_norm", "attn.k_norm", "mlp.experts",
                  "mlp.router", "mlp.", "norm"),
    # Phi3Attention.__init__: o_proj before qkv_proj
    "phi3": ("attn.o.", "attn.qkv.", "mlp.", "norm"),
    # PhiDecoderLayer: self_attn (q, k, v, dense), mlp (fc1, fc2), input_layernorm
    "phi": ("attn.q.", "attn.k.", "attn.v.", "attn.o.", "mlp.", "norm"),
    # GPT2Block: ln_1, attn (c_attn, c_proj), ln_2, mlp: memlab's own order
    "gpt2": ("norm1", "attn.", "norm2", "mlp."),
    # GPTNeoXLayer: both norms, then attention, then the MLP
    "gpt_neox": ("norm", "attn.", "mlp."),
    # GPTJBlock: ln_1, attn (k_proj, v_proj, q_proj, out_proj), mlp
    "gptj": ("norm", "attn.k.", "attn.v.", "attn.q.", "attn.o.", "mlp."),
    # OPTDecoderLayer: self_attn (k, v, q, out), self_attn_layer_norm, fc1, fc2, final_layer_norm
    "opt": ("attn.k.", "attn.v.", "attn.q.", "attn.o.", "norm1", "mlp.up", "mlp.down", "norm2"),
    # FalconDecoderLayer: self_attention, mlp, then its norms (ln_attn/ln_mlp or input_layernorm)
    "falcon": ("attn.", "mlp.", "norm"),
}
"""Family -> the prefixes of memlab's block parameter names (after ``blocks.i.``) in the order the family's decoder
layer registers them; a name takes the rank of its longest matching prefix, ties keep memlab's order (a linear's
weight before its bias, an MLP's gate, up, down, as transformers has them)."""

TOP_ORDER: Mapping[str, tuple[str, ...]] = {
    # OPTDecoder.__init__: embed_tokens, embed_positions, final_layer_norm, then layers
    "opt": ("tok_emb.", "pos_emb.", "norm_f.", "blocks.", "head."),
}
_TOP = ("tok_emb.", "pos_emb.", "blocks.", "norm_f.", "head.")
"""The model-level order of every other family: embeddings, blocks, final norm, then the LM head (registered by
``*ForCausalLM.__init__`` after the base model)."""


def _rank(name: str, order: tuple[str, ...]) -> int:
    best = max((p for p in order if name.startswith(p)), key=len, default=None)
    if best is None:
        raise ConfigError(f"no registration order known for parameter {name!r}")
    return order.index(best)


def registration_order(config: TransformerConfig) -> list[tuple[str, tuple[int, ...], str]]:
    """``config.param_shapes()`` in the order the config's family registers them (module docstring); memlab's own
    order for the reference GPT. Raises :class:`ConfigError` for a Hugging Face family with no order here (every
    family :func:`memlab.predict.families.reader.from_hf` builds has one: the test checks it)."""
    shapes = config.param_shapes()
    family = config.impl.family
    if family == "reference":
        return shapes
    if family not in BLOCK_ORDER:
        raise ConfigError(f"{family}: no parameter registration order is known (memlab.predict.families.order)")
    block, top = BLOCK_ORDER[family], TOP_ORDER.get(family, _TOP)

    def key(item: tuple[int, tuple[str, tuple[int, ...], str]]) -> tuple[int, int, int, int]:
        i, (name, _, _) = item
        if not name.startswith("blocks."):
            return (_rank(name, top), 0, 0, i)
        _, layer, rest = name.split(".", 2)
        return (_rank(name, top), int(layer), _rank(rest, block), i)

    return [row for _, row in sorted(enumerate(shapes), key=key)]
