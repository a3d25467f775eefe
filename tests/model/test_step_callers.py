"""Every caller of the one training step loop (memlab.model.step.train_step) honours every Setup field that changes a
step: the optimizer implementation, what zero_grad does, gradient accumulation (or a SetupError), the precision
policy. A spy wraps train_step in each caller's module and the TrainingStep methods, and records what each step
did: the optimizer's ``foreach`` flag, autocast inside the forward, the model's dtype, the gradients after every
zero_grad and the backward passes before each optimizer step."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from memlab.errors import SetupError
from memlab.model import step as step_mod
from memlab.model.step import MasterWeights, TrainingStep, model_dtype
from memlab.predict.spec.model import preset
from memlab.predict.spec.setup import Setup

TINY = preset("tiny-gpt")
CALLER_MODULES = ("memlab.model.step", "memlab.tracing.tracer", "memlab.run.runner", "memlab.run.live_steps",
                  "memlab.run.op_profile", "memlab.run.hf", "memlab.run.distributed.worker")


class Spy:
    """What every TrainingStep did while the spy was on, and how many train_step calls ran."""

    def __init__(self) -> None:
        self.train_steps = 0
        self.steps: dict[int, dict[str, Any]] = {}

    def of(self, step: TrainingStep) -> dict[str, Any]:
        return self.steps.setdefault(id(step), {"step": step, "calls": [], "autocast": [], "after_zero_grad": [],
                                                "backwards_per_update": []})


def _params(step: TrainingStep) -> list[torch.Tensor]:
    opt = step.optimizer
    if isinstance(opt, MasterWeights):
        return list(opt.params)
    return [p for group in opt.param_groups for p in group["params"]]


def _inner(step: TrainingStep) -> torch.optim.Optimizer:
    opt = step.optimizer
    return opt.optimizer if isinstance(opt, MasterWeights) else opt


def _grads(step: TrainingStep) -> str:
    grads = [p.grad for p in _params(step)]
    if all(g is None for g in grads):
        return "none"
    if all(g is not None and not g.any() for g in grads):
        return "zeros"
    return "kept"


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    s = Spy()
    original = step_mod.train_step

    def counting(*args: Any, **kwargs: Any) -> None:
        s.train_steps += 1
        original(*args, **kwargs)

    for name in CALLER_MODULES:
        module = importlib.import_module(name)
        if hasattr(module, "train_step"):
            monkeypatch.setattr(module, "train_step", counting)

    fwd, bwd, upd, zero = (TrainingStep.forward_context, TrainingStep.backward, TrainingStep.step,
                           TrainingStep.zero_grad)

    @contextlib.contextmanager
    def forward_context(self: TrainingStep) -> Iterator[None]:
        rec = s.of(self)
        rec["calls"].append("forward")
        with fwd(self):
            rec["autocast"].append(torch.is_autocast_enabled("cpu"))
            yield

    def backward(self: TrainingStep, loss: torch.Tensor) -> None:
        s.of(self)["calls"].append("backward")
        bwd(self, loss)

    def update(self: TrainingStep) -> None:
        rec = s.of(self)
        since = rec["calls"][::-1].index("step") if "step" in rec["calls"] else len(rec["calls"])
        rec["backwards_per_update"].append(rec["calls"][len(rec["calls"]) - since:].count("backward"))
        rec["calls"].append("step")
        upd(self)

    def zero_grad(self: TrainingStep, *args: Any, **kwargs: Any) -> None:
        rec = s.of(self)
        rec["calls"].append("zero_grad")
        zero(self, *args, **kwargs)
        rec["after_zero_grad"].append(_grads(self))

    monkeypatch.setattr(TrainingStep, "forward_context", forward_context)
    monkeypatch.setattr(TrainingStep, "backward", backward)
    monkeypatch.setattr(TrainingStep, "step", update)
    monkeypatch.setattr(TrainingStep, "zero_grad", zero_grad)
    return s


def _runner(setup: Setup) -> None:
    from memlab.run.runner import run_step

    run_step(TINY, setup, "cpu", steps=1, with_mfu=False)  # first, steady, timed steps and the FLOP count


def _trace(setup: Setup) -> None:
    from memlab.tracing.gpt import trace_gpt

    trace_gpt(TINY, setup, fake=False, device_type="cpu")


def _live(setup: Setup) -> None:
    from memlab.run.live_steps import live_training_steps

    live_training_steps(TINY, setup, steps=2)


def _profile(setup: Setup) -> None:
    from memlab.run.op_profile import profile_step

    profile_step(TINY, setup, "cpu")


def _step_time(setup: Setup) -> None:
    from memlab.labs.step_time import training_loop
    from memlab.measure.machine import detect

    training_loop(TINY, setup, "cpu", steps=1, accelerator=detect(measure_cpu_peak=False, device="cpu"))


CALLERS: dict[str, Callable[[Setup], None]] = {"runner": _runner, "trace": _trace, "live steps": _live,
                                               "op_profile": _profile, "step_time": _step_time}
ACCUMULATES = {"trace"}  # the others measure one micro-batch per step and refuse grad_accum_steps > 1

CASES = [
    Setup(batch=2, seq=16, precision="fp32", optimizer_impl="foreach", zero_grad_to_none=True),
    Setup(batch=2, seq=16, precision="fp32", optimizer_impl="for-loop", zero_grad_to_none=False),
    Setup(batch=2, seq=16, precision="amp-bf16", optimizer_impl="for-loop", zero_grad_to_none=True),
    Setup(batch=2, seq=16, precision="mixed-bf16", optimizer_impl="foreach", zero_grad_to_none=False),
    Setup(batch=2, seq=16, precision="fp32", optimizer_impl="for-loop", grad_accum_steps=2),
]


def _case_id(s: Setup) -> str:
    return f"{s.precision}-{s.optimizer_impl}-none{s.zero_grad_to_none}-accum{s.grad_accum_steps}"


def _check(spy: Spy, setup: Setup, *, accum: int) -> None:
    assert spy.train_steps > 0, "the caller did not run memlab.model.step.train_step"
    records = [r for r in spy.steps.values() if r["calls"]]
    assert records, "no TrainingStep ran"
    for rec in records:
        step: TrainingStep = rec["step"]
        assert step.policy.name == setup.precision
        assert {p.dtype for p in _params(step)} == {model_dtype(setup.policy)}
        assert isinstance(step.optimizer, MasterWeights) == bool(setup.policy.master_bytes)
        assert _inner(step).defaults["foreach"] is (setup.optimizer_impl == "foreach")
        assert rec["autocast"] and set(rec["autocast"]) == {setup.policy.autocast}
        assert rec["after_zero_grad"] and set(rec["after_zero_grad"]) == {"none" if setup.zero_grad_to_none
                                                                           else "zeros"}
        assert rec["backwards_per_update"] and set(rec["backwards_per_update"]) == {accum}


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("setup", CASES, ids=_case_id)
def test_every_caller_honours_every_setup_field_that_changes_a_step(spy: Spy, caller: str, setup: Setup) -> None:
    if setup.grad_accum_steps != 1 and caller not in ACCUMULATES:
        with pytest.raises(SetupError, match="grad_accum_steps=1"):
            CALLERS[caller](setup)
        return
    CALLERS[caller](setup)
    _check(spy, setup, accum=setup.grad_accum_steps)


@pytest.mark.parametrize("caller", ["runner", "live steps", "op_profile", "step_time"])
@pytest.mark.parametrize("setup", [Setup(batch=2, seq=16, zero_stage=1, world_size=2), Setup(batch=2, seq=16, tp=2)],
                         ids=["zero1-ws2", "tp2"])
def test_single_process_callers_refuse_what_one_process_cannot_run(caller: str, setup: Setup) -> None:
    with pytest.raises(SetupError, match="torchrun"):
        CALLERS[caller](setup)


@pytest.mark.parametrize("autocast", [False, True])
def test_the_hf_run_is_one_train_step_with_its_autocast(spy: Spy, autocast: bool) -> None:
    pytest.importorskip("transformers")
    from memlab.run.hf import run_hf

    path = Path(__file__).resolve().parents[2] / "memlab" / "predict" / "families" / "configs" / "tiny" / "gpt2.json"
    config = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    run_hf(config, attn_implementation="eager", dtype="fp32", batch=2, seq=16, autocast=autocast)
    assert spy.train_steps == 1
    (rec,) = [r for r in spy.steps.values() if r["calls"]]
    assert rec["calls"] == ["forward", "backward", "step", "zero_grad"]
    assert rec["autocast"] == [autocast] and rec["after_zero_grad"] == ["none"]
    assert rec["step"].policy.name == ("amp-bf16" if autocast else "fp32")


def test_the_torchrun_worker_runs_train_step_in_process(spy: Spy) -> None:
    """One gloo rank in this process: DDP over the reference GPT, fp32 and AdamW's for-loop, gradients freed."""
    import torch.distributed as dist

    from memlab.run.distributed.worker import run_strategy

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        spec = {"config": dataclasses.asdict(TINY), "batch": 2, "seq": 16, "steps": 2}
        row = run_strategy("ddp", spec, 0, 1, torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    assert row["status"] == "ok" and row["grads_bytes"] == row["params_bytes"] and row["step_time_s"] > 0
    assert spy.train_steps == 2
    (rec,) = [r for r in spy.steps.values() if r["calls"]]
    assert rec["calls"] == ["forward", "backward", "step", "zero_grad"] * 2
    assert _inner(rec["step"]).defaults["foreach"] is False and set(rec["after_zero_grad"]) == {"none"}
