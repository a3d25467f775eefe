"""Issue 34, point 6: ``memlab mfu --hf CONFIG`` and ``--finetune lora|qlora|frozen``: the MFU of a fine-tuning step
counts the FLOPs the step runs (no weight-gradient GEMMs of frozen weights), HFU adds the recompute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlab import cli
from memlab.predict.compute.flops import flops_per_token, step_flops
from memlab.predict.families.reader import from_hf
from memlab.predict.spec.setup import Setup

LLAMA = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "tiny" / "llama.json"
BASE = ["mfu", "--hf", str(LLAMA), "--gpu", "h100-sxm", "--seq", "64", "--tokens-per-second", "1e6", "--json"]


def _json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    assert cli.main([*BASE, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_hf_is_the_configs_full_training_count(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys)
    assert out["flops_per_token"] == flops_per_token(from_hf(LLAMA), 64) and out["finetune"] is None
    assert cli.main(["mfu", "--model", str(LLAMA), *BASE[3:]]) == 0  # --model SPEC routes to --hf
    assert json.loads(capsys.readouterr().out)["flops_per_token"] == out["flops_per_token"]


@pytest.mark.parametrize("extra", [
    ("--finetune", "lora", "--lora-rank", "16", "--lora-targets", "q,k,v,o,gate,up,down"),
    ("--finetune", "qlora", "--recompute", "full"),
    ("--finetune", "frozen", "--frozen-layers", "1", "--recompute", "selective"),
])
def test_finetune_counts_the_steps_flops(capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]) -> None:
    out = _json(capsys, *extra)
    fields = dict(zip(extra[::2], extra[1::2], strict=True))
    recompute = fields.pop("--recompute", "none")
    setup = Setup(batch=1, seq=64, recompute=recompute, precision="bf16" if fields["--finetune"] == "qlora" else "fp32",
                  **{k[2:].replace("-", "_"): int(v) if v.isdigit() else v for k, v in fields.items()})
    step = step_flops(from_hf(LLAMA), setup)
    assert out["flops_per_token"] == step.model / 64 < flops_per_token(from_hf(LLAMA), 64)
    assert out["hardware_flops_per_token"] == step.hardware / 64
    assert (out["hfu"] > out["mfu"]) == (recompute != "none")
    assert out["finetune"]["finetune"] == fields["--finetune"] and fields["--finetune"] in out["formula"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--params", "7e9", "--tokens-per-second", "1e3", "--finetune", "lora"], "need the model's shapes"),
    (["--hf", str(LLAMA), "--preset", "gpt2", "--seq", "64", "--tokens-per-second", "1e3"],
     "the model comes from --hf, so --preset would be ignored"),
    (["--hf", str(LLAMA), "--seq", "64", "--tokens-per-second", "1e3", "--lora-rank", "8"], "finetune='lora'"),
    (["--hf", str(LLAMA), "--seq", "64", "--tokens-per-second", "1e3", "--finetune", "frozen", "--frozen-layers",
      "2"], "leave at least one"),
    (["--hf", str(LLAMA), "--seq", "64", "--tokens-per-second", "1e3", "--finetune", "lora", "--lora-targets", "x"],
     "unknown module kind 'x'"),
])
def test_bad_finetune_input_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert cli.main(["mfu", "--gpu", "h100-sxm", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_recompute_every_k_counts_torchtitans_layer_policy(capsys: pytest.CaptureFixture[str]) -> None:
    """HFU under ``--recompute full --recompute-every k`` adds the forward of the blocks (i + 1) % k == 0 only:
    between no recompute and every block; ``k = 1`` is ``full``; without ``full`` it is one error line."""
    from memlab.predict.compute.flops import megatron_iteration_flops

    config = from_hf(LLAMA)
    none, full = _json(capsys), _json(capsys, "--recompute", "full")
    every = {k: _json(capsys, "--recompute", "full", "--recompute-every", str(k)) for k in (1, 2)}
    assert every[1]["hfu"] == full["hfu"] and none["hfu"] < every[2]["hfu"] < full["hfu"]
    per_token = megatron_iteration_flops(config, 1, 64, "full", recompute_every=2) / 64
    assert every[2]["hfu"] == pytest.approx(none["hfu"] * per_token / none["flops_per_token"], rel=1e-12)
    assert cli.main([*BASE, "--recompute-every", "2"]) == 2
    assert "goes with recompute='full'" in capsys.readouterr().err
