"""Hugging Face causal LMs built from configs, never downloaded: :func:`hf_config` and :func:`build_hf_model`.

:func:`hf_config` is the one way memlab turns what a user holds (a ``config.json`` path or its folder, a dict with its
``model_type``, a ``PretrainedConfig``, or a model type name with dimensions) into a ``transformers`` config;
:func:`build_hf_model` is ``AutoModelForCausalLM.from_config`` in a dtype and attention implementation. The trace
(:mod:`memlab.tracing.hf`) and the measured runs (:mod:`memlab.run.hf`) both build through here.
:func:`memlab.predict.families.reader.from_hf` is the torch-free reader the estimator uses. :func:`call_inputs` makes a
call convention's labels and mask (no mask, all ones, a padded batch: :func:`pad_counts`), for both as well.

``transformers`` is imported when a function runs, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memlab.errors import ConfigError, MemlabError, SetupError, unknown_name
from memlab.predict.families.reader import read_config_json
from memlab.predict.spec.setup import LORA_KINDS, is_target_regex
from memlab.predict.spec.validate import check_int

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""Dtypes a Hugging Face model is built in here (memlab name -> torch dtype)."""


def import_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - a course dependency
        raise SetupError(f"tracing a Hugging Face model needs transformers: pip install transformers ({exc})") from None
    return transformers


def hf_config(source: Any, *, task: str = "causal-lm", **dims: Any) -> Any:
    """A ``transformers`` config, of a type with the head ``task`` (:mod:`memlab.model.tasks`; ``auto``: the head
    its ``architectures`` name, else the causal LM), from what a user holds: a config object (returned as is, or
    copied with ``dims``), a dict with its ``model_type`` (a parsed ``config.json``), a ``config.json`` path (or its
    folder, read by :func:`memlab.predict.families.reader.read_config_json`: regular files only, size-capped, strict
    UTF-8 JSON), or a model type name (``gpt2``, ``llama``, ``mistral``, ``qwen2``, ...); ``dims`` override or add
    keys. Nothing is downloaded. Keys starting with ``_`` (memlab's notes, transformers' bookkeeping) and
    ``transformers_version`` are dropped (``architectures`` is kept: it names the head ``task='auto'`` builds). A bad
    path or file, an unknown type, a type without the head (t5 has no causal LM), a config transformers refuses, a
    size that is not a positive int, or heads that do not divide the width raise :class:`~memlab.errors.ConfigError`
    (an unknown type :class:`~memlab.errors.UnknownNameError`) in one line; transformers' config warnings are
    silenced."""
    tf = import_transformers()
    if not isinstance(source, str | os.PathLike | dict) and not (hasattr(source, "to_dict")
                                                                   and hasattr(source, "model_type")):
        raise ConfigError(f"hf_config needs a config.json path, a dict with model_type, a transformers config or a "
                          f"model type name, got {type(source).__name__}")
    with quiet_transformers():
        if not isinstance(source, str | os.PathLike | dict):
            cfg = _built(lambda: source.__class__.from_dict({**source.to_dict(), **dims}) if dims else source,
                         type(source).__name__)
        elif isinstance(source, dict):
            cfg = _from_dict(tf, dict(source), dims, "an HF config dict")
        elif _is_config_path(Path(source)):
            cfg = _from_dict(tf, read_config_json(source), dims, str(source))
        else:
            cfg = _for_type(tf, str(source), dims)
    return _checked(cfg, task)


def _is_config_path(path: Path) -> bool:
    """A path (a ``.json`` name, or anything that exists) rather than a model type name like ``llama``."""
    try:
        return path.suffix == ".json" or os.path.lexists(path)
    except (OSError, ValueError):  # a name too long, a NUL byte: read_config_json says what is wrong
        return True


def _for_type(tf: Any, kind: str, dims: dict[str, Any], where: str = "") -> Any:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if kind not in CONFIG_MAPPING:
        raise unknown_name("Hugging Face model type", kind[:100], list(CONFIG_MAPPING.keys()))
    return _built(lambda: tf.AutoConfig.for_model(kind, **dims), f"{where} ({kind})" if where else f"a {kind} config")


def _from_dict(tf: Any, data: dict[str, Any], dims: dict[str, Any], where: str) -> Any:
    kind = data.pop("model_type", None)
    if not kind:
        raise ConfigError(f"{where} has no 'model_type' (gpt2, llama, ...): is it a Hugging Face config.json?")
    if not isinstance(kind, str):
        raise ConfigError(f"{where}: model_type must be a string (gpt2, llama, ...), got {type(kind).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{where}: config keys must be strings, got {bad[0]!r:.60}")
    keys = {k: v for k, v in {**data, **dims}.items()
            if not k.startswith("_") and k != "transformers_version"}
    return _for_type(tf, kind, keys, where)


def _built(make: Callable[[], Any], what: str) -> Any:
    """``make()``, with whatever transformers raises for a config it refuses (its strict dataclass checks, a
    ``TypeError`` for a list where a dict belongs, ...) as one :class:`ConfigError` line."""
    try:
        return make()
    except MemlabError:
        raise
    except RecursionError:
        raise ConfigError(f"{what} nests too deep for transformers to read") from None
    except Exception as exc:  # the boundary with transformers' many config checks
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        text = " ".join(str(cause).split())[:300]
        raise ConfigError(f"transformers refuses {what}: {type(cause).__name__}: {text}") from None


def _tasks(kind: Any) -> tuple[str, ...]:
    from memlab.model.tasks import tasks_of

    return tasks_of(str(kind))


_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "head_dim", "vocab_size", "max_position_embeddings")
"""Config attributes that, when a config has them and sets them, must be positive ints (``attribute_map`` reads
GPT-2's ``n_embd`` as ``hidden_size``)."""


def _checked(cfg: Any, task: str = "causal-lm") -> Any:
    """``cfg`` when it describes a model memlab can build: its type has the ``task`` head
    (:func:`memlab.model.tasks.resolve_task`; a causal LM by default), its sizes (:data:`_SIZES`) are positive ints
    and its heads divide the width (unless it gives ``head_dim``)."""
    from memlab.model.tasks import resolve_task

    kind = getattr(cfg, "model_type", None)
    if task == "causal-lm" and "causal-lm" not in _tasks(kind):
        raise ConfigError(f"model_type {kind!r:.60} has no causal LM in transformers (AutoModelForCausalLM): memlab "
                          "builds decoder-only language models (gpt2, llama, mistral, qwen2, ...) and traces other "
                          f"heads with a task (its tasks: {', '.join(_tasks(kind)) or 'none'})")
    resolve_task(cfg, task)
    sizes = {}
    for key in _SIZES:
        try:
            value = getattr(cfg, key, None)
        except Exception:  # a property that cannot compute from a broken config
            value = None
        if value is not None:
            sizes[key] = check_int(key, value, owner=str(kind), err=ConfigError)
    width, heads, kv = (sizes.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads"))
    if width and heads and "head_dim" not in sizes and width % heads:
        raise ConfigError(f"the {kind} config's num_attention_heads={heads} must divide hidden_size={width} (or give "
                          "head_dim)")
    if heads and kv and heads % kv:
        raise ConfigError(f"the {kind} config's num_key_value_heads={kv} must divide num_attention_heads={heads}")
    return cfg


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' logging at error level while building configs and models (its config-validation warnings
    about tiny vocabularies and loss types would precede memlab's own one-line answer)."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def attention_implementations(config: Any) -> tuple[str, ...]:
    """The ``attn_implementation`` values memlab runs that transformers builds this config's causal LM with:
    ``eager`` always, ``sdpa`` where the model class sets ``_supports_sdpa`` (Gemma 2 does not in transformers 5.x:
    modeling_gemma2.py)."""
    from transformers import AutoModelForCausalLM

    with quiet_transformers():
        cfg = hf_config(config)
    cls = AutoModelForCausalLM._model_mapping.get(type(cfg), None)
    return ("eager", "sdpa") if cls is None or getattr(cls, "_supports_sdpa", False) else ("eager",)


def build_hf_model(config: Any, *, attn_implementation: str = "eager", dtype: str = "fp32",
                   device: str | torch.device = "cpu", seed: int = 0,
                   gradient_checkpointing: bool = False, reentrant: bool = False) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_config`` in ``dtype`` with ``attn_implementation`` (eager or sdpa), in train mode;
    ``gradient_checkpointing`` calls the model's ``activation_checkpointing_enable()`` (memlab's recompute "full";
    ``gradient_checkpointing_enable`` before transformers 5), non-reentrant as transformers defaults, or with
    ``reentrant`` torch's reentrant checkpoint, what peft's ``prepare_model_for_kbit_training`` leaves
    (``Setup.checkpoint_reentrant``)."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise SetupError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch.manual_seed(seed)
    with quiet_transformers():  # config validation warnings about tiny vocabularies, once per build
        cfg = hf_config(config)
        if attn_implementation == "sdpa" and "sdpa" not in attention_implementations(cfg):
            raise SetupError(f"transformers builds {cfg.model_type} without SDPA attention (its model class does not "
                             "support it): use attn_implementation='eager'")
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation, dtype=DTYPES[dtype])
    if reentrant and not gradient_checkpointing:
        raise SetupError("reentrant chooses torch's reentrant checkpoint: it goes with gradient_checkpointing=True")
    if gradient_checkpointing:
        enable_checkpointing(model, reentrant=reentrant)
    return model.to(device).train()


def enable_checkpointing(model: torch.nn.Module, *, reentrant: bool = False, context_fn: Any = None) -> None:
    """transformers' per-layer gradient checkpointing on ``model`` (``activation_checkpointing_enable``, transformers
    5's name; ``gradient_checkpointing_enable`` before it), with ``use_reentrant`` given explicitly: False is the
    library's own default (modeling_utils.py, kwargs None), True torch's default when no ``use_reentrant`` reaches
    it, which peft's ``prepare_model_for_kbit_training`` leaves (its ``{}`` kwargs; ``Setup.checkpoint_reentrant``).
    ``context_fn`` (non-reentrant only): a selective policy's contexts (torchtitan's per-op policy)."""
    kwargs: dict[str, Any] = {"use_reentrant": bool(reentrant)}
    if context_fn is not None:
        if reentrant:
            raise SetupError("a selective checkpoint policy (context_fn) runs under the non-reentrant checkpoint only")
        kwargs["context_fn"] = context_fn
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def checkpoint_every(model: torch.nn.Module, every: int) -> int:
    """Keep transformers' gradient checkpointing (already enabled on ``model``) on every ``every``-th layer only:
    each ``GradientCheckpointingLayer`` carries its own ``gradient_checkpointing`` flag, which
    ``set_gradient_checkpointing`` sets on all of them [hf-transformers: modeling_layers.py]; this turns it off on the
    layers ``i`` (from 0, in module order) where ``(i + 1) % every != 0``, torchtitan's layer policy
    (:func:`memlab.predict.spec.setup.checkpointed_blocks`). Returns how many layers stay checkpointed."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from memlab.predict.spec.setup import checkpointed_blocks

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    kept = set(checkpointed_blocks(len(layers), every))
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = layer.gradient_checkpointing and i in kept
    return sum(layer.gradient_checkpointing for layer in layers)


LORA_MODULE_NAMES: dict[str, dict[str, str]] = {
    "gpt2": {"qkv": "c_attn", "o": "attn.c_proj", "up": "c_fc", "down": "mlp.c_proj"},
    "phi": {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "dense", "up": "fc1", "down": "fc2"},
    "opt": {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "up": "fc1", "down": "fc2"},
    "gptj": {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "up": "fc_in", "down": "fc_out"},
    "starcoder2": {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "up": "c_fc", "down": "c_proj"},
    # fused q, k, v: any of them names the one projection, as peft's default targets do (peft/utils/constants.py
    # TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: gpt_neox and falcon ["query_key_value"])
    "phi3": {"qkv": "qkv_proj", "o": "o_proj", "gate": "gate_up_proj", "up": "gate_up_proj", "down": "down_proj"},
    "gpt_neox": {"qkv": "query_key_value", "o": "attention.dense", "up": "dense_h_to_4h", "down": "dense_4h_to_h"},
    "falcon": {"qkv": "query_key_value", "o": "self_attention.dense", "up": "dense_h_to_4h",
               "down": "dense_4h_to_h"},
}
"""peft ``target_modules`` names (module-name suffixes) of memlab's adapter kinds, where a family's differ from the
Llama-style ``q_proj ... down_proj`` (Llama, Mistral, Qwen2, Gemma, ...): GPT-2 fuses q, k, v into ``c_attn``."""
_LLAMA_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
                "down": "down_proj"}


def lora_target_modules(model_type: str, kinds: tuple[str, ...]) -> list[str]:
    """peft ``target_modules`` for memlab adapter ``kinds`` on a ``model_type`` model (:data:`LORA_MODULE_NAMES`);
    on GPT-2 any of q, k, v names the fused ``c_attn``. A kind the family lacks raises :class:`SetupError`."""
    names = _target_names(model_type)  # the embedding: peft's Embedding LoRA
    out: list[str] = []
    for kind in kinds:
        if kind == "gate" and set(kinds) == set(LORA_KINDS) and "gate" not in names:
            continue  # all-linear: the Linears the model has
        key = "qkv" if ("qkv" in names and kind in ("q", "k", "v")) else kind
        if key not in names:
            have = sorted((set(names) - {"qkv", "embed", "head"}) | ({"q", "k", "v"} if "qkv" in names else set()))
            raise SetupError(f"lora_targets names {kind!r}, which a {model_type} model does not have: use "
                             f"{', '.join(have)}")
        if names[key] not in out:
            out.append(names[key])
    return out


def _target_names(model_type: str) -> dict[str, str]:
    """The peft name (a module-name suffix) of each kind memlab models on a ``model_type`` model
    (:data:`LORA_MODULE_NAMES`, the Llama-style names otherwise), the embedding and the head included."""
    return {**LORA_MODULE_NAMES.get(model_type, _LLAMA_NAMES),
            "embed": "wte" if model_type == "gpt2" else "embed_tokens", "head": "lm_head"}


@dataclass(frozen=True)
class RegexReading:
    """What a ``lora_targets`` regex selects on one model, as peft matches it (:func:`read_lora_regex`): the module
    ``names`` (peft's keys, e.g. ``model.layers.0.self_attn.q_proj``), and ``kinds``, the comma list of memlab kinds
    the formula reads when the regex selects whole kinds in every block ('' when it does not: some blocks only, or
    modules memlab has no kind for), and ``why``, the reading in one line."""

    regex: str
    names: tuple[str, ...]
    kinds: str
    why: str


def _kind_of(name: str, names: dict[str, str]) -> str | None:
    """The memlab kind of a module name by peft's list rule (the name or a ``.suffix``), ``qkv`` for GPT-2's fused
    projection, None for a module memlab has no kind for."""
    return next((k for k, suffix in names.items() if name == suffix or name.endswith("." + suffix)), None)


def _peft_adaptable() -> tuple[type, ...]:
    """The module types peft's LoRA adapts (peft 0.21.2 tuners/lora/model.py ``_create_new_module``'s error lists
    them)."""
    from transformers.pytorch_utils import Conv1D

    nn = torch.nn
    return (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, Conv1D, nn.MultiheadAttention)


def read_lora_regex(config: Any, regex: str) -> RegexReading:
    """The modules of ``config``'s causal LM (built on the meta device: names only, no bytes) that peft adapts for
    the string ``LoraConfig(target_modules=regex)``: every non-root module whose full name ``re.fullmatch``-es it
    (peft 0.21.2 tuners_utils.py ``inject_adapter`` skips the root's empty key; ``check_target_module_exists`` ->
    ``match_target_against_key``). Where they are whole kinds of :data:`LORA_KINDS` in every block (or the
    embedding, the head), ``kinds`` is their comma list, which the formula models; otherwise ''. A regex that
    matches nothing is peft's own error, one :class:`SetupError` line."""
    import re

    from transformers import AutoModelForCausalLM

    with quiet_transformers():
        cfg = hf_config(config)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    matched = tuple(n for n, _ in model.named_modules() if n and re.fullmatch(regex, n))
    if not matched:
        example = next((n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)), "")
        raise SetupError(f"lora_targets: Target modules {regex} not found in the base model. Please check the target "
                         "modules and try again. (peft's NoMatchingPeftModuleError: peft matches a string with "
                         f"re.fullmatch against full names such as {example})")
    modules = dict(model.named_modules())
    odd = next((n for n in matched if not isinstance(modules[n], _peft_adaptable())), None)
    if odd is not None:  # peft's LoraModel._create_new_module refuses it, after matching
        raise SetupError(f"lora_targets {regex!r} matches {odd}: peft: Target module {modules[odd]} is not "
                         "supported. Currently, only the following modules are supported: `torch.nn.Linear`, "
                         "`torch.nn.Embedding`, `torch.nn.Conv1d`, `torch.nn.Conv2d`, `torch.nn.Conv3d`, "
                         "`transformers.pytorch_utils.Conv1D`, `torch.nn.MultiheadAttention.`: narrow the regex to "
                         "Linear layers")
    names = _target_names(cfg.model_type)
    found: dict[str, list[str]] = {}  # kind -> the block index of each module of that kind ('' outside the blocks)
    for name in matched:
        index = next((p for p in name.split(".") if p.isdigit()), "")
        found.setdefault(_kind_of(name, names) or "?", []).append(index)
    every = [str(i) for i in range(int(cfg.num_hidden_layers))]
    whole = "?" not in found and all(  # each block's module of a kind once (not an expert's, not some blocks')
        sorted(idx, key=lambda i: int(i or -1)) == ([""] if k in ("embed", "head") else every)
        for k, idx in found.items())
    kinds = ",".join(("q,k,v" if k == "qkv" else k) for k in names if k in found) if whole else ""
    outer = " (the embedding or the head: itself)" if {"embed", "head"} & set(found) else ""
    reading = (f"selects whole kinds, one module of each in every block{outer}: the formula reads it as "
               f"lora_targets='{kinds}'" if whole else f"selects {len(matched)} module(s) ({matched[0]}, ...) "
               "that are not whole kinds in every block: the formula does not model it, the trace passes it to peft")
    return RegexReading(regex, matched, kinds,
                        f"lora_targets '{regex}' is a regex (peft's re.fullmatch on each module's name): it {reading}")


def apply_lora(model: torch.nn.Module, setup: Any, seed: int = 0) -> torch.nn.Module:
    """``peft.get_peft_model(model, LoraConfig(...))`` for ``setup`` (``finetune`` lora or qlora): rank
    ``setup.lora_r``, dropout ``setup.lora_dropout`` on the modules ``setup.lora_target_kinds`` names, peft's other
    defaults (alpha 8, fp32 adapters over a 16-bit base). The base is frozen by peft; the returned model trains only
    the adapters. ``qlora`` first quantises the base's block Linears to NF4 (:func:`quantize_nf4`);
    ``setup.kbit_prepare`` then passes the base through peft's ``prepare_model_for_kbit_training`` (every 16-bit
    parameter but the 4-bit weights cast to fp32), as QLoRA scripts do for a 4-bit model. ``setup.lora_dtype='bf16'``
    casts the trainable parameters to bf16 after, as TRL's SFTTrainer does for a k-bit model."""
    if setup.finetune not in ("lora", "qlora"):
        raise SetupError(f"apply_lora builds finetune='lora' or 'qlora' models, got finetune={setup.finetune!r}")
    try:
        with quiet_bitsandbytes():  # peft imports bitsandbytes when it is installed
            import peft
    except ImportError as exc:  # pragma: no cover - a course dependency
        raise SetupError(f"LoRA runs need peft: pip install peft ({exc})") from None
    kind = model.config.model_type
    # a regex is peft's string target_modules (re.fullmatch on full names), passed as is
    targets = setup.lora_targets if is_target_regex(setup.lora_targets) else \
        lora_target_modules(kind, setup.lora_target_kinds)
    if setup.finetune == "qlora":  # bnb_4bit_compute_dtype: the policy's (bf16; fp16 under amp-fp16, for T4s);
        # FSDP recipes store the packed weight as bf16 (quant_storage_of)
        model = quantize_nf4(model, compute_dtype=DTYPES[setup.policy.compute_dtype],
                             quant_storage=quant_storage_of(setup))
    if setup.kbit_prepare:  # the fp32 casts only: checkpointing is the setup's recompute, enabled by the caller
        # (reentrant, as prepare_model_for_kbit_training enables it, with Setup.checkpoint_reentrant)
        # peft skips a 4-bit weight by its class name (Params4bit); memlab's fake one is a plain Parameter, which a
        # bf16 quant_storage would expose to the cast: its packed data is put back (model_fn runs before tracking)
        packed = {p: p.data for p in model.parameters() if getattr(p, "quant_state", None) is not None}
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        for param, data in packed.items():
            param.data = data
    torch.manual_seed(seed)
    names = {"head": "lm_head", "embed": "wte" if kind == "gpt2" else "embed_tokens"}
    save = [names[k] for k in setup.lora_save_kinds] or None
    cfg = peft.LoraConfig(r=setup.lora_r, lora_dropout=setup.lora_dropout, target_modules=targets,
                          modules_to_save=save, fan_in_fan_out=kind == "gpt2")  # GPT-2's Conv1D: transposed weights
    with warnings.catch_warnings():  # peft reads the deprecated is_gradient_checkpointing (transformers 5 warns)
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        try:
            model = peft.get_peft_model(model, cfg)
        except ValueError as exc:  # a regex peft finds nothing for, or a module it cannot adapt: its words, one line
            if not isinstance(targets, str):
                raise
            raise SetupError(f"lora_targets {targets!r}: peft: {' '.join(str(exc).split())[:300]}") from None
    if setup.lora_dtype == "bf16":  # as TRL's SFTTrainer casts a k-bit model's trainable parameters
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
    return model


@contextlib.contextmanager
def quiet_logger(name: str, level: int) -> Iterator[None]:
    """The Python logger ``name`` at ``level`` (e.g. ``logging.ERROR``) inside the block, its own level after."""
    import logging

    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def quiet_bitsandbytes() -> contextlib.AbstractContextManager[None]:
    """bitsandbytes' CPU backend at error level while it is imported: on an AVX512-BF16 CPU its import tries an
    optional kernel from the network (the ``kernels`` package) and logs a warning when it cannot; its own CPU
    kernels run instead, and memlab downloads nothing."""
    import logging

    return quiet_logger("bitsandbytes.backends.cpu.ops", logging.ERROR)


def apply_frozen(model: torch.nn.Module, setup: Any) -> torch.nn.Module:
    """Freeze the input embeddings and the bottom ``setup.frozen_layers`` blocks of a transformers causal LM
    (``requires_grad_(False)``; ``finetune='frozen'``): the rest trains in full. Returns ``model``."""
    if setup.finetune != "frozen":
        raise SetupError(f"apply_frozen builds finetune='frozen' models, got finetune={setup.finetune!r}")
    blocks = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), None)
    if blocks is None or setup.frozen_layers >= len(blocks):
        raise SetupError(f"frozen_layers={setup.frozen_layers} must leave at least one of the model's blocks to train")
    model.get_input_embeddings().requires_grad_(False)
    for block in list(blocks)[: setup.frozen_layers]:
        block.requires_grad_(False)
    return model


def apply_finetune(model: torch.nn.Module, setup: Any, seed: int = 0) -> torch.nn.Module:
    """``model`` made ready for ``setup.finetune``: unchanged for full, :func:`apply_frozen` for frozen,
    :func:`apply_lora` for lora and qlora (the one entry the trace and the measured runs use)."""
    if setup.finetune == "full":
        return model
    if setup.finetune == "frozen":
        return apply_frozen(model, setup)
    return apply_lora(model, setup, seed=seed)


def quant_storage_of(setup: Any) -> torch.dtype:
    """The dtype bitsandbytes stores a packed 4-bit weight in under ``setup``: ``torch.uint8`` (its default) on one
    process, ``torch.bfloat16`` when FSDP shards it (``world_size`` > 1), as the FSDP-QLoRA recipe sets
    ``BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16)`` so that FSDP flattens and shards the packed weight
    with the bf16 parameters [answerai2024]. The bytes are the same (two 4-bit values per byte: ``numel / 4`` bf16
    elements of shape ``(numel / 4, 1)``); only the dtype FSDP sees changes."""
    return torch.bfloat16 if setup.world_size > 1 else torch.uint8


def quantize_nf4(model: torch.nn.Module, compute_dtype: torch.dtype = torch.bfloat16,
                 quant_storage: torch.dtype = torch.uint8) -> torch.nn.Module:
    """``model`` with every ``nn.Linear`` but the LM head replaced by bitsandbytes' ``Linear4bit``: NF4
    weights with double quantisation, ``compute_dtype`` compute (bf16: QLoRA's setting [dettmers2023]; fp16 on cards
    without bf16, a T4; what transformers' ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=...)`` loads).
    The weights are quantised where they are (bitsandbytes 0.45+ quantises on the CPU too; fake weights, under a
    FakeTensorMode, through bitsandbytes' fake kernels: :func:`fake_params4bit`). Families whose blocks
    use GPT-2's ``Conv1D`` are refused (SetupError). ``quant_storage``: the packed weight's dtype
    (:func:`quant_storage_of`). The real weights are made with ``module=`` their ``Linear4bit``, as bitsandbytes'
    own constructor makes them, so the module keeps the ``quant_state`` its forward restores when FSDP has replaced
    the weight (``fix_4bit_weight_quant_state_from_module``)."""
    try:
        with quiet_bitsandbytes():
            import bitsandbytes as bnb
    except ImportError as exc:
        raise SetupError(f"QLoRA runs need bitsandbytes: pip install bitsandbytes ({exc})") from None
    if any(type(m).__name__ == "Conv1D" for m in model.modules()):
        raise SetupError(f"quantize_nf4 replaces nn.Linear layers; {model.config.model_type}'s blocks use Conv1D: "
                         "use a Llama-style family (llama, mistral, qwen2, ...)")
    from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or name == "lm_head":
                continue
            fake = is_fake(child.weight)
            with unset_fake_temporarily() if fake else contextlib.nullcontext():  # a meta shell: no fake Params4bit
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=compute_dtype, quant_type="nf4", compress_statistics=True,
                                      quant_storage=quant_storage, device="meta")
            if fake:
                q.weight = fake_params4bit(bnb, child.weight.data, q, quant_storage)
            else:
                q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4",
                                             compress_statistics=True, quant_storage=quant_storage, module=q)
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data, requires_grad=child.bias.requires_grad)
            setattr(parent, name, q if fake else q.to(child.weight.device))  # (.to() re-wraps a fake weight)
    return model


_FAKE_QMAPS: weakref.WeakKeyDictionary[Any, dict[str, torch.Tensor]] = weakref.WeakKeyDictionary()
"""bitsandbytes' code cache (``functional.name2qmap``) per fake mode: :func:`fake_params4bit`."""


def fake_params4bit(bnb: Any, weight: torch.Tensor, module: torch.nn.Module,
                    quant_storage: torch.dtype = torch.uint8) -> torch.nn.Parameter:
    """The 4-bit weight of ``module`` (a ``Linear4bit``) for a fake 16-bit ``weight`` (FakeTensorMode): bitsandbytes'
    own ``functional.quantize_4bit`` (NF4, blocksize 64, double quantisation, ``quant_storage``) runs on its registered
    fake kernels (``bitsandbytes::quantize_4bit`` and ``quantize_blockwise``), giving the packed weight and a
    QuantState of fake tensors of the real dtypes and sizes. ``Params4bit`` itself cannot wrap a FakeTensor
    (``Tensor._make_subclass`` refuses a tensor that is already a Python subclass), so the packed weight is a frozen
    ``nn.Parameter`` carrying the attributes ``Linear4bit.forward`` and peft read (``quant_state``, ``quant_type``,
    ``blocksize``, ``compress_statistics``, ``quant_storage``, ``bnb_quantized``, ``module``): the same bytes, and the
    same ``bnb.matmul_4bit`` path (``MatMul4Bit``: ``gemm_4bit`` forward, ``dequantize_4bit`` in backward)."""
    fn = bnb.functional
    # bitsandbytes caches its 8-bit dynamic code (name2qmap) as one real tensor shared by every quantised weight;
    # under a fake mode one fake code is made and shared the same way
    # (bitsandbytes builds it from Python floats, .tolist(): it is built for real here and handed to the fake mode)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    mode = weight.fake_mode
    if mode not in _FAKE_QMAPS:
        with unset_fake_temporarily():
            code = fn.create_dynamic_map()
        _FAKE_QMAPS[mode] = {"dynamic": mode.from_tensor(code)}
    cached, fn.name2qmap = fn.name2qmap, _FAKE_QMAPS[mode]
    try:
        packed, state = fn.quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4",
                                         quant_storage=quant_storage)
    finally:
        fn.name2qmap = cached
    param = torch.nn.Parameter(packed, requires_grad=False)
    for key, value in {"quant_state": state, "quant_type": "nf4", "blocksize": 64, "compress_statistics": True,
                       "quant_storage": quant_storage, "bnb_quantized": True, "module": module}.items():
        setattr(param, key, value)
    module.quant_state = state
    return param


def restore_quant_state(model: torch.nn.Module) -> None:
    """Give a fake 4-bit weight its bitsandbytes attributes back when FSDP has swapped it, as bitsandbytes does for
    a real one.

    FSDP2 replaces every parameter with a new ``nn.Parameter``, a sharded DTensor at rest and the all-gathered tensor
    in forward and backward (``FSDPParam._init_sharded_param``, ``init_unsharded_param`` [pytorch-fsdp2-internals]),
    so the ``quant_state`` and the other attributes on the weight are lost; ``Linear4bit.forward`` then calls
    ``fix_4bit_weight_quant_state_from_module``, which wraps the gathered tensor in a ``Params4bit`` (a new Python
    object over the same storage: no bytes) and sets its ``quant_state`` from the module [bitsandbytes]. A fake tensor
    cannot be wrapped in ``Params4bit`` (:func:`fake_params4bit`), so here a forward pre-hook on each 4-bit module sets
    the same attributes on the gathered weight itself before that fix-up runs, and the fix-up finds them: the same
    call, the same bytes (the fake trace equals the step with real tensors over the same fake process group, phase by
    phase: ``tests/tracing/test_trace_hf_qlora_fsdp.py``)."""
    def hook(module: torch.nn.Module, args: Any) -> None:
        weight = module.weight
        if getattr(weight, "quant_state", None) is None:
            for key, value in attrs[module].items():
                setattr(weight, key, value)

    keys = ("quant_state", "quant_type", "blocksize", "compress_statistics", "quant_storage", "bnb_quantized", "module")
    attrs = {m: {k: getattr(m.weight, k) for k in keys} for m in model.modules()
             if getattr(m, "quant_state", None) is not None and hasattr(m, "weight")}
    for module in attrs:
        module.register_forward_pre_hook(hook)


def quant_state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The quantisation constants bitsandbytes keeps beside each 4-bit weight (``weight.quant_state``: absmax, the
    NF4 code, and with double quantisation the nested absmax, its 8-bit code and offset), one per storage. They are
    no parameters or buffers, so a parameter count (or MemTracker's module tracking) misses them. Under FSDP the
    weight is FSDP's own parameter and carries none: the module's ``quant_state`` (which bitsandbytes sets beside
    it) is read then, and every rank holds all of them (FSDP shards parameters only)."""
    seen: set[tuple[str, int]] = set()
    out: list[torch.Tensor] = []
    for module in model.modules():
        qs = getattr(getattr(module, "weight", None), "quant_state", None) or getattr(module, "quant_state", None)
        if qs is None:
            continue
        tensors = [qs.absmax, qs.code]
        if getattr(qs, "nested", False):
            tensors += [qs.state2.absmax, qs.state2.code, qs.offset]
        for t in tensors:
            # a storage's identity (_cdata, its StorageImpl): a fake tensor has no data pointer
            key = (str(t.device), t.untyped_storage()._cdata) if isinstance(t, torch.Tensor) else None
            if key is not None and key not in seen:
                seen.add(key)
                out.append(t)
    return out


def quant_state_bytes(model: torch.nn.Module) -> int:
    """Bytes of :func:`quant_state_tensors`, by unique storage."""
    return sum(t.untyped_storage().nbytes() for t in quant_state_tensors(model))


def pad_counts(batch: int, seq: int, pad_fraction: float) -> list[int]:
    """Padding tokens in each row of a padded ``batch`` x ``seq`` batch:
    ``floor(pad_fraction * batch * seq)`` tokens split as evenly as possible, the first rows one more. A row that
    would be all padding is a :class:`SetupError` (a sequence needs a real token)."""
    n = int(pad_fraction * batch * seq)
    counts = [n // batch + (1 if i < n % batch else 0) for i in range(batch)]
    if max(counts, default=0) >= seq:
        raise SetupError(f"pad_fraction={pad_fraction} pads a whole row of {seq} tokens at batch={batch}: lower it")
    return counts


def call_inputs(input_ids: torch.Tensor, attention_mask: str = "none", pad_fraction: float = 0.0,
                padding_side: str = "right") -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(labels, mask)`` for a call convention (``Setup.attention_mask``): ``none`` passes no mask (labels a copy of
    the ids, as transformers' ``DataCollatorForLanguageModeling(mlm=False)`` makes them and as
    :func:`memlab.tracing.hf.trace_hf`'s batch holds them: the loop holds both through the step), ``ones`` an
    all-ones (batch, seq) int64 mask, ``padded`` a padded batch (:func:`pad_counts`): the mask 0 and the labels -100
    on each row's last (``padding_side='right'``) or first (``'left'``) padding positions."""
    if attention_mask == "none":
        return input_ids.clone(), None
    if padding_side not in ("right", "left"):
        raise SetupError(f"padding_side must be right or left, got {padding_side!r}")
    mask = torch.ones_like(input_ids)
    if attention_mask == "padded":
        b, s = input_ids.shape
        for row, n in enumerate(pad_counts(b, s, pad_fraction)):
            if n:
                (mask[row, s - n:] if padding_side == "right" else mask[row, :n]).fill_(0)
    elif attention_mask != "ones":
        raise SetupError(f"attention_mask must be none, ones or padded, got {attention_mask!r}")
    return input_ids.masked_fill(mask == 0, -100), mask
