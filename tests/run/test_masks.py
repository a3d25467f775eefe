"""Calling conventions (issue 17 point 2): an all-ones attention mask and a right-padded batch, measured on the tiny
HF configs against the estimate. ``ones`` saves what no mask saves (every family, eager and SDPA); ``padded`` saves
the same under eager and more under SDPA, which the Setup refuses in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch

from memlab.errors import SetupError
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.spec.setup import Setup
from memlab.run.hf import call_inputs, pad_counts, predict_hf, run_hf

CONFIGS = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "tiny"
FAMILIES = tuple(sorted(p.stem for p in CONFIGS.glob("*.json") if p.stem != "gemma2"))  # gemma2 has no SDPA


def tiny(family: str) -> dict:
    return {k: v for k, v in json.loads((CONFIGS / f"{family}.json").read_text()).items() if not k.startswith("_")}


def _draws(n: int = 5, seed: int = 17) -> list[tuple[str, str, str, int, int, float]]:
    """Seeded (family, attention, dtype, batch, seq, pad_fraction) draws, eager and SDPA alternating."""
    rng = random.Random(seed)
    return [(rng.choice(FAMILIES), ("eager", "sdpa")[i % 2], rng.choice(("fp32", "bf16")), rng.randint(2, 3),
             rng.randint(6, 20), rng.choice((0.1, 0.25, 0.4))) for i in range(n)]


@pytest.mark.parametrize(("family", "attn", "dtype", "batch", "seq", "frac"), _draws())
def test_conventions_measured_against_the_estimate(family: str, attn: str, dtype: str, batch: int, seq: int,
                                                   frac: float) -> None:
    runs = {conv: run_hf(tiny(family), attn_implementation=attn, dtype=dtype, batch=batch, seq=seq,
                         attention_mask=conv, pad_fraction=frac if conv == "padded" else 0.0)
            for conv in ("none", "ones", "padded")}
    saved = {conv: m.saved_bytes for conv, (_, m) in runs.items()}
    tc, ones = runs["ones"]
    assert saved["ones"] == saved["none"] == predict_hf(tc, ones)["activations"]
    _, padded = runs["padded"]
    assert saved["padded"] == predict_hf(tc, padded)["activations"]
    if attn == "eager" or family == "falcon":  # eager's mask changes values only; Falcon's SDPA always keeps one
        assert saved["padded"] == saved["none"]
    else:  # SDPA keeps an explicit (b, 1, s, s) mask per layer (and GQA repeats k, v)
        assert saved["padded"] > saved["none"]
        with pytest.raises(SetupError, match="not measured"):
            estimate(tc, padded.setup(tc), device_type="cuda")


def test_the_estimates_padding_test_counts_the_tokens_the_batch_pads() -> None:
    """The torch-free test the estimate and the trace use (family_terms.padding_present) agrees with the batch the
    runs build (pad_counts) on drawn shapes and fractions, scalars and arrays alike."""
    import numpy as np

    from memlab.predict.memory.family_terms import padding_present

    rng = random.Random(9)
    for _ in range(200):
        b, s, f = rng.randint(1, 6), rng.randint(2, 48), rng.choice((rng.random() * 0.3, 1 / rng.randint(2, 300)))
        try:
            pads = sum(pad_counts(b, s, f)) > 0
        except SetupError:
            continue
        setup = Setup(batch=b, seq=s, attention_mask="padded", pad_fraction=f)
        assert padding_present(setup, b, s) == pads, (b, s, f)
        assert padding_present(setup, np.array([b]), np.array([s]))[0] == pads
    assert padding_present(Setup(batch=2, seq=8, attention_mask="ones"), 2, 8) is False


@pytest.mark.parametrize("family", ["qwen3", "llama", "gpt2"])
def test_a_padded_call_that_pads_no_token_is_the_all_ones_call(family: str) -> None:
    """floor(pad_fraction b s) = 0 (a 1 x 9 batch at 0.1: a draw of seed 1) pads nothing, so transformers drops the
    all-ones mask for SDPA: the estimate keeps no 4-D mask or repeated K, V there, as measured, and refuses nothing
    on CUDA; a batch one token larger in padding gets them."""
    rng = random.Random(family)
    b, s = 1, rng.randint(6, 9)
    frac = 1 / (b * s) - 0.01
    tc, m = run_hf(tiny(family), attn_implementation="sdpa", dtype="fp32", batch=b, seq=s, attention_mask="padded",
                   pad_fraction=frac)
    _, ones = run_hf(tiny(family), attn_implementation="sdpa", dtype="fp32", batch=b, seq=s, attention_mask="ones")
    assert m.saved_bytes == ones.saved_bytes == predict_hf(tc, m)["activations"]
    assert estimate(tc, m.setup(tc), device_type="cuda").peak_bytes > 0
    tc, more = run_hf(tiny(family), attn_implementation="sdpa", dtype="fp32", batch=b, seq=s,
                      attention_mask="padded", pad_fraction=frac + 0.02)
    assert more.saved_bytes == predict_hf(tc, more)["activations"]
    assert more.saved_bytes > m.saved_bytes  # the 4-D mask each layer keeps (and, for GQA, repeated K, V)


@pytest.mark.parametrize("seed", range(20))
def test_padding_is_right_aligned_and_counted(seed: int) -> None:
    rng = random.Random(seed)
    b, s, f = rng.randint(1, 5), rng.randint(2, 40), rng.random() * 0.9
    ids = torch.arange(b * s).view(b, s)
    try:
        counts = pad_counts(b, s, f)
    except SetupError:
        assert int(f * b * s) // b + (int(f * b * s) % b > 0) >= s
        return
    labels, mask = call_inputs(ids, "padded", f)
    assert mask is not None and int((mask == 0).sum()) == sum(counts) == int(f * b * s)
    for row, n in enumerate(counts):
        assert mask[row, : s - n].all() and not mask[row, s - n:].any()  # padding at the end only
    assert torch.equal(labels == -100, mask == 0)
    assert call_inputs(ids, "none")[1] is None and bool(call_inputs(ids, "ones")[1].all())


@pytest.mark.parametrize("changes", [dict(pad_fraction=0.2), dict(attention_mask="padded", attention="math"),
                                     dict(attention_mask="ones", recompute="selective"),
                                     dict(attention_mask="ones", loss="fused"), dict(attention_mask="padded",
                                                                                     pad_fraction=1.0)])
def test_unmeasured_conventions_are_refused_in_one_line(changes: dict) -> None:
    """By Setup where its fields contradict, by the estimate where memlab has not measured the call."""
    with pytest.raises(SetupError) as err:
        estimate(from_hf(tiny("llama")), Setup(**changes))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family", ["gpt2", "llama", "opt", "qwen2"])
def test_a_padded_batch_traces_as_the_real_step_holds_it(family: str) -> None:
    """A padded batch's fake mask takes transformers' padded path (the 4-D mask built, as "tracing" makes it), so the
    fake trace equals the same step on real tensors with real padding, phase by phase, on drawn shapes, sides,
    attention and precision (OPT derives its positions from the mask: no value of it changes a byte)."""
    import random

    from memlab.tracing.hf import trace_hf

    rng = random.Random(family)
    for _ in range(2):
        b, s = rng.randint(1, 3), rng.randint(8, 32)
        setup = Setup(batch=b, seq=s, attention_mask="padded", pad_fraction=rng.choice((0.1, 0.25, 0.5)),
                      padding_side=rng.choice(("right", "left")), attention=rng.choice(("eager", "flash")),
                      precision=rng.choice(("fp32", "bf16", "amp-bf16")))
        fake, real = (trace_hf(tiny(family), setup, fake=f, device_type="cpu") for f in (True, False))
        assert [r.held_bytes for r in fake.phases] == [r.held_bytes for r in real.phases], setup
        assert fake.peak_bytes == real.peak_bytes and any("padded batch" in n for n in fake.notes)


def test_a_padded_batch_on_cuda_sdpa_is_refused_in_one_line() -> None:
    """Which CUDA SDPA kernel takes an explicit mask is not traced: one line, the ways out."""
    from memlab.tracing.hf import trace_hf

    setup = Setup(batch=2, seq=8, attention_mask="padded", pad_fraction=0.25, precision="bf16", attention="flash")
    with pytest.raises(SetupError, match="explicit mask") as err:
        trace_hf(tiny("gpt2"), setup)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("mask", "fraction"), [("none", 0.0), ("ones", 0.0), ("padded", 0.25)])
def test_what_the_loop_holds_after_the_step_is_the_calls_tensors(mask: str, fraction: float) -> None:
    """After the optimizer step the loop holds the call's own tensors: the ids, the labels (a copy, as a data
    collator makes them) and, with a mask, the int64 mask (8 B a token more). Measured live bytes (parameters,
    buffers and the call's tensors up) minus the estimate's held bytes is then exactly the rotary buffers, which the
    phases leave to the buffers overhead: inv_freq and original_inv_freq, head_dim / 2 fp32 each. (Batch 2 and 3:
    at batch 1 the estimate holds HF's padded label copy, b s + 1 ids, after the step, 8 B over the loop's labels.)"""
    cfg = json.loads((CONFIGS / "llama.json").read_text())
    rng = random.Random(f"{mask}")
    cfg.update(num_hidden_layers=1, vocab_size=rng.choice((96, 200)), intermediate_size=128)
    b, s = rng.randint(2, 3), rng.randint(12, 40)
    tc, m = run_hf(cfg, attn_implementation="sdpa", dtype="bf16", batch=b, seq=s, steps=2, phase_peaks=True,
                   attention_mask=mask, pad_fraction=fraction)
    held = {r.phase: r.held_bytes for r in estimate(tc, m.setup(tc), device_type="cpu").phases if r.step == "steady"}
    live = {r.phase: r.held_bytes for r in m.phase_peaks if r.step == "steady"}
    rotary = 2 * 4 * (tc.head_dim // 2)
    assert live["optimizer step"] - held["optimizer step"] == rotary
    assert live["zero_grad"] - held["zero_grad"] == rotary
