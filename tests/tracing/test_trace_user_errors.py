"""Issue 34, point 5: memlab.trace of a user's module fails as cleanly as the CLI. A mistake in what the user's
functions do (a batch the model cannot take, a real tensor made outside the trace, a function that raises, every
phase marked unreliable) is one SetupError line naming the mistake and the way out: never torch's RuntimeError, the
fake mode's AssertionError, or a ValueError from max() of nothing."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import SetupError
from memlab.tracing.tracer import trace

from .test_trace_arguments import _batch, _loss, _model  # the same tiny Linear step

REAL_BATCH = torch.randn(4, 8)
REAL_MODEL = torch.nn.Linear(8, 8)
ALL_PHASES = tuple((step, phase) for step in ("first", "steady") for phase in ("forward", "backward"))


def _raise(*_: object) -> None:
    raise ZeroDivisionError("division by zero")


BASE = {"model_fn": _model, "batch_fn": _batch, "loss_fn": _loss}
MISTAKES: dict[str, tuple[dict, str]] = {
    "batch of the wrong shape": ({"batch_fn": lambda: torch.randn(4, 5)},
                                 r"loss_fn\(model, batch\) failed on the batch \(\(4, 5\) float32\): RuntimeError: .*"
                                 "make batch_fn return what the model takes"),
    "batch made outside the trace": ({"batch_fn": lambda: REAL_BATCH},
                                     r"batch_fn\(\) returned a real tensor, made outside the trace: make the batch "
                                     "inside batch_fn"),
    "module made outside the trace": ({"model_fn": lambda: REAL_MODEL},
                                      r"model_fn\(\) returned a module whose 'weight' is a real tensor.*inside "
                                      "model_fn"),
    "a real tensor captured by loss_fn": ({"loss_fn": lambda m, x: (m(x) - REAL_BATCH).square().mean()},
                                          r"loss_fn\(model, batch\) used a real tensor, made outside the trace: build "
                                          "every tensor inside"),
    "no phase reliable": ({"unreliable": ALL_PHASES},
                          r"unreliable names every phase the step ran \(\('first', 'forward'\).*leave at least one"),
    "batch_fn raises": ({"batch_fn": _raise}, r"batch_fn\(\) raised ZeroDivisionError: division by zero: fix "
                                              "batch_fn"),
    "model_fn raises": ({"model_fn": lambda: torch.nn.Linear(8)},  # type: ignore[call-arg]
                        r"model_fn\(\) raised TypeError: .*out_features.*: fix model_fn"),
    "loss_fn raises": ({"loss_fn": lambda m, x: m(x).no_such_method()},
                       r"loss_fn\(model, batch\) raised AttributeError: .*no_such_method.*: fix loss_fn"),
    "optimizer_fn raises": ({"optimizer_fn": _raise}, r"optimizer_fn\(model\) raised ZeroDivisionError"),
    "backward_fn raises": ({"backward_fn": _raise}, r"backward_fn\(loss\) raised ZeroDivisionError"),
    "forward_context raises": ({"forward_context": _raise}, r"forward_context\(\) raised ZeroDivisionError"),
    "default loss on a dict batch the model does not take": (
        {"loss_fn": None, "batch_fn": lambda: {"x": torch.randn(4, 8)}},
        r"the model's forward \(the default loss_fn\) raised TypeError: .*unexpected keyword argument 'x': pass "
        "loss_fn="),
    "a loss that is not a scalar": ({"loss_fn": lambda m, x: m(x)}, r"scalar loss tensor, got \(4, 8\)"),
    "a default loss that is not a scalar": ({"loss_fn": None}, "the model's output is not a scalar loss"),
}


@pytest.mark.parametrize("case", list(MISTAKES))
def test_a_mistake_is_one_setup_error_naming_it(case: str) -> None:
    override, message = MISTAKES[case]
    with pytest.raises(SetupError, match=message) as info:
        trace(**{**BASE, **override})
    assert "\n" not in str(info.value)
    error = info.value  # no chained torch traceback under the line
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def test_real_tensors_are_fine_with_fake_false() -> None:
    t = trace(**{**BASE, "batch_fn": lambda: REAL_BATCH}, fake=False)
    assert t.peak_bytes > 0


def test_a_partly_unreliable_trace_keeps_its_peak() -> None:
    t = trace(**BASE, unreliable=ALL_PHASES[:3])
    assert (t.peak_step, t.peak_phase) == ("steady", "backward")
