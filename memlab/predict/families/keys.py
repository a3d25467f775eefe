"""Every key of a supported family's Hugging Face config, accounted for: modelled, memory-neutral, or refused.

:func:`memlab.predict.families.reader.from_hf` estimates a model from its ``config.json``; a key it did not read could
change what the real modelling code allocates, and the estimate would be silently wrong. So each family has a
:class:`KeyAccount` that puts every key its ``transformers`` config class knows (transformers 5.x, nested
``rope_parameters`` / ``rope_scaling`` keys as ``rope_parameters.rope_type``) into one of three lists:

- **modelled**: the key changes the estimate; the value names the memlab file and function that read it;
- **neutral**: the key cannot change a training step's memory; the value says why (a token id, an init range,
  a generation flag, a key the family's 5.x modelling file does not read; the ones marked "traced equal" were
  checked by tracing the tiny config with the key changed, ``benchmarks/config_keys_neutral.py``);
- **refused**: memlab does not model the key's effect; :func:`check` raises a one-line
  :class:`~memlab.errors.ConfigError` unless the value is one of :attr:`KeyAccount.accepted` (the class default,
  or a value whose effect is nil).

A key in no list is refused too (:func:`check`), so a config from a newer transformers, or a hand-edited one,
cannot add a silent key; ``tests/predict/test_config_keys.py`` reads the installed config classes and fails on a
key the accounts miss. Pure data and functions: no torch, no transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memlab.errors import ConfigError
from memlab.predict.families.new_keys import NEW_FAMILY_KEYS

NESTED = ("rope_parameters", "rope_scaling")
"""Keys whose value is a dict of keys accounted one by one (as ``rope_parameters.rope_type``)."""

_HF = "memlab/predict/families/reader.py"
_NOT_READ = "the family's modelling file (transformers 5.x) does not read it"
_TRACED = "; traced equal (benchmarks/config_keys_neutral.py)"


@dataclass(frozen=True)
class KeyAccount:
    """Where every key of one family's config goes (module docstring)."""

    modelled: Mapping[str, str]
    """key -> the memlab file and function that reads it."""
    neutral: Mapping[str, str]
    """key -> why it cannot change a training step's memory."""
    refused: Mapping[str, str]
    """key -> what memlab does with it (a ConfigError unless the value is accepted)."""
    accepted: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """refused key -> the values under which the estimate stays exact (the class default among them)."""

    def kind(self, key: str) -> str | None:
        """``"modelled"``, ``"neutral"``, ``"refused"`` or None (in no list). A key of one layer kind's rotary dict
        (``rope_parameters.full_attention.rope_type``) is accounted as the plain one (``rope_parameters.rope_type``)."""
        for k in dict.fromkeys((key, base_key(key))):
            for name in ("modelled", "neutral", "refused"):
                if k in getattr(self, name):
                    return name
        return None

    def entry(self, key: str, name: str) -> Any:
        """``key``'s value in the list or table ``name`` (``refused``, ``accepted`` ...), by its :func:`base_key`
        when the key itself is not there."""
        table = getattr(self, name)
        return table[key] if key in table else table.get(base_key(key))


LAYER_KINDS = ("full_attention", "sliding_attention")
"""Layer kinds that carry rotary parameters of their own (Gemma 3: ``rope_parameters.sliding_attention``)."""


def base_key(key: str) -> str:
    """``rope_parameters.<kind>.<k>`` as ``rope_parameters.<k>`` for a :data:`LAYER_KINDS` kind; other keys as given."""
    parts = key.split(".")
    if len(parts) == 3 and parts[0] in NESTED and parts[1] in LAYER_KINDS:
        return f"{parts[0]}.{parts[2]}"
    return key


COMMON_NEUTRAL: dict[str, str] = {
    "_name_or_path": "a label (memlab shows it as the model's name)",
    "name": "a label (from_hf shows it when _name_or_path is missing)",
    "architectures": "names the head class; memlab builds AutoModelForCausalLM from model_type",
    "transformers_version": "the writer's version",
    "dtype": "the step's dtype is Setup.precision: memlab.model.hf.build_hf_model and the trace build in it, "
             "not in the config's dtype" + _TRACED,
    "torch_dtype": "the 4.x spelling of dtype (same reason)",
    "id2label": "labels of a classification head, not the causal LM" + _TRACED,
    "label2id": "labels of a classification head, not the causal LM",
    "problem_type": "the loss of a classification head, not the causal LM" + _TRACED,
    "return_dict": "the output container's type; memlab's step passes return_dict through its loss call",
    "chunk_size_feed_forward": "read only by apply_chunking_to_forward, which these families do not call" + _TRACED,
    "is_encoder_decoder": "a generation flag; the causal-LM classes do not read it" + _TRACED,
    "is_decoder": "the causal-LM classes of these families do not read it",
    "use_cache": "training: memlab's step passes no use_cache and builds no KV cache" + _TRACED,
    "bos_token_id": "a token id" + _TRACED,
    "eos_token_id": "a token id",
    "pad_token_id": "a token id (nn.Embedding padding_idx zeroes that row's gradient, same bytes)" + _TRACED,
    "sep_token_id": "a token id",
    "decoder_start_token_id": "a token id (encoder-decoder generation)",
    "tokenizer_class": "the tokenizer's name",
    "finetuning_task": "a label",
    "prefix": "a generation prompt prefix",
    "task_specific_params": "generation settings per task",
    "use_bfloat16": "TensorFlow only (4.x)",
    "tf_legacy_loss": "TensorFlow only (4.x)",
    "initializer_range": "initial values, not sizes" + _TRACED,
    "rope_theta": "the 4.x spelling of rope_parameters.rope_theta: changes cos/sin values, not their shapes",
    "_memlab_source": "memlab's note of where a shipped config comes from",
    "_memlab_note": "memlab's note on a shipped tiny config",
    **{k: "a generation setting (model.generate), not read by a training step" for k in (
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
        "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
        "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
        "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
        "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens")},
}
"""Keys of ``PretrainedConfig`` itself (and its 4.x spellings) that no family's training step reads for memory."""

COMMON_MODELLED: dict[str, str] = {
    "model_type": f"{_HF} from_hf (picks the family's builder)",
    "tie_word_embeddings": f"{_HF} each family's builder (TransformerConfig.tied_embeddings)",
    "vocab_size": f"{_HF} each family's builder (TransformerConfig.vocab_size)",
}

COMMON_REFUSED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "output_attentions": ("ConfigError unless false: the output keeps every layer's attention weights referenced "
                          "until the loss returns (and forces eager attention), not modelled", (False,)),
    "output_hidden_states": ("ConfigError unless false: the output keeps every layer's hidden states referenced "
                             "until the loss returns, not modelled", (False,)),
    "torchscript": ("ConfigError unless false: TorchScript mode clones the tied embedding instead of sharing it",
                    (False,)),
    "pruned_heads": ("ConfigError unless empty: pruned heads change the attention's parameter shapes", ({},)),
    "add_cross_attention": ("ConfigError unless false: cross-attention adds parameters and saved tensors "
                            "(traced +67,072 B on tiny gpt2)", (False,)),
    "tie_encoder_decoder": ("ConfigError unless false: an encoder-decoder setting", (False,)),
    "quantization_config": ("ConfigError: a quantized checkpoint's layout is not modelled (memlab's QLoRA is "
                            "Setup.finetune='qlora')", ()),
    "auto_map": ("ConfigError: the config runs custom code (trust_remote_code), not the family's transformers "
                 "modelling file", ()),
}
"""Keys any family's config may carry whose effect memlab does not model: (what memlab does, accepted values)."""

_ROPE_NEUTRAL = {
    "rope_parameters": "a dict: its keys are accounted one by one",
    "rope_scaling": "the 4.x dict of rope_parameters (null: none): its keys are accounted one by one",
    "rope_parameters.rope_theta": "the rotary base: changes cos/sin values, not their shapes",
    **{f"rope_parameters.{kind}": "one layer kind's rotary parameters (Gemma 3): a dict whose keys are accounted one "
                                  "by one as the plain rope_parameters keys" for kind in LAYER_KINDS},
    "rope_scaling.rope_theta": "as rope_parameters.rope_theta",
    **{f"{p}.{k}": "a scaling constant of the rope_type: changes inv_freq values or the scalar attention_scaling "
                   "that multiplies cos/sin for every rope_type, not shapes" + _TRACED
       for p in NESTED for k in ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                                 "beta_slow", "low_freq_factor", "high_freq_factor", "mscale", "mscale_all_dim",
                                 "truncate")},
}
_ROPE_TYPES = ("default", "linear", "yarn", "llama3")
_ROPE_REFUSED = {
    f"{p}.{k}": (f"ConfigError unless {', '.join(_ROPE_TYPES)}: these only change inv_freq values and the scalar "
                 "attention_scaling (traced equal); dynamic recomputes inv_freq from the batch's length and longrope "
                 "adds buffers (traced +32 B on tiny llama), not modelled", (*_ROPE_TYPES, None))
    for p in NESTED for k in ("rope_type", "type")
}


def _account(modelled: Mapping[str, str], neutral: Mapping[str, str],
             refused: Mapping[str, tuple[str, tuple[Any, ...]]], *, rope: bool = True) -> KeyAccount:
    """A family's account: its own keys plus the common ones (and the rotary keys when ``rope``)."""
    ref = {**COMMON_REFUSED, **(_ROPE_REFUSED if rope else {}), **refused}
    return KeyAccount(
        modelled={**COMMON_MODELLED, **modelled},
        neutral={**COMMON_NEUTRAL, **(_ROPE_NEUTRAL if rope else {}), **neutral},
        refused={k: text for k, (text, _) in ref.items()},
        accepted={k: ok for k, (_, ok) in ref.items()},
    )


def _b(family: str, what: str) -> str:
    return f"{_HF} {family} ({what})"


_EPS = "the norm's epsilon: a scalar, no tensor" + _TRACED
_LLAMA_MODELLED = {
    "hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads", "intermediate_size": "d_ff", "max_position_embeddings": "max_seq",
    "hidden_act": "Implementation.activation", "head_dim": "attn_head_dim",
    "attention_dropout": "Implementation.attention_dropout",
}


def _llama_like_modelled(extra: Mapping[str, str] = ()) -> dict[str, str]:
    return {k: _b("_llama_like", v) for k, v in {**_LLAMA_MODELLED, **dict(extra)}.items()}


def _sliding(family: str) -> tuple[str, tuple[Any, ...]]:
    return (f"{family}'s window hides keys further back than it: from_hf records it (Implementation.sliding_window); "
            "eager attention builds the same (batch, 1, seq, seq) mask either way, so the estimate is exact; for the "
            "SDPA kernels a seq longer than the window makes transformers pass an explicit mask instead of is_causal, "
            "which the estimate refuses (memlab/predict/spec/traits.py Implementation.check_window)", ())


_NO_PARTIAL = {f"{p}.partial_rotary_factor": ("ConfigError unless 1: a partial rotary in this family is not "
                                              "modelled", (1, 1.0)) for p in (*NESTED, "")}
_NO_PARTIAL["partial_rotary_factor"] = _NO_PARTIAL.pop(".partial_rotary_factor")
_PARTIAL = {f"{p}.partial_rotary_factor": "Implementation.rotary_fraction" for p in NESTED}


ACCOUNTS: dict[str, KeyAccount] = {
    "gpt2": _account(
        {"n_embd": _b("_gpt2", "d_model"), "n_layer": _b("_gpt2", "n_layers"), "n_head": _b("_gpt2", "n_heads"),
         "n_inner": _b("_gpt2", "d_ff"), "n_positions": _b("_gpt2", "max_seq, the learned table"),
         "activation_function": _b("_gpt2", "Implementation.activation"),
         "resid_pdrop": _b("_gpt2", "dropout"), "attn_pdrop": f"{_HF} from_hf (Implementation.attention_dropout)",
         "embd_pdrop": f"{_HF} from_hf (Implementation.embedding_dropout)"},
        {"layer_norm_epsilon": _EPS,
         **{k: "the sequence-summary head of GPT2DoubleHeadsModel, not the causal LM" + _TRACED for k in (
             "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
             "summary_first_dropout")}},
        {"reorder_and_upcast_attn": ("ConfigError unless false: the fp32 baddbmm path keeps other tensors "
                                     "(traced +327,680 B on tiny gpt2), not modelled", (False,)),
         "scale_attn_weights": ("ConfigError unless true: the estimate follows the scaled eager attention",
                                (True,)),
         "scale_attn_by_inverse_layer_idx": ("ConfigError unless false: an extra op on the scores, not modelled",
                                             (False,))},
        rope=False),
    "opt": _account(
        {"hidden_size": _b("_opt", "d_model"), "num_hidden_layers": _b("_opt", "n_layers"),
         "num_attention_heads": _b("_opt", "n_heads"), "ffn_dim": _b("_opt", "d_ff"),
         "max_position_embeddings": _b("_opt", "max_seq, the learned table"),
         "activation_function": _b("_opt", "Implementation.activation"), "dropout": _b("_opt", "dropout"),
         "enable_bias": _b("_opt", "bias"),
         "attention_dropout": f"{_HF} from_hf (Implementation.attention_dropout)"},
        {"init_std": "initial values, not sizes" + _TRACED,
         "activation_dropout": _NOT_READ + " (modeling_opt.py has no activation dropout)" + _TRACED},
        {"do_layer_norm_before": ("ConfigError unless true: post-norm OPT (opt-350m) is not modelled (_opt)",
                                  (True,)),
         "word_embed_proj_dim": ("ConfigError unless null or hidden_size: project_in/project_out are not "
                                 "modelled (_opt)", (None,)),
         "_remove_final_layer_norm": ("ConfigError unless false: no final norm is not modelled", (False,)),
         "layer_norm_elementwise_affine": ("ConfigError unless true: norms without weights change the parameter "
                                           "count (traced -3,880 B on tiny opt)", (True,)),
         "layerdrop": ("ConfigError unless 0: dropping whole layers at random is not modelled", (0, 0.0))},
        rope=False),
    "gpt_neox": _account(
        {"hidden_size": _b("_neox", "d_model"), "num_hidden_layers": _b("_neox", "n_layers"),
         "num_attention_heads": _b("_neox", "n_heads"), "intermediate_size": _b("_neox", "d_ff"),
         "max_position_embeddings": _b("_neox", "max_seq"), "hidden_act": _b("_neox", "Implementation.activation"),
         "use_parallel_residual": _b("_neox", "Implementation.parallel_block"),
         "attention_bias": _b("_neox", "Implementation.qkv_bias, o_bias"),
         "hidden_dropout": _b("_neox", "dropout, Implementation.embedding_dropout"),
         "attention_dropout": f"{_HF} from_hf (Implementation.attention_dropout)",
         "rotary_pct": _b("_neox", "Implementation.rotary_fraction (the 4.x key)"),
         **{k: _b("_neox", v) for k, v in _PARTIAL.items()}},
        {"layer_norm_eps": _EPS, "classifier_dropout": "the classification head's dropout, not the causal LM",
         "rotary_emb_base": "the 4.x spelling of rope_parameters.rope_theta: values, not shapes"},
        {}),
    "phi": _account(
        {"hidden_size": _b("_phi", "d_model"), "num_hidden_layers": _b("_phi", "n_layers"),
         "num_attention_heads": _b("_phi", "n_heads"), "num_key_value_heads": _b("_phi", "n_kv_heads"),
         "intermediate_size": _b("_phi", "d_ff"), "max_position_embeddings": _b("_phi", "max_seq"),
         "hidden_act": _b("_phi", "Implementation.activation"), "resid_pdrop": _b("_phi", "dropout"),
         "embd_pdrop": f"{_HF} from_hf (Implementation.embedding_dropout)",
         "attention_dropout": f"{_HF} from_hf (Implementation.attention_dropout)",
         "partial_rotary_factor": _b("_phi", "Implementation.rotary_fraction (the 4.x key)"),
         **{k: _b("_phi", v) for k, v in _PARTIAL.items()}},
        {"layer_norm_eps": _EPS},
        {"qk_layernorm": ("ConfigError unless false: the q/k layer norms are not modelled (_phi)", (False,))}),
    "llama": _account(
        _llama_like_modelled({"attention_bias": "Implementation.qkv_bias, o_bias",
                              "mlp_bias": "Implementation.mlp_bias"}),
        {"rms_norm_eps": _EPS, "pretraining_tp": _NOT_READ + " (5.x dropped the sliced-matmul path)" + _TRACED},
        _NO_PARTIAL),
    "mistral": _account(
        _llama_like_modelled(),
        {"rms_norm_eps": _EPS, **{k: "modeling_mistral.py builds every projection with bias=False: the key is not "
                                     "read" for k in ("attention_bias", "mlp_bias")}},
        {**_NO_PARTIAL, "sliding_window": _sliding("mistral")}),
    "qwen2": _account(
        _llama_like_modelled(),
        {"rms_norm_eps": _EPS},
        {**_NO_PARTIAL, "sliding_window": _sliding("qwen2"),
         "use_sliding_window": ("ConfigError unless false: sliding-window layers are not modelled", (False,)),
         "max_window_layers": ("accepted while use_sliding_window is false (then every layer is full attention; "
                               "from_hf checks layer_types); use_sliding_window true is refused", ()),
         "layer_types": ("ConfigError unless every entry is full_attention: sliding-window layers are not "
                         "modelled", ())}),
    "gemma": _account(
        {k: _b("_gemma", v) for k, v in {**_LLAMA_MODELLED, "hidden_activation": "Implementation.activation",
                                          "attention_bias": "Implementation.qkv_bias, o_bias"}.items()},
        {"rms_norm_eps": _EPS},
        {**_NO_PARTIAL, "use_bidirectional_attention": ("ConfigError unless false: bidirectional attention "
                                                        "changes the mask", (False, None))}),
}
"""model_type -> its :class:`KeyAccount`."""


def account(model_type: str) -> KeyAccount:
    """The :class:`KeyAccount` of ``model_type``; a :class:`ConfigError` for a family without one."""
    try:
        return ACCOUNTS[model_type]
    except (KeyError, TypeError):
        raise ConfigError(f"model_type {model_type!r:.60} has no key account in memlab.predict.families.keys: its "
                          "config keys are not checked, so the formula refuses it") from None


def flat_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config``'s keys, with the keys of each :data:`NESTED` dict as ``parent.key`` beside ``parent`` (and those
    of a layer kind's dict inside it as ``parent.kind.key``)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        out[key] = value
        if key in NESTED and isinstance(value, Mapping):
            for k, v in value.items():
                out[f"{key}.{k}"] = v
                if k in LAYER_KINDS and isinstance(v, Mapping):  # one layer kind's own rotary dict
                    out.update({f"{key}.{k}.{kk}": vv for kk, vv in v.items()})
    return out


def unaccounted(model_type: str, config: Mapping[str, Any]) -> list[str]:
    """The keys of ``config`` (nested ones dotted) in none of ``model_type``'s three lists, sorted."""
    acc = account(model_type)
    return sorted(k for k in flat_keys(config) if acc.kind(k) is None)


def refused_values(model_type: str, config: Mapping[str, Any]) -> list[str]:
    """The refused keys of ``config`` whose values are not accepted (null counts as not given), sorted; the
    conditional ones (:data:`CONDITIONAL`) are left to :func:`memlab.predict.families.reader.from_hf`."""
    acc = account(model_type)
    bad = []
    for key, value in flat_keys(config).items():
        if acc.kind(key) != "refused" or key in CONDITIONAL or value is None:
            continue
        if not any(_same(value, ok) for ok in acc.entry(key, "accepted") or ()):
            bad.append(key)
    return sorted(bad)


def _same(value: Any, ok: Any) -> bool:
    """Whether ``value`` is the accepted ``ok``: a bool only equals a bool, numbers compare by value (0 == 0.0)."""
    if isinstance(value, bool) or isinstance(ok, bool):
        return value is ok
    numbers = isinstance(value, int | float) and isinstance(ok, int | float)
    return (numbers or type(value) is type(ok)) and value == ok


CONDITIONAL = ("sliding_window", "max_window_layers", "layer_types", "word_embed_proj_dim")
"""Refused keys whose accepted values depend on other keys: :func:`memlab.predict.families.reader.from_hf` (and the
family builders of :mod:`memlab.predict.families.builders`) check them."""


def check(model_type: str, config: Mapping[str, Any]) -> None:
    """Raise a one-line :class:`ConfigError` when ``config`` has a key in no list, or a refused key with a value
    the estimate does not cover (the first such key, with what memlab does about it)."""
    missing = unaccounted(model_type, config)
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise ConfigError(f"{model_type} config key(s) {shown} are not accounted for in memlab.predict.families.keys "
                          "(not known to change memory or not): the estimate refuses rather than ignore them; "
                          "remove them or trace the model (memlab trace --hf)")
    bad = refused_values(model_type, config)
    if bad:
        key = bad[0]
        value = flat_keys(config)[key]
        raise ConfigError(f"{model_type} config {key}={value!r:.60} is not modelled: "
                          f"{account(model_type).entry(key, 'refused')}")


def _new_family(lists: Mapping[str, Mapping[str, Any]]) -> KeyAccount:
    """A :mod:`memlab.predict.families.new_keys` family's account, with the keys every family shares (the common refused
    keys and rotary types win over the family's own listing of them; ``model_type`` is modelled, as everywhere)."""
    common = {**COMMON_REFUSED, **_ROPE_REFUSED}
    refused = dict(lists["refused"])  # key -> (what memlab does, the accepted values)
    keep = {k: v for k, v in lists["neutral"].items() if base_key(k) not in common and k not in refused
            and k not in COMMON_MODELLED}
    modelled = {k: v if "memlab/" in v else f"memlab/predict/families/builders.py ({v})"
                for k, v in lists["modelled"].items() if k not in common}
    return _account(modelled, keep, refused)


ACCOUNTS.update({family: _new_family(lists) for family, lists in NEW_FAMILY_KEYS.items()})

REFUSED_DEFAULTS: dict[str, str] = {}
"""Families whose ``transformers`` config class defaults describe a layout memlab refuses (with why)."""
