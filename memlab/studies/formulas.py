"""The calculators that are formulas (no package to call): gpu_poor's ``src/App.js`` ``[gpu-poor]``, and the one
formula Transformer Math 101 ``[anthony2023]`` and the Ultra-Scale Playbook ``[tazi2025]`` share (Korthikanti et
al.'s activations ``[korthikanti2022]``), each read from its source and scored only on its scope
(:mod:`memlab.compare.scoring`). Part of :mod:`memlab.studies.calculators`, which re-exports them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from memlab.compare.scoring import CalculatorResult, scoped
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.korthikanti import korthikanti_layer_bytes
from memlab.predict.spec.model import TransformerConfig

if TYPE_CHECKING:
    from memlab.run.spec import Run


def _params(run: Run) -> int:
    return from_hf(run.hf).param_count()


def _bytes16(run: Run) -> int:
    return 4 if run.dtype == "fp32" else 2


def _gpu_poor_config(hf: dict[str, Any]) -> dict[str, int]:
    """gpu_poor's ``getParseConfig``: the first key present, else its default."""

    def key(names: Iterable[str], default: int) -> int:
        return next((hf[n] for n in names if hf.get(n) is not None), default)

    h = key(["hidden_size", "d_model", "n_embd"], 768)
    heads = key(["num_attention_heads", "num_heads", "n_head"], 12)
    return {"vocab": key(["vocab_size"], 32000), "h": h, "heads": heads,
            "inter": key(["intermediate_size", "n_inner", "d_ff"], 4 * h),
            "layers": key(["num_layers", "num_hidden_layers", "n_layer"], 12)}


GPU_POOR_APP = "src/App.js @ ad2fc0e (2024-12-03)"
"""The gpu_poor source the formulas below are read from (RahulSChand/gpu_poor)."""


def _gpu_poor_qlora_extra(c: dict[str, int], seq: int) -> float:
    """gpu_poor's ``getExtraMemory(config, "qlora", contextLen)`` (App.js lines 340-383): 0.75 x (15 h + 6 i) L
    x 50 x sqrt(max(1, seq / 50)) bytes per sequence, an empirical 4-bit dequantisation allowance."""
    common = (10 * c["h"] + 5 * c["h"] + 4 * c["inter"] + 2 * c["inter"]) * c["layers"]
    return 0.75 * common * 50 * (seq / 50) ** 0.5 if seq > 50 else 0.75 * common * 50


def gpu_poor(run: Run) -> CalculatorResult:
    """gpu_poor's training estimate (``src/App.js``: ``computeModelSize``, ``getGradOptMemory`` with Adam and no
    quantisation, ``getActivationMemory``; ``convertToBytes`` is 2 for every float type). ``[gpu-poor]``

    Its LoRA mode (``lora_trn``, App.js lines 297-301): 16-bit weights plus ``L * 8 * h * 2 * 4 * 3 * 2`` bytes of
    adapter gradients and Adam states, whatever the rank or target modules; QLoRA (``qlora``, lines 239-245 and
    ``convertToMBModelSize``, lines 770-790): weights ``2N/4 - 2N/64 + 0.06 x 2N`` bytes, states ``L * 8 * h * 0.5 *
    4 * 3`` plus :func:`_gpu_poor_qlora_extra` per sequence. Activations are its full-training ones in every mode
    (its LoRA activation term is commented out, lines 454-457). Scored only where it applies: activations on eager
    attention (its s x s terms), a fine-tune on 16-bit weights."""
    c = _gpu_poor_config(run.hf)
    h, inter, heads, L, n = c["h"], c["inter"], c["heads"], c["layers"], run.seq
    params = c["vocab"] * h * 2 + L * 4 * h * h + L * 3 * inter * h
    fb = 2.0
    if run.finetune == "lora":
        states = params * fb + L * 8 * h * 2 * 4 * 3 * 2
    elif run.finetune == "qlora":
        states = params * fb / 4 - params * fb / 64 + 0.06 * params * fb \
            + L * 8 * h * 0.5 * 4 * 3 + _gpu_poor_qlora_extra(c, n) * run.batch
    else:
        states = params * fb + params * 3 * fb
    attn = (n * h * 3 * fb + n * h * 2 * fb + n * n * heads * fb + n * n * heads * 4 + n * n * heads * fb
            + 3 * n * h * fb)
    ffn = 2 * h * n * fb + fb * 5 * n * inter + inter * n * fb
    norm = n * 4 * 2 + n * h * fb * 6
    acts = (attn + ffn + norm) * L * run.batch
    note = "its own parameter formula; 650 MB overhead left out"
    reasons = {"peak": "a sum of terms, no peak"}
    claims: dict[str, float | None] = {"states": states, "activations": acts}
    if run.attn_implementation not in ("eager", "math"):
        reasons["activations"] = (f"models eager attention's s x s scores (getActivationMemory), not "
                                  f"{run.attn_implementation}")
        claims["activations"] = None
    if run.finetune != "full":
        if run.dtype == "fp32":
            reasons["states"] = reasons["activations"] = "assumes 16-bit weights (convertToBytes is 2), not fp32"
            claims = {}
        return scoped("gpu_poor", claims, reasons, note=note)
    if run.recipe != "bf16":
        reasons["states"] = f"assumes 2-byte weights, gradients and Adam states (pure 16-bit), not {run.recipe}"
        claims["states"] = None
    if run.recipe == "fp32":
        reasons["activations"] = "2-byte activations (every float type is 2 bytes), not fp32"
        claims["activations"] = None
    if run.recompute != "none":
        reasons["activations"] = "no gradient checkpointing option"
        claims["activations"] = None
    return scoped("gpu_poor", claims, reasons, note=note)


KORTHIKANTI = "transformer-math-101 / ultrascale-playbook"
"""One tool row for the two guides that print one formula: 16 B/param with AdamW on the mixed recipe (TM101's 2 + 2
+ 12, the Playbook's 2 + 2 + 4 + 8) and Korthikanti et al.'s activations (TM101 with t = 1 is the Playbook's
``L s b h (34 + 5 a s / h)``)."""


def _korthikanti_model_bytes(run: Run, cfg: TransformerConfig, recompute: str = "none") -> float:
    """L layers of Korthikanti's per-layer bytes (t = 1; ``recompute`` none, selective or full). The formula is
    linear in b, so the L layers of batch b are passed as one layer of batch b*L: the integer product s*b*L*h comes
    first, as both sources write it, and the float result is the same to the last bit."""
    return korthikanti_layer_bytes(run.seq, run.batch * cfg.n_layers, cfg.d_model, cfg.n_heads, recompute=recompute)


def korthikanti_variant(run: Run) -> str:
    """Which of the guides' activation formulas a run is: ``full`` with gradient checkpointing (TM101's ``2 sbhL``);
    ``selective`` for a fused SDPA kernel, which stores no ``s x s`` scores (TM101's ``sbhL(10 + 24/t)``: the
    Playbook notes FlashAttention makes selective recomputation native); ``none`` for eager attention (with the
    ``5as/h`` scores term)."""
    if run.recompute == "full":
        return "full"
    return "none" if run.setup().attention in ("eager", "math") else "selective"


def korthikanti_guides(run: Run) -> CalculatorResult:
    """Transformer Math 101 and the Ultra-Scale Playbook, one formula (:data:`KORTHIKANTI`) applied as documented:
    states 16 B/param (the mixed recipe of both; for fp32, the Playbook's full-precision 4 + 4 + 8, where TM101
    read literally keeps a 12 B/param AdamW term with a master copy fp32 training does not have); activations
    ``sbhL(10 + 24 + 5as/h)`` with eager attention, without the ``5as/h`` scores under a fused SDPA kernel, ``2 sbhL``
    with full checkpointing (:func:`korthikanti_variant`), 2-byte activations (16-bit recipes only); total their
    sum. A pure bf16 run's 8 B/param states are out of scope. ``[anthony2023]`` ``[tazi2025]``"""
    if run.finetune != "full":
        return CalculatorResult(KORTHIKANTI, None, None, note="full training only")
    n, cfg = _params(run), from_hf(run.hf)
    reasons = {"peak": "a sum of terms, no peak"}
    claims: dict[str, float | None] = {"states": float(16 * n),
                                       "activations": _korthikanti_model_bytes(run, cfg, korthikanti_variant(run))}
    if run.recipe == "bf16":
        reasons["states"] = "assumes fp32 master weights and Adam states (16 B/param), not pure bf16"
        claims["states"] = None
    if run.recipe == "fp32":
        reasons["activations"] = "2-byte (16-bit) activations, not fp32"
        claims["activations"] = None
    return scoped(KORTHIKANTI, claims, reasons, note=f"activations: Korthikanti, recompute "
                                                      f"{korthikanti_variant(run)!r} form")


def transformer_math_101(run: Run) -> CalculatorResult:
    """EleutherAI's Transformer Math 101 read literally (kept for the by-hand check; the shoot-out scores
    :func:`korthikanti_guides`): model 4 (fp32) or 2 (16-bit) B/param, AdamW 12 B/param, gradients 4 or 2 B/param;
    activations without recomputation ``s b h L (10 + 24/t + 5 a s / (h t))`` with t = 1. ``[anthony2023]``"""
    if run.finetune != "full":
        return CalculatorResult("transformer-math-101", None, None, note="full training only")
    n, cfg = _params(run), from_hf(run.hf)
    b16 = _bytes16(run)
    return CalculatorResult("transformer-math-101", float(n * (b16 + 12 + b16)),
                            float(_korthikanti_model_bytes(run, cfg)))


def ultrascale_playbook(run: Run) -> CalculatorResult:
    """The Ultra-Scale Playbook read literally (kept for the by-hand check; the shoot-out scores
    :func:`korthikanti_guides`): 16 N bytes with Adam; activations ``L s b h (34 + 5 a s / h)``. ``[tazi2025]``"""
    if run.finetune != "full":
        return CalculatorResult("ultrascale-playbook", None, None, note="full training only")
    n, cfg = _params(run), from_hf(run.hf)
    return CalculatorResult("ultrascale-playbook", float(16 * n), float(_korthikanti_model_bytes(run, cfg)))
