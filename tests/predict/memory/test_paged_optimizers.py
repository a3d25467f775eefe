"""Paged optimizers (bitsandbytes' PagedAdamW32bit and PagedAdamW8bit; Setup.optimizer paged-adamw and
paged-adam-8bit): which states are paged, that the formula reports them apart from the allocator's peak, that the
trace books them apart the same way, what the fit verdict says, and the refusals (memlab.predict.memory.states)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from memlab.errors import SetupError
from memlab.measure.accounting import model_states
from memlab.model.optimizers import build_optimizer
from memlab.predict.estimate import estimate
from memlab.predict.fit import fits
from memlab.predict.memory.states import (
    ADAM_8BIT_QMAP_BYTES,
    PAGED_MIN_ELEMENTS,
    adam8bit_tensor_bytes,
    paged_optimizer_bytes,
    paged_tensor_bytes,
)
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup
from memlab.tracing.gpt import trace_gpt

SHAPES = [(400, 300), (3000,), (5000,), (64,)]
"""One tensor bitsandbytes pages (120,000 >= 1e5 elements), two it keeps in the allocator (fp32 and, under 8 bits,
uint8 states), one below the 8-bit minimum."""
CFG = TransformerConfig(name="t-paged", d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=1024, vocab_size=800,
                        max_seq=64, mlp="swiglu", norm="rmsnorm", positions="rotary", tied_embeddings=False,
                        bias=False)
"""A generated shape with tensors on both sides of 1e5 elements (the MLP's 131,072 and the embedding's 102,400 are
paged; attention's 16,384 and the norms are not)."""


def test_only_states_of_tensors_of_1e5_elements_are_paged() -> None:
    """get_state_buffer: paged from 1e5 elements; 8-bit absmax never (bitsandbytes 0.50.2 optim/optimizer.py)."""
    n = PAGED_MIN_ELEMENTS
    assert paged_tensor_bytes(n - 1, "paged-adamw") == (8 * (n - 1), 0)
    assert paged_tensor_bytes(n, "paged-adamw") == (0, 8 * n)
    assert paged_tensor_bytes(n - 1, "paged-adam-8bit") == (adam8bit_tensor_bytes(n - 1), 0)
    assert paged_tensor_bytes(n, "paged-adam-8bit") == (adam8bit_tensor_bytes(n) - 2 * n, 2 * n)
    device, paged = paged_optimizer_bytes([n, 5000, 10], "paged-adam-8bit")
    assert device + paged == sum(adam8bit_tensor_bytes(k) for k in (n, 5000, 10)) + ADAM_8BIT_QMAP_BYTES


@pytest.mark.parametrize(("cls", "name"), [("PagedAdamW", "paged-adamw"), ("PagedAdamW8bit", "paged-adam-8bit")])
def test_bitsandbytes_on_cpu_holds_the_formulas_bytes_unpaged(cls: str, name: str) -> None:
    """On a CPU bitsandbytes warns and falls back to plain tensors (get_state_buffer l. 375-382): all of the state
    is plain memory, device + paged bytes of the formula; memlab's stand-in holds the same."""
    bnb = pytest.importorskip("bitsandbytes")
    device, paged = paged_optimizer_bytes([math.prod(s) for s in SHAPES], name)
    assert paged > 0
    params = [nn.Parameter(torch.randn(s)) for s in SHAPES]
    real = getattr(bnb.optim, cls)(params)
    with pytest.warns(UserWarning, match="not supported on CPU"):
        _step(real, params)
    assert not any(getattr(v, "is_paged", False) for st in real.state.values() for v in st.values())
    assert model_states(nn.ParameterList(params), real).optimizer_bytes == device + paged
    params = [nn.Parameter(torch.randn(s)) for s in SHAPES]
    twin = build_optimizer(name, params)
    _step(twin, params)
    assert model_states(nn.ParameterList(params), twin).optimizer_bytes == device + paged


def _step(opt: torch.optim.Optimizer, params: list[nn.Parameter]) -> None:
    sum((p * p).sum() for p in params).backward()
    opt.step()


@pytest.mark.parametrize("setup", [Setup(batch=2, seq=16, optimizer="paged-adamw"),
                                   Setup(batch=2, seq=16, optimizer="paged-adamw", precision="mixed-bf16"),
                                   Setup(batch=2, seq=16, optimizer="paged-adam-8bit"),
                                   Setup(batch=1, seq=16, optimizer="paged-adam-8bit", precision="bf16")])
def test_formula_and_trace_report_the_paged_states_apart(setup: Setup) -> None:
    """The trace books the stand-in's paged states under their own key (memlab.tracing.tracer.PAGED_DEVICE): the
    phases and the peak hold the allocator's bytes only, on both sides, and the paged bytes agree to the byte; the
    optimizer step too (the stand-ins' temporaries: torch's for-loop AdamW's, and
    memlab.predict.memory.phases.adam8bit_step_bytes, 16-bit gradients included)."""
    t, bd = trace_gpt(CFG, setup, device_type="cpu"), estimate(CFG, setup, device_type="cpu")
    assert t.paged_bytes == bd.paged_bytes > 0
    unpaged = estimate(CFG, setup.with_(optimizer="adam-8bit" if "8bit" in setup.optimizer else "adamw"),
                       device_type="cpu")
    assert bd.optimizer_bytes < unpaged.optimizer_bytes
    for row in t.phases:
        if row.phase in ("forward", "zero_grad", "optimizer step"):
            assert row.held_bytes == bd.phase_bytes(row.phase, row.step), (row.step, row.phase)
    # on CUDA the estimate names the stand-in's step temporaries as what bitsandbytes' in-place kernels do not hold
    term = [x for x in estimate(CFG, setup).named_terms if x.key == "bitsandbytes' CUDA step"]
    assert [(x.bytes, x.sign) for x in term] == [(t.phase("optimizer step").by_category["temporaries"], -1)]
    if setup.precision == "fp32" and setup.optimizer == "paged-adamw":  # backward: the gap the estimate has without
        twin = setup.with_(optimizer="adamw", optimizer_impl="for-loop")  # paging (its bottom-block moment), no more
        gap = trace_gpt(CFG, twin, device_type="cpu").phase("backward").held_bytes - unpaged.phase_bytes("backward")
        assert t.phase("backward").held_bytes - bd.phase_bytes("backward") == gap


def test_lora_adapters_under_1e5_elements_are_not_paged() -> None:
    """QLoRA r=16 on q, v of a 7B: every adapter (16 x 4096 = 65,536 elements) is below 1e5, nothing is paged; at
    r=64 on every linear (the QLoRA paper's) all of them are."""
    cfg = preset("llama-2-7b")
    base = Setup(finetune="qlora", precision="bf16", seq=512, attention="flash", optimizer="paged-adamw")
    assert estimate(cfg, base.with_(lora_rank=16)).paged_bytes == 0
    wide = estimate(cfg, base.with_(lora_rank=64, lora_targets="all-linear"))
    assert wide.paged_bytes > 0 and wide.optimizer_detail["moments"] == 0


def test_verdict_when_the_paged_states_do_not_fit_beside_the_peak() -> None:
    """Full fine-tuning of a 7B with paged AdamW on an 80 GB card: the allocator's peak fits; the 50 GiB of fp32
    states do not fit beside it, which pages them to host RAM, not an out-of-memory error."""
    s = Setup(precision="amp-bf16", optimizer="paged-adamw", seq=2048, recompute="full", attention="flash")
    bd = estimate(preset("llama-2-7b"), s)
    v = fits(bd, "h100-sxm")
    assert v.fits and not v.paged_resident and v.paged_bytes == bd.paged_bytes
    assert bd.peak_bytes < v.capacity_bytes < bd.device_peak_bytes
    note = v.paged_note()
    assert "do not fit" in note and "host RAM" in note and "no out-of-memory error" in note
    assert v.to_dict()["paged_note"] == note


def test_paged_optimizer_refusals_name_the_way_out() -> None:
    cfg = preset("tiny-gpt")
    with pytest.raises(SetupError, match=r"ZeRO/FSDP sharding over ranks is not modelled.*unpaged optimizer"):
        estimate(cfg, Setup(seq=32, optimizer="paged-adamw", zero_stage=2, world_size=2))
    with pytest.raises(SetupError, match=r"16-bit parameters stepped directly \(bitsandbytes"):
        estimate(cfg, Setup(seq=32, optimizer="paged-adamw", precision="bf16"))
    with pytest.raises(SetupError, match="bare parameter count"):
        estimate(10**9, Setup(optimizer="paged-adam-8bit"))
    assert estimate(cfg, Setup(seq=32, optimizer="paged-adam-8bit", precision="bf16")).paged_bytes >= 0
    with pytest.raises(SetupError, match="stand-in for bitsandbytes steps plain tensors"):  # and the trace
        trace_gpt(cfg, Setup(seq=16, optimizer="paged-adam-8bit", zero_stage=3, world_size=2), device_type="cpu")


def test_cli_takes_the_trainers_spelling_and_prints_the_paged_term(capsys: pytest.CaptureFixture[str]) -> None:
    from memlab.cli import main

    assert main(["estimate", "--preset", "llama-2-7b", "--finetune", "qlora", "--lora-rank", "64", "--lora-targets",
                 "all-linear", "--optimizer", "paged_adamw_8bit", "--seq", "1024", "--recompute", "full",
                 "--gpu", "rtx-4090", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "paged-adam-8bit" in out and "paged optimizer states" in out and "fit beside the peak" in out
    assert "CUDA managed memory" in out and "cudaMallocManaged" in out  # the --explain line
    assert main(["estimate", "--preset", "tiny-gpt", "--optimizer", "paged_lion_8bit"]) != 0  # not modelled


@pytest.mark.wide
def test_lora_paged_adamw_traced_through_peft_agrees_with_the_formula() -> None:
    """peft LoRA (r=256 on every linear of a generated Llama: all adapters but k's and v's B >= 1e5 elements) under
    paged-adamw: the trace of transformers' and peft's code books the paged states apart exactly as the formula, and
    every phase
    differs from the formula by what it differs under plain adamw (the family's own terms), no more."""
    from memlab.course.hf_configs import load_config
    from memlab.predict.families.reader import from_hf
    from memlab.tracing.hf import trace_hf

    raw = {**load_config("llama"), "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
           "num_key_value_heads": 4, "num_hidden_layers": 1}
    cfg = from_hf(raw)
    setup = Setup(batch=1, seq=16, finetune="lora", lora_rank=256, lora_targets="all-linear", attention="eager",
                  optimizer="paged-adamw")
    twin = setup.with_(optimizer="adamw", optimizer_impl="for-loop")
    t, bd = trace_hf(raw, setup, device_type="cpu"), estimate(cfg, setup, device_type="cpu")
    tt, bt = trace_hf(raw, twin, device_type="cpu"), estimate(cfg, twin, device_type="cpu")
    assert t.paged_bytes == bd.paged_bytes > 0  # the k/v adapters' B (256 x 256) stay in the allocator
    assert bd.paged_bytes + bd.optimizer_detail["moments"] == bt.optimizer_detail["moments"]
    for row, plain in zip(t.phases, tt.phases, strict=True):
        assert row.held_bytes - bd.phase_bytes(row.phase, row.step) == \
            plain.held_bytes - bt.phase_bytes(row.phase, row.step), (row.step, row.phase)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "mixed-bf16"])
def test_adam8bit_step_temporaries_equal_the_trace_on_an_odd_shape(precision: str) -> None:
    """The 8-bit stand-in's step (paged or not) holds what adam8bit_step_bytes says: a largest tensor of 1001 x 120
    elements, not a whole number of 256-element blocks, and a 333-token vocabulary."""
    cfg = TransformerConfig(name="odd", d_model=120, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=1001, vocab_size=333,
                            max_seq=64, mlp="swiglu", norm="rmsnorm", positions="rotary", tied_embeddings=False,
                            bias=False)
    setup = Setup(batch=1, seq=16, optimizer="adam-8bit", precision=precision)
    t, bd = trace_gpt(cfg, setup, device_type="cpu"), estimate(cfg, setup, device_type="cpu")
    for step in ("first", "steady"):
        assert t.phase("optimizer step", step).held_bytes == bd.phase_bytes("optimizer step", step)


def test_a_real_cpu_run_holds_the_paged_states_as_plain_tensors() -> None:
    """On a CPU nothing is paged (bitsandbytes falls back to plain tensors, and so do memlab's stand-ins): a real CPU
    step (memlab.run.runner, live tensor bytes) holds the estimate's allocator bytes plus paged_bytes in every phase
    from the first optimizer step on, and exactly the estimate before the states exist."""
    from memlab.run.runner import run_step

    setup = Setup(batch=2, seq=16, optimizer="paged-adam-8bit")
    m = run_step(CFG, setup, "cpu", steps=1, with_counted_flops=False, with_mfu=False)
    bd = estimate(CFG, setup, device_type="cpu")
    assert bd.paged_bytes > 0
    for row in m.phase_peaks:
        if row.phase == "backward":
            continue  # the estimate's bottom-block moment, paged or not (tests/tracing/test_trace.py)
        held = bd.paged_bytes if (row.step, row.phase) != ("first", "forward") else 0
        assert row.held_bytes == bd.phase_bytes(row.phase, row.step) + held, (row.step, row.phase)
