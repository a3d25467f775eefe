"""The spec of one calculator run: :class:`Run`, the training step every estimator of the shoot-out is asked about.

A :class:`Run` is an HF config (a dict with ``model_type``), batch and sequence, the model's dtype, the attention
implementation transformers runs, the recipe (:data:`RECIPES`), recompute and the fine-tuning method. It is a
description, not a measurement: :func:`memlab.run.hf.measure_run` runs it for real on this machine, the
calculators of the shoot-out study (:mod:`memlab.studies.calculators`) each predict it, and :meth:`Run.setup` is
memlab's own :class:`~memlab.predict.spec.setup.Setup` for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memlab.errors import SetupError
from memlab.predict.families.reader import from_hf, hf_attention
from memlab.predict.spec.setup import Setup

RECIPES = {"": "the pure recipe of the run's dtype", "mixed-bf16": "bf16 model, fp32 master weights and Adam states",
           "amp-bf16": "fp32 model under torch.autocast(bf16): Hugging Face Trainer's bf16=True"}
"""The recipes a :class:`Run` trains with (``""``: pure fp32 or pure bf16)."""


@dataclass(frozen=True)
class Run:
    """One training step every calculator is asked about: an HF config (dict with ``model_type``) and the shape."""

    hf: dict[str, Any] = field(hash=False)
    batch: int
    seq: int
    dtype: str = "fp32"
    attn_implementation: str = "eager"
    device_type: str = "cpu"
    name: str = ""
    finetune: str = "full"
    """``full``, ``lora`` or ``qlora`` (:attr:`memlab.predict.spec.setup.Setup.finetune`), with the LoRA fields
    below."""
    lora_rank: int = 0
    lora_targets: str = ""
    precision: str = ""
    """The training recipe (a :data:`RECIPES` key): "" is the pure one of ``dtype`` (``fp32``, or ``bf16``: bf16
    weights, gradients and Adam states, as ``model.to(torch.bfloat16)`` trains); ``mixed-bf16`` is a bf16 model
    with fp32 master weights and Adam states (``dtype`` must be ``bf16``), the recipe most calculators assume;
    ``amp-bf16`` is an fp32 model under ``torch.autocast`` in bf16 (``dtype`` must be ``fp32``), what Hugging Face
    Trainer's ``bf16=True`` runs."""
    recompute: str = "none"
    """``none`` or ``full`` (gradient checkpointing of every block: transformers' ``gradient_checkpointing_enable``)."""

    def __post_init__(self) -> None:
        if self.precision not in RECIPES:
            raise SetupError(f"Run.precision must be one of {', '.join(map(repr, RECIPES))}, got "
                             f"{self.precision!r:.40}")
        if self.precision == "mixed-bf16" and self.dtype != "bf16":
            raise SetupError(f"a mixed-bf16 run trains a bf16 model (dtype='bf16'), got dtype={self.dtype!r:.20}")
        if self.precision == "amp-bf16" and self.dtype != "fp32":
            raise SetupError(f"an amp-bf16 run autocasts an fp32 model (dtype='fp32'), got dtype={self.dtype!r:.20}")
        if self.recompute not in ("none", "full"):
            raise SetupError(f"Run.recompute must be 'none' or 'full', got {self.recompute!r:.40}")

    @property
    def recipe(self) -> str:
        """The memlab precision policy the run trains with: ``precision``, or the pure recipe of ``dtype``."""
        return self.precision or ("fp32" if self.dtype == "fp32" else "bf16")

    @property
    def label(self) -> str:
        ft = "" if self.finetune == "full" else f" {self.finetune} r{self.setup().lora_r}"
        ck = "" if self.recompute == "none" else " ckpt"
        return (f"{self.name or self.hf.get('model_type')} {self.attn_implementation} {self.recipe} "
                f"b{self.batch}x{self.seq}{ck}{ft}")

    def setup(self) -> Setup:
        """memlab's Setup for the run (:attr:`recipe`, ``recompute``, the kernel ``attn_implementation`` runs)."""
        cfg = from_hf(self.hf)
        p = cfg.impl.attention_dropout_or(cfg.dropout)
        return Setup(batch=self.batch, seq=self.seq, precision=self.recipe, optimizer="adamw",
                     attention=hf_attention(self.attn_implementation, self.device_type, self.dtype, p),
                     recompute=self.recompute, finetune=self.finetune, lora_rank=self.lora_rank,
                     lora_targets=self.lora_targets)
