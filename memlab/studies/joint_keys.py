"""Every key of a family drawn jointly: the widened configs of the generated comparisons (issue 36).

:func:`memlab.studies.hf_draws.draw_hf` changes a few keys of a small config around its values (layers, vocabulary,
MLP width, the boolean keys the tiny config spells out, dropouts). The misses issue 36 found sit where keys meet:
a boolean key the tiny config leaves at its class default, a grouped-query variant of a partial-rotary family,
checkpointing at a width the tiny configs do not have. :func:`draw_joint` therefore draws every key the family's
account models (:mod:`memlab.predict.families.keys`) at once, each from its own short list, whether or not the base
config spells it out (its value there, else the transformers config class's default, is what a flip starts from):

- the shape: a width from :data:`WIDTHS` (small and large against the vocabularies of the draws), a number of heads
  whose head dimension is at least 8, a number of KV heads that divides it (MHA, GQA or MQA: :func:`variant`), an
  explicit ``head_dim`` where the family reads one, half of the time, and the MLP widths 1-4 x the width;
- the positions: a partial rotary factor (or GPT-J's ``rotary_dim``), a sliding window shorter or longer than the
  drawn sequence, logit soft-capping on or off;
- the experts: how many, how many per token, their normalisation, which layers are sparse;
- every boolean key flipped with probability 1/2, every dropout key 0 or 0.1, every activation key one of the
  activations memlab reads (:data:`memlab.predict.families.common.HF_ACTIVATIONS`).

Pure dict-in, dict-out but for the config class defaults (read once per family from transformers). A drawn
combination that memlab refuses ends as ``refused``, one transformers rejects as ``unbuildable``: both are answers.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from typing import Any

WIDTHS = (32, 64, 128, 256, 512)
"""The model widths a joint draw picks from: 32-64 narrower than every vocabulary of the draws (the small-width
checkpointing peaks of issue 36), 256-512 wider than most (the layer terms dominate)."""
HEAD_DIMS = (8, 16, 32, 64)
"""The explicit ``head_dim`` values a joint draw picks from where the family reads the key."""
_WIDTH_KEYS = ("hidden_size", "n_embd")
_HEAD_KEYS = ("num_attention_heads", "n_head")
_KV_KEYS = ("num_key_value_heads", "num_kv_heads")
_FF_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "moe_intermediate_size",
            "shared_expert_intermediate_size")
_FOLLOW_WIDTH = ("word_embed_proj_dim",)
"""Keys that must equal the width for the family to be modelled (OPT's projection: refused unless equal)."""
_ACTIVATION_KEYS = ("hidden_act", "activation_function", "hidden_activation", "activation")
_EXPERT_KEYS = ("num_experts", "num_local_experts")
_CHOICES: dict[str, tuple[Any, ...]] = {
    "partial_rotary_factor": (0.25, 0.5, 1.0),
    "rotary_pct": (0.25, 0.5, 1.0),
    "sliding_window": (None, 8, 16, 32, 256),
    "attn_logit_softcapping": (None, 50.0),
    "final_logit_softcapping": (None, 30.0),
    "decoder_sparse_step": (1, 2),
    "mlp_only_layers": ([], [0]),
    "num_ln_in_parallel_attn": (None, 1, 2),
    "sliding_window_pattern": (1, 2, 6),
    "_sliding_window_pattern": (1, 2, 6),
}
"""Keys drawn from a short list of their own (values transformers' configs of these families take)."""
_DROPOUT_WORDS = ("dropout", "pdrop")
_NO_KV = ("gptj",)
"""Families whose account lists ``num_key_value_heads`` (an alias transformers maps) but that have no grouped heads."""


@functools.cache
def class_defaults(model_type: str) -> Mapping[str, Any]:
    """The defaults of ``model_type``'s transformers config class (``CONFIG_MAPPING[model_type]()``), as a dict."""
    from transformers import CONFIG_MAPPING

    from memlab.model.hf import quiet_transformers

    with quiet_transformers():
        return CONFIG_MAPPING[model_type]().to_dict()


def draw_joint(rng: random.Random, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` (an HF config dict with ``model_type``) with every key its family's account models drawn jointly from
    ``rng`` (module docstring); the other keys (layers, vocabulary, refused keys) as given."""
    from memlab.predict.families.registry import account

    family = str(cfg["model_type"])
    modelled = {k for k in account(family).modelled if "." not in k}
    defaults = class_defaults(family)
    out = dict(cfg)
    _draw_shape(rng, out, modelled, family)
    for key in sorted(modelled):
        value = out.get(key, defaults.get(key))
        if key in _CHOICES:  # None only where the class's default may be None (Gemma 2's window is an int)
            out[key] = rng.choice([c for c in _CHOICES[key] if c is not None or not isinstance(value, int)])
        elif key in _ACTIVATION_KEYS and isinstance(value, str):
            from memlab.predict.families.common import HF_ACTIVATIONS

            out[key] = rng.choice(sorted(HF_ACTIVATIONS))
        elif any(w in key for w in _DROPOUT_WORDS) and isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = rng.choice((0.0, 0.1))
        elif isinstance(value, bool):
            out[key] = rng.random() < 0.5
    _draw_positions_and_experts(rng, out, modelled)
    return out


def _draw_shape(rng: random.Random, out: dict[str, Any], modelled: set[str], family: str) -> None:
    """Width, heads, KV heads, an explicit head dimension (half of the time, where read) and the MLP widths."""
    width = rng.choice(WIDTHS)
    heads = rng.choice([h for h in (1, 2, 4, 8) if width // h >= 8])
    for key in _WIDTH_KEYS + _FOLLOW_WIDTH:
        if key in out:
            out[key] = width
    for key in _HEAD_KEYS:
        if key in out:
            out[key] = heads
    kv_keys = [k for k in _KV_KEYS if k in modelled and family not in _NO_KV]
    kv_key = next((k for k in kv_keys if k in out), kv_keys[0] if kv_keys else None)  # the spelling given first
    if kv_key is not None:
        out[kv_key] = rng.choice([k for k in (1, 2, 4, 8) if heads % k == 0 and k <= heads])
    if "head_dim" in modelled:
        out["head_dim"] = rng.choice(HEAD_DIMS) if rng.random() < 0.5 else width // heads
    for key in _FF_KEYS:
        if key in modelled and (out.get(key) or key == "ffn_hidden_size"):
            out[key] = 8 * round(width * rng.choice((1.0, 1.5, 2.0, 4.0)) / 8)


def _draw_positions_and_experts(rng: random.Random, out: dict[str, Any], modelled: set[str]) -> None:
    """GPT-J's ``rotary_dim`` (an even part of the head dimension, or the whole) and the experts: how many, and how
    many each token takes (at most all of them)."""
    if "rotary_dim" in modelled:
        head = out.get("n_embd", 64) // out.get("n_head", 4)
        out["rotary_dim"] = rng.choice(sorted({max(2, 2 * int(head * f // 2)) for f in (0.25, 0.5, 1.0)}))
    experts = next((k for k in _EXPERT_KEYS if k in modelled and k in out), None)
    if experts is not None:
        out[experts] = rng.choice((2, 4, 8))
        if "num_experts_per_tok" in modelled:
            out["num_experts_per_tok"] = rng.choice([k for k in (1, 2, 4) if k <= out[experts]])


def variant(cfg: Mapping[str, Any]) -> str:
    """The attention variant of an HF config dict, for the coverage table: ``MHA``, ``GQA`` or ``MQA`` (KV heads
    against heads), ``+partial-rotary`` (a rotary factor below 1 or a ``rotary_dim`` below the head dimension),
    ``+sliding`` (a window) and ``+softcap`` (attention logit soft-capping)."""
    heads = next((cfg[k] for k in _HEAD_KEYS if cfg.get(k)), 1)
    kv = next((cfg[k] for k in _KV_KEYS if cfg.get(k)), heads)
    if cfg.get("model_type") == "falcon" and not cfg.get("new_decoder_architecture"):
        kv = 1 if cfg.get("multi_query", True) else heads
    name = "MHA" if kv == heads else "MQA" if kv == 1 else "GQA"
    width = next((cfg[k] for k in _WIDTH_KEYS if cfg.get(k)), 0)
    partial = (cfg.get("partial_rotary_factor") or 1.0) < 1 or (cfg.get("rotary_pct") or 1.0) < 1 or (
        cfg.get("rotary_dim") is not None and cfg["rotary_dim"] < width // heads)
    sliding = bool(cfg.get("sliding_window")) and cfg.get("use_sliding_window", True) is not False
    return name + ("+partial-rotary" if partial else "") + ("+sliding" if sliding else "") + (
        "+softcap" if cfg.get("attn_logit_softcapping") else "")
