"""The task heads transformers builds a config with: which auto class, which labels, which loss (issue 34, point 5).

One row of :data:`TASKS` per task memlab traces: the ``AutoModelFor...`` class, the name of its model-type mapping in
``transformers.models.auto.modeling_auto`` (which types have the head), and the labels the head's ``forward`` takes
with the loss transformers computes from them. :func:`resolve_task` turns ``Setup.task`` (``auto`` included) and a
config into one task; :func:`task_labels` makes the labels of a batch. Sources: transformers 5.x
``models/auto/modeling_auto.py`` (the mappings), ``loss/loss_utils.py`` (ForCausalLMLoss, ForMaskedLMLoss,
ForSequenceClassificationLoss, ForTokenClassification, ForQuestionAnsweringLoss) and each head's ``forward``
(``modeling_bert.py``: BertForSequenceClassification picks its ``problem_type`` from ``num_labels`` and the labels'
dtype).

``transformers`` and ``torch`` are imported when a function runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memlab.errors import ConfigError


@dataclass(frozen=True)
class Task:
    """One task head: ``auto`` (the transformers auto class), ``mapping`` (its model-type -> class-name table in
    ``modeling_auto``), ``labels`` and ``loss`` (what the head takes and computes, in words, for the notes)."""

    auto: str
    mapping: str
    labels: str
    loss: str


TASKS: dict[str, Task] = {
    "causal-lm": Task("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                      "labels = the token ids (batch, seq) int64, shifted inside",
                      "cross-entropy over the vocabulary at every position but the last (ForCausalLMLoss)"),
    "masked-lm": Task("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
                      "labels (batch, seq) int64 token ids at every position (a collator's -100 on unmasked "
                      "positions leaves the same tensors: the logits and their log-softmax cover every position)",
                      "cross-entropy over the vocabulary (ForMaskedLMLoss)"),
    "sequence-classification": Task("AutoModelForSequenceClassification",
                                    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
                                    "labels (batch,) int64 in [0, num_labels); float (batch,) when num_labels is 1 "
                                    "(regression); float (batch, num_labels) for multi_label_classification",
                                    "cross-entropy, MSE or BCE-with-logits by problem_type "
                                    "(ForSequenceClassificationLoss)"),
    "token-classification": Task("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
                                 "labels (batch, seq) int64 in [0, num_labels)",
                                 "cross-entropy over num_labels at every position (ForTokenClassification)"),
    "question-answering": Task("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
                               "start_positions and end_positions (batch,) int64 in [0, seq)",
                               "the mean of the start and end cross-entropies over seq (ForQuestionAnsweringLoss)"),
}
"""The tasks memlab traces, by ``Setup.task`` name (``auto`` resolves to one of them: :func:`resolve_task`)."""


def _classes(task: str, model_type: str) -> tuple[str, ...]:
    """The class names transformers maps ``model_type`` to for ``task`` (empty when the type has no such head)."""
    from transformers.models.auto import modeling_auto

    names = getattr(modeling_auto, TASKS[task].mapping).get(model_type, ())
    return (names,) if isinstance(names, str) else tuple(names)


def tasks_of(model_type: str) -> tuple[str, ...]:
    """The tasks of :data:`TASKS` that transformers builds ``model_type`` for, in table order."""
    return tuple(t for t in TASKS if _classes(t, model_type))


def resolve_task(config: Any, task: str = "auto") -> str:
    """The task a trace of ``config`` (a transformers config) builds: ``task`` when the type has that head;
    for ``auto`` the head the config's ``architectures`` names (``BertForSequenceClassification``), else the causal
    LM where the type has one. A type without the head asked for (or, under ``auto``, without a causal LM and no
    head named) raises :class:`ConfigError` listing the tasks it has."""
    kind = str(getattr(config, "model_type", ""))
    have = tasks_of(kind)
    if task == "auto":
        named = [t for arch in (getattr(config, "architectures", None) or ()) for t in have
                 if arch in _classes(t, kind)]
        task = named[0] if named else "causal-lm"
        if task in have:
            return task
        why = "its architectures name no head of these" if getattr(config, "architectures", None) else \
            "it names no architectures"
        raise ConfigError(f"model_type {kind!r:.60} has no causal LM in transformers and {why}: pick its task with "
                          f"--task (Setup.task): {', '.join(have) or 'none memlab traces'}")
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r:.60}: use one of auto, {', '.join(TASKS)}")
    if task not in have:
        raise ConfigError(f"model_type {kind!r:.60} has no {task} head in transformers ({TASKS[task].auto}): "
                          f"its tasks are {', '.join(have) or 'none memlab traces'}")
    return task


def task_labels(config: Any, task: str, ids: Any) -> dict[str, Any]:
    """The label tensors ``model(input_ids=ids, **labels)`` takes for ``task`` (a resolved one), made like ``ids``
    (random values: only their shapes and dtypes matter to memory): :attr:`Task.labels` says which."""
    import torch

    batch, seq = ids.shape
    n = int(getattr(config, "num_labels", 2))
    if task in ("causal-lm", "masked-lm"):
        return {"labels": ids}
    if task == "token-classification":
        return {"labels": torch.randint(0, n, (batch, seq))}
    if task == "question-answering":
        return {"start_positions": torch.randint(0, seq, (batch,)), "end_positions": torch.randint(0, seq, (batch,))}
    kind = getattr(config, "problem_type", None) or ("regression" if n == 1 else "single_label_classification")
    if kind == "regression":
        return {"labels": torch.randn(batch) if n == 1 else torch.randn(batch, n)}
    if kind == "multi_label_classification":
        return {"labels": torch.randint(0, 2, (batch, n)).float()}
    return {"labels": torch.randint(0, n, (batch,))}
