"""memlab trace: fake tensors hold exactly the bytes real ones do, by phase and category, and the estimator's
phase model agrees with the trace (memlab.tracing.tracer, memlab.measure.live_bytes)."""

from __future__ import annotations

import itertools

import pytest
import torch

from memlab.errors import SetupError
from memlab.predict.estimate import estimate
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup
from memlab.run.runner import run_step
from memlab.tracing.gpt import trace_gpt
from memlab.tracing.tracer import CATEGORIES, trace

TINY = preset("tiny-gpt")
LLAMA = TransformerConfig(name="t-llama", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, max_seq=128,
                          mlp="swiglu", norm="rmsnorm", positions="rotary", tied_embeddings=False, bias=False)


def _same(a, b) -> None:
    assert [(r.step, r.phase, r.peak_bytes, r.end_bytes, r.by_category) for r in a.phases] == \
        [(r.step, r.phase, r.peak_bytes, r.end_bytes, r.by_category) for r in b.phases]
    assert (a.peak_bytes, a.peak_phase, a.peak_step) == (b.peak_bytes, b.peak_phase, b.peak_step)


@pytest.mark.parametrize(("attention", "recompute"), list(itertools.product(("eager", "math", "flash"),
                                                                            ("none", "selective", "full"))))
def test_fake_trace_equals_real_run_byte_for_byte(attention: str, recompute: str) -> None:
    setup = Setup(batch=2, seq=32, attention=attention, recompute=recompute)
    _same(trace_gpt(TINY, setup, fake=True), trace_gpt(TINY, setup, fake=False))


@pytest.mark.parametrize("setup", [
    Setup(batch=2, seq=32, precision="amp-bf16", optimizer_impl="foreach"),
    Setup(batch=1, seq=48, precision="mixed-bf16", attention="flash", optimizer="sgd-momentum"),
    Setup(batch=2, seq=32, precision="bf16", optimizer_impl="fused", grad_accum_steps=2, zero_grad_to_none=False),
])
def test_fake_equals_real_for_precisions_and_optimizers(setup: Setup) -> None:
    _same(trace_gpt(LLAMA, setup, fake=True), trace_gpt(LLAMA, setup, fake=False))


@pytest.mark.parametrize("setup", [Setup(batch=2, seq=32), Setup(batch=2, seq=32, precision="amp-bf16",
                                                                   attention="flash", recompute="full")])
def test_trace_equals_the_runners_live_bytes(setup: Setup) -> None:
    """Two independent counters: MemTracker on fake tensors, memlab's dispatch-mode counter on real ones."""
    m = run_step(TINY, setup, "cpu", steps=1, with_counted_flops=False, with_mfu=False)
    t = trace_gpt(TINY, setup, device_type="cpu")
    for row in m.phase_peaks:
        tr = t.phase(row.phase, row.step)
        assert (row.peak_bytes, row.end_bytes) == (tr.peak_bytes, tr.end_bytes), row
        assert m.phase_peak(row.phase, row.step) is row


def test_trace_categories_and_modules() -> None:
    t = trace_gpt(TINY, Setup(batch=2, seq=32))
    fwd = t.phase("forward", "first")
    assert set(fwd.by_category) == set(CATEGORIES)
    bd = estimate(TINY, Setup(batch=2, seq=32), device_type="cpu")
    assert fwd.by_category["parameters"] == bd.params_bytes
    assert t.phase("zero_grad").end_by_category["optimizer states"] == bd.optimizer_bytes
    top = t.top_modules(3)
    assert top and all("." in m["module"] for m in top) and top[0]["activation_bytes"] > 0
    kinds = t.modules_by_kind(3)
    assert kinds[0]["count"] == TINY.n_layers and "*" in kinds[0]["module"]
    frame = t.to_frame()
    assert len(frame) == 8 and frame["peak_bytes"].max() == t.peak_bytes
    assert t.to_dict()["peak_bytes"] == t.peak_bytes and t.cuda_terms
    comp = t.components()
    assert (comp["params"], comp["optimizer"]) == (bd.params_bytes, bd.optimizer_bytes)
    assert comp["grads"] == bd.grads_bytes
    assert abs(comp["activations"] - bd.activations_bytes) <= 2 * 32 * 8 + 4  # the labels and the loss


@pytest.mark.parametrize("setup", [
    Setup(batch=2, seq=64), Setup(batch=2, seq=64, attention="flash", precision="amp-bf16"),
    Setup(batch=2, seq=64, optimizer_impl="foreach", recompute="selective"),
    Setup(batch=2, seq=64, precision="mixed-bf16"),
])
def test_estimator_peak_is_within_a_few_percent_of_the_trace(setup: Setup) -> None:
    for cfg in (TINY, LLAMA):
        t, bd = trace_gpt(cfg, setup, device_type="cpu"), estimate(cfg, setup, device_type="cpu")
        assert abs(bd.peak_bytes - t.peak_bytes) / t.peak_bytes < 0.03, (cfg.name, bd.peak_phase, t.peak_phase)


def test_user_module_api() -> None:
    t = trace(model_fn=lambda: torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                                   torch.nn.Linear(2048, 512)),
              batch_fn=lambda: torch.randn(64, 128, 512),
              optimizer_fn=lambda m: torch.optim.AdamW(m.parameters(), foreach=True),
              loss_fn=lambda m, x: m(x).square().mean())
    n = 512 * 2048 * 2 + 2048 + 512
    assert t.phase("zero_grad").end_by_category["optimizer states"] >= 8 * n
    assert t.phase("optimizer step").by_category["temporaries"] >= 4 * n  # foreach: one fp32 temp per param
    with pytest.raises(SetupError, match="scalar loss"):
        trace(lambda: torch.nn.Linear(4, 4), lambda: torch.randn(2, 4))


def test_trace_refuses_what_it_cannot_run() -> None:
    with pytest.raises(SetupError, match="tp=1"):
        trace_gpt(TINY, Setup(tp=2, seq=32))
    with pytest.raises(SetupError, match="weight dtype"):
        trace_gpt(TINY, Setup(mode="inference", seq=32, inference_weights="int8"))


def test_data_dependent_steps_get_one_clear_error() -> None:
    with pytest.raises(SetupError, match="fake tensor does not have"):
        trace_gpt(TINY, Setup(batch=1, seq=16, optimizer="adafactor"), device_type="cpu")


def test_sharded_trace_runs_fsdp2_over_a_fake_process_group() -> None:
    from memlab.predict.estimate import Overheads

    setup = Setup(batch=2, seq=32, zero_stage=3, world_size=4, attention="flash")
    fake, real = trace_gpt(TINY, setup, device_type="cpu"), trace_gpt(TINY, setup, fake=False, device_type="cpu")
    # Exact but for the first optimizer step, where a fake trace also counts DTensor's first sharding propagation
    key = [(r.step, r.phase) for r in fake.phases]
    for (st, ph), a, b in zip(key, fake.phases, real.phases, strict=True):
        if (st, ph) != ("first", "optimizer step"):
            assert (a.peak_bytes, a.end_bytes, a.by_category) == (b.peak_bytes, b.end_bytes, b.by_category), (st, ph)
    assert fake.peak_of("steady") == real.peak_of("steady")
    one = trace_gpt(TINY, setup.with_(zero_stage=0, world_size=1), device_type="cpu")
    states = fake.phase("zero_grad").end_by_category
    assert states["optimizer states"] < one.phase("zero_grad").end_by_category["optimizer states"] / 3
    bd = estimate(TINY, setup, device_type="cpu", overheads=Overheads(gathered_layers=2))
    assert abs(bd.peak_bytes - fake.peak_bytes) / fake.peak_bytes < 0.08
    with pytest.raises(SetupError, match="FSDP2"):
        trace_gpt(TINY, Setup(seq=32, zero_stage=1, world_size=4))


def test_inference_trace_prefill_and_decode() -> None:
    setup = Setup(mode="inference", seq=48, batch=2, inference_weights="fp32", kv_cache_dtype="fp32",
                  kv_cache="static")
    fake, real = trace_gpt(TINY, setup), trace_gpt(TINY, setup, fake=False)
    _same(fake, real)
    assert [r.phase for r in fake.phases] == ["prefill", "decode"] and fake.peak_phase == "prefill"
    kv = 2 * TINY.n_layers * 2 * 48 * TINY.d_model * 4
    assert fake.phase("decode").end_by_category["inputs"] >= kv  # preallocated before the prefill
    grown = trace_gpt(TINY, setup.with_(kv_cache="dynamic"))  # generate()'s default: made inside the phases
    assert grown.phase("decode").end_by_category["inputs"] == 8 * 2 * 48  # the token ids only
    assert grown.phase("decode").end_by_category["activations"] >= kv
