"""Calling conventions, the rest of issue 17 point 2: a hand-written loss on the returned logits (``loss_call``), left
padding (``padding_side``), what gradient checkpointing keeps of the mask with each mask convention, and the CUDA rules
(SDPA's kernel for a mask, CUDA autocast's op list), measured on the tiny HF configs against the estimate."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch

from memlab.errors import SetupError
from memlab.model.hf import build_hf_model
from memlab.model.loss import LossOptions, hf_causal_lm_loss
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.run.hf import call_inputs, predict_hf, run_hf

CONFIGS = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "tiny"
FAMILIES = tuple(sorted(p.stem for p in CONFIGS.glob("*.json")))
PRECISIONS = (("fp32", False), ("bf16", False), ("fp32", True))  # (model dtype, bf16 autocast)


def tiny(family: str) -> dict:
    return {k: v for k, v in json.loads((CONFIGS / f"{family}.json").read_text()).items() if not k.startswith("_")}


def _draws(n: int = 4, seed: int = 23) -> list[tuple]:
    """Seeded (family, attention, dtype, autocast, batch, seq, pad_fraction, loss_call, checkpointing) draws of a
    padded batch, eager and SDPA alternating (Gemma 2 has no SDPA: eager for it)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        family = rng.choice(FAMILIES)
        dtype, amp = rng.choice(PRECISIONS)
        out.append((family, "eager" if family == "gemma2" else ("eager", "sdpa")[i % 2], dtype, amp,
                    rng.randint(1, 3), rng.randint(6, 16), rng.choice((0.1, 0.25, 0.4)), rng.choice(("labels",
                    "manual")), rng.random() < 0.5))
    return out


def _run(family: str, attn: str, dtype: str, amp: bool, b: int, s: int, frac: float, call: str, gc: bool,
         side: str) -> tuple:
    return run_hf(tiny(family), attn_implementation=attn, dtype=dtype, batch=b, seq=s, autocast=amp,
                  attention_mask="padded", pad_fraction=frac, padding_side=side, loss_call=call,
                  gradient_checkpointing=gc)


@pytest.mark.parametrize(("family", "attn", "dtype", "amp", "b", "s", "frac", "call", "gc"), _draws())
def test_left_padding_and_the_loss_call_measured_against_the_estimate(family: str, attn: str, dtype: str,
                                                                       amp: bool, b: int, s: int, frac: float,
                                                                       call: str, gc: bool) -> None:
    tc, left = _run(family, attn, dtype, amp, b, s, frac, call, gc, "left")
    _, right = _run(family, attn, dtype, amp, b, s, frac, call, gc, "right")
    assert left.saved_bytes == right.saved_bytes  # no saved tensor's shape depends on where the zeros sit
    try:
        predicted = predict_hf(tc, left)["activations"]
    except SetupError as err:  # refused: one line, and only the combination measured not to match
        assert "\n" not in str(err) and "not" in str(err)
        return
    assert left.saved_bytes == predicted


@pytest.mark.parametrize("b", [1, 3])
def test_a_hand_written_loss_on_16_bit_logits_keeps_them_unupcast(b: int) -> None:
    """bf16 model, no autocast: the hand-written loss keeps a bf16 log-softmax and total_weight (2 B each less per
    element than transformers' fp32 upcast) and the user's targets (t ids, no padded copy: 8 B less at batch 1)."""
    family = random.Random(b).choice([f for f in FAMILIES if f != "gemma2"])
    s = 9
    runs = {call: run_hf(tiny(family), attn_implementation="sdpa", dtype="bf16", batch=b, seq=s, loss_call=call)
            for call in ("labels", "manual")}
    tc = runs["labels"][0]
    diff = runs["labels"][1].saved_bytes - runs["manual"][1].saved_bytes
    assert diff == 2 * b * s * tc.vocab_size + 2 + 8 * (b == 1) * tc.impl.loss_labels_padded
    for _, m in runs.values():
        assert m.saved_bytes == predict_hf(tc, m)["activations"]


def test_the_hand_written_loss_is_the_same_loss() -> None:
    torch.manual_seed(0)
    model = build_hf_model(tiny("llama"), attn_implementation="eager", dtype="fp32", device="cpu", seed=0)
    ids = torch.randint(0, model.config.vocab_size, (2, 10))
    labels, mask = call_inputs(ids, "padded", 0.3, "left")
    got = [hf_causal_lm_loss(model, ids, labels, LossOptions(call=c), mask) for c in ("labels", "manual")]
    assert torch.allclose(got[0], got[1], rtol=1e-5)


@pytest.mark.parametrize("changes", [
    dict(loss_call="manual", loss="fused"), dict(loss_call="manual", logits_to_keep=4, seq=8),
    dict(padding_side="left"), dict(padding_side="left", attention_mask="ones"), dict(loss_call="hand"),
    dict(loss_call="manual", mode="inference")])
def test_unmodelled_calls_are_refused_in_one_line(changes: dict) -> None:
    with pytest.raises(SetupError) as err:
        Setup(**changes)
    assert "\n" not in str(err.value)


def test_the_estimate_names_the_call() -> None:
    tc = from_hf(tiny("qwen2"))
    setup = Setup(batch=2, seq=12, precision="bf16", loss_call="manual", attention_mask="padded", pad_fraction=0.25,
                  padding_side="left")
    line = next(a for a in estimate(tc, setup, device_type="cpu").assumptions if a.startswith("the call:"))
    assert "left-padded" in line and "F.cross_entropy" in line and "no fp32 upcast" in line
    with pytest.raises(SetupError, match="memlab's own GPT"):
        estimate(preset("tiny-gpt"), Setup(batch=2, seq=8, loss_call="manual"), device_type="cpu")


@pytest.mark.parametrize("family", ["gpt2", "gptj", "phi", "llama"])
def test_gelu_new_under_cuda_autocast_is_named_with_its_bound(family: str) -> None:
    """CUDA's autocast runs pow in fp32, CPU's does not (torch amp Autocast Op Reference): for a gelu_new family the
    CUDA estimate names that its GELU tensors are counted as on CPU, with the bound per token; not on CPU, not
    without autocast, not for a SiLU family (Llama)."""
    tc = from_hf(tiny(family))
    setup = Setup(batch=2, seq=8, precision="amp-bf16")

    def note(st: Setup, dev: str) -> list[str]:
        return [a for a in estimate(tc, st, device_type=dev).assumptions if "gelu_new under CUDA autocast" in a]

    assert not note(setup, "cpu") and not note(setup.with_(precision="bf16"), "cuda")
    got = note(setup, "cuda")
    assert len(got) == (family != "llama")
    if got:
        per_token = 2 * tc.impl.mlp_saved_tensors("gelu") * tc.n_layers * tc.ffn
        assert f"up to {per_token:,} B per token" in got[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: this machine's torch sees none")
@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])
def test_on_cuda_an_all_ones_mask_saves_what_no_mask_saves_and_a_padded_batch_is_refused(family: str) -> None:
    """On a GPU: transformers drops an all-ones mask for SDPA there too (the kernel picked with no mask, flash for
    bf16), so ``ones`` saves what ``none`` saves and the estimate for both is the measured count; a padded batch
    hands SDPA an explicit mask (flash cannot take one: the memory-efficient or math kernel runs), which memlab
    refuses on CUDA rather than guess. Skipped without CUDA: a CPU run is never CUDA evidence."""
    runs = {conv: run_hf(tiny(family), attn_implementation="sdpa", dtype="bf16", batch=2, seq=16, device="cuda",
                         attention_mask=conv) for conv in ("none", "ones")}
    assert runs["ones"][1].saved_bytes == runs["none"][1].saved_bytes
    tc, m = runs["ones"]
    assert m.saved_bytes == predict_hf(tc, m)["activations"]
    padded = Setup(batch=2, seq=16, precision="bf16", attention="flash", attention_mask="padded", pad_fraction=0.25)
    with pytest.raises(SetupError, match="not"):
        estimate(tc, padded, device_type="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: this machine's torch sees none")
@pytest.mark.parametrize("family", ["gpt2", "phi"])
def test_on_cuda_gelu_new_under_autocast_sits_inside_its_named_bound(family: str) -> None:
    """On a GPU, fp32 model under bf16 autocast: the measured saved bytes lie between the CPU-measured count the
    estimate gives and that count plus the named bound (every gelu_new d_ff-wide tensor in fp32); the hand-written
    loss on a bf16 model is exact there too."""
    b, s = 2, 16
    tc, m = run_hf(tiny(family), attn_implementation="sdpa", dtype="fp32", batch=b, seq=s, device="cuda",
                   autocast=True)
    predicted = predict_hf(tc, m)["activations"]
    bound = 2 * tc.impl.mlp_saved_tensors("gelu") * tc.n_layers * tc.ffn * b * s
    assert predicted <= m.saved_bytes <= predicted + bound
    tc, manual = run_hf(tiny(family), attn_implementation="sdpa", dtype="bf16", batch=b, seq=s, device="cuda",
                        loss_call="manual")
    assert manual.saved_bytes == predict_hf(tc, manual)["activations"]
