"""What the family builders share: the activation names, the rotary and window readers, the checked optional keys,
the Llama-shaped decoder most newer families are written as (:func:`decoder`) and the experts of a mixture.

Each family module (:mod:`memlab.predict.families`) builds its TransformerConfig from these, naming in ``sources``
the transformers file and function that causes each trait (transformers 5.x ``[hf-transformers]``). Pure: no torch.
"""

from __future__ import annotations

from typing import Any

from memlab.errors import ConfigError
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.traits import Implementation
from memlab.predict.spec.validate import check_int, check_number

TRANSFORMERS = "transformers/models"

HF_ACTIVATIONS = {"gelu_new": "gelu_new", "gelu_fast": "gelu_fast", "gelu": "gelu", "relu": "relu", "silu": "silu",
                  "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
"""HF activation names (``ACT2FN`` keys, transformers activations.py) -> memlab ``Implementation.activation``."""

RMS = {"fp32-input": "{F}RMSNorm.forward: hidden_states.to(torch.float32), weight * x.to(input_dtype)",
       "fp32-product": "{F}RMSNorm.forward: (weight * x_fp32).to(input_dtype)",
       "fp32": "{F}RMSNorm.forward: x.float(), output * (1.0 + self.weight.float())"}
"""Where each :attr:`~memlab.predict.spec.traits.Implementation.rmsnorm` kind is in a family's code (``{F}``: the
family's class prefix)."""


def hf_activation(name: object, field: str, family: str) -> str:
    """The memlab activation of an HF activation name, or a one-line ConfigError naming the known ones."""
    if not isinstance(name, str) or name not in HF_ACTIVATIONS:
        raise ConfigError(f"{family}: {field}={name!r} is not modelled; known activations: "
                          f"{', '.join(sorted(HF_ACTIVATIONS))}")
    return HF_ACTIVATIONS[name]


def modeling_file(folder: str) -> str:
    """``transformers/models/FOLDER/modeling_FOLDER.py``."""
    return f"{TRANSFORMERS}/{folder}/modeling_{folder}.py"


def src(folder: str, text: str) -> str:
    """``transformers/models/FOLDER/TEXT``: where a trait comes from."""
    return f"{TRANSFORMERS}/{folder}/{text}"


def optional(c: dict[str, Any], key: str, family: str, check: Any, default: Any) -> Any:
    """``c[key]`` checked by ``check`` (a :mod:`memlab.predict.spec.validate` checker; numbers in [0, 1]), or
    ``default`` when the config leaves it out or gives null: for keys some families have and their defaults do
    not list."""
    value = c.get(key)
    if value is None:
        return default
    bounds = {"lo": 0.0, "hi": 1.0} if check is check_number else {}
    return check(key, value, **bounds, owner=f"HF {family} config", err=ConfigError)


def rope_value(c: dict[str, Any], key: str, default: float) -> float:
    """A rope setting given at the top level (older config.json files) or in ``rope_parameters`` /
    ``rope_scaling`` (transformers 5 moves it there)."""
    for where in (c, c.get("rope_parameters"), c.get("rope_scaling")):
        if isinstance(where, dict) and where.get(key) is not None:
            return float(check_number(key, where[key], lo=0.0, hi=1.0, lo_open=True, owner="HF config",
                                      err=ConfigError))
    return default


def positive_or_none(c: dict[str, Any], key: str, default: float | None, family: str) -> float | None:
    """``c[key]`` (else ``default``) as a positive number, or None."""
    value = c.get(key, default)
    if value is None:
        return None
    return float(check_number(key, value, lo=0.0, lo_open=True, hi=1e9, owner=f"HF {family} config",
                              err=ConfigError))


def window(c: dict[str, Any], family: str, used: bool = True) -> int | None:
    """The sliding window a family's layers use (None when none does), checked as a positive int."""
    value = c.get("sliding_window")
    if not used or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"HF {family} config: sliding_window must be a positive int or null, got {value!r:.60}")
    return value


def mistral_window(raw: dict[str, Any], family: str, max_seq: int) -> int | None:
    """The attention window a Mistral config sets (default 4096; None: none, or one at least ``max_seq`` long)."""
    value = raw.get("sliding_window", 4096)  # MistralConfig's default
    if value is None:
        return None
    check_int("sliding_window", value, owner=f"HF {family} config", err=ConfigError)
    return value if value < max_seq else None


def layer_kinds(c: dict[str, Any], family: str) -> set[str]:
    """The kinds of ``layer_types`` (empty when the config leaves it out), each full or sliding attention."""
    kinds = c.get("layer_types")
    if kinds is None:
        return set()
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ConfigError(f"HF {family} config: layer_types must be a list of names, got {kinds!r:.80}")
    unknown = set(kinds) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ConfigError(f"HF {family} config: layer_types {sorted(unknown)} are not modelled (only full_attention "
                          "and sliding_attention)")
    return set(kinds)


def decoder(c: dict[str, Any], family: str, label: str, *, cls: str, file: str, act_key: str = "hidden_act",
            mlp: str = "swiglu", norm: str = "rmsnorm", rmsnorm: str = "fp32-input", bias: bool = False,
            qkv_bias: bool = False, o_bias: bool = False, mlp_bias: bool = False, dropout: float = 0.0,
            head_dim: int | None = None, sources: tuple[tuple[str, str], ...] = (),
            **traits: Any) -> TransformerConfig:
    """A decoder-only family written like Llama (separate or fused projections, ``repeat_kv``, fp32 softmax,
    rotary tables per forward) with the given differences; ``cls`` is the family's class prefix (``Qwen3``),
    ``file`` its modelling file (:func:`modeling_file`)."""
    d, a = c["hidden_size"], c["num_attention_heads"]
    hd = head_dim or d // a
    base = (("eager_repeat_kv", f"{file} repeat_kv (eager_attention_forward)"),
            ("softmax_fp32", f"{file} eager_attention_forward: softmax(..., dtype=torch.float32).to(query.dtype)"),
            ("rotary_tables_per_forward", f"{file} {cls}RotaryEmbedding.forward, apply_rotary_pos_emb"))
    if norm == "rmsnorm":
        base += (("rmsnorm", f"{file} " + RMS[rmsnorm].format(F=cls)),)
    impl = Implementation(
        family=family, activation=hf_activation(c[act_key], act_key, family), eager_repeat_kv=True, softmax_fp32=True,
        rmsnorm=rmsnorm if norm == "rmsnorm" else "reference", rotary_tables_per_forward=True,
        qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias, sources=base + sources, **traits,
    )
    return TransformerConfig(
        name=label, d_model=d, n_layers=c["num_hidden_layers"], n_heads=a, n_kv_heads=c["num_key_value_heads"],
        d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_seq=c["max_position_embeddings"], mlp=mlp,
        positions="rotary", norm=norm, bias=bias, tied_embeddings=bool(c["tie_word_embeddings"]), dropout=dropout,
        attn_head_dim=None if hd * a == d else hd, impl=impl,
    )


GPT_ALIASES: dict[str, str] = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
                               "num_attention_heads": "n_head", "max_position_embeddings": "n_positions"}
"""GPT2Config's and GPTJConfig's ``attribute_map``: the usual size names onto their fields (``Family.aliases``)."""


def alias_notes(aliases: dict[str, str], module: str) -> dict[str, str]:
    """The key-account notes of a family's aliases: each is read as the field it sets, and wins over it."""
    return {a: f"memlab/predict/families/{module}.py FAMILY.aliases ({a} is the config class's attribute_map "
               f"spelling of {f}; given, it replaces {f}, as in transformers)" for a, f in aliases.items()}


def experts(c: dict[str, Any], family: str) -> tuple[int, int]:
    """(routed experts, top_k) of an MoE config, checked: 2 or more experts, 1 <= top_k <= experts. The count is
    the config class's field, ``num_experts`` (Qwen3-MoE, Qwen2-MoE) or ``num_local_experts`` (Mixtral); the
    other spelling (``attribute_map``) was moved onto it by the reader (``Family.aliases``)."""
    key = "num_experts" if "num_experts" in c else "num_local_experts"
    n, top_k = c[key], c["num_experts_per_tok"]
    for name, value in ((key, n), ("num_experts_per_tok", top_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{family}: {name} must be a positive int, got {value!r:.40}")
    if n < 2 or top_k > n:
        raise ConfigError(f"{family}: num_experts_per_tok={top_k} of {key}={n} is not a mixture of experts "
                          "memlab models (it needs 2 or more experts and top_k <= experts)")
    return n, top_k


def refuse_router_logits(c: dict[str, Any], family: str) -> None:
    """The router-logits auxiliary loss of a mixture is refused (one line)."""
    if c["output_router_logits"]:
        raise ConfigError(f"{family}: output_router_logits=True (the load-balancing auxiliary loss over every "
                          "layer's router logits) is not modelled; set it false")
