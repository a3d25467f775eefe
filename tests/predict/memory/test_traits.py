"""Implementation traits on the reference GPT: composed gelu_new, ReLU, exact GELU, GeGLU, a parallel block (with
and without a shared norm), a head_dim that is not d_model / n_heads, per-projection biases. For each, the
term-by-term prediction of memlab.predict.memory.activations equals what the GPT saves for backward, category by
category, on CPU, exactly as for the default traits (tests/predict/memory/test_activations.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from memlab.errors import ConfigError, SetupError
from memlab.measure.accounting import SavedTensorRecorder
from memlab.model.gpt import GPT
from memlab.model.saved import saved_tensor_category
from memlab.model.step import autocast, model_dtype
from memlab.predict.memory.activations import activation_bytes
from memlab.predict.spec.model import TransformerConfig, preset
from memlab.predict.spec.setup import Setup
from memlab.predict.spec.traits import REFERENCE, Implementation

CPU = torch.device("cpu")
GPT_ = preset("tiny-gpt")
LLAMA = preset("tiny-llama")
VARIANTS = {
    "gelu_new": GPT_.with_(impl=Implementation(activation="gelu_new")),
    "relu": GPT_.with_(impl=Implementation(activation="relu")),
    "gelu-exact": GPT_.with_(impl=Implementation(activation="gelu")),
    "parallel": GPT_.with_(impl=Implementation(parallel_block=True, activation="gelu")),
    "parallel-shared-gelu_new": GPT_.with_(impl=Implementation(parallel_block=True, shared_norm=True,
                                                               activation="gelu_new")),
    "llama-parallel": LLAMA.with_(impl=Implementation(parallel_block=True)),
    "geglu-head_dim": LLAMA.with_(attn_head_dim=32, impl=Implementation(activation="gelu_tanh")),
    "biases-head": LLAMA.with_(impl=Implementation(qkv_bias=True, mlp_bias=True, head_bias=True)),
}


def measured_by_category(config: TransformerConfig, setup: Setup) -> dict[str, int]:
    torch.manual_seed(0)
    model = GPT(config, attention=setup.attention, recompute=setup.recompute, dtype=model_dtype(setup.policy)).train()
    idx, tgt = (torch.randint(0, config.vocab_size, (setup.batch, setup.seq)) for _ in range(2))
    rec = SavedTensorRecorder(model, categorize=saved_tensor_category)
    with rec, autocast(setup.policy, CPU):
        model(idx, tgt)
    return {k: v for k, v in rec.result().by_category().items() if v}


CASES = list(itertools.product(VARIANTS, ("eager", "flash"), ("fp32", "amp-bf16", "bf16"), ("none", "selective")))
CASES += [(v, "eager", "fp32", "full") for v in VARIANTS]


@pytest.mark.parametrize(("variant", "attention", "precision", "recompute"), CASES)
def test_traits_prediction_equals_saved_tensors(variant: str, attention: str, precision: str, recompute: str) -> None:
    cfg = VARIANTS[variant]
    setup = Setup(batch=2, seq=17, precision=precision, attention=attention, recompute=recompute)
    predicted = {k: v for k, v in activation_bytes(cfg, setup, device_type="cpu").items() if v}
    assert measured_by_category(cfg, setup) == predicted


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_traits_param_shapes_are_the_models(variant: str) -> None:
    cfg = VARIANTS[variant]
    model = GPT(cfg, device="meta")
    assert sorted((n, tuple(p.shape)) for n, p in model.named_parameters()) == sorted(
        (n, s) for n, s, _ in cfg.param_shapes())
    assert model.num_params() == cfg.param_count()


def test_gelu_new_keeps_five_dff_tensors_where_the_fused_gelu_keeps_two() -> None:
    setup = Setup(batch=2, seq=16)
    f, L, t = GPT_.ffn, GPT_.n_layers, 2 * 16
    fused = activation_bytes(GPT_, setup, device_type="cpu")["mlp"]
    composed = activation_bytes(VARIANTS["gelu_new"], setup, device_type="cpu")["mlp"]
    assert composed - fused == 3 * L * t * f * 4
    relu = activation_bytes(VARIANTS["relu"], setup, device_type="cpu")["mlp"]
    assert fused - relu == L * t * f * 4


def test_shared_norm_drops_the_second_norm_and_the_mlp_input() -> None:
    setup = Setup(batch=2, seq=16)
    seq_ = activation_bytes(GPT_.with_(impl=Implementation(activation="gelu_new")), setup, device_type="cpu")
    shared = activation_bytes(VARIANTS["parallel-shared-gelu_new"], setup, device_type="cpu")
    t, h, L = 32, GPT_.d_model, GPT_.n_layers
    assert seq_["norms"] - shared["norms"] == L * (t * h + 2 * t) * 4
    assert seq_["mlp"] - shared["mlp"] == L * t * h * 4


def test_default_traits_are_the_reference_and_round_trip() -> None:
    assert GPT_.impl == REFERENCE and REFERENCE.differs() == {}
    cfg = VARIANTS["parallel-shared-gelu_new"]
    assert TransformerConfig(**cfg.to_dict()) == cfg
    assert Implementation.from_dict(cfg.impl.to_dict()) == cfg.impl


def test_bad_traits_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="activation"):
        Implementation(activation="swish")
    with pytest.raises(ConfigError, match="shared_norm"):
        Implementation(shared_norm=True)
    # every field by its annotation (memlab.predict.spec.validate.check_fields), as TransformerConfig and Setup
    for name, bad in (("parallel_block", "yes"), ("rotary_fraction", 0.0), ("rotary_fraction", 1.5),
                      ("attention_dropout", 1.0), ("embedding_dropout", "0.1"), ("position_offset", -1),
                      ("rmsnorm", "fp16"), ("qkv_bias", 1)):
        with pytest.raises(ConfigError, match=f"Implementation.{name}"):
            Implementation(**{name: bad})
    with pytest.raises(SetupError, match="eager_repeat_kv"):
        GPT(LLAMA.with_(impl=Implementation(eager_repeat_kv=True)), device="meta")
