"""memlab.predict.spec.model: exact parameter counts pinned to published totals, independent formulas, validation,
presets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.errors import ConfigError, MemlabError, UnknownNameError
from memlab.predict.spec.model import PRESETS, TransformerConfig, preset, preset_names, swiglu_hidden

# Published totals. gpt2: the 124,439,808 of the openai-community/gpt2 checkpoint (nanoGPT's
# transformer_sizing.ipynb reproduces it); the others are the parameter counts shown on the Hugging Face
# model cards (safetensors metadata) of meta-llama/Llama-2-7b-hf, meta-llama/Meta-Llama-3-8B,
# mistralai/Mistral-7B-v0.1 and meta-llama/Llama-2-70b-hf.
PUBLISHED = {
    "gpt2": 124_439_808,
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "llama-2-70b": 68_976_648_192,
}


@pytest.mark.parametrize(("name", "count"), sorted(PUBLISHED.items()))
def test_param_count_matches_published_total(name: str, count: int) -> None:
    assert preset(name).param_count() == count


def _gpt2_closed_form(V: int, S: int, L: int, h: int) -> int:
    """nanoGPT / Kaplan-style count of a GPT-2 layout with biases and tied head: V*h + S*h + L*(12h^2 + 13h) + 2h."""
    return V * h + S * h + L * (12 * h * h + 13 * h) + 2 * h


def _llama_closed_form(V: int, L: int, h: int, k: int, f: int) -> int:
    """Llama layout (no biases, RMSNorm, untied head): 2Vh + L*(2h^2 + 2hk + 3hf + 2h) + h."""
    return 2 * V * h + L * (2 * h * h + 2 * h * k + 3 * h * f + 2 * h) + h


@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-3-175b", "tiny-gpt"])
def test_gpt2_layout_presets_follow_the_closed_form(name: str) -> None:
    c = preset(name)
    assert c.param_count() == _gpt2_closed_form(c.vocab_size, c.max_seq, c.n_layers, c.d_model)


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
                                  "mistral-7b", "tiny-llama"])
def test_llama_layout_presets_follow_the_closed_form(name: str) -> None:
    c = preset(name)
    assert c.param_count() == _llama_closed_form(c.vocab_size, c.n_layers, c.d_model, c.kv_dim, c.ffn)


@settings(max_examples=60, deadline=None)
@given(
    heads=st.integers(1, 8), head_dim=st.sampled_from([2, 4, 8]), kv_div=st.sampled_from([1, 2, 4, 8]),
    L=st.integers(1, 4), V=st.integers(1, 300), S=st.integers(1, 64), f=st.one_of(st.none(), st.integers(1, 50)),
    mlp=st.sampled_from(["gelu", "swiglu"]), pos=st.sampled_from(["learned", "rotary"]),
    norm=st.sampled_from(["layernorm", "rmsnorm"]), bias=st.booleans(), tied=st.booleans(),
)
def test_param_count_matches_an_independent_formula(heads, head_dim, kv_div, L, V, S, f, mlp, pos, norm, bias,
                                                    tied) -> None:
    kv = heads // kv_div if heads % kv_div == 0 else heads
    h = heads * head_dim
    c = TransformerConfig(d_model=h, n_layers=L, n_heads=heads, n_kv_heads=kv, d_ff=f, vocab_size=V, max_seq=S,
                          mlp=mlp, positions=pos, norm=norm, bias=bias, tied_embeddings=tied)
    ff = f if f is not None else (4 * h if mlp == "gelu" else swiglu_hidden(h))
    k = kv * head_dim
    n_up = 2 if mlp == "swiglu" else 1
    attn = 2 * h * h + 2 * h * k + (2 * h + 2 * k if bias else 0)
    mlp_n = (n_up + 1) * h * ff + (n_up * ff + h if bias else 0)
    norm_n = h * (2 if norm == "layernorm" and bias else 1)
    expected = V * h + (S * h if pos == "learned" else 0) + L * (attn + mlp_n + 2 * norm_n) + norm_n
    expected += 0 if tied else V * h
    assert c.param_count() == expected
    assert c.param_count() == sum(c.param_breakdown().values())
    assert sum(math.prod(s) for _, s, _ in c.param_shapes()) == expected
    names = [n for n, _, _ in c.param_shapes()]
    assert len(names) == len(set(names))


def test_breakdown_components_of_gpt2() -> None:
    c = preset("gpt2")
    b = c.param_breakdown()
    h, L = c.d_model, c.n_layers
    assert b["embeddings"] == c.vocab_size * h
    assert b["positions"] == c.max_seq * h
    assert b["attention"] == L * (4 * h * h + 4 * h)
    assert b["mlp"] == L * (8 * h * h + 5 * h)
    assert b["norms"] == (2 * L + 1) * 2 * h
    assert b["head"] == 0  # tied


def test_untied_head_is_counted_and_tied_is_not() -> None:
    c = preset("tiny-gpt")
    untied = c.with_(tied_embeddings=False)
    assert untied.param_count() - c.param_count() == c.vocab_size * c.d_model
    assert untied.param_breakdown()["head"] == c.vocab_size * c.d_model


def test_gqa_shrinks_k_and_v_only() -> None:
    mha = preset("llama-2-7b").with_(n_kv_heads=32)
    gqa = mha.with_(n_kv_heads=8)
    h, L = mha.d_model, mha.n_layers
    assert mha.param_count() - gqa.param_count() == L * 2 * h * (h - 8 * mha.head_dim)
    assert gqa.kv_dim == 8 * 128


def test_swiglu_default_width_is_the_llama_rule() -> None:
    # Llama 2 7B: 2/3 * 4 * 4096 = 10922.67 -> rounded up to a multiple of 256 = 11008 (its released d_ff).
    assert swiglu_hidden(4096) == 11008
    assert TransformerConfig(d_model=4096, n_layers=1, n_heads=32, mlp="swiglu").ffn == 11008
    assert TransformerConfig(d_model=64, n_layers=1, n_heads=4).ffn == 256


def test_matmul_params_are_block_matrices_and_one_vocab_matrix() -> None:
    c = preset("gpt2")
    h, L = c.d_model, c.n_layers
    assert c.matmul_param_count() == L * 12 * h * h + c.vocab_size * h


def test_config_is_frozen_and_with_revalidates() -> None:
    c = preset("tiny-gpt")
    with pytest.raises(AttributeError):
        c.d_model = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match="n_heads"):
        c.with_(d_model=65)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"d_model": 0}, "d_model"),
    ({"n_layers": -1}, "n_layers"),
    ({"n_heads": 3}, "n_heads"),  # 64 % 3
    ({"n_kv_heads": 3}, "n_kv_heads"),  # 4 % 3
    ({"n_kv_heads": 0}, "n_kv_heads"),
    ({"vocab_size": 1.5}, "vocab_size"),
    ({"max_seq": True}, "max_seq"),
    ({"d_ff": 0}, "d_ff"),
    ({"mlp": "relu"}, "mlp"),
    ({"positions": "alibi"}, "positions"),
    ({"norm": "batchnorm"}, "norm"),
    ({"dropout": 1.0}, "dropout"),
    ({"positions": "rotary", "n_heads": 64, "d_model": 64}, "head_dim"),  # head_dim 1 is odd
])
def test_bad_config_names_the_field(kwargs: dict, field: str) -> None:
    base = {"d_model": 64, "n_layers": 2, "n_heads": 4}
    with pytest.raises(ConfigError, match=field):
        TransformerConfig(**{**base, **kwargs})


def test_config_errors_are_memlab_errors_and_value_errors() -> None:
    with pytest.raises(MemlabError):
        TransformerConfig(d_model=10, n_layers=1, n_heads=3)
    assert issubclass(ConfigError, ValueError)


def test_unknown_preset_lists_the_closest_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        preset("llama-2-8b")
    msg = str(info.value)
    assert "llama-2-8b" in msg and "Closest:" in msg and "llama-2-7b" in msg


@pytest.mark.parametrize(("alias", "name"), [("GPT2_small", "gpt2"), ("gpt3", "gpt-3-175b"),
                                             ("Llama2-7B", "llama-2-7b")])
def test_aliases_and_case_resolve(alias: str, name: str) -> None:
    assert preset(alias) is PRESETS[name].config


def test_every_preset_has_a_source_and_its_own_name() -> None:
    assert preset_names() == list(PRESETS)
    for name, p in PRESETS.items():
        assert p.source.strip(), name
        assert p.config.name == name
    for required in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-2-7b", "llama-2-13b", "llama-2-70b",
                     "llama-3-8b", "llama-3-70b", "mistral-7b", "opt-13b", "gpt-3-175b"):
        assert required in PRESETS


def test_to_dict_round_trips() -> None:
    c = preset("tiny-llama")
    assert TransformerConfig(**c.to_dict()) == c


def test_every_setup_field_sits_in_one_group() -> None:
    """Setup's fields by concern (SETUP_GROUPS): each in exactly one group, read back by Setup.group."""
    from memlab.errors import SetupError
    from memlab.predict.spec.setup import SETUP_GROUPS, Setup

    grouped = [f for fields in SETUP_GROUPS.values() for f in fields]
    assert sorted(grouped) == sorted(Setup.__dataclass_fields__) and len(grouped) == len(set(grouped))
    setup = Setup(batch=2, zero_stage=3, world_size=8)
    assert setup.group("parallelism")["zero_stage"] == 3 and setup.group("shape")["batch"] == 2
    with pytest.raises(SetupError, match="the groups are shape"):
        setup.group("shapes")
