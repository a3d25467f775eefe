"""Configs memlab's tests did not choose: seeded draws of every supported Hugging Face family, each built small
and trained one real step, its saved activations and model states against the estimate, or a refusal.

A draw starts from a small config of the family (the caller's: the bench and the tests pass the tiny ones shipped
in ``memlab/course/configs/tiny``) and changes what its key account
(:mod:`memlab.predict.config_keys`) says memlab reads or refuses: the number of layers, the vocabulary and the MLP
width; every boolean key the account models, flipped at random; a dropout of 0.1 on the keys that carry one; and,
one draw in four, one refused key set to a value its account does not accept. The calling side is drawn too:
eager or SDPA attention (where transformers builds it), fp32, bf16 or an fp32 model under bf16 autocast,
gradient checkpointing on or off, batch 1-3 and 8-40 tokens. Each draw ends in one verdict:

- ``exact``: saved-for-backward bytes and parameters, gradients and AdamW state equal the estimate to the byte;
- ``refused``: :func:`memlab.predict.hf.from_hf` or the estimate raised a one-line :class:`~memlab.errors.MemlabError`
  (a refused key must end here);
- ``off``: a number differs, or a refused key was estimated anyway: silently wrong, the case this exists to find;
- ``unbuildable``: transformers itself rejects the drawn config (not memlab's to judge).

What it does not compare yet: the peak (memlab measures HF steps' saved bytes and states, not a live-bytes peak).
``benchmarks/hf_draws.py`` runs a large sample; ``tests/compare/test_hf_draws.py`` a seeded one.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memlab.errors import MemlabError

_LAYERS = ("num_hidden_layers", "n_layer")
_FF = ("intermediate_size", "n_inner", "ffn_dim")
_DROPOUT_WORDS = ("dropout", "pdrop")


@dataclass(frozen=True)
class HfDraw:
    """One drawn run: an HF config (a dict with ``model_type``) and how it is called."""

    family: str
    config: Mapping[str, Any]
    attention: str
    dtype: str
    autocast: bool
    checkpointing: bool
    batch: int
    seq: int
    refused_key: str | None = None
    """The refused key this draw set to a value its account does not accept (it must be refused)."""

    def label(self) -> str:
        """A short description for tables: family, call, shape and what was changed."""
        how = "amp-bf16" if self.autocast else self.dtype
        ck = " ckpt" if self.checkpointing else ""
        extra = f" {self.refused_key}=*" if self.refused_key else ""
        return f"{self.family} {self.attention} {how}{ck} b{self.batch}x{self.seq}{extra}"


@dataclass(frozen=True)
class HfVerdict:
    """The outcome of one :class:`HfDraw`: ``verdict`` (module docstring), the predicted and measured bytes per
    component (``activations``, ``states``) where both exist, and ``reason`` (the refusal, the error, or which
    component is off)."""

    draw: HfDraw
    verdict: str
    predicted: Mapping[str, int] = field(default_factory=dict)
    measured: Mapping[str, int] = field(default_factory=dict)
    reason: str = ""

    def error(self, component: str) -> float | None:
        """(predicted - measured) / measured for ``component``, or None without both."""
        p, m = self.predicted.get(component), self.measured.get(component)
        return None if p is None or not m else (p - m) / m


def draw_hf(rng: random.Random, base: Mapping[str, Any]) -> HfDraw:
    """One seeded draw from ``base``, a small HF config dict with ``model_type`` (module docstring)."""
    from memlab.predict.config_keys import CONDITIONAL, account
    from memlab.run.hf import attention_implementations

    family = str(base.get("model_type"))
    acc = account(family)
    cfg = {k: v for k, v in base.items() if not k.startswith("_")}
    for key in _LAYERS:
        if key in cfg:
            cfg[key] = rng.randint(1, 3)
    cfg["vocab_size"] = rng.choice((96, 128, 200, 512))
    for key in _FF:
        if cfg.get(key):
            cfg[key] = rng.choice((64, 96, 128, 160))
    for key in sorted(acc.modelled):
        if "." not in key and isinstance(cfg.get(key), bool) and rng.random() < 0.5:
            cfg[key] = not cfg[key]
        if any(w in key for w in _DROPOUT_WORDS) and key in cfg and rng.random() < 0.3:
            cfg[key] = 0.1
    refused = None
    candidates = [k for k in sorted(acc.refused) if "." not in k and k not in CONDITIONAL
                  and acc.accepted.get(k) and isinstance(acc.accepted[k][0], bool)]
    if candidates and rng.random() < 0.25:
        refused = rng.choice(candidates)
        cfg[refused] = not acc.accepted[refused][0]
    attention = rng.choice(attention_implementations(cfg))
    dtype, autocast = rng.choice((("fp32", False), ("bf16", False), ("fp32", True)))
    return HfDraw(family=family, config=cfg, attention=attention, dtype=dtype, autocast=autocast,
                  checkpointing=rng.random() < 0.3, batch=rng.randint(1, 3), seq=rng.randint(8, 40),
                  refused_key=refused)


def judge(draw: HfDraw, *, seed: int = 0) -> HfVerdict:
    """Build ``draw``'s model, train one step, and compare with the estimate (or record the refusal)."""
    from memlab.predict.hf import from_hf
    from memlab.run.hf import predict_hf, run_hf

    try:
        config = from_hf(dict(draw.config))
    except MemlabError as exc:
        return HfVerdict(draw, "refused", reason=str(exc))
    try:
        _, m = run_hf(dict(draw.config), attn_implementation=draw.attention, dtype=draw.dtype, batch=draw.batch,
                      seq=draw.seq, autocast=draw.autocast, gradient_checkpointing=draw.checkpointing, seed=seed)
    except MemlabError as exc:
        return HfVerdict(draw, "refused", reason=str(exc))
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:  # transformers rejects the drawn config
        return HfVerdict(draw, "unbuildable", reason=f"{type(exc).__name__}: {str(exc)[:200]}")
    try:
        p = predict_hf(config, m)
    except MemlabError as exc:
        return HfVerdict(draw, "refused", reason=str(exc))
    predicted = {"activations": p["activations"], "states": p["params"] + p["grads"] + p["optimizer"]}
    measured = {"activations": m.saved_bytes, "states": m.states_bytes}
    if draw.refused_key is not None:
        return HfVerdict(draw, "off", predicted, measured, f"{draw.refused_key} is refused but was estimated")
    off = [k for k in predicted if predicted[k] != measured[k]]
    return HfVerdict(draw, "off" if off else "exact", predicted, measured,
                     ", ".join(f"{k} {predicted[k] - measured[k]:+,} B" for k in off))


def hf_agreement(bases: Mapping[str, Mapping[str, Any]], draws: int, *, seed: int = 0) -> list[HfVerdict]:
    """``draws`` seeded draws spread in turn over ``bases`` (name -> small HF config), each judged
    (:func:`judge`)."""
    names = sorted(bases)
    rng = random.Random(seed)
    return [judge(draw_hf(rng, bases[names[i % len(names)]]), seed=seed) for i in range(draws)]


def verdict_counts(verdicts: Iterable[HfVerdict]) -> dict[str, int]:
    """How many draws ended in each verdict (every verdict named, zero where none)."""
    out = dict.fromkeys(("exact", "refused", "off", "unbuildable"), 0)
    for v in verdicts:
        out[v.verdict] += 1
    return out
