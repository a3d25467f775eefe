"""Issue 38: a fit search answers from both ends of device-used's range (the allocator's reserve at its bound: for
certain; no reserve: the most that may fit), and the trace settles what lies between (memlab.tracing.fit), deciding
as the allocator does on the card: freeing its cache and retrying before it runs out."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from memlab import cli
from memlab.predict.estimate import estimate
from memlab.predict.fit import fits, largest_fitting, levers, max_batch, serving_table
from memlab.predict.gpu.allocator import AllocationLog
from memlab.predict.gpu.device import DeviceOverheads, allocator_room, for_estimate, for_trace, terms
from memlab.predict.gpu.replay import replay
from memlab.predict.hardware.gpus import gpu
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup
from memlab.tracing.fit import DECIDED_ON_TRACE, traced_search
from memlab.tracing.gpt import trace_gpt

MB = 1 << 20
TINY = preset("tiny-gpt")
TRAIN = Setup(batch=2, seq=64)


def _card(capacity: int):
    return replace(gpu("rtx-4090"), memory_bytes=capacity)


def _ends(config, setup: Setup, key: str = "rtx-4090") -> tuple[int, int]:
    p = for_estimate(estimate(config, setup), setup, key, 1)
    return p.device_low_bytes, p.device_high_bytes


def test_the_two_ends_are_where_each_end_of_device_used_stops_fitting() -> None:
    cfg, setup = preset("gpt2"), Setup(batch=4, seq=512)
    cap = _ends(cfg, setup.with_(batch=8))[1]  # batch 8 fits for certain, by its high end exactly
    found = max_batch(cfg, setup, _card(cap))
    assert found.value >= 8 and found.up_to > found.value and not found.settled
    assert _ends(cfg, setup.with_(batch=found.value))[1] <= cap < _ends(cfg, setup.with_(batch=found.value + 1))[1]
    assert _ends(cfg, setup.with_(batch=found.up_to))[0] <= cap < _ends(cfg, setup.with_(batch=found.up_to + 1))[0]
    assert found.words() == f"{found.value:,} for certain, up to {found.up_to:,}"
    assert "fit only if the caching allocator's reserve" in found.reason and "memlab trace --gpu" in found.reason


def test_nothing_fits_when_even_the_low_end_does_not() -> None:
    cfg, setup = preset("gpt2"), Setup(batch=4, seq=512)
    found = max_batch(cfg, setup, _card(_ends(cfg, setup.with_(batch=1))[0] - 1))
    assert (found.value, found.up_to) == (0, 0) and "with no allocator reserve" in found.reason


def test_serving_rows_and_levers_carry_both_ends() -> None:
    inf = Setup(mode="inference", batch=1, seq=1024, inference_weights="bf16")
    row = serving_table(preset("llama-2-7b"), inf, "rtx-4090", [1024], limit=54)[0]
    assert 0 < row["max_batch"] <= row["max_batch_up_to"]
    ranked = levers(preset("gpt2"), Setup(batch=16, seq=1024), "rtx-4090")
    words = {r.word() for r in ranked}
    assert "reserve decides" in words and all(r.may_fit for r in ranked if r.fits)
    assert all(r.device_low_bytes <= r.device_bytes for r in ranked)


@pytest.mark.parametrize("stop", [1, 5, 9, 16])
def test_largest_fitting_bisects_a_monotone_predicate(stop: int) -> None:
    asked: list[int] = []

    def fits_at(v: int) -> bool:
        asked.append(v)
        return v <= stop

    assert largest_fitting(fits_at, 16) == stop and len(set(asked)) <= 6
    assert largest_fitting(lambda v: False, 16) == 0


def _fake_trace(events: list, peak: int) -> SimpleNamespace:
    log = AllocationLog(tuple(events))
    return SimpleNamespace(peak_bytes=peak, replay=lambda config=None, capacity_bytes=None: replay(
        log, config, capacity_bytes=capacity_bytes))


def test_a_traced_step_whose_whole_reserve_passes_the_card_fits_after_a_cache_flush() -> None:
    """The reserve the whole step would ask (a 50 MiB segment cached, then a 60 MiB request) is more than the card
    leaves; torch's allocator frees its cache and retries (CUDACachingAllocator.cpp ``malloc``), so it fits."""
    setup = Setup()
    ov = DeviceOverheads(cuda_context_bytes=0, workspace_bytes=0)
    trace = _fake_trace([(1, 50 * MB), (1,), (2, 60 * MB)], 60 * MB)
    cap = 100 * MB
    assert replay([(1, 50 * MB), (1,), (2, 60 * MB)]).total.reserved_bytes == 110 * MB > cap
    p, on_card = for_trace(trace, setup, "rtx-4090", cap, overheads=ov)
    assert p.fits and on_card.alloc_retries == 1 and p.device_high_bytes == 60 * MB
    assert "retries 1 time" in p.reserve_source
    p, on_card = for_trace(trace, setup, "rtx-4090", 55 * MB, overheads=ov)  # not even after the flush
    assert not p.fits and on_card.oom_event == 2 and p.reserved_bytes == 110 * MB


def test_the_allocators_room_is_the_card_less_what_lives_outside_it() -> None:
    extra = terms("h100-sxm", Setup(), DeviceOverheads(), 0)
    held = sum(t.high for t in extra)
    assert allocator_room(80 * 2**30, extra) == 80 * 2**30 - held and allocator_room(1, extra) == 0


def test_the_traced_search_is_the_brute_force_answer_inside_the_formulas_ends() -> None:
    ov = DeviceOverheads(cuda_context_bytes=0, workspace_bytes=0)
    setup = TRAIN
    setup = setup.with_(seq=8)
    traces = {b: trace_gpt(TINY, setup.with_(batch=b)) for b in range(1, 6)}
    devices = {b: for_trace(t, setup.with_(batch=b), "rtx-4090", 1, overheads=ov)[0] for b, t in traces.items()}
    cap = (devices[2].device_high_bytes + devices[3].device_high_bytes) // 2
    card = _card(cap)
    formula = max_batch(TINY, setup, card, device=ov, limit=5)
    calls: list[int] = []

    def trace_at(s: Setup):
        calls.append(s.batch)
        return traces[s.batch]

    found = traced_search(trace_at, setup, "batch", card, formula=formula, limit=5, overheads=ov)
    brute = max(b for b in traces if for_trace(traces[b], setup.with_(batch=b), "rtx-4090", cap,
                                               overheads=ov)[0].fits)
    assert found.value == brute and found.settled and found.decided_on == DECIDED_ON_TRACE
    assert formula.value <= found.value <= formula.up_to
    assert len(set(calls)) <= 5 and found.margin_bytes >= 0
    alone = traced_search(trace_at, setup, "batch", card, limit=5, overheads=ov)  # no formula: double, bisect
    assert alone.value == brute


def test_fits_agrees_with_the_formula_search_at_its_certain_end() -> None:
    cfg, setup = preset("gpt2"), Setup(batch=4, seq=512)
    found = max_batch(cfg, setup, "rtx-4090")
    assert fits(cfg, "rtx-4090", setup.with_(batch=found.value)).fits
    assert not fits(cfg, "rtx-4090", setup.with_(batch=found.value + 1)).fits


def test_memlab_trace_searches_by_tracing_with_the_options_honoured(capsys: pytest.CaptureFixture[str]) -> None:
    """The command line's traced search, the verdict's options honoured on it: --fragmentation fixes the reserve
    (so the formula's ends meet and two traces settle it), the card and terms are the options'."""
    argv = ["trace", "tiny-gpt", "--batch", "1", "--seq", "8", "--gpu", "rtx-4090", "--gpu-memory-gib", "0.0105",
            "--cuda-context-mib", "0", "--workspace-mib", "0", "--fragmentation", "0.1", "--max-batch", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    r = out["max_batch"]
    assert r["decided_on"] == DECIDED_ON_TRACE and r["up_to"] == r["value"] and r["formula"]["field"] == "batch"
    assert r["value"] >= r["formula"]["value"] > 0 and r["margin_bytes"] >= 0 and len(r["tried"]) <= 3
    assert r["capacity_bytes"] == round(0.0105 * 2**30)
    assert [fits for *_, fits in r["tried"]] == [v <= r["value"] for v, *_ in r["tried"]]


@pytest.mark.parametrize(("argv", "says"), [
    (["--levers", "--gpu", "rtx-4090"], "memlab estimate answers them"),
    (["--serving", "1024", "--gpu", "rtx-4090"], "memlab estimate answers them"),
    (["--max-batch"], "add --gpu NAME"),
])
def test_memlab_trace_refuses_the_formulas_searches_in_one_line(argv: list[str], says: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trace", "tiny-gpt", "--batch", "2", "--seq", "64", *argv]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in out + err


@pytest.mark.wide
@pytest.mark.parametrize("seed", range(16))
def test_on_generated_steps_the_traced_answer_lies_between_the_formulas_ends(seed: int) -> None:
    """Drawn setups (model, sequence, precision, recompute, card): the formula's certain end fits on the trace's
    replay, its upper end + 1 does not (the trace's tensors are the formula's where it is exact), and the traced
    search is the brute-force answer over every batch up to there."""
    import random

    rng = random.Random(seed)
    cfg = preset(rng.choice(["tiny-gpt", "tiny-llama"]))  # the reference MoE is refused on fake tensors
    setup = Setup(batch=1, seq=rng.choice([8, 16, 32]), precision=rng.choice(["fp32", "amp-bf16", "bf16"]),
                  recompute=rng.choice(["none", "full"]))
    ov = DeviceOverheads(cuda_context_bytes=0, workspace_bytes=0)
    top = 12
    traces = {b: trace_gpt(cfg, setup.with_(batch=b)) for b in range(1, top + 1)}
    used = {b: for_trace(t, setup.with_(batch=b), "rtx-4090", 1, overheads=ov)[0].device_high_bytes
            for b, t in traces.items()}
    k = rng.randint(1, top - 1)
    card = _card((used[k] + used[k + 1]) // 2 if used[k + 1] > used[k] else used[k])
    formula = max_batch(cfg, setup, card, device=ov, limit=top)
    found = traced_search(lambda s: traces[s.batch], setup, "batch", card, formula=formula, limit=top, overheads=ov)
    brute = max((b for b, t in traces.items()
                 if for_trace(t, setup.with_(batch=b), "rtx-4090", card.memory_bytes, overheads=ov)[0].fits),
                default=0)
    assert found.value == brute, (seed, found.reason)
    assert formula.value <= brute <= formula.up_to, (seed, cfg.name, setup, formula.reason, brute)


def test_the_traced_sequence_search_stops_at_the_models_position_table(tmp_path, capsys) -> None:
    """A Hugging Face config's longest sequence bounds --longest-seq (a trace past it would be refused), read from
    the config where the formula does not answer."""
    from memlab.cli.trace import _positions

    cfg = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    argv = ["trace", "--hf", str(path), "--batch", "1", "--seq", "16", "--gpu", "rtx-4090", "--gpu-memory-gib",
            "0.02", "--cuda-context-mib", "0", "--workspace-mib", "0", "--longest-seq", "--json"]
    assert cli.main(argv) == 0
    r = json.loads(capsys.readouterr().out)["max_seq"]
    assert 0 < r["value"] <= 64 and all(v <= 64 for v, *_ in r["tried"])
    assert _positions(cfg) == 64 and _positions({"max_position_embeddings": 4096, "n_positions": 9}) == 4096
    assert _positions({"hidden_size": 8}) is None and _positions({"n_ctx": True}) is None
