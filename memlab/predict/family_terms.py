"""What the newer families' code adds to the saved tensors and what it cannot run, kept beside
:mod:`memlab.predict.activations` (which calls these): the q/k norms' rows (Qwen3, OLMo 2, Gemma 3) and the setup
refusals of a sliding window and of soft-capping (:mod:`memlab.predict.hf_families` sets the traits). Pure
arithmetic on ints or numpy arrays; no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memlab.errors import SetupError
from memlab.predict.models import TransformerConfig

FP32 = 4


def qk_norm_rows(config: TransformerConfig, t: Any, compute: float) -> list[tuple]:
    """What the RMSNorms on q and k keep (``config.impl.qk_norm``), all layers, as activation term rows: the
    projection's output upcast to fp32 (in an fp32 model the output itself, otherwise a new fp32 tensor), the fp32
    rstd per normalised row, and the normalised tensor the weight multiplies (cast back to the projection's dtype,
    ``compute`` bytes, or fp32 for OLMo 2's and Gemma's kinds, Gemma's with ``1 + weight``) [hf-transformers:
    modeling_qwen3.py Qwen3RMSNorm, modeling_olmo2.py Olmo2RMSNorm, modeling_gemma3.py Gemma3RMSNorm]. ``t``:
    tokens in the micro-batch."""
    im, L = config.impl, config.n_layers
    width = config.q_dim + config.kv_dim
    rows = (config.n_heads + config.n_kv_heads) if im.qk_norm == "head" else 2
    weight = 2 * config.head_dim if im.qk_norm == "head" else width
    out: list[tuple] = [("q/k norm input, fp32", "norms", L * t * width, FP32, True, "x.to(float32)"),
                        ("q/k norm rstd, fp32", "norms", L * t * rows, FP32, True)]
    if im.rmsnorm in ("fp32", "fp32-product"):
        out.append(("q/k norm x*rstd, fp32", "norms", L * t * width, FP32, True))
        if im.rmsnorm == "fp32":
            out.append(("q/k norm 1 + weight, fp32", "norms", L * weight, FP32, False))
    else:
        out.append(("q/k norm x*rstd cast back", "norms", L * t * width, compute, True))
    return out


def check_family_setup(config: TransformerConfig, setup: Any, seq: Any = None) -> None:
    """Raise :class:`~memlab.errors.SetupError` (one line) for a setup the family's code runs differently from what
    memlab counts: a ``seq`` (default ``setup.seq``) reaching the sliding window with a fused or math kernel
    (:meth:`~memlab.predict.traits.Implementation.check_window`); attention soft-capping with SDPA's math or
    memory-efficient kernel (PyTorch SDPA has no softcap; transformers refuses sdpa for Gemma 2); the final logits'
    soft-capping with memlab's chunked or fused loss (which compute the logits themselves, without the cap)."""
    im = config.impl
    im.check_window(setup.seq if seq is None else seq, setup.attention)
    if im.attn_softcap and setup.attention in ("math", "efficient"):
        raise SetupError(f"{im.family}: attention logit soft-capping runs in eager or flash attention only "
                         "(PyTorch SDPA has no softcap; transformers refuses sdpa for it)")
    if im.final_softcap and setup.mode != "inference" and setup.loss != "plain":
        raise SetupError(f"{im.family}: final_logit_softcapping caps the model's own logits; the {setup.loss} loss "
                         "computes its logits itself, without the cap: use loss='plain'")
    _check_autocast_draws(config, setup)


def _check_autocast_draws(config: TransformerConfig, setup: Any) -> None:
    """Refuse the three HF setups under bf16 autocast that generated draws (:mod:`memlab.compare.hf_draws`) found
    memlab's count to miss, each measured on tiny configs and not yet modelled: eager attention with dropout on the
    probabilities in a family that softmaxes in fp32 (one more 16-bit (b, a, s, s) tensor per layer: Llama, Qwen2,
    Phi, Starcoder2); eager attention with one K/V head at batch 1, where ``repeat_kv`` stays a view (Gemma:
    -5,376 B at b1 x 14); Falcon with ``bias`` (-512 B per token and layer at d_model 64)."""
    im = config.impl
    if im.family == "reference" or not setup.policy.autocast or setup.mode == "inference":
        return
    why = ""
    if setup.attention == "eager" and im.softmax_fp32 and im.attention_dropout_or(config.dropout) > 0:
        why = "eager attention with attention dropout keeps one more 16-bit score tensor per layer than memlab counts"
    elif (setup.attention == "eager" and im.eager_repeat_kv and config.n_kv_heads == 1
          and bool(np.any(np.asarray(setup.batch) == 1))):
        why = ("eager attention with one K/V head at batch 1 (repeat_kv stays a view) keeps tensors memlab does "
               "not count")
    elif im.family == "falcon" and im.mlp_bias is not False:  # None: as config.bias (True: the norms' bias)
        why = "Falcon with bias keeps per-token tensors memlab does not count"
    if why:
        raise SetupError(f"{im.family} under bf16 autocast: {why} (measured on tiny configs, not modelled yet): "
                         "use a 16-bit or fp32 model without autocast, or trace it (memlab trace --hf)")
