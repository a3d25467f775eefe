"""Real HF models built from the shipped tiny configs (memlab/predict/families/configs/tiny, nothing downloaded), one
training step on CPU: memlab's term-by-term activations equal the bytes saved for backward exactly, and model states
equal the estimator's, for every family in a handful of (attention, dtype, shape) runs; the per-op listing explains
them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch

from memlab.measure.by_op import layer_listing, saved_by_op
from memlab.model.hf import build_hf_model
from memlab.predict.families.reader import from_hf
from memlab.run.hf import predict_hf, run_hf

CONFIGS = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "tiny"


def tiny(family: str) -> dict:
    return {k: v for k, v in json.loads((CONFIGS / f"{family}.json").read_text()).items() if not k.startswith("_")}


RUNS = [
    ("gpt2", "eager", "fp32", 1, 40),  # batch 1: q is a view of the fused QKV buffer
    ("gpt2", "sdpa", "bf16", 2, 24),
    ("llama", "eager", "bf16", 2, 24),  # repeat_kv, fp32 softmax, RMSNorm upcast
    ("gemma", "eager", "fp32", 1, 40),  # one KV head at batch 1: repeat_kv stays a view
    ("gpt_neox", "sdpa", "fp32", 2, 24),  # parallel block, output copy
    ("opt", "eager", "bf16", 2, 24),  # ReLU, per-token position ids
    ("phi", "eager", "bf16", 1, 40),  # shared norm, gelu_new
    ("qwen2", "sdpa", "fp32", 2, 24),
    ("mistral", "sdpa", "bf16", 1, 40),
    ("qwen3", "eager", "bf16", 2, 24),  # per-head q/k RMSNorm
    ("qwen3", "sdpa", "fp32", 1, 40),
    ("phi3", "eager", "fp32", 1, 40),  # fused qkv and gate_up
    ("phi3", "sdpa", "bf16", 2, 24),  # q sliced from the fused output: SDPA's output is copied
    ("starcoder2", "eager", "bf16", 2, 24),  # LayerNorm with bias, gelu MLP
    ("starcoder2", "sdpa", "fp32", 1, 40),
    ("olmo2", "eager", "bf16", 2, 24),  # post-sublayer norms, q/k norm over the projection, fp32 rotary tables
    ("olmo2", "sdpa", "bf16", 1, 40),
    ("stablelm", "eager", "fp32", 2, 24),  # partial rotary, LayerNorm
    ("stablelm", "sdpa", "bf16", 1, 40),
    ("gemma2", "eager", "bf16", 2, 24),  # sandwich norms, attention and final logit soft-capping
    ("gemma2", "eager", "fp32", 1, 40),
    ("gemma3_text", "eager", "fp32", 2, 24),  # per-head q/k norm
    ("gemma3_text", "sdpa", "bf16", 1, 40),
    ("gptj", "eager", "bf16", 2, 24),  # fp32 q and k, per-rotation cos/sin, parallel block, head bias
    ("gptj", "sdpa", "fp32", 1, 40),
    ("falcon", "eager", "bf16", 2, 24),  # new decoder architecture: K, V broadcast to every head, two norms
    ("falcon", "sdpa", "fp32", 1, 40),  # SDPA gets (and keeps) the 4-D mask
    ("mixtral", "eager", "bf16", 2, 24),  # router in fp32, grouped_mm experts on the (token, choice) pairs
    ("mixtral", "sdpa", "fp32", 1, 40),
    ("qwen3_moe", "eager", "bf16", 2, 24),  # routing weights in bf16, q/k norm, experts of moe_intermediate_size
    ("qwen3_moe", "sdpa", "fp32", 1, 40),
    ("qwen2_moe", "eager", "bf16", 2, 24),  # q/k/v bias, routed pairs and a gated shared expert
    ("qwen2_moe", "sdpa", "fp32", 1, 40),
]
DROPOUT = {"gpt2": {"resid_pdrop": 0.1, "attn_pdrop": 0.1, "embd_pdrop": 0.1},  # GPT-2's defaults
           "gpt_neox": {"hidden_dropout": 0.1},  # residual and embedding dropout, none on the probabilities
           "llama": {"attention_dropout": 0.1},  # on the probabilities only; SDPA on CPU then runs the math backend
           "phi3": {"resid_pdrop": 0.1, "embd_pdrop": 0.1},  # embd_pdrop: in the config, unused by the model
           "starcoder2": {"residual_dropout": 0.1, "embedding_dropout": 0.1, "attention_dropout": 0.1},
           "gptj": {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}}


@pytest.mark.parametrize(("family", "attn"), [("gpt2", "eager"), ("gpt2", "sdpa"), ("llama", "eager"),
                                             ("phi", "sdpa"), ("gemma", "eager")])
def test_gradient_checkpointing_is_recompute_full(family: str, attn: str) -> None:
    """model.gradient_checkpointing_enable() keeps each layer's input (and, for GPT-2 eager, its 4-D mask)."""
    config, m = run_hf(tiny(family), attn_implementation=attn, dtype="fp32", batch=2, seq=24,
                       gradient_checkpointing=True)
    assert m.recompute == "full"
    assert predict_hf(config, m)["activations"] == m.saved_bytes


@pytest.mark.parametrize(("family", "attn"), [("gpt2", "eager"), ("gpt_neox", "eager"), ("llama", "sdpa"),
                                             ("phi", "eager"), ("opt", "sdpa")])
def test_autocast_on_an_fp32_model_is_amp_bf16(family: str, attn: str) -> None:
    """torch.autocast to bf16 on an fp32 model (what Trainer(bf16=True) runs): GPT-2's fp32 mask promotes its
    scores to fp32, a fused QKV projection casts its input once; states are fp32 weights, grads and Adam."""
    config, m = run_hf(tiny(family), attn_implementation=attn, dtype="fp32", batch=2, seq=24, autocast=True)
    p = predict_hf(config, m)
    assert m.setup(config).precision == "amp-bf16"
    assert p["activations"] == m.saved_bytes
    assert p["params"] + p["grads"] + p["optimizer"] == m.states_bytes


@pytest.mark.parametrize("family", list(DROPOUT))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_dropout_masks_are_counted_where_each_family_drops(family: str, attn: str) -> None:
    config, m = run_hf({**tiny(family), **DROPOUT[family]}, attn_implementation=attn, dtype="bf16", batch=2,
                       seq=24)
    assert predict_hf(config, m)["activations"] == m.saved_bytes


NEW_FAMILY_VARIANTS = [
    ("gemma3_text", {"num_hidden_layers": 6, "final_logit_softcapping": 15.0}, "sdpa", "fp32"),  # local + global rope
    ("stablelm", {"use_parallel_residual": True}, "sdpa", "fp32"),  # one norm feeds attention and MLP
    ("starcoder2", {"sliding_window": 41}, "sdpa", "bf16"),  # a window longer than seq: SDPA skips the mask
    ("qwen3", {"num_key_value_heads": 4}, "eager", "bf16"),  # no GQA
    ("falcon", {"new_decoder_architecture": False, "multi_query": False, "num_kv_heads": 4}, "sdpa", "bf16"),
    ("falcon", {"num_ln_in_parallel_attn": 1, "bias": True}, "eager", "fp32"),
    ("falcon", {"new_decoder_architecture": False, "multi_query": True}, "eager", "bf16"),  # Falcon-7B: one K/V head
    ("falcon", {"new_decoder_architecture": False, "multi_query": True}, "sdpa", "fp32"),
]


@pytest.mark.parametrize(("family", "changes", "attn", "dtype"), NEW_FAMILY_VARIANTS)
def test_new_family_variants_are_exact(family: str, changes: dict, attn: str, dtype: str) -> None:
    config, m = run_hf({**tiny(family), **changes}, attn_implementation=attn, dtype=dtype, batch=1, seq=40)
    assert predict_hf(config, m)["activations"] == m.saved_bytes
    assert config.param_count() == m.params


@pytest.mark.parametrize(("family", "attn"), [("phi3", "eager"), ("gemma2", "eager"), ("gptj", "eager"),
                                             ("falcon", "eager")])
def test_new_families_under_autocast_and_checkpointing(family: str, attn: str) -> None:
    """Phi-3's fused gate_up casts its input once under autocast; checkpointed layers keep only their input."""
    for kwargs in ({"autocast": True}, {"gradient_checkpointing": True}):
        config, m = run_hf(tiny(family), attn_implementation=attn, dtype="fp32", batch=2, seq=24, **kwargs)
        assert predict_hf(config, m)["activations"] == m.saved_bytes


def test_a_sequence_reaching_the_sliding_window_is_refused_for_fused_kernels() -> None:
    from memlab.errors import SetupError
    from memlab.predict.estimate import estimate
    from memlab.predict.memory.activations import activation_bytes
    from memlab.predict.spec.setup import Setup

    config = from_hf({**tiny("starcoder2"), "sliding_window": 40})
    for attention in ("flash", "math", "efficient"):
        setup = Setup(batch=1, seq=40, precision="bf16", attention=attention)
        with pytest.raises(SetupError, match="sliding_window=40"):
            activation_bytes(config, setup, device_type="cpu")
        with pytest.raises(SetupError, match="sliding_window=40"):
            estimate(config, setup)
    assert activation_bytes(config, Setup(batch=1, seq=39, precision="bf16", attention="flash"), device_type="cpu")


@pytest.mark.parametrize("family", ["starcoder2", "gemma3_text"])
def test_eager_attention_past_the_sliding_window_keeps_what_it_keeps_without_one(family: str) -> None:
    """The windowed mask is added to the full (s, s) scores: the same tensors are saved at seq > window."""
    config, m = run_hf({**tiny(family), "sliding_window": 16}, attn_implementation="eager", dtype="bf16", batch=1,
                       seq=40)
    assert config.impl.sliding_window == 16
    assert predict_hf(config, m)["activations"] == m.saved_bytes


@pytest.mark.parametrize(("family", "attn", "dtype", "batch", "seq"), RUNS)
def test_activations_and_states_are_exact(family: str, attn: str, dtype: str, batch: int, seq: int) -> None:
    config, m = run_hf(tiny(family), attn_implementation=attn, dtype=dtype, batch=batch, seq=seq)
    p = predict_hf(config, m)
    assert config.param_count() == m.params
    assert p["activations"] == m.saved_bytes
    assert (p["params"], p["grads"], p["optimizer"]) == (m.params_bytes, m.grads_bytes, m.optimizer_bytes)


def test_by_op_listing_sums_to_the_recorded_total_and_names_gelu_new() -> None:
    model = build_hf_model(tiny("gpt2"))
    idx = torch.randint(0, 512, (2, 16))
    frame = saved_by_op(model, lambda: model(input_ids=idx, labels=idx).loss)
    config = from_hf(tiny("gpt2"))
    assert "(not in a node)" not in set(frame["op"])
    layer = layer_listing(frame, "h.0.", tokens=32)
    d_ff_rows = layer[layer["op"].isin(["PowBackward0", "TanhBackward0", "MulBackward0"])]
    assert d_ff_rows["nbytes"].sum() == 4 * 32 * config.ffn * 4  # gelu_new's four d_ff-wide tensors, fp32
    assert layer["nbytes"].sum() == frame[frame["scope"].str.contains("h.0.", regex=False)]["nbytes"].sum()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
@pytest.mark.parametrize(("family", "attn", "dtype", "batch", "seq"), RUNS)
def test_activations_and_states_are_exact_on_cuda(family: str, attn: str, dtype: str, batch: int, seq: int) -> None:
    """The same runs on CUDA: SDPA picks the CUDA kernels (flash for bf16, memory-efficient for fp32), layer_norm
    keeps fp32 statistics; the prediction for device_type 'cuda' must still equal the saved bytes."""
    config, m = run_hf(tiny(family), attn_implementation=attn, dtype=dtype, batch=batch, seq=seq, device="cuda")
    p = predict_hf(config, m)
    assert p["activations"] == m.saved_bytes
    assert (p["params"], p["grads"], p["optimizer"]) == (m.params_bytes, m.grads_bytes, m.optimizer_bytes)
