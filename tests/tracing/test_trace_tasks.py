"""Issue 34, point 5: encoders (and decoders) with task heads. ``Setup.task`` picks the head transformers builds a
config with (the auto class, the labels its forward takes, the loss it computes): the trace equals the real step byte
for byte, ``auto`` follows the config's ``architectures``, a type without the head is one line listing its tasks, the
formula refuses a head by name and ``memlab estimate --hf`` answers it from the trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlab import cli
from memlab.errors import ConfigError, SetupError
from memlab.predict.spec.setup import Setup

pytest.importorskip("transformers")

from memlab.model.hf import hf_config
from memlab.model.tasks import TASKS, resolve_task, task_labels
from memlab.tracing.hf import trace_hf

BERT = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64}
ROBERTA = {**BERT, "model_type": "roberta", "max_position_embeddings": 66, "pad_token_id": 1}  # positions from 2
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
         "pad_token_id": 0}  # sequence classification of a batch > 1 needs it (the last non-pad token)
DISTILBERT = {"model_type": "distilbert", "dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128,
              "vocab_size": 256}
ENCODER_TASKS = ("masked-lm", "sequence-classification", "token-classification", "question-answering")


def _rows(t) -> list:
    return [(r.step, r.phase, r.peak_bytes, r.end_bytes, r.by_category) for r in t.phases]


@pytest.mark.parametrize(("config", "task"), [
    pytest.param(c, t, id=f"{name}-{t}", marks=() if (name, t) == ("bert", ENCODER_TASKS[0]) else pytest.mark.wide)
    for name, c in (("bert", BERT), ("roberta", ROBERTA)) for t in ENCODER_TASKS])  # one in make test, the rest wide
def test_an_encoders_head_traces_as_it_runs(config: dict, task: str) -> None:
    setup = Setup(batch=2, seq=32, task=task)
    fake, real = trace_hf(config, setup), trace_hf(config, setup, fake=False)
    assert _rows(fake) == _rows(real)
    assert fake.model == f"hf:{config['model_type']}:{task}"
    assert any(n.startswith(f"task {task}: transformers.{TASKS[task].auto}") for n in fake.notes)


# wide (make bench): make test keeps the seeded samples beside it; a fresh clone's make test was over 5 minutes
@pytest.mark.wide
def test_heads_differ_by_their_logits() -> None:
    """The masked LM keeps batch x seq x vocab logits, token classification batch x seq x num_labels, sequence
    classification batch x num_labels: their steps' peaks fall in that order."""
    peaks = {t: trace_hf(BERT, Setup(batch=2, seq=32, task=t)).peak_bytes for t in ENCODER_TASKS}
    assert peaks["masked-lm"] > peaks["token-classification"] and peaks["masked-lm"] > peaks["sequence-classification"]


def test_a_decoder_with_a_classification_head_traces_as_it_runs() -> None:
    setup = Setup(batch=2, seq=32, task="sequence-classification")
    fake, real = trace_hf(LLAMA, setup), trace_hf(LLAMA, setup, fake=False)
    assert _rows(fake) == _rows(real) and fake.model == "hf:llama:sequence-classification"


@pytest.mark.parametrize(("config", "expected"), [
    ({**BERT, "architectures": ["BertForTokenClassification"]}, "token-classification"),
    ({**BERT, "architectures": ["BertForPreTraining"]}, "causal-lm"),  # no head of the table: the causal LM
    (BERT, "causal-lm"),  # BertLMHeadModel
    ({**LLAMA, "architectures": ["LlamaForSequenceClassification"]}, "sequence-classification"),
    ({**DISTILBERT, "architectures": ["DistilBertForMaskedLM"]}, "masked-lm"),
])
def test_auto_is_the_head_architectures_names_else_the_causal_lm(config: dict, expected: str) -> None:
    assert resolve_task(hf_config(config, task="auto"), "auto") == expected


@pytest.mark.parametrize(("config", "task", "message"), [
    (DISTILBERT, "auto", "'distilbert' has no causal LM in transformers and it names no architectures: pick its "
                         "task with --task .*: masked-lm, sequence-classification, token-classification, "
                         "question-answering"),
    (LLAMA, "masked-lm", "'llama' has no masked-lm head in transformers .*: its tasks are causal-lm, "
                         "sequence-classification"),
    (DISTILBERT, "causal-lm", "'distilbert' has no causal LM"),
])
def test_a_type_without_the_head_is_one_line_listing_its_tasks(config: dict, task: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        trace_hf(config, Setup(batch=1, seq=8, task=task))


def test_labels_follow_num_labels_and_problem_type() -> None:
    import torch

    ids = torch.zeros(3, 8, dtype=torch.long)
    cfg = hf_config(BERT, task="auto")
    assert task_labels(cfg, "sequence-classification", ids)["labels"].shape == (3,)
    one = hf_config({**BERT, "num_labels": 1}, task="auto")
    assert task_labels(one, "sequence-classification", ids)["labels"].dtype == torch.float32  # regression: MSE
    multi = hf_config({**BERT, "num_labels": 4, "problem_type": "multi_label_classification"}, task="auto")
    assert task_labels(multi, "sequence-classification", ids)["labels"].shape == (3, 4)
    assert set(task_labels(cfg, "question-answering", ids)) == {"start_positions", "end_positions"}
    assert trace_hf({**BERT, "num_labels": 1}, Setup(batch=2, seq=16, task="sequence-classification")).peak_bytes > 0


@pytest.mark.parametrize(("fields", "message"), [
    ({"loss": "chunked", "loss_chunk": 8}, "the causal LM's"),
    ({"finetune": "lora"}, "finetune='lora' with task='masked-lm' is not traced"),
])
def test_causal_lm_only_options_are_refused_under_a_head(fields: dict, message: str) -> None:
    with pytest.raises(SetupError, match=message):
        trace_hf(BERT, Setup(batch=1, seq=8, task="masked-lm", **fields))


def test_the_formula_refuses_a_head_by_name_and_the_reference_gpt_has_none() -> None:
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf
    from memlab.predict.spec.model import preset
    from memlab.tracing.gpt import trace_gpt

    with pytest.raises(SetupError, match="task='token-classification': the formula models a causal LM's head"):
        estimate(from_hf({k: v for k, v in LLAMA.items() if k != "pad_token_id"}),
                 Setup(batch=1, seq=8, task="token-classification"))
    with pytest.raises(SetupError, match="the reference GPT is a causal LM"):
        trace_gpt(preset("tiny-gpt"), Setup(batch=1, seq=8, task="masked-lm"))


def _estimate(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[int, dict, str]:
    code = cli.main(["estimate", "--hf", str(path), "--batch", "2", "--seq", "32", "--json", *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else {}, err


def test_estimate_answers_an_encoders_head_from_the_trace(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bert.json"
    path.write_text(json.dumps(BERT))
    code, out, err = _estimate(capsys, path, "--task", "sequence-classification")
    assert code == 0 and out["source_of_truth"] == "trace" and out["model"].endswith(":sequence-classification")
    assert out["peak_bytes"] == trace_hf(BERT, Setup(**out["setup"])).peak_bytes  # the library's attention
    assert out["setup"]["task"] == "sequence-classification"
    assert "tracing transformers' modelling code" in err


def test_estimate_follows_architectures_to_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "llama.json"
    path.write_text(json.dumps({**LLAMA, "architectures": ["LlamaForSequenceClassification"]}))
    code, out, err = _estimate(capsys, path, "--attention", "eager")  # CUDA's default kernel for fp32 (efficient) is
    # not traced with grouped K/V heads (memlab.tracing.hf.cuda_efficient_on_fake)
    assert code == 0 and out["source_of_truth"] == "trace" and "the formula does not model this setup" in err
    assert "task='sequence-classification': the formula models a causal LM's head" in out["formula_refused"]
    code, out, _ = _estimate(capsys, path, "--task", "causal-lm")  # the causal LM: the formula's
    assert code == 0 and out["source_of_truth"] == "formula"
