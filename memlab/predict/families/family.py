"""The record each family module exports: :class:`Family`, what :func:`memlab.predict.families.reader.from_hf` needs
to map one family's ``config.json`` (its defaults, its key account, its builder, its parameter order). Pure data."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memlab.predict.families.keys import KeyAccount
from memlab.predict.spec.model import TransformerConfig

Builder = Callable[[dict[str, Any], str, str], TransformerConfig]
"""``build(c, model_type, label)``: the checked config dict (defaults filled in) -> a TransformerConfig with its
:class:`~memlab.predict.spec.traits.Implementation` traits."""


@dataclass(frozen=True)
class Family:
    """One Hugging Face family (one ``model_type``, or a few whose transformers code is shared), as its module in
    :mod:`memlab.predict.families` declares it. Every mapping is keyed by ``model_type``."""

    model_types: tuple[str, ...]
    """The ``model_type`` values of a ``config.json`` this family reads."""
    defaults: Mapping[str, Mapping[str, Any]]
    """model_type -> the ``transformers`` defaults of the keys the builder reads (the family's
    ``configuration_*.py``); :func:`~memlab.predict.families.reader.from_hf` checks each given value by the kind
    of its default."""
    keys: Mapping[str, KeyAccount]
    """model_type -> every key of its config, modelled, neutral or refused (:mod:`memlab.predict.families.keys`)."""
    build: Builder
    """The builder (:data:`Builder`); it is called with the ``model_type``."""
    param_order: Mapping[str, tuple[str, ...]]
    """model_type -> the prefixes of memlab's block parameter names in the order the family's decoder layer
    registers them (:mod:`memlab.predict.families.order`)."""
    top_order: tuple[str, ...] | None = None
    """The model-level registration order, when it is not embeddings, blocks, final norm, head (OPT)."""
    rotary_key: str | None = None
    """The 4.x top-level key of the rotating share of head_dim (``rotary_pct``, ``partial_rotary_factor``), read
    when the rotary dict does not give ``partial_rotary_factor``; None: the whole head rotates unless it does."""
    attention_dropout_key: str = "attention_dropout"
    """The key of the attention probabilities' dropout (GPT-2, GPT-J: ``attn_pdrop``)."""
    aliases: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """model_type -> {a key of the config class's ``attribute_map``: the dataclass field it sets}: the other
    spelling of a size (GPT-2's ``hidden_size`` for ``n_embd``). Given, it wins over the field whatever the order:
    the field is assigned in ``__init__`` and the extra key afterwards, by ``PreTrainedConfig.__post_init__``,
    through ``__setattr__``'s ``attribute_map`` (transformers 5.x ``configuration_utils.py``); the reader applies
    it so (:func:`alias_given`)."""

    @classmethod
    def single(cls, model_type: str, *, defaults: Mapping[str, Any], keys: KeyAccount, build: Builder,
               param_order: tuple[str, ...], **more: Any) -> Family:
        """The record of a family of one ``model_type``."""
        return cls((model_type,), {model_type: defaults}, {model_type: keys}, build, {model_type: param_order},
                   **more)


def alias_given(raw: Mapping[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    """``raw`` with each given ``aliases`` key moved onto its field (its value replaces the field's, as the config
    class does: :attr:`Family.aliases`)."""
    out = dict(raw)
    for alias, name in aliases.items():
        if alias in out:
            out[name] = out.pop(alias)
    return out
