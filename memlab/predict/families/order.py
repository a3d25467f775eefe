"""The order a Hugging Face family registers its parameters in: the order ``model.parameters()`` yields them, so
the order ``torch.optim.AdamW(model.parameters())`` steps them, one tensor after another, in its for-loop
implementation (the CPU default).

The for-loop step's worst moment is ``2 x a tensor + the one before it`` (:mod:`memlab.predict.memory.phases`): which
tensor comes before the largest one is a fact of the modelling code, not of the shapes. memlab's own naming
(:meth:`memlab.predict.spec.model.TransformerConfig.param_shapes`) follows :mod:`memlab.model.gpt` (norm, attention,
norm, MLP); transformers registers a module's children in the order its ``__init__`` assigns them, so a Llama
block yields attention, MLP, then its two norms, and the first attention weight follows the embedding directly
(``LlamaModel.__init__``: ``embed_tokens``, ``layers``, ``norm``). Each family's order is read from its
``modeling_<family>.py`` (transformers 5.x), declared in its family module (``param_order``), and checked
against ``named_parameters()`` of the real model, on the shipped tiny configs and on drawn ones, by
``tests/predict/families/test_hf_order.py``. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from memlab.errors import ConfigError
from memlab.predict.families.registry import FAMILIES
from memlab.predict.spec.model import TransformerConfig

BLOCK_ORDER: Mapping[str, tuple[str, ...]] = {t: f.param_order[t] for t, f in FAMILIES.items()}
"""Family -> the prefixes of memlab's block parameter names (after ``blocks.i.``) in the order the family's decoder
layer registers them (each family module's ``param_order``); a name takes the rank of its longest matching prefix,
ties keep memlab's order (a linear's weight before its bias, an MLP's gate, up, down, as transformers has them)."""

_TOP = ("tok_emb.", "pos_emb.", "blocks.", "norm_f.", "head.")
"""The model-level order of every family without its own ``top_order`` (OPT has one): embeddings, blocks, final
norm, then the LM head (registered by ``*ForCausalLM.__init__`` after the base model)."""


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
    block, top = BLOCK_ORDER[family], FAMILIES[family].top_order or _TOP

    def key(item: tuple[int, tuple[str, tuple[int, ...], str]]) -> tuple[int, int, int, int]:
        i, (name, _, _) = item
        if not name.startswith("blocks."):
            return (_rank(name, top), 0, 0, i)
        _, layer, rest = name.split(".", 2)
        return (_rank(name, top), int(layer), _rank(rest, block), i)

    return [row for _, row in sorted(enumerate(shapes), key=key)]
