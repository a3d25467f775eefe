"""``Setup.lora_targets`` as a regex, peft's string ``target_modules``: memlab.model.hf.read_lora_regex reads it
against the model's module names as peft matches them (re.fullmatch on each full name), and the kinds it gives the
formula are the modules peft really wraps."""

from __future__ import annotations

import warnings

import pytest

from memlab.errors import SetupError
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.finetune import lora_modules
from memlab.predict.spec.setup import Setup, is_target_regex, parse_targets

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

DIMS = {
    "llama": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64},
    "qwen2": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 64},
    "phi": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 128, "max_position_embeddings": 64},
}

CASES = [  # (family, regex, the kinds the formula reads: '' where it refuses and the trace answers)
    ("llama", r".*\.(q_proj|v_proj)", "q,v"),
    ("llama", r".*_proj", "q,k,v,o,gate,up,down"),
    ("llama", r"model\.layers\.\d+\.mlp\.\w+_proj", "gate,up,down"),
    ("llama", r".*layers\.[01]\..*(q|v)_proj", ""),  # two of three blocks
    ("llama", r".*self_attn\.(q|k)_proj|lm_head", "q,k,head"),
    ("qwen2", r".*(o|down)_proj", "o,down"),
    ("gpt2", r".*c_attn", "q,k,v"),
    ("gpt2", r".*\.(c_attn|c_fc)", "q,k,v,up"),
    ("gpt2", r".*h\.1\.attn\.c_attn", ""),
    ("phi", r".*(dense|fc1|fc2)", "o,up,down"),
]


def _peft_wrapped(family: str, regex: str) -> list[str]:
    from memlab.model.hf import hf_config

    cfg = hf_config(family, **DIMS[family])
    base = transformers.AutoModelForCausalLM.from_config(cfg)
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=regex,
                                                          fan_in_fan_out=family == "gpt2"))
    prefix = "base_model.model."
    return sorted(n.removeprefix(prefix) for n, m in model.named_modules() if hasattr(m, "lora_A")
                  and n.startswith(prefix))


@pytest.mark.parametrize(("family", "regex", "kinds"), CASES)
def test_a_regex_reads_as_the_modules_peft_wraps_and_their_kinds(family: str, regex: str, kinds: str) -> None:
    """The names read equal the modules get_peft_model adapts for the same string; where they are whole kinds,
    the formula's adapted modules per block times the blocks count the same modules."""
    from memlab.model.hf import hf_config, read_lora_regex

    assert is_target_regex(regex)
    reading = read_lora_regex(hf_config(family, **DIMS[family]), regex)
    wrapped = _peft_wrapped(family, regex)
    assert sorted(reading.names) == wrapped
    assert reading.kinds == kinds, reading.why
    if kinds:
        config = from_hf({"model_type": family, **DIMS[family]})
        inner = [k for k in parse_targets(kinds) if k not in ("embed", "head")]
        outer = len(parse_targets(kinds)) - len(inner)
        assert config.n_layers * len(lora_modules(config, tuple(inner))) + outer == len(wrapped)


def test_a_regex_matching_nothing_or_a_module_peft_cannot_adapt_is_peft_s_error_in_one_line() -> None:
    from memlab.model.hf import hf_config, read_lora_regex

    llama = hf_config("llama", **DIMS["llama"])
    with pytest.raises(SetupError, match=r"Target modules \.\*c_attn not found in the base model") as info:
        read_lora_regex(llama, r".*c_attn")
    assert "\n" not in str(info.value)
    with pytest.raises(SetupError, match=r"act_fn: peft: Target module SiLUActivation\(\) is not supported") as info:
        read_lora_regex(llama, r".*mlp\..*")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="is not supported"):  # what peft itself says
        _peft_wrapped("llama", r".*mlp\..*")


def test_a_regex_is_validated_by_setup_and_refused_by_the_formula_until_read() -> None:
    """Setup compiles the pattern (one line); the formula, which cannot know module names from a bare setup,
    refuses a regex with the way out; its reading (whole kinds) is what the formula answers."""
    with pytest.raises(SetupError, match="cannot compile") as info:
        Setup(finetune="lora", lora_targets=r".*(q_proj")
    assert "\n" not in str(info.value)
    assert not is_target_regex("q_proj,v_proj") and not is_target_regex("all-linear")
    config = from_hf({"model_type": "llama", **DIMS["llama"]})
    setup = Setup(seq=16, finetune="lora", lora_targets=r".*\.(q_proj|v_proj)")
    with pytest.raises(SetupError, match="read_lora_regex") as info:
        estimate(config, setup)
    assert "\n" not in str(info.value)
    with pytest.raises(SetupError, match="is a regex"):
        setup.lora_target_kinds  # noqa: B018 - the property refuses rather than guessing
    assert estimate(config, setup.with_(lora_targets="q,v")).peak_bytes > 0


def test_a_regex_over_some_blocks_is_traced_as_peft_adapts_it() -> None:
    """A regex the formula refuses (two of three blocks) is traced: peft gets the string, and the trace's
    trainable parameters are the adapters of exactly the modules read."""
    from memlab.model.hf import hf_config, read_lora_regex
    from memlab.tracing.hf import trace_hf

    regex = CASES[3][1]
    reading = read_lora_regex(hf_config("llama", **DIMS["llama"]), regex)
    setup = Setup(batch=1, seq=8, finetune="lora", lora_rank=2, lora_targets=regex)
    traced = trace_hf(hf_config("llama", **DIMS["llama"]), setup, device_type="cpu").components()
    h, kv = 64, 32  # q_proj 64 -> 64, v_proj 64 -> 32 (two KV heads of 16)
    per = {"q_proj": 2 * (h + h), "v_proj": 2 * (h + kv)}
    assert traced["grads"] == 4 * sum(per[n.rsplit(".", 1)[1]] for n in reading.names)


def test_the_trace_passes_a_regex_to_peft_and_says_its_no_match_error_in_one_line() -> None:
    from memlab.model.hf import hf_config
    from memlab.tracing.hf import trace_hf

    setup = Setup(batch=1, seq=8, finetune="lora", lora_rank=2, lora_targets=r".*\.c_attn")
    with pytest.raises(SetupError, match="not found in the base model") as info:
        trace_hf(hf_config("llama", **DIMS["llama"]), setup, device_type="cpu")
    assert "\n" not in str(info.value)
