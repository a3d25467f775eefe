"""Issue 38, part 3: every fit of memlab.predict.fit (fits, max_batch, max_seq, serving_table, levers, plan_to_fit)
decides on device-used (memlab.predict.gpu.device.for_estimate, the --gpu verdict's call), the margin named and the
tensor peak kept beside it; a step that fits on its tensors but not on device-used is reported as not fitting."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memlab import cli
from memlab.errors import SetupError
from memlab.predict.estimate import Overheads, estimate
from memlab.predict.families.resolver import resolve_with_raw
from memlab.predict.fit import ALLOCATED_ONLY, fits, levers, max_batch, max_seq, plan_to_fit, serving_table
from memlab.predict.gpu.device import DeviceOverheads, for_estimate
from memlab.predict.hardware.gpus import gpu
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

CFG = preset("gpt2")
TRAIN = Setup(batch=4, seq=512)
NOTHING = ALLOCATED_ONLY
"""Every device term 0: device-used is the tensor peak (what the fits decided on before)."""


def _card(capacity: int):
    """The RTX 4090's row with ``capacity`` bytes (a custom card, as --gpu-memory-gib makes)."""
    return replace(gpu("rtx-4090"), memory_bytes=capacity)


def _between(setup: Setup, **over: int) -> int:
    """A capacity above ``setup``'s tensor peak and below its device-used high end on the 4090."""
    bd = estimate(CFG, setup.with_(**over))
    high = for_estimate(bd, setup.with_(**over), "rtx-4090", 1).device_high_bytes
    assert bd.peak_bytes < high
    return (bd.peak_bytes + high) // 2


def test_fits_decides_on_device_used_and_keeps_the_tensor_peak() -> None:
    bd = estimate(CFG, TRAIN)
    v = fits(bd, _card(_between(TRAIN)))
    assert v.peak_bytes <= v.capacity_bytes and v.headroom_bytes >= 0  # fits on its tensors
    assert not v.fits and v.margin_bytes < 0 and v.used_bytes == v.device.device_high_bytes
    assert v.to_dict()["decided_on"].startswith("device-used")
    alone = fits(bd, _card(_between(TRAIN)), device=NOTHING)  # every term 0: the tensor peak decides
    assert alone.fits and alone.used_bytes == bd.peak_bytes


def test_max_batch_and_max_seq_stop_where_device_used_stops_fitting() -> None:
    cap = _between(TRAIN)  # batch 4 fits on tensors, not on device-used
    found = max_batch(CFG, TRAIN, _card(cap))
    assert found.value < 4 and found.margin_bytes >= 0 and "margin" in found.reason
    assert max_batch(CFG, TRAIN, _card(cap), device=NOTHING).value >= 4
    assert not fits(CFG, _card(cap), TRAIN.with_(batch=found.value + 1)).fits
    seq = max_seq(CFG, TRAIN, _card(_between(TRAIN, seq=1024)), limit=1024)
    assert seq.value < 1024 and seq.device_bytes <= seq.capacity_bytes


def test_a_search_where_only_the_tensors_fit_reports_zero_with_the_margin() -> None:
    found = max_batch(CFG, TRAIN, _card(_between(TRAIN, batch=1)))
    assert found.value == 0 and found.margin_bytes < 0 and found.total_bytes < found.capacity_bytes
    assert "no batch fits for certain: batch=1 needs device-used" in found.reason and "margin -" in found.reason
    assert found.up_to >= 1 and "batch=1 fits only if the caching allocator's reserve" in found.reason


def test_serving_table_rows_carry_device_used_and_margin() -> None:
    inf = Setup(mode="inference", batch=8, seq=1024)
    row = serving_table(CFG, inf, _card(_between(inf)), [1024], limit=64)[0]
    assert row["max_batch"] < 8 and row["margin_bytes"] >= 0 and row["device_bytes"] > row["peak_bytes"]


def test_levers_decide_on_device_used_and_plan_to_fit_fits_there() -> None:
    setup = TRAIN.with_(batch=8)
    ranked = levers(CFG, setup, "rtx-4090", world_size=2)
    best = ranked[0]
    cap = (best.peak_bytes + best.device_bytes) // 2  # the best lever fits on its tensors only
    again = {r.name: r for r in levers(CFG, setup, _card(cap), world_size=2)}
    assert not again[best.name].fits and again[best.name].margin_bytes < 0
    tight = _card(_between(setup))  # the step fits on its tensors only: a plan on allocated bytes would stop here
    names, fitted, _ = plan_to_fit(CFG, setup, tight, world_size=2)
    assert names and fits(CFG, tight, fitted).fits and not fits(CFG, tight, setup).fits


def test_overrides_are_honoured_and_a_disagreement_is_one_error() -> None:
    ctx = 900 * 2**20
    given = fits(estimate(CFG, TRAIN, overheads=Overheads(cuda_context_bytes=ctx)), "rtx-4090")
    ctx_term = next(t for t in given.device.terms if t.name == "cuda_context")
    assert (ctx_term.low, ctx_term.high) == (ctx, ctx)  # the breakdown's own term, not the default range
    frac = fits(CFG, "rtx-4090", TRAIN, device=DeviceOverheads(reserve_fraction=0.25)).device
    assert frac.reserved_bytes - frac.allocated_bytes == round(0.25 * frac.allocated_bytes)
    with pytest.raises(SetupError, match="disagree"):
        fits(CFG, "rtx-4090", TRAIN, overheads=Overheads(cuda_context_bytes=5),
             device=DeviceOverheads(cuda_context_bytes=7))


def test_cli_searches_take_the_verdicts_terms_and_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--preset", "gpt2", "--batch", "4", "--seq", "512", "--gpu", "rtx-4090", "--max-batch",
            "--gpu-memory-gib", "6", "--cuda-context-mib", "700", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    setup = Setup(**out["setup"])  # the setup the CLI resolved (its library defaults)
    model = resolve_with_raw("gpt2")[0]  # --preset gpt2: the published config, transformers' GPT-2
    want = max_batch(model, setup, _card(6 * 2**30), overheads=Overheads(cuda_context_bytes=700 * 2**20),
                     device=DeviceOverheads(cuda_context_bytes=700 * 2**20))
    assert out["max_batch"] == json.loads(json.dumps(want.to_dict())) and want.capacity_bytes == 6 * 2**30
    assert out["device"]["capacity_bytes"] == 6 * 2**30
    assert max_batch(model, setup, "rtx-4090").value > want.value  # the card's 24 GiB and default terms: more


@pytest.mark.parametrize(("argv", "says"), [
    (["--max-batch"], "add --gpu NAME"),
    (["--levers", "--gpu-memory-gib", "8"], "give --gpu NAME too"),
    (["--serving", "1024", "--gpu", "rtx-4090"], "add --mode inference"),
])
def test_cli_searches_refuse_in_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["estimate", "--preset", "gpt2", *argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in out + err, err
