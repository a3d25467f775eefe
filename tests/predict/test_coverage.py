"""The coverage table is the one place that says what memlab models: every row is reached by a case, the estimate's
refusals, assumptions and named terms are views of it, and a valid Setup the formula does not model is refused by
the estimate (with its way out), not by Setup, so a trace or a real run can still take it."""

from __future__ import annotations

import itertools
import random

import pytest

from memlab.course.hf_configs import load_config
from memlab.errors import MemlabError, SetupError
from memlab.predict import coverage
from memlab.predict.estimate import Overheads, estimate
from memlab.predict.families.reader import from_hf
from memlab.predict.memory.breakdown import rank_breakdown
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

FAMILIES = ("llama", "gemma2", "mistral", "mixtral", "qwen2_moe", "gpt2")
MODELS = {"tiny-gpt": preset("tiny-gpt"), "tiny-moe": preset("tiny-moe"), "count": 1_000_000,
          **{name: from_hf(load_config(name)) for name in FAMILIES},
          "mistral, a 16-token window": from_hf({**load_config("mistral"), "sliding_window": 16}),
          "qwen2_moe, a dense layer 0": from_hf({**load_config("qwen2_moe"), "mlp_only_layers": [0]})}

FIELDS = {
    "mode": ("train", "inference"), "precision": ("fp32", "bf16", "amp-bf16", "mixed-bf16", "fp16", "amp-fp16"),
    "optimizer": ("adamw", "sgd", "adafactor", "adam-8bit", "paged-adamw", "paged-adam-8bit"),
    "recompute": ("none", "selective", "full", "op"),
    "recompute_every": (1, 1, 2), "activation_memory_budget": (1.0, 1.0, 1.0, 0.5),
    "attention": ("eager", "flash", "math", "efficient"), "zero_stage": (0, 2, 3), "world_size": (1, 2),
    "tp": (1, 2), "loss": ("plain", "chunked", "fused"), "logits_to_keep": (0, 1), "offload_activations": (False, True),
    "grad_accum_steps": (1, 2), "finetune": ("full", "lora", "qlora", "frozen"), "attention_mask": ("none", "ones",
                                                                                                   "padded"),
    "fsdp_param_dtype": ("none", "bf16"), "fsdp_output_dtype": ("none", "bf16"), "fsdp_offload": (False, True),
    "pp": (1, 2), "cp": (1, 2), "ep": (1, 2), "seq": (16, 64), "task": ("auto",) * 6 + ("causal-lm", "masked-lm"),
    "kbit_prepare": (False, False, True), "lora_dtype": ("fp32", "fp32", "bf16"),
    "checkpoint_reentrant": (False, False, True),
    "lora_targets": ("",) * 4 + ("q_proj,v_proj", "all-linear", "q,lm_head", r".*\.(q|v)_proj"),
}


def _setups(n: int, seed: int = 0) -> list[Setup]:
    """Valid setups drawn field by field (invalid draws, refused by Setup itself, are skipped)."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        fields = {k: rng.choice(v) for k, v in FIELDS.items()}
        if fields["finetune"] == "frozen":
            fields["frozen_layers"] = 1
        if fields["attention_mask"] == "padded":
            fields["pad_fraction"] = 0.25
        if fields["pp"] > 1:
            fields["micro_batches"] = 2
        fields["world_size"] *= fields["ep"]
        try:
            out.append(Setup(batch=rng.choice((1, 2)), **fields))
        except MemlabError:
            continue
    return out


def _reached() -> dict[str, int]:
    """How many (model, setup, device) cases make each row's predicate hold."""
    hits = dict.fromkeys((e.key for e in coverage.TABLE), 0)
    setups = _setups(300)
    for (_, model), setup, device in itertools.product(MODELS.items(), setups, ("cuda", "cpu")):
        case = coverage.Case(model, setup, device, Overheads())
        for entry in coverage.TABLE:
            try:
                hits[entry.key] += bool(entry.when(case))
            except (MemlabError, AttributeError):  # a row that reads what a bare count has not
                continue
    return hits


def test_each_row_has_a_key_and_one_kind() -> None:
    keys = [e.key for e in coverage.TABLE]
    assert len(keys) == len(set(keys)), "keys repeat"
    for e in coverage.TABLE:
        assert (e.refuse is not None) != (e.says is not None or e.terms is not None), e.key


def test_every_row_of_the_table_is_reached_by_a_drawn_case() -> None:
    unreached = [k for k, n in _reached().items() if n == 0]
    assert not unreached, f"no drawn case reaches {unreached}"


@pytest.mark.parametrize("seed", range(3))
def test_the_estimate_is_a_view_of_the_table(seed: int) -> None:
    """Refused exactly when the table refuses, with its message; otherwise its assumptions are the table's, in the
    table's order (the seq note and the count's notes between and after), and its named terms the table's."""
    rng = random.Random(seed)
    for setup in _setups(60, seed):
        name, model = rng.choice(list(MODELS.items()))
        device = rng.choice(("cuda", "cpu"))
        message = coverage.refusal(model, setup, device)
        try:
            bd = estimate(model, setup, device_type=device)
        except MemlabError as exc:
            assert message is None or str(exc) == message, (name, setup)
            continue
        assert message is None, (name, setup, message)
        if bd.layout:  # a layout whose ranks differ says its own assumptions, then the overheads left out
            continue
        head, tail = coverage.assumptions(model, setup, Overheads(), device)
        notes = rank_breakdown(model, setup, device_type=device).assumptions  # the count's own notes
        assert bd.assumptions == (*head, *coverage.rotary_seq_note(model, setup.seq), *tail, *notes)
        assert bd.named_terms == coverage.named_terms(model, setup, bd, device)
        assert all(t.key in {e.key for e in coverage.TABLE} for t in bd.named_terms)


def test_a_valid_setup_memlab_does_not_model_is_refused_by_the_estimate_not_by_setup() -> None:
    """LoRA under ZeRO over two ranks is a valid Setup (a real run takes it); the formula refuses it with the way
    out, in one line."""
    setup = Setup(finetune="lora", zero_stage=2, world_size=2, seq=32)
    with pytest.raises(SetupError, match="set zero_stage=0") as info:
        estimate(MODELS["llama"], setup)
    assert "\n" not in str(info.value)
    assert coverage.refusal(MODELS["llama"], setup) == str(info.value)


def test_reentrant_checkpointing_is_refused_with_the_trace_as_way_out_and_the_variant_assumed_is_said() -> None:
    """torch's reentrant checkpoint (peft's prepare_model_for_kbit_training alone) holds other bytes in backward than
    the non-reentrant one the formula models (tests/tracing/test_trace_reentrant.py): refused in one line, the trace
    as the way out on a Hugging Face config, transformers' default named on the reference GPT; an estimate under
    full recompute of a Hugging Face config says which checkpoint it assumes and where the other comes from."""
    setup = Setup(seq=32, recompute="full", checkpoint_reentrant=True)
    for name, way_out in (("llama", "memlab estimate --hf answers from the trace"),
                          ("tiny-gpt", "the reference GPT checkpoints non-reentrant")):
        with pytest.raises(SetupError, match=way_out) as info:
            estimate(MODELS[name], setup)
        assert "\n" not in str(info.value) and coverage.refusal(MODELS[name], setup) == str(info.value)
    said = estimate(MODELS["llama"], setup.with_(checkpoint_reentrant=False)).assumptions
    assert coverage.CHECKPOINT_VARIANT in said and "prepare_model_for_kbit_training(model) alone" in \
        coverage.CHECKPOINT_VARIANT and "--reentrant" in coverage.CHECKPOINT_VARIANT
    assert coverage.CHECKPOINT_VARIANT not in estimate(MODELS["tiny-gpt"], setup.with_(
        checkpoint_reentrant=False)).assumptions  # the reference GPT's checkpoint is memlab's own
