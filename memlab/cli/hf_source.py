"""``--hf PATH``: a Hugging Face config for ``estimate``, ``trace``, ``measure`` and ``shard``, read offline.

PATH is any spelling of :func:`memlab.predict.families.resolve` but ``ref:``: a ``config.json``, a folder holding
one, the name of a published config memlab ships (``hf:NAME`` or ``NAME``: ``--hf llama-2-7b``), or a model id
(``org/name``) whose ``config.json`` is in the local Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``,
else ``~/.cache/huggingface/hub``; read from the file system, never the network). Anything else is one clear error:
memlab never downloads. :func:`model_info` is what ``--json`` says about the model: its family, the traits its
modelling code implies, how the step calls it, and which source of truth gave the numbers (the formula, or the trace
of the real modelling code).
"""

from __future__ import annotations

import argparse
from typing import Any

from memlab.errors import ConfigError, MemlabError

HF_CALL = ("transformers AutoModelForCausalLM.from_config(config) in the setup's dtype; loss = model(input_ids=ids, "
           "labels=ids).loss (transformers shifts the labels inside: loss_utils.py ForCausalLMLoss)")
"""How memlab's step calls a Hugging Face model (memlab.model.loss, memlab.tracing.hf, memlab.run.hf)."""
HF_GENERATE = ("transformers AutoModelForCausalLM.from_config(config) in the weights' dtype; model.generate(ids): "
               "a prefill (logits of Setup.logits_to_keep positions), then decode steps with the Setup.kv_cache cache")
"""How an inference estimate takes a Hugging Face model to be served (memlab.predict.memory.inference)."""
REFERENCE_CALL = "memlab.model.gpt.GPT (the reference GPT) through memlab.model.step.train_step"
"""How memlab's step calls the reference GPT (presets with the ref: prefix, explicit dimensions)."""


def published_presets() -> tuple[str, ...]:
    """The preset names memlab ships a published config of (``--preset NAME`` is then that published model)."""
    from memlab.predict.families.resolver import config_names
    from memlab.predict.spec.model import preset_names

    return tuple(n for n in preset_names() if n in config_names("full"))


def is_published(model: Any) -> bool:
    """Whether ``model`` is a Hugging Face family's config (from :func:`memlab.predict.families.reader.from_hf`), not
    the reference GPT."""
    impl = getattr(model, "impl", None)
    return impl is not None and impl.family != "reference"


def model_label(model: Any) -> str:
    """Which model the numbers are of, in words, for every output: ``NAME (published config, family F)``,
    ``reference GPT with NAME's sizes (ref:NAME)``, ``NAME (reference GPT; memlab ships no published config of that
    name)``, or the reference GPT with explicit dimensions."""
    from memlab.predict.families.resolver import shipped
    from memlab.predict.spec.model import PRESETS

    name = getattr(model, "name", None)
    if not isinstance(name, str):
        return "a bare parameter count (model states only)"
    if is_published(model):
        where = "published config" if shipped(name) is not None else "Hugging Face config"
        return f"{name} ({where}, family {model.impl.family})"
    if shipped(name) is not None:
        return f"reference GPT with {name}'s sizes (ref:{name})"
    if name in PRESETS:
        return f"{name} (reference GPT; memlab ships no published config of that name)"
    return f"reference GPT with explicit dimensions ({name})"


def published_twin(model: Any, setup: Any, overheads: Any) -> dict[str, Any] | None:
    """For a preset named after a published model whose config memlab ships: that model as its published code
    runs it (:func:`memlab.predict.families.reader.from_hf` of the shipped config) under the same setup, as ``{"hf":
    name,
    "peak": bytes, "activations": bytes, "param_count": n}``; None for any other model."""
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf
    from memlab.predict.families.resolver import shipped

    name = getattr(model, "name", None)
    impl = getattr(model, "impl", None)
    path = shipped(name) if isinstance(name, str) and impl is not None and impl.family == "reference" else None
    if path is None:
        return None
    bd = estimate(from_hf(path), setup, overheads=overheads)
    return {"hf": name, "peak": bd.peak_bytes, "activations": bd.activations_bytes, "param_count": bd.param_count}


def hf_path(text: str) -> str:
    """An argument type: :func:`memlab.predict.families.resolver.locate` (the config.json a spec names) with its
    error as the one-line argparse error."""
    from memlab.predict.families.resolver import locate

    try:
        return locate(text)
    except MemlabError as exc:  # a bad config (ConfigError) or an unknown name (UnknownNameError)
        raise argparse.ArgumentTypeError(str(exc)) from None


def model_info(model: Any, *, source: str, config: dict[str, Any] | None = None,
               refused: str | None = None, task: str = "causal-lm", mode: str = "train") -> dict[str, Any]:
    """What ``--json`` says about the model: ``family``, ``traits`` (``impl.differs()``; None when the formula
    does not cover the model), ``calling_convention`` (a ``task`` head's auto class, labels and loss:
    :data:`memlab.model.tasks.TASKS`; ``mode`` inference: ``generate()``), ``source_of_truth`` (``formula`` or
    ``trace``) and, when the formula refused the config, ``formula_refused`` (its one-line reason); ``model_label``
    is :func:`model_label`."""
    impl = getattr(model, "impl", None)
    hf = config is not None or (impl is not None and impl.family != "reference")
    family = (config or {}).get("model_type") or (impl.family if impl is not None else None)
    call = (HF_GENERATE if mode == "inference" else HF_CALL) if hf else REFERENCE_CALL
    if task not in ("auto", "causal-lm"):
        from memlab.model.tasks import TASKS

        row = TASKS[task]
        call = f"transformers {row.auto}.from_config(config) in the setup's dtype; {row.labels}; loss: {row.loss}"
    out = {"family": family if hf else "reference", "traits": impl.differs() if impl is not None else None,
           "calling_convention": call, "source_of_truth": source,
           "model_label": model_label(model) if model is not None else f"{family} (Hugging Face config)"}
    if refused is not None:
        out["formula_refused"] = refused
    return out


def with_task(setup: Any, raw: dict[str, Any] | None) -> Any:
    """``setup`` with ``task='auto'`` resolved for a Hugging Face config whose ``architectures`` name a head other
    than the causal LM's (``BertForSequenceClassification``): the formula then refuses it by name and the trace
    answers it (:func:`memlab.model.tasks.resolve_task`); any other setup as it is."""
    if raw is None or setup.task != "auto" or not isinstance(raw.get("architectures"), list):
        return setup
    from types import SimpleNamespace

    from memlab.model.tasks import resolve_task

    try:  # the type and its architectures are all it reads: no config is built
        task = resolve_task(SimpleNamespace(model_type=raw.get("model_type"), architectures=raw["architectures"]))
    except ConfigError:  # a type with no causal LM and no head named: the trace says so, with the tasks it has
        return setup
    return setup if task == "causal-lm" else setup.with_(task=task)
