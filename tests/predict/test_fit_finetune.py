"""Issue 18: the fine-tuning levers (LoRA, QLoRA, frozen layers, 8-bit AdamW) are entries of fit.LEVERS, ranked by
the phase-aware peak on generated setups, and ``memlab estimate --finetune qlora --max-batch --levers`` answers a
7B-on-24-GB question; bad fine-tuning combinations are one error line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from memlab import cli
from memlab.predict.estimate import estimate
from memlab.predict.families.reader import from_hf, read_config_json
from memlab.predict.fit import LEVERS, fits, levers, max_batch, plan_to_fit
from memlab.predict.spec.setup import Setup

CONFIGS = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "full"
SEVEN_B = ("llama-2-7b", "mistral-7b", "qwen2-7b")
PEFT = ("LoRA", "QLoRA", "frozen", "8-bit AdamW")


def _config(name: str):
    return from_hf(read_config_json(CONFIGS / f"{name}.json"))


def _lever(name_start: str):
    return next(lv for lv in LEVERS if lv.name.startswith(name_start))


def test_each_fine_tuning_lever_is_one_entry_with_its_cost() -> None:
    for start in PEFT:
        matching = [lv for lv in LEVERS if lv.name.startswith(start)]
        assert len(matching) == 1 and matching[0].cost, start


def _generated(seed: int) -> tuple[str, Setup]:
    rng = random.Random(seed)
    name = rng.choice(SEVEN_B)
    setup = Setup(batch=rng.choice((1, 2, 4)), seq=rng.choice((256, 512, 1024, 2048)),
                  precision=rng.choice(("bf16", "fp32", "amp-bf16")), attention=rng.choice(("eager", "flash")))
    return name, setup


@pytest.mark.parametrize("seed", range(6))
def test_levers_rank_the_fine_tuning_levers_by_the_peak_each_gives(seed: int) -> None:
    name, setup = _generated(seed)
    cfg = _config(name)
    ranked = levers(cfg, setup, "rtx-4090")
    assert [r.device_bytes for r in ranked] == sorted(r.device_bytes for r in ranked)  # ranked on device-used
    by_name = {r.name: r for r in ranked}
    for start in ("LoRA", "QLoRA", "frozen"):
        r = next(r for n, r in by_name.items() if n.startswith(start))
        alone = estimate(cfg, setup.with_(**r.changes))
        assert r.peak_bytes == alone.peak_bytes and r.peak_phase == alone.peak_phase  # the peak, never the sum
        verdict = fits(alone, "rtx-4090")  # decided on device-used, as the --gpu verdict is
        assert (r.fits, r.device_bytes, r.margin_bytes) == (verdict.fits, verdict.used_bytes, verdict.margin_bytes)
    lora = next(r for n, r in by_name.items() if n.startswith("LoRA"))
    qlora = next(r for n, r in by_name.items() if n.startswith("QLoRA"))
    assert qlora.changes == {"finetune": "qlora", "precision": "bf16"}
    # a 4-bit base under the same adapters holds less than a bf16/fp32 one, whatever the activations
    assert qlora.peak_bytes < estimate(cfg, setup.with_(finetune="lora", precision="bf16")).peak_bytes
    assert lora.changes["precision"] == setup.precision  # fp32, bf16, amp-bf16 keep theirs under peft


def test_levers_that_do_not_apply_are_left_out() -> None:
    cfg = _config("llama-2-7b")
    on_qlora = {r.name for r in levers(cfg, Setup(seq=512, finetune="qlora", precision="bf16"), "rtx-4090")}
    assert not any(n.startswith(("LoRA", "QLoRA", "frozen")) for n in on_qlora)
    assert any(n.startswith("8-bit AdamW") for n in on_qlora)  # 8-bit states for the adapters still apply
    on_8bit = {r.name for r in levers(cfg, Setup(seq=512, precision="bf16", optimizer="adam-8bit"), "rtx-4090")}
    assert not any(n.startswith("8-bit AdamW") for n in on_8bit)
    # a master-weight policy cannot carry peft's fp32 adapters (nor a frozen base): those levers compute in bf16
    mixed = levers(cfg, Setup(seq=512, precision="mixed-bf16"), "rtx-4090")
    for start in ("LoRA", "frozen"):
        assert next(r for r in mixed if r.name.startswith(start)).changes["precision"] == "bf16"


def test_frozen_lever_freezes_half_the_blocks_of_the_model() -> None:
    for name in SEVEN_B:
        cfg = _config(name)
        r = next(r for r in levers(cfg, Setup(seq=512, precision="bf16"), "rtx-4090") if r.name.startswith("frozen"))
        assert r.changes == {"finetune": "frozen", "frozen_layers": cfg.n_layers // 2, "precision": "bf16"}


def test_plan_to_fit_a_7b_full_fine_tune_on_24_gb_switches_on_a_peft_lever() -> None:
    cfg = _config("llama-2-7b")
    setup = Setup(seq=512, precision="bf16")
    assert estimate(cfg, setup).peak_bytes > 24 * 2**30
    names, fitted, peak = plan_to_fit(cfg, setup, "rtx-4090", world_size=1)
    assert estimate(cfg, fitted).peak_bytes == peak and fits(estimate(cfg, fitted), "rtx-4090").fits  # device-used
    assert fitted.finetune in ("lora", "qlora", "frozen") or fitted.optimizer == "adam-8bit", names


def _main_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert cli.main(["estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_answers_qlora_max_batch_and_levers_for_a_7b_on_a_4090(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "llama-2-7b.json")
    out = _main_json(capsys, "--hf", path, "--finetune", "qlora", "--lora-rank", "16", "--max-batch", "--levers",
                     "--gpu", "rtx-4090")
    assert out["setup"]["precision"] == "bf16"  # QLoRA's compute dtype when --precision is not given
    setup = Setup(seq=out["setup"]["seq"], finetune="qlora", lora_rank=16, precision="bf16",
                  attention=out["setup"]["attention"])  # the kernel the CLI resolved (the library's, on a 4090)
    assert out["max_batch"]["value"] == max_batch(_config("llama-2-7b"), setup, "rtx-4090").value >= 1
    assert out["to_fit"]["fits"] and out["to_fit"]["levers"] == []
    full = _main_json(capsys, "--hf", path, "--precision", "bf16", "--seq", "512", "--levers", "--gpu", "rtx-4090")
    assert full["to_fit"]["fits"] and full["to_fit"]["levers"]
    assert any(r["name"].startswith("QLoRA") and r["fits"] for r in full["levers"])


@pytest.mark.parametrize(("argv", "says"), [
    (["--finetune", "qlora", "--precision", "fp32"], "precision='bf16'"),
    (["--lora-rank", "16"], "finetune='lora'"),
    (["--finetune", "lora", "--recompute", "selective"], "selective"),
    (["--finetune", "frozen"], "frozen_layers"),
    (["--finetune", "lora", "--optimizer", "adafactor"], "adafactor"),
    (["--finetune", "qlora", "--loss", "chunked"], "chunked"),
])
def test_bad_fine_tuning_combinations_are_one_error_line(argv: list[str], says: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["estimate", "--hf", str(CONFIGS / "llama-2-7b.json"), *argv, "--max-batch", "--levers",
                     "--gpu", "rtx-4090"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error: ") and says in lines[0], err
    assert "Traceback" not in err + out


def test_fit_margin_is_borderline_when_the_context_takes_the_card_past_95_percent() -> None:
    """A peak that fits with less than the CUDA context (426 MiB, the --gpu verdict's) + 5 % of the card left reads
    borderline, not fits (review 11.3: LoRA on a 24 GiB card with +0.6 GiB of headroom)."""
    from memlab.predict.fit import BORDERLINE_SHARE, CUDA_CONTEXT_BYTES, FitVerdict
    from memlab.units import GiB

    cap = 24 * GiB

    def verdict(peak: int) -> str:
        return FitVerdict(peak <= cap, peak, cap, cap - peak, "rtx-4090", "RTX 4090", peak).margin()

    edge = int(BORDERLINE_SHARE * cap) - CUDA_CONTEXT_BYTES
    assert verdict(edge) == "fits" and verdict(edge + 1) == "borderline"
    assert verdict(int(23.4 * GiB)) == verdict(cap) == "borderline"
    assert verdict(cap + 1) == "does not fit"
