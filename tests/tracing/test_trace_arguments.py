"""Issue 23, part 3: the traces' Python API (memlab.trace, trace_gpt, trace_hf) answers an argument of the wrong kind,
or a function returning the wrong kind, with one SetupError naming it: never a TypeError, AttributeError,
RuntimeError or AssertionError from deep inside the step, and never a trace that silently drops the optimizer."""

from __future__ import annotations

import contextlib

import pytest
import torch

from memlab.errors import SetupError
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.tracing.gpt import trace_gpt
from memlab.tracing.tracer import trace

TINY = preset("tiny-gpt")


def _model() -> torch.nn.Module:
    return torch.nn.Linear(8, 8)


def _batch() -> torch.Tensor:
    return torch.randn(4, 8)


def _loss(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x).square().mean()


def _sgd(m: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1)


BASE = {"model_fn": _model, "batch_fn": _batch, "loss_fn": _loss}
BAD: dict[str, tuple[dict, str]] = {
    "model_fn a module": ({"model_fn": torch.nn.Linear(8, 8)}, "model_fn must be a function"),
    "model_fn an int": ({"model_fn": 3}, "model_fn must be a function"),
    "model_fn returns an int": ({"model_fn": lambda: 3}, r"model_fn\(\) returned int"),
    "model_fn returns None": ({"model_fn": lambda: None}, r"model_fn\(\) returned NoneType"),
    "batch_fn None": ({"batch_fn": None}, "batch_fn must be a function"),
    "batch_fn a tensor": ({"batch_fn": torch.randn(2, 8)}, "batch_fn must be a function"),
    "batch_fn returns None": ({"batch_fn": lambda: None}, r"batch_fn\(\) must return a tensor"),
    "batch_fn returns a str": ({"batch_fn": lambda: "x"}, "str 'x' inside it"),
    "batch_fn returns an int leaf": ({"batch_fn": lambda: (torch.randn(4, 8), 3)}, "int 3 inside it"),
    "optimizer_fn a str": ({"optimizer_fn": "adamw"}, "optimizer_fn must be a function or None"),
    "optimizer_fn an optimizer": ({"optimizer_fn": torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1)},
                                  "optimizer_fn must be a function or None"),
    "optimizer_fn returns None": ({"optimizer_fn": lambda m: None}, "optimizer_fn returned None"),
    "optimizer_fn returns an int": ({"optimizer_fn": lambda m: 3}, "no step"),
    "loss_fn a str": ({"loss_fn": "mse"}, "loss_fn must be a function or None"),
    "loss_fn returns a float": ({"loss_fn": lambda m, x: 1.0}, "scalar loss tensor, got float"),
    "loss_fn returns a vector": ({"loss_fn": lambda m, x: m(x)}, r"scalar loss tensor, got \(4, 8\)"),
    "loss_fn returns no gradient": ({"loss_fn": lambda m, x: x.sum()}, "no gradient"),
    "forward_context a context": ({"forward_context": contextlib.nullcontext()}, "forward_context must be a function"),
    "forward_context returns an int": ({"forward_context": lambda: 3}, "not a context manager"),
    "backward_fn a str": ({"backward_fn": "x"}, "backward_fn must be a function or None"),
    "fake a str": ({"fake": "no"}, "fake must be True or False"),
    "set_to_none a str": ({"set_to_none": "no"}, "set_to_none must be True or False"),
    "grad_accum_steps True": ({"grad_accum_steps": True}, "grad_accum_steps"),
    "grad_accum_steps 0": ({"grad_accum_steps": 0}, "grad_accum_steps"),
    "name an int": ({"name": 3}, "name must be a string"),
    "notes a str": ({"notes": "abc"}, "notes must be a tuple"),
    "setup a list": ({"setup": [1]}, "setup must be a dict"),
    "unreliable a str": ({"unreliable": "first"}, "unreliable must be"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_trace_names_the_bad_argument(case: str) -> None:
    override, hint = BAD[case]
    with pytest.raises(SetupError, match=hint):
        trace(**{**BASE, **override})


def test_no_optimizer_is_forward_and_backward_only() -> None:
    t = trace(**BASE)
    assert [r.phase for r in t.phases] == ["forward", "backward"] * 2
    with_opt = trace(**BASE, optimizer_fn=_sgd)
    assert "optimizer step" in {r.phase for r in with_opt.phases}


@pytest.mark.parametrize("setup", [None, {"batch": 1}, 3])
def test_trace_gpt_needs_a_setup(setup: object) -> None:
    with pytest.raises(SetupError, match=r"setup must be a memlab\.predict\.spec\.setup\.Setup"):
        trace_gpt(TINY, setup)  # type: ignore[arg-type]


@pytest.mark.parametrize("device_type", ["cuda:7", "tpu", None, 7, "CPU", True])
def test_trace_gpt_takes_cpu_or_cuda_only(device_type: object) -> None:
    with pytest.raises(SetupError, match="device_type must be 'cpu' or 'cuda'"):
        trace_gpt(TINY, Setup(batch=1, seq=16), device_type=device_type)  # type: ignore[arg-type]
    with pytest.raises(SetupError, match="fake must be True or False"):
        trace_gpt(TINY, Setup(batch=1, seq=16), fake="yes")  # type: ignore[arg-type]


LLAMA = {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}


class TestTraceHf:
    @pytest.fixture(autouse=True)
    def _transformers(self) -> None:
        pytest.importorskip("transformers")

    def _cfg(self, family: str = "llama", **dims: object) -> object:
        from memlab.model.hf import hf_config

        return hf_config(family, **(dims or LLAMA))

    @pytest.mark.parametrize("device_type", ["cuda:7", "tpu", None, 7])
    def test_device_type(self, device_type: object) -> None:
        from memlab.tracing.hf import trace_hf

        with pytest.raises(SetupError, match="device_type must be 'cpu' or 'cuda'"):
            trace_hf(self._cfg(), Setup(batch=1, seq=16), device_type=device_type)  # type: ignore[arg-type]

    def test_setup_world_size_and_mode(self) -> None:
        from memlab.tracing.hf import trace_hf

        with pytest.raises(SetupError, match="Setup"):
            trace_hf(self._cfg(), None)  # type: ignore[arg-type]
        with pytest.raises(SetupError, match="runs FSDP2: set zero_stage=2 or 3"):
            trace_hf(self._cfg(), Setup(batch=1, seq=16, zero_stage=1, world_size=2))
        with pytest.raises(SetupError, match="training step"):
            trace_hf(self._cfg(), Setup(batch=1, seq=16, mode="inference"))
        with pytest.raises(SetupError, match="force_unpacked"):
            trace_hf(self._cfg(), Setup(batch=1, seq=16), force_unpacked="no")  # type: ignore[arg-type]

    @pytest.mark.parametrize(("family", "dims"), [
        ("gpt2", {"n_embd": 64, "n_layer": 1, "n_head": 4, "vocab_size": 256, "n_positions": 32}),
        ("opt", {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "ffn_dim": 128,  # offset 2
                 "vocab_size": 256, "max_position_embeddings": 32, "word_embed_proj_dim": 64}),
    ])
    def test_seq_past_a_learned_position_table(self, family: str, dims: dict) -> None:
        from memlab.tracing.hf import trace_hf

        cfg = self._cfg(family, **dims)
        assert trace_hf(cfg, Setup(batch=1, seq=32)).peak_bytes > 0  # exactly the table: fine
        with pytest.raises(SetupError, match="max_position_embeddings=32"):
            trace_hf(cfg, Setup(batch=1, seq=33))

    def test_rotary_models_run_past_max_position_embeddings(self) -> None:
        from memlab.tracing.hf import trace_hf

        cfg = self._cfg(**{**LLAMA, "max_position_embeddings": 16})
        assert trace_hf(cfg, Setup(batch=1, seq=32)).peak_bytes > 0

    @pytest.mark.parametrize(("source", "dims", "hint"), [
        (None, {}, "hf_config needs"), (3, {}, "hf_config needs"), ([1], {}, "hf_config needs"),
        ("t5", {}, "no causal LM"), ("llama", {"hidden_size": 0}, "hidden_size must be >= 1"),
        ("llama", {"hidden_size": "64"}, "expected int"), ("gpt2", {"n_head": 5, "n_embd": 64}, "must divide"),
        ({"model_type": 3}, {}, "model_type must be a string"), ({"model_type": "llama", 1: 2}, {}, "keys must be"),
    ])
    def test_hf_config_refuses_in_one_config_error(self, source: object, dims: dict, hint: str) -> None:
        from memlab.errors import ConfigError
        from memlab.model.hf import hf_config

        with pytest.raises(ConfigError, match=hint):
            hf_config(source, **dims)

    def test_hf_config_of_a_config_object_with_dims(self) -> None:
        from memlab.errors import ConfigError
        from memlab.model.hf import hf_config

        cfg = self._cfg()
        assert hf_config(cfg) is cfg and hf_config(cfg, num_hidden_layers=1).num_hidden_layers == 1
        with pytest.raises(ConfigError, match="transformers refuses"):
            hf_config(cfg, num_hidden_layers="1")
