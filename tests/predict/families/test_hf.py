"""memlab.predict.families.reader.from_hf: HF configs (built here as dicts, nothing downloaded) map to
TransformerConfig sizes and the implementation traits of their family; unsupported families get an error naming the
supported ones. With
transformers installed, the parameter count equals the HF model's, built from the same config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlab.errors import ConfigError
from memlab.predict.families.reader import SUPPORTED, from_hf, hf_attention
from memlab.predict.memory.activations import reference_activation_bytes, trait_effects

H, L, A, KV, F, V, P = 64, 2, 4, 2, 128, 512, 256
TINY = {
    "gpt2": {"model_type": "gpt2", "n_embd": H, "n_layer": L, "n_head": A, "vocab_size": V, "n_positions": P},
    "opt": {"model_type": "opt", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": A, "ffn_dim": F,
            "vocab_size": V, "max_position_embeddings": P, "word_embed_proj_dim": H},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": A,
                 "intermediate_size": F, "vocab_size": V, "max_position_embeddings": P, "rotary_pct": 0.25},
    "phi": {"model_type": "phi", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": A,
            "intermediate_size": F, "vocab_size": V, "max_position_embeddings": P, "partial_rotary_factor": 0.5},
    "llama": {"model_type": "llama", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": A,
              "num_key_value_heads": KV, "intermediate_size": F, "vocab_size": V, "max_position_embeddings": P},
    "mistral": {"model_type": "mistral", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": A,
                "num_key_value_heads": KV, "intermediate_size": F, "vocab_size": V, "max_position_embeddings": P},
    "qwen2": {"model_type": "qwen2", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": A,
              "num_key_value_heads": KV, "intermediate_size": F, "vocab_size": V, "max_position_embeddings": P,
              "tie_word_embeddings": True},
    "gemma": {"model_type": "gemma", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": A,
              "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": F, "vocab_size": V,
              "max_position_embeddings": P},
}


NEW_FAMILIES = ("qwen3", "phi3", "starcoder2", "olmo2", "stablelm", "gemma2", "gemma3_text", "gptj",
                "falcon", "mixtral", "qwen3_moe", "qwen2_moe")
TINY.update({f: {k: v for k, v in json.loads((Path(__file__).resolve().parents[3] / "memlab" / "predict" / "families"
                                               / "configs" / "tiny" / f"{f}.json").read_text()).items()
                  if not k.startswith("_")}
             for f in NEW_FAMILIES})  # the shipped tiny configs: H, L, A, V as above


def test_every_supported_family_is_covered_here() -> None:
    assert set(TINY) == set(SUPPORTED)


@pytest.mark.parametrize("family", list(TINY))
def test_sizes_map(family: str) -> None:
    cfg = from_hf(TINY[family])
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.vocab_size) == (H, L, A, V)
    assert cfg.impl.family == family
    assert all(src for _, src in cfg.impl.sources)


def test_family_traits() -> None:
    gpt2, opt, neox, phi = (from_hf(TINY[f]).impl for f in ("gpt2", "opt", "gpt_neox", "phi"))
    llama, gemma, qwen = (from_hf(TINY[f]) for f in ("llama", "gemma", "qwen2"))
    assert gpt2.activation == "gelu_new" and gpt2.fused_qkv and not gpt2.softmax_fp32
    assert opt.activation == "relu" and opt.position_offset == 2 and opt.position_ids_per_token
    assert neox.parallel_block and not neox.shared_norm and neox.rotary_fraction == 0.25
    assert phi.parallel_block and phi.shared_norm and phi.head_bias and phi.activation == "gelu_new"
    assert llama.impl.eager_repeat_kv and llama.impl.softmax_fp32 and llama.impl.rmsnorm == "fp32-input"
    assert llama.n_kv_heads == KV and llama.mlp == "swiglu" and not llama.tied_embeddings
    assert gemma.impl.rmsnorm == "fp32" and gemma.impl.activation == "gelu_tanh" and gemma.head_dim == 32
    assert gemma.q_dim == 128 and gemma.tied_embeddings
    names = {n for n, _, _ in qwen.param_shapes()}
    assert qwen.impl.qkv_bias and qwen.tied_embeddings
    assert "blocks.0.attn.q.bias" in names and "blocks.0.attn.o.bias" not in names
    assert "activation" not in llama.impl.differs()  # SiLU is the reference swiglu's: not a difference


def test_gemma_7b_head_dim_is_not_d_model_over_heads() -> None:
    cfg = from_hf({"model_type": "gemma", "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 16, "head_dim": 256, "intermediate_size": 24576, "vocab_size": 256000})
    assert cfg.head_dim == 256 and cfg.q_dim == 4096
    assert round(cfg.param_count() / 1e9, 2) == 8.54  # Gemma-7B has 8.54B parameters (Gemma Team 2024, Table 2)


def test_unsupported_family_names_the_supported_ones() -> None:
    with pytest.raises(ConfigError) as info:
        from_hf({"model_type": "bert", "hidden_size": 64})
    assert all(f in str(info.value) for f in SUPPORTED)


def test_new_family_traits() -> None:
    qwen3, phi3, olmo2, gemma2, gemma3 = (from_hf(TINY[f]) for f in ("qwen3", "phi3", "olmo2", "gemma2",
                                                                      "gemma3_text"))
    assert qwen3.impl.qk_norm == "head" and qwen3.head_dim == 32 and qwen3.q_dim == 128
    assert phi3.impl.fused_qkv and phi3.impl.fused_gate_up and phi3.impl.sdpa_output_copy
    assert olmo2.impl.qk_norm == "full" and olmo2.impl.rmsnorm == "fp32-product" and olmo2.impl.rotary_tables_fp32
    assert gemma2.impl.attn_softcap and gemma2.impl.final_softcap and gemma2.impl.norm_placement == "sandwich"
    assert not gemma3.impl.attn_softcap and gemma3.impl.qk_norm == "head" and gemma3.impl.rmsnorm == "fp32"
    assert from_hf({**TINY["gemma3_text"], "num_hidden_layers": 6}).impl.rotary_table_pairs == 2
    assert from_hf({**TINY["gemma3_text"], "sliding_window_pattern": 1}).impl.sliding_window is None


@pytest.mark.parametrize(("family", "changes", "match"), [
    ("stablelm", {"qk_layernorm": True}, "qk_layernorm"),
    ("stablelm", {"hidden_dropout": 0.1}, "hidden_dropout"),
    ("phi3", {"partial_rotary_factor": 0.75}, "partial_rotary_factor"),
    ("gemma2", {"attn_logit_softcapping": -1.0}, "attn_logit_softcapping"),
    ("gemma3_text", {"layer_types": ["chunked_attention", "full_attention"]}, "layer_types"),
    ("starcoder2", {"sliding_window": 0}, "sliding_window"),
    ("falcon", {"alibi": True}, "alibi"),
    ("falcon", {"hidden_dropout": 0.1}, "dropout"),
])
def test_new_family_configs_memlab_does_not_model_are_refused(family: str, changes: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        from_hf({**TINY[family], **changes})


def test_softcaps_refuse_what_they_cannot_run() -> None:
    from memlab.errors import SetupError
    from memlab.predict.memory.activations import activation_bytes
    from memlab.predict.spec.setup import Setup

    gemma2 = from_hf(TINY["gemma2"])
    with pytest.raises(SetupError, match="soft-capping"):
        activation_bytes(gemma2, Setup(batch=1, seq=8, precision="bf16", attention="math"), device_type="cpu")
    with pytest.raises(SetupError, match="final_logit_softcapping"):
        activation_bytes(gemma2, Setup(batch=1, seq=8, precision="bf16", attention="eager", loss="chunked",
                                       loss_chunk=4), device_type="cpu")


def test_opt_350m_post_norm_is_refused() -> None:
    with pytest.raises(ConfigError, match="post-norm"):
        from_hf({**TINY["opt"], "do_layer_norm_before": False})


def test_config_json_path_and_object_and_classmethod(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY["llama"]))

    class Obj:
        def to_dict(self) -> dict:
            return dict(TINY["llama"])

    assert from_hf(path) == from_hf(tmp_path) == from_hf(Obj()).with_(name=from_hf(path).name)
    assert from_hf(TINY["llama"], name="x").name == "x"
    with pytest.raises(ConfigError, match="no config file"):
        from_hf(tmp_path / "missing.json")


def test_attention_mapping() -> None:
    assert hf_attention("sdpa", "cpu") == "flash" and hf_attention("eager") == "eager"
    assert hf_attention("sdpa", "cuda", "fp32") == "efficient" and hf_attention("sdpa", "cuda", "bf16") == "flash"
    with pytest.raises(ConfigError):
        hf_attention("flex")


@pytest.mark.parametrize("family", list(TINY))
def test_param_count_equals_the_hf_models(family: str) -> None:
    pytest.importorskip("transformers")
    from memlab.model.hf import build_hf_model

    model = build_hf_model(TINY[family])
    assert from_hf(TINY[family]).param_count() == sum(p.numel() for p in model.parameters())


def test_reference_formula_is_the_sizes_counted_as_the_reference_gpt() -> None:
    from memlab.predict.memory.activations import activation_bytes
    from memlab.predict.spec.setup import Setup
    from memlab.predict.spec.traits import REFERENCE

    setup = Setup(batch=2, seq=24, precision="bf16", attention="eager")
    gpt2 = from_hf({**TINY["gpt2"], "resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0})
    ref = reference_activation_bytes(gpt2, setup, device_type="cpu")
    assert ref == sum(activation_bytes(gpt2.with_(impl=REFERENCE), setup, device_type="cpu").values())
    traits = sum(activation_bytes(gpt2, setup, device_type="cpu").values())
    assert traits - ref == trait_effects(gpt2, setup, device_type="cpu")["activation"]  # its one trait: gelu_new


def test_trait_effects_name_what_each_trait_adds() -> None:
    from memlab.predict.spec.setup import Setup

    setup = Setup(batch=2, seq=24, precision="bf16", attention="eager")
    gpt2 = from_hf({**TINY["gpt2"], "resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0})
    effects = trait_effects(gpt2, setup, device_type="cpu")
    assert list(effects) == ["activation"]
    with_defaults = trait_effects(from_hf(TINY["gpt2"]), setup, device_type="cpu")  # GPT-2 drops out 0.1 by default
    assert with_defaults["embedding_dropout"] == 2 * 24 * H * 2  # one bf16 noise mask per token, d_model wide
    assert effects["activation"] == 3 * 2 * 24 * gpt2.ffn * 2 * gpt2.n_layers  # 3 more d_ff tensors, bf16
    llama = trait_effects(from_hf(TINY["llama"]), setup, device_type="cpu")
    scores = 2 * 4 * 24 * 24 * 2  # b a s^2 L
    assert llama["softmax_fp32"] == 4 * scores  # fp32 probabilities + their bf16 copy instead of bf16 alone
    assert {"rmsnorm", "eager_repeat_kv"} <= set(llama)
