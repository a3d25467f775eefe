"""Korthikanti et al. 2022 [korthikanti2022], "Reducing Activation Recomputation in Large Transformer Models":
activation bytes per transformer layer under tensor and sequence parallelism and recomputation (their Table 2),
the paper's own formulas as pure functions, for the chapters and the calculators to set beside memlab's term-by-term
count (:mod:`memlab.predict.memory.activations`). No torch.
"""

from __future__ import annotations

from memlab.predict.spec.model import TransformerConfig


def korthikanti_layer_bytes(
    s: int, b: int, h: int, a: int, *, t: int = 1, sp: bool = False, recompute: str = "none"
) -> float:
    """Activation bytes per transformer layer from Korthikanti et al. 2022, Table 2 (16-bit, with dropout).

    none: ``sbh(10 + 24/t + 5as/(ht))``, or ``sbh/t (34 + 5as/h)`` with sequence parallelism;
    selective: ``sbh(10 + 24/t)``, or ``34 sbh/t``; full: ``2 sbh`` (``2 sbh/t`` with sequence parallelism).
    With t = 1 the first is the familiar ``sbh(34 + 5as/h)``.
    """
    sbh = s * b * h
    attn = 5 * a * s / h
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    if sp:
        return sbh / t * (34 + (0 if recompute == "selective" else attn))
    return sbh * (10 + 24 / t + (0 if recompute == "selective" else attn / t))


KORTHIKANTI_TABLE2_ROWS = (
    "no parallelism",
    "tensor parallel (baseline)",
    "tensor + sequence parallel",
    "tensor parallel + selective activation recomputation",
    "tensor parallel + sequence parallel + selective activation recomputation",
    "full activation recomputation",
)
"""The six rows of Korthikanti et al. 2022, Table 2, in the paper's order and wording [korthikanti2022]."""

KORTHIKANTI_TABLE2_SETUPS = (
    (1, False, "none"), (None, False, "none"), (None, True, "none"), (None, False, "selective"),
    (None, True, "selective"), (1, False, "full"),
)
"""Each Table 2 row as ``(t, sp, recompute)`` of :func:`korthikanti_layer_bytes` (``None``: the table's t). The
"full activation recomputation" row is printed without t or SP (``sbh(2)``): it is the row at t = 1; memlab's
:func:`korthikanti_layer_bytes` extends it to ``2 sbh / t`` under SP, where Megatron-LM keeps each checkpointed
layer input split along the sequence (memlab's own extension, stated, not a row of the paper)."""


def korthikanti_table2(s: int, b: int, h: int, a: int, t: int) -> dict[str, float]:
    """Korthikanti et al. 2022, Table 2, "activations memory per transformer layer", in bytes, every row at once
    [korthikanti2022]: sequence ``s``, micro-batch ``b``, hidden ``h``, heads ``a``, tensor-parallel size ``t``;
    16-bit activations, dropout on, the paper's GPT block (4h MLP). The rows, as printed:

    ``sbh(34 + 5as/h)``; ``sbh(10 + 24/t + 5as/(ht))``; ``sbh(34/t + 5as/(ht))``; ``sbh(10 + 24/t)``;
    ``sbh(34/t)``; ``sbh(2)``.
    """
    return {row: korthikanti_layer_bytes(s, b, h, a, t=t if tt is None else tt, sp=sp, recompute=rc)
            for row, (tt, sp, rc) in zip(KORTHIKANTI_TABLE2_ROWS, KORTHIKANTI_TABLE2_SETUPS, strict=True)}


def attention_score_share(config: TransformerConfig, seq: int) -> float:
    """Korthikanti's attention term 5as/h over the whole per-layer factor 34 + 5as/h (fraction of activations
    that selective recomputation removes)."""
    term = 5 * config.n_heads * seq / config.d_model
    return term / (34 + term)
