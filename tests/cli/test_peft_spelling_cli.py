"""``memlab estimate --hf`` with peft's spellings (issue 34 point 2): a ``--lora-targets`` regex read against the
model's module names, and QLoRA on a T4 (fp16 compute: ``amp-fp16``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlab import cli

TINY_LLAMA = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "tiny" / "llama.json"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_regex_of_whole_kinds_is_answered_by_the_formula_and_the_reading_is_said(
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    regex = r".*\.(q_proj|v_proj)"
    code, out, err = _run(capsys, "estimate", "--hf", str(TINY_LLAMA), "--finetune", "lora", "--lora-targets", regex,
                          "--seq", "16", "--json")
    assert code == 0, err
    assert "is a regex" in err and "lora_targets='q,v'" in err
    d = json.loads(out)
    assert d["source_of_truth"] == "formula" and d["setup"]["lora_targets"] == "q,v"
    code, plain, _ = _run(capsys, "estimate", "--hf", str(TINY_LLAMA), "--finetune", "lora", "--lora-targets",
                          "q_proj,v_proj", "--seq", "16", "--json")
    assert json.loads(plain)["per_device"] == d["per_device"]


def test_a_regex_matching_nothing_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    code, _, err = _run(capsys, "estimate", "--hf", str(TINY_LLAMA), "--finetune", "lora", "--lora-targets",
                        r".*\.c_attn", "--seq", "16")
    assert code != 0 and "not found in the base model" in err and len(err.strip().splitlines()) == 1


@pytest.mark.wide
def test_a_regex_over_some_blocks_is_answered_by_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("peft")
    code, out, err = _run(capsys, "estimate", "--hf", str(TINY_LLAMA), "--finetune", "lora", "--lora-targets",
                          r".*layers\.0\..*_proj", "--seq", "16", "--json")
    assert code == 0, err
    assert "not whole kinds" in err and "source of truth: trace" in err
    assert json.loads(out)["source_of_truth"] == "trace"


def test_qlora_on_a_t4_computes_in_fp16_and_a_7b_recipe_is_answered(capsys: pytest.CaptureFixture[str]) -> None:
    """No --precision: QLoRA on a card without bf16 takes its fp16 recipe (amp-fp16); the memory-efficient SDPA
    kernel torch runs on sm75; the formula answers for Llama 2 7B under full recompute."""
    code, out, err = _run(capsys, "estimate", "--hf", "llama-2-7b", "--finetune", "qlora", "--gpu", "t4",
                          "--recompute", "full", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["setup"]["precision"] == "amp-fp16" and d["setup"]["attention"] == "efficient"
    assert d["source_of_truth"] == "formula" and d["fits"] is True
    code, out, _ = _run(capsys, "estimate", "--hf", "llama-2-7b", "--finetune", "qlora", "--gpu", "a100-80gb-sxm",
                        "--recompute", "full", "--json")
    assert json.loads(out)["setup"]["precision"] == "bf16"
