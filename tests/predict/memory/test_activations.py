"""memlab.predict.memory.activations: the term-by-term activation model equals what the reference GPT saves for backward
(exactly,
category by category, on CPU), and reduces to Korthikanti et al. 2022 (arXiv:2205.05198) Section 4 / Table 2."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest
import torch

from memlab.errors import SetupError
from memlab.measure.accounting import SavedTensorRecorder
from memlab.model.gpt import GPT
from memlab.model.saved import saved_tensor_category
from memlab.model.step import autocast, model_dtype
from memlab.predict.memory.activations import CATEGORIES, activation_bytes, activation_terms, widths
from memlab.predict.memory.korthikanti import (
    KORTHIKANTI_TABLE2_ROWS,
    KORTHIKANTI_TABLE2_SETUPS,
    attention_score_share,
    korthikanti_layer_bytes,
    korthikanti_table2,
)
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup

CPU = torch.device("cpu")
CUSTOM = TransformerConfig(name="custom-nobias", d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=80,
                           vocab_size=97, max_seq=64, bias=False, norm="layernorm", tied_embeddings=False)
MODELS = {"tiny-gpt": preset("tiny-gpt"), "tiny-llama": preset("tiny-llama"), CUSTOM.name: CUSTOM}


def measured_by_category(config: TransformerConfig, setup: Setup, seed: int = 0) -> dict[str, int]:
    """Bytes the reference GPT saves for backward in one training forward, by category (as the runner records)."""
    torch.manual_seed(seed)
    model = GPT(config, attention=setup.attention, recompute=setup.recompute, dtype=model_dtype(setup.policy)).train()
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, config.vocab_size, (setup.batch, setup.seq), generator=gen)
    tgt = torch.randint(0, config.vocab_size, (setup.batch, setup.seq), generator=gen)
    rec = SavedTensorRecorder(model, categorize=saved_tensor_category)
    with rec, autocast(setup.policy, CPU):  # autocast exits inside the recorder: its weight-cast cache is freed
        model(idx, tgt)
    return rec.result().by_category()


def _nonzero(d: dict) -> dict:
    return {k: v for k, v in d.items() if v}


CASES = [
    pytest.param(m, att, rec, prec, drop, id=f"{m}-{att}-{rec}-{prec}-drop{drop}")
    for m, att, rec, prec, drop in itertools.product(
        MODELS, ("eager", "math", "flash"), ("none", "selective", "full"), ("fp32", "amp-bf16", "mixed-bf16"),
        (0.0, 0.1),
    )
    if not (att == "flash" and drop)  # refused on CPU: see the test below
]


@pytest.mark.parametrize(("model", "attention", "recompute", "precision", "dropout"), CASES)
def test_prediction_equals_saved_tensors_by_category(model, attention, recompute, precision, dropout) -> None:
    cfg = MODELS[model].with_(dropout=dropout)
    setup = Setup(batch=3, seq=17, precision=precision, attention=attention, recompute=recompute)
    measured = measured_by_category(cfg, setup)
    predicted = activation_bytes(cfg, setup, device_type="cpu")
    assert set(measured) <= set(CATEGORIES)
    assert _nonzero(measured) == _nonzero(predicted)


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (2, 32), (1, 64)])
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_prediction_holds_at_other_shapes(batch: int, seq: int, attention: str) -> None:
    cfg = preset("tiny-llama")
    setup = Setup(batch=batch, seq=seq, precision="amp-bf16", attention=attention)
    assert _nonzero(measured_by_category(cfg, setup)) == _nonzero(activation_bytes(cfg, setup, device_type="cpu"))


def test_fp32_eager_total_by_hand() -> None:
    """An independent count for tiny-gpt, fp32, eager, no dropout, no recompute (4-byte elements):
    per layer two norm inputs + mean/rstd, the q/k/v input, contiguous q, k^T, v, the softmax output (b*a*s^2),
    the output-projection input, the MLP input and two d_ff-wide tensors (GELU input, down input); then token ids,
    targets and positions (int64), the final norm, the LM-head input, the fp32 log-softmax and the loss's weight."""
    cfg = preset("tiny-gpt")
    b, s = 2, 24
    t, h, f, a, V, L = b * s, cfg.d_model, cfg.ffn, cfg.n_heads, cfg.vocab_size, cfg.n_layers
    per_layer = 4 * (2 * t * h + 2 * 2 * t + t * h + 3 * t * h + b * a * s * s + t * h + t * h + 2 * t * f)
    model_level = 8 * (2 * t + s) + 4 * (t * h + 2 * t + t * h + t * V + 1)
    measured = measured_by_category(cfg, Setup(batch=b, seq=s))
    assert sum(measured.values()) == L * per_layer + model_level


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch explains why each fused kernel declined
def test_flash_with_dropout_is_refused_on_cpu_naming_the_kernels() -> None:
    cfg = preset("tiny-gpt").with_(dropout=0.1)
    with pytest.raises(SetupError) as info:
        measured_by_category(cfg, Setup(batch=1, seq=8, attention="flash"))
    assert "eager" in str(info.value) and "math" in str(info.value)


def test_recompute_orders_memory_and_full_keeps_only_block_inputs() -> None:
    cfg = preset("tiny-gpt")
    tot = {r: sum(activation_bytes(cfg, Setup(batch=2, seq=64, recompute=r), device_type="cpu").values())
           for r in ("none", "selective", "full")}
    assert tot["full"] < tot["selective"] < tot["none"]
    full = activation_bytes(cfg, Setup(batch=2, seq=64, recompute="full"), device_type="cpu")
    assert full["block inputs (recompute)"] == cfg.n_layers * 2 * 64 * cfg.d_model * 4
    assert "attention scores" not in full


def test_inference_keeps_nothing_for_backward() -> None:
    assert activation_terms(preset("tiny-gpt"), Setup(mode="inference")) == []
    assert activation_bytes(preset("tiny-gpt"), Setup(mode="inference")) == {}


def test_cuda_autocast_keeps_fp32_probabilities_and_a_16_bit_copy() -> None:
    """CUDA autocast runs softmax in fp32 (AT_FORALL_FP32 list); the CPU autocast lists do not include softmax."""
    s = Setup(precision="amp-bf16")
    assert widths(s, "cuda")["probs"] == 4 and widths(s, "cuda")["probs_copy"] == 2
    assert widths(s, "cpu")["probs"] == 2 and widths(s, "cpu")["probs_copy"] == 0
    cfg, setup = preset("tiny-gpt"), Setup(batch=1, seq=32, precision="amp-bf16")
    scores = cfg.n_layers * cfg.n_heads * 32 * 32
    assert activation_bytes(cfg, setup, device_type="cuda")["attention scores"] == 6 * scores
    assert activation_bytes(cfg, setup, device_type="cpu")["attention scores"] == 2 * scores


# -- Korthikanti et al. 2022 --------------------------------------------------------------------------------------
GPT3 = preset("gpt-3-175b")
S3 = 2048  # GPT-3's training sequence length (Brown et al. 2020, Table 2.1 context window)


def test_gpt3_attention_term_is_80_and_selective_removes_about_70_percent() -> None:
    """Korthikanti Section 5: for GPT-3, 5as/h = 80, so selective recompute removes 80 / (34 + 80) = 70 %."""
    assert 5 * GPT3.n_heads * S3 / GPT3.d_model == 80
    assert attention_score_share(GPT3, S3) == pytest.approx(80 / 114)
    assert round(attention_score_share(GPT3, S3), 2) == 0.70
    none = korthikanti_layer_bytes(S3, 1, GPT3.d_model, GPT3.n_heads)
    sel = korthikanti_layer_bytes(S3, 1, GPT3.d_model, GPT3.n_heads, recompute="selective")
    assert 1 - sel / none == pytest.approx(0.70, abs=0.01)


def table2(s: int, b: int, h: int, a: int, t: int, sp: bool, recompute: str) -> float:
    """Korthikanti et al. 2022, Table 2: activation bytes per layer (16-bit, with dropout), written out here."""
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)  # with SP the kept layer input is split along the sequence (Sec. 4.2.3)
    if recompute == "selective":
        return sbh * 34 / t if sp else sbh * (10 + 24 / t)
    return sbh / t * (34 + 5 * a * s / h) if sp else sbh * (10 + 24 / t + 5 * a * s / (h * t))


def generalised_per_layer(config: TransformerConfig, setup: Setup) -> float:
    """Per-layer bytes of memlab's generalised terms (layer L=2 minus L=1 removes the model-level terms), without
    the block norms' mean/rstd (the paper leaves those statistics out)."""

    def total(n_layers: int) -> float:
        terms = activation_terms(config.with_(n_layers=n_layers), setup, device_type="cuda")
        return sum(t.bytes(setup.tp, setup.sp) for t in terms if not t.name.endswith("mean and rstd"))

    return total(2) - total(1)


PAPER_SETUP = {"precision": "mixed-fp16", "attention": "eager"}


@pytest.mark.parametrize("b", [1, 4])
def test_generalised_terms_reduce_to_sbh_34_plus_5as_over_h(b: int) -> None:
    cfg = GPT3.with_(dropout=0.1)
    s, h, a = S3, cfg.d_model, cfg.n_heads
    got = generalised_per_layer(cfg, Setup(batch=b, seq=s, **PAPER_SETUP))
    assert got == s * b * h * (34 + 5 * a * s / h)


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (8, False), (2, True), (8, True)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_generalised_terms_match_table2_rows(t: int, sp: bool, recompute: str) -> None:
    cfg = GPT3.with_(dropout=0.1)
    setup = Setup(batch=2, seq=S3, tp=t, sp=sp, recompute=recompute, **PAPER_SETUP)
    expected = table2(S3, 2, cfg.d_model, cfg.n_heads, t, sp, recompute)
    assert generalised_per_layer(cfg, setup) == pytest.approx(expected, rel=1e-12)
    assert korthikanti_layer_bytes(S3, 2, cfg.d_model, cfg.n_heads, t=t, sp=sp, recompute=recompute) == \
        pytest.approx(expected, rel=1e-12)


def test_without_dropout_the_masks_and_dropped_copies_disappear() -> None:
    """Korthikanti's 34 + 5as/h counts dropout: without it the two 1-byte sbh masks (attention and MLP outputs) go,
    34 - 2 = 32, and so do the score mask (as^2b) and the dropped probabilities (2as^2b): 5 - 3 = 2 remain."""
    cfg = GPT3.with_(dropout=0.0)
    s, h, a = S3, cfg.d_model, cfg.n_heads
    got = generalised_per_layer(cfg, Setup(batch=1, seq=s, **PAPER_SETUP))
    assert got == s * h * (32 + 2 * a * s / h)


def test_flash_attention_has_no_s_squared_term() -> None:
    cfg = GPT3
    b = 1
    per = {s: generalised_per_layer(cfg, Setup(batch=b, seq=s, precision="mixed-fp16", attention="flash"))
           for s in (1024, 2048)}
    assert per[2048] == pytest.approx(2 * per[1024])  # linear in s: no as^2b term
    eager = {s: generalised_per_layer(cfg, Setup(batch=b, seq=s, **PAPER_SETUP)) for s in (1024, 2048)}
    assert eager[2048] > 2 * eager[1024]


def _paper_rows(s: int, b: int, h: int, a: int, t: int) -> list[Fraction]:
    """Korthikanti et al. 2022, Table 2, typed from the paper, in exact rationals (its order)."""
    sbh, q = Fraction(s * b * h), Fraction(5 * a * s, h)
    return [sbh * (34 + q), sbh * (10 + Fraction(24, t) + q / t), sbh * (Fraction(34, t) + q / t),
            sbh * (10 + Fraction(24, t)), sbh * Fraction(34, t), sbh * 2]


@pytest.mark.parametrize("seed", range(6))
def test_korthikanti_table2_every_row_exactly_on_generated_shapes(seed: int) -> None:
    """Every row of Table 2 on generated (s, b, h, a, t), exactly; and memlab's generalised terms on the paper's
    assumptions (16-bit, dropout, eager attention, 4h GELU MLP, layernorm) equal each row plus what the paper leaves
    out: the two layernorms' fp32 mean and rstd, 2 x 2 x sb x 4 bytes (sb/t each under SP), a named residual."""
    rng = random.Random(seed)
    t = rng.choice([1, 2, 4, 8])
    a = t * rng.randint(1, 4)
    h, s, b = a * 8 * rng.randint(1, 4), 16 * rng.randint(1, 8), rng.randint(1, 3)
    got = korthikanti_table2(s, b, h, a, t)
    assert list(got) == list(KORTHIKANTI_TABLE2_ROWS)
    for value, paper in zip(got.values(), _paper_rows(s, b, h, a, t), strict=True):
        assert value == pytest.approx(float(paper), rel=1e-12)
    cfg = TransformerConfig(d_model=h, n_layers=2, n_heads=a, vocab_size=64, max_seq=s, dropout=0.1)
    for row, (tt, sp, rc) in zip(KORTHIKANTI_TABLE2_ROWS, KORTHIKANTI_TABLE2_SETUPS, strict=True):
        tp = t if tt is None else tt
        sp = sp and tp > 1  # at t = 1 the SP rows are the rows without SP (memlab refuses sp without tp)
        setup = Setup(batch=b, seq=s, tp=tp, sp=sp, recompute=rc, **PAPER_SETUP)

        def per_layer(c: TransformerConfig, st: Setup = setup) -> float:
            one = {n: sum(x.bytes(st.tp, st.sp) for x in activation_terms(c.with_(n_layers=n), st))
                   for n in (1, 2)}
            return one[2] - one[1]

        stats = 0 if rc == "full" else 2 * 2 * s * b * 4 / (tp if sp else 1)
        assert per_layer(cfg) == pytest.approx(got[row] + stats, rel=1e-12), row
