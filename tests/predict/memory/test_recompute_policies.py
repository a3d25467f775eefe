"""Recompute policies as frameworks run them (issue 34 point 3): full recompute over every k-th block (torchtitan's
layer policy) and torchtitan's per-op policy agree with the trace of the reference GPT phase by phase (and the layer
policy with transformers' saved tensors byte for byte); what the formula does not model is refused with the trace
as the way out."""

from __future__ import annotations

import pytest

from memlab.course.hf_configs import load_config
from memlab.errors import SetupError
from memlab.model.gpt import GPT
from memlab.predict.compute.flops import megatron_iteration_flops, op_policy_kept, recomputed_flops
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.activations import activation_bytes
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup, checkpointed_blocks
from memlab.studies.setup_draws import _CI_MODELS, Draw, compare_draw


def test_checkpointed_blocks_count_as_torchtitans_layer_policy() -> None:
    """torchtitan increments its counter before the test: ``count % k == 0`` picks blocks k-1, 2k-1, ... (from 0)."""
    assert checkpointed_blocks(8, 3) == (2, 5)
    assert checkpointed_blocks(4, 1) == (0, 1, 2, 3)
    assert checkpointed_blocks(3, 5) == ()
    model = GPT(preset("small-gpt"), recompute="full", recompute_every=2, device="meta")
    assert [b.recompute_full for b in model.blocks] == [False, True, False, True]


def test_recompute_every_goes_with_full_recompute() -> None:
    with pytest.raises(SetupError, match="recompute='full'"):
        Setup(recompute_every=2)
    with pytest.raises(SetupError, match="recompute_every"):
        GPT(preset("tiny-gpt"), recompute="selective", recompute_every=2, device="meta")


@pytest.mark.parametrize("extra", [dict(recompute_every=2), dict(recompute_every=3, precision="amp-bf16"),
                                   dict(recompute_every=2, attention="flash", grad_accum_steps=2),
                                   dict(recompute_every=2, precision="bf16", zero_stage=3, world_size=4)],
                         ids=["k2-fp32", "k3-amp", "k2-flash-accum", "k2-bf16-fsdp2"])
def test_every_k_formula_equals_the_trace_phase_by_phase(extra: dict) -> None:
    """Every phase of both steps and the peak within 0.1 % of the fake-tensor trace of the reference GPT."""
    setup = Setup(batch=2, seq=64, recompute="full", optimizer_impl="for-loop", **extra)
    rows = compare_draw(Draw(_CI_MODELS["dense"], setup, "dense"))
    assert all(r["verdict"] == "within" for r in rows), [r for r in rows if r["verdict"] != "within"]


def test_every_k_sits_between_none_and_full() -> None:
    """Checkpointing fewer blocks keeps more: the activations fall monotonically from none through k = 4, 2 to 1."""
    cfg = preset("small-gpt").with_(n_layers=8)
    acts = [sum(activation_bytes(cfg, Setup(batch=2, seq=64, **kw), device_type="cpu").values())
            for kw in (dict(), dict(recompute="full", recompute_every=4), dict(recompute="full", recompute_every=2),
                       dict(recompute="full"))]
    assert acts == sorted(acts, reverse=True) and len(set(acts)) == 4


@pytest.mark.parametrize(("family", "attention"), [("llama", "sdpa"), ("gpt2", "eager"), ("qwen3", "sdpa")])
def test_hf_every_k_saves_what_the_formula_counts(family: str, attention: str) -> None:
    """transformers' checkpointing with the flag off on all but every k-th layer (memlab.model.hf.checkpoint_every):
    the bytes a real CPU step saves for backward equal the formula's, byte for byte."""
    from memlab.model.hf import build_hf_model, checkpoint_every
    from memlab.run.hf import measure_hf

    raw = {**load_config(family), "num_hidden_layers" if family != "gpt2" else "n_layer": 4}
    cfg = from_hf(dict(raw))
    model = build_hf_model(raw, attn_implementation=attention, gradient_checkpointing=True)
    assert checkpoint_every(model, 3) == 1
    m = measure_hf(model, batch=2, seq=16, attn_implementation=attention)
    setup = m.setup(cfg).with_(recompute_every=3)
    assert m.saved_bytes == sum(activation_bytes(cfg, setup, device_type="cpu").values())


@pytest.mark.wide  # make bench: the formula-vs-trace tests of both policies stay in make test
def test_hf_trace_runs_both_torchtitan_policies() -> None:
    """trace_hf under recompute_every 2 and under the op policy keeps more than full recompute and less than none."""
    from memlab.tracing.hf import trace_hf

    raw = {**load_config("llama"), "num_hidden_layers": 4}
    acts = {}
    for name, kw in (("none", {}), ("k2", dict(recompute="full", recompute_every=2)), ("op", dict(recompute="op")),
                     ("full", dict(recompute="full"))):
        t = trace_hf(raw, Setup(batch=2, seq=16, attention="flash", **kw), device_type="cpu")
        acts[name] = t.phase("forward", "first").end_by_category["activations"]
    assert acts["none"] > acts["k2"] > acts["full"] and acts["none"] > acts["op"] > acts["full"]


def test_a_family_whose_layers_lose_their_cache_is_refused_with_the_trace_as_the_way_out() -> None:
    """GPT-2 under SDPA: with checkpointing on, transformers hands no cache to any layer, so an un-checkpointed
    layer keeps other buffers than without recompute (measured, not modelled): refused, naming the trace."""
    cfg = from_hf(load_config("gpt2"))
    with pytest.raises(SetupError, match="memlab trace"):
        estimate(cfg, Setup(seq=16, attention="flash", recompute="full", recompute_every=2), device_type="cpu")
    bd = estimate(cfg, Setup(seq=16, recompute="full", recompute_every=2), device_type="cpu")
    assert any("torchtitan's layer policy" in a for a in bd.assumptions)


def test_op_policy_keeps_the_odd_numbered_mm_outputs() -> None:
    """torchtitan counts aten.mm only: Llama-style unbiased projections q, k, v, o, gate, up, down keep the 1st, 3rd,
    5th and 7th; a biased projection is aten.addmm, off the list, so a GPT-2-style block keeps only its input."""
    assert op_policy_kept(preset("tiny-llama")) == ["q", "v", "gate", "down"]
    biased = preset("small-gpt")
    assert op_policy_kept(biased) == []
    op, full = (activation_bytes(biased, Setup(batch=2, seq=32, recompute=r), device_type="cpu")
                for r in ("op", "full"))
    assert op == full


@pytest.mark.parametrize(("model", "extra"), [("tiny-llama", dict()),
                                              ("tiny-llama", dict(attention="flash", precision="amp-bf16")),
                                              ("gqa-128k", dict(attention="flash", precision="bf16", zero_stage=2,
                                                                world_size=2))],
                         ids=["eager-fp32", "flash-amp", "gqa-bf16-fsdp2"])
def test_op_policy_formula_equals_the_trace_phase_by_phase(model: str, extra: dict) -> None:
    """The reference GPT checkpointed under torchtitan's per-op policy (memlab.model.policies), traced on fake
    tensors: every phase within 0.1 % of the formula (CPU widths; CPU's flash kernel is not on torchtitan's list)."""
    cfg = _CI_MODELS[model] if model in _CI_MODELS else preset(model)
    setup = Setup(batch=2, seq=64, recompute="op", optimizer_impl="for-loop", **extra)
    rows = compare_draw(Draw(cfg, setup, "dense"))
    assert all(r["verdict"] == "within" for r in rows), [r for r in rows if r["verdict"] != "within"]


def test_op_policy_on_cuda_keeps_the_fused_kernels_output() -> None:
    """On CUDA the flash kernel is on torchtitan's list: its output and fp32 log-sum-exp are kept per layer."""
    cfg = preset("tiny-llama")
    setup = Setup(batch=2, seq=64, recompute="op", attention="flash", precision="bf16")
    cuda, cpu = (sum(activation_bytes(cfg, setup, device_type=d).values()) for d in ("cuda", "cpu"))
    t = 2 * 64
    assert cuda - cpu == cfg.n_layers * (t * cfg.q_dim * 2 + 2 * cfg.n_heads * 64 * 4)


def test_recomputed_flops_per_policy() -> None:
    """HFU's extra FLOPs: full recomputes the blocks' forward, every k-th block its share, op all but the kept
    projections (and the attention core where eager keeps nothing of it)."""
    cfg = preset("tiny-llama").with_(n_layers=4)
    full = recomputed_flops(cfg, 2, 64, "full")
    assert recomputed_flops(cfg, 2, 64, "full", recompute_every=2) * 2 == full
    op = recomputed_flops(cfg, 2, 64, "op")
    assert 0 < op < recomputed_flops(cfg, 2, 64, "op", attention_kept=False) < full
    assert megatron_iteration_flops(cfg, 2, 64, "op") == megatron_iteration_flops(cfg, 2, 64) + op


def test_compiles_memory_budget_is_refused_with_the_traced_policies_named() -> None:
    """torch._functorch.config.activation_memory_budget acts on a compiled graph: the estimate, the trace and the
    run refuse it in one line that names recompute op, full and selective."""
    from memlab.tracing.gpt import trace_gpt

    setup = Setup(seq=32, activation_memory_budget=0.5)
    with pytest.raises(SetupError, match="recompute='op'"):
        estimate(preset("tiny-gpt"), setup)
    with pytest.raises(SetupError, match="recompute='op'"):
        trace_gpt(preset("tiny-gpt"), setup)
