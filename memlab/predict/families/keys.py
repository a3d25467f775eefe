"""How every key of a family's Hugging Face config is accounted for: modelled, memory-neutral, or refused.

:func:`memlab.predict.families.reader.from_hf` estimates a model from its ``config.json``; a key it did not read
could change what the real modelling code allocates, and the estimate would be silently wrong. So each family module
declares a :class:`KeyAccount` (built here with :func:`key_account` or :func:`listed_account`) that puts every key
its ``transformers`` config class knows (transformers 5.x, nested ``rope_parameters`` / ``rope_scaling`` keys as
``rope_parameters.rope_type``) into one of three lists:

- **modelled**: the key changes the estimate; the value names the memlab file and function that read it;
- **neutral**: the key cannot change a training step's memory; the value says why (a token id, an init range,
  a generation flag, a key the family's 5.x modelling file does not read; the ones marked "traced equal" were
  checked by tracing the tiny config with the key changed, ``benchmarks/config_keys_neutral.py``);
- **refused**: memlab does not model the key's effect; :func:`memlab.predict.families.registry.check` raises a
  one-line :class:`~memlab.errors.ConfigError` unless the value is one of :attr:`KeyAccount.accepted` (the class
  default, or a value whose effect is nil).

A key in no list is refused too, so a config from a newer transformers, or a hand-edited one, cannot add a silent
key; ``tests/predict/families/test_config_keys.py`` reads the installed config classes and fails on a key the
accounts miss.
What the lists claim is checked against the real model: every boolean key flipped, and two to six keys drawn
jointly, give memlab's parameter count and the estimate's states equal to ``AutoModelForCausalLM.from_config``'s
(on the meta device), or a refusal; and every modelled key changes what ``from_hf`` gives for some value
(:mod:`memlab.studies.key_draws`, ``tests/studies/test_key_draws.py``, ``benchmarks/config_key_counts.py``).
A config class's ``attribute_map`` spelling (GPT-2's ``hidden_size`` for ``n_embd``) is read as the field it sets
and wins over it, as in transformers (:attr:`memlab.predict.families.family.Family.aliases`).
This module holds the account type and the key groups every family shares; the accounts themselves are in the family
modules, looked up by ``model_type`` in :mod:`memlab.predict.families.registry`. Pure data and functions: no torch,
no transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NESTED = ("rope_parameters", "rope_scaling")
"""Keys whose value is a dict of keys accounted one by one (as ``rope_parameters.rope_type``)."""

FAMILIES_DIR = "memlab/predict/families"
_HF = f"{FAMILIES_DIR}/reader.py"
NOT_READ = "the family's modelling file (transformers 5.x) does not read it"
TRACED = "; traced equal (benchmarks/config_keys_neutral.py)"


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
             "not in the config's dtype" + TRACED,
    "torch_dtype": "the 4.x spelling of dtype (same reason)",
    "id2label": "labels of a classification head, not the causal LM" + TRACED,
    "label2id": "labels of a classification head, not the causal LM",
    "problem_type": "the loss of a classification head, not the causal LM" + TRACED,
    "return_dict": "the output container's type; memlab's step passes return_dict through its loss call",
    "chunk_size_feed_forward": "read only by apply_chunking_to_forward, which these families do not call" + TRACED,
    "is_encoder_decoder": "a generation flag; the causal-LM classes do not read it" + TRACED,
    "is_decoder": "the causal-LM classes of these families do not read it",
    "use_cache": "training: memlab's step passes no use_cache and builds no KV cache" + TRACED,
    "bos_token_id": "a token id" + TRACED,
    "eos_token_id": "a token id",
    "pad_token_id": "a token id (nn.Embedding padding_idx zeroes that row's gradient, same bytes)" + TRACED,
    "sep_token_id": "a token id",
    "decoder_start_token_id": "a token id (encoder-decoder generation)",
    "tokenizer_class": "the tokenizer's name",
    "finetuning_task": "a label",
    "prefix": "a generation prompt prefix",
    "task_specific_params": "generation settings per task",
    "use_bfloat16": "TensorFlow only (4.x)",
    "tf_legacy_loss": "TensorFlow only (4.x)",
    "initializer_range": "initial values, not sizes" + TRACED,
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
                   "that multiplies cos/sin for every rope_type, not shapes" + TRACED
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


def key_account(modelled: Mapping[str, str], neutral: Mapping[str, str],
                refused: Mapping[str, tuple[str, tuple[Any, ...]]], *, rope: bool = True) -> KeyAccount:
    """A family's account: its own keys plus the common ones (and the rotary keys when ``rope``); ``refused`` maps
    a key to (what memlab does, the accepted values)."""
    ref = {**COMMON_REFUSED, **(_ROPE_REFUSED if rope else {}), **refused}
    return KeyAccount(
        modelled={**COMMON_MODELLED, **modelled},
        neutral={**COMMON_NEUTRAL, **(_ROPE_NEUTRAL if rope else {}), **neutral},
        refused={k: text for k, (text, _) in ref.items()},
        accepted={k: ok for k, (_, ok) in ref.items()},
    )


def builder_note(module: str, what: str) -> str:
    """Where a modelled key is read: ``memlab/predict/families/MODULE.py build (WHAT)``."""
    return f"{FAMILIES_DIR}/{module}.py build ({what})"


EPS = "the norm's epsilon: a scalar, no tensor" + TRACED


def sliding(family: str) -> tuple[str, tuple[Any, ...]]:
    """The refusal entry of a Mistral-like ``sliding_window`` (checked by the builder, :data:`CONDITIONAL`)."""
    return (f"{family}'s window hides keys further back than it: from_hf records it (Implementation.sliding_window); "
            "eager attention builds the same (batch, 1, seq, seq) mask either way, so the estimate is exact; for the "
            "SDPA kernels a seq longer than the window makes transformers pass an explicit mask instead of is_causal, "
            "which the estimate refuses (memlab/predict/spec/traits.py Implementation.check_window)", ())


NO_PARTIAL = {f"{p}.partial_rotary_factor": ("ConfigError unless 1: a partial rotary in this family is not "
                                             "modelled", (1, 1.0)) for p in (*NESTED, "")}
NO_PARTIAL["partial_rotary_factor"] = NO_PARTIAL.pop(".partial_rotary_factor")
PARTIAL = {f"{p}.partial_rotary_factor": "Implementation.rotary_fraction" for p in NESTED}


# -- the listed accounts of the newer families (their modelled keys name a trait or size, not a file) ------------
_BOOKKEEPING = "transformers bookkeeping (outputs, labels, names, serialisation): no tensor of the step"
_TOKEN = "a special token id: selects a row, sizes nothing"
_INIT = "initialisation scale: values of the weights, not their sizes"
EPSILON = "a norm's epsilon: a value in the arithmetic, no tensor"
ROPE_VALUES = ("how cos and sin are computed (under no_grad, each forward): their values, not which tensors are "
               "saved or their sizes [modeling_rope_utils.py]")
ROPE_NEUTRAL = {"rope_parameters.rope_theta": ROPE_VALUES, "rope_parameters.rope_type": ROPE_VALUES}
AUX_LOSS = ("True raises ConfigError (the load-balancing auxiliary loss is not modelled)", (False,))
WINDOW = ("Implementation.sliding_window: a seq of the window or longer raises SetupError (check_window); "
          "shorter, the mask is the causal one")
LAYER_TYPES = ("which layers slide: a sliding one sets Implementation.sliding_window; a kind other than "
               "full_attention or sliding_attention raises ConfigError")

_LISTED_MODELLED = {
    "hidden_size": "TransformerConfig.d_model",
    "num_hidden_layers": "TransformerConfig.n_layers",
    "num_attention_heads": "TransformerConfig.n_heads",
    "num_key_value_heads": "TransformerConfig.n_kv_heads",
    "intermediate_size": "TransformerConfig.d_ff",
    "vocab_size": "TransformerConfig.vocab_size (the embedding's rows as given)",
    "max_position_embeddings": "TransformerConfig.max_seq (rotary: not a table, no refusal)",
    "tie_word_embeddings": "TransformerConfig.tied_embeddings",
    "attention_dropout": "Implementation.attention_dropout (the probabilities' dropout mask; CPU SDPA: math)",
}
_LISTED_NEUTRAL = {
    **{k: _BOOKKEEPING for k in ("_name_or_path", "architectures", "chunk_size_feed_forward", "dtype",
                                 "id2label", "is_encoder_decoder", "label2id", "model_type",
                                 "output_attentions", "output_hidden_states", "problem_type", "return_dict",
                                 "transformers_version")},
    **{k: _TOKEN for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
    "initializer_range": _INIT,
    "use_cache": "the KV cache of generation; a training step with labels builds none",
}


def listed_account(module: str, modelled: Mapping[str, str], neutral: Mapping[str, str],
                   refused: Mapping[str, tuple[str, tuple[Any, ...]]] | None = None) -> KeyAccount:
    """A newer family's account from its own lists (every key of ``AutoConfig.for_model(model_type).to_dict()``,
    nested dicts as ``parent.child``): the usual sizes are modelled unless the family lists them otherwise, and
    the keys every family shares are added (the common refused keys and rotary types win over the family's own
    listing of them; ``model_type`` is modelled, as everywhere). A modelled key's note names the trait or size it
    sets, read in ``memlab/predict/families/MODULE.py``."""
    refused = dict(refused or {})  # key -> (what memlab does, the accepted values)
    sizes = {k: v for k, v in _LISTED_MODELLED.items() if k not in refused and k not in neutral}
    common = {**COMMON_REFUSED, **_ROPE_REFUSED}
    neutral = {**_LISTED_NEUTRAL, **neutral}
    keep = {k: v for k, v in neutral.items() if base_key(k) not in common and k not in refused
            and k not in COMMON_MODELLED}
    notes = {k: v if "memlab/" in v else f"{FAMILIES_DIR}/{module}.py ({v})"
             for k, v in {**sizes, **modelled}.items() if k not in common}
    return key_account(notes, keep, refused)


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


def same_value(value: Any, ok: Any) -> bool:
    """Whether ``value`` is the accepted ``ok``: a bool only equals a bool, numbers compare by value (0 == 0.0)."""
    if isinstance(value, bool) or isinstance(ok, bool):
        return value is ok
    numbers = isinstance(value, int | float) and isinstance(ok, int | float)
    return (numbers or type(value) is type(ok)) and value == ok


CONDITIONAL = ("sliding_window", "max_window_layers", "layer_types", "word_embed_proj_dim")
"""Refused keys whose accepted values depend on other keys: :func:`memlab.predict.families.reader.from_hf` and the
family builders check them."""


REFUSED_DEFAULTS: dict[str, str] = {}
"""Families whose ``transformers`` config class defaults describe a layout memlab refuses (with why)."""
