"""The argument checks of the traces: :func:`check_trace_arguments` for :func:`memlab.tracing.tracer.trace`'s
functions and flags, the ``checked_*_of`` checks of what those functions return, and :func:`check_trace_setup` for
the ``setup``/``device_type``/``fake`` that :func:`~memlab.tracing.gpt.trace_gpt` and
:func:`~memlab.tracing.hf.trace_hf` share. Each raises one :class:`~memlab.errors.SetupError` naming the argument,
before torch would raise a ``TypeError`` deep inside the step (or trace a step with no optimizer without a word).
:func:`user_call` runs one of the user's functions and turns what it raises (a batch whose shape the model does not
take, a real tensor reaching the fake mode, any bug of the function) into one :class:`~memlab.errors.SetupError`
naming the function and the way out (issue 34, point 5).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError, SetupError
from memlab.predict.spec.setup import Setup
from memlab.predict.spec.validate import check_bool

BNB_STAND_INS = ("adam-8bit", "paged-adamw", "paged-adam-8bit")
"""Optimizers a trace runs as memlab's stand-ins for bitsandbytes' (memlab.model.optimizers): plain tensors only."""


def check_trace_setup(setup: object, device_type: object, fake: object = True) -> None:
    """Raise :class:`SetupError` unless ``setup`` is a :class:`Setup`, ``device_type`` is ``"cpu"`` or ``"cuda"``
    (the device whose defaults a trace imitates: a device *type*, not ``"cuda:7"``) and ``fake`` is a bool."""
    if not isinstance(setup, Setup):
        raise SetupError(f"setup must be a memlab.predict.spec.setup.Setup, got {type(setup).__name__}: pass e.g. "
                         "Setup(batch=1, seq=1024)")
    if not isinstance(device_type, str) or device_type not in ("cpu", "cuda"):
        raise SetupError(f"device_type must be 'cpu' or 'cuda' (the device whose optimizer default a trace "
                         f"imitates; traces always run on CPU), got {device_type!r:.60}")
    check_bool("fake", fake, err=SetupError)
    if setup.activation_memory_budget < 1:  # the partitioner of a compiled graph: nothing eager code would run
        raise SetupError(f"activation_memory_budget={setup.activation_memory_budget} needs torch.compile (its "
                         "partitioner picks what to save in the compiled graph), which a trace of eager code does not "
                         "run: use recompute='op', 'full' (with recompute_every) or 'selective'")
    if setup.mode == "train" and setup.optimizer in BNB_STAND_INS and setup.zero_stage >= 2 and setup.world_size > 1:
        raise SetupError(f"optimizer={setup.optimizer!r} under FSDP2 (zero_stage {setup.zero_stage} over "
                         f"{setup.world_size} ranks): memlab's stand-in for bitsandbytes steps plain tensors, not "
                         "FSDP2's sharded DTensors: trace it on one rank (world_size=1), or trace adamw")
    if setup.ep > 1:  # every other trace runs all experts on every rank: it would not be an expert-parallel rank
        raise SetupError(f"ep={setup.ep}: trace expert parallelism with memlab.tracing.experts.trace_gpt_ep (this "
                         "trace holds every expert on every rank)")


def check_trace_arguments(**args: Any) -> None:
    """:func:`trace`'s arguments of the right kind, or one :class:`SetupError` naming the first that is not."""
    for key in ("model_fn", "batch_fn"):
        value = args[key]
        if isinstance(value, nn.Module | torch.Tensor) or not callable(value):
            what = "a module" if isinstance(value, nn.Module) else type(value).__name__
            raise SetupError(f"{key} must be a function that builds the {key[:-3]} inside the fake mode (lambda: ...), "
                             f"got {what}")
    for key in ("optimizer_fn", "loss_fn", "forward_context", "backward_fn"):
        value = args[key]
        if value is not None and (not callable(value) or isinstance(value, torch.optim.Optimizer | nn.Module)):
            raise SetupError(f"{key} must be a function or None, got {type(value).__name__}"
                             + (": pass lambda: <the context manager>" if key == "forward_context" else ""))
    for key in ("fake", "set_to_none"):
        if not isinstance(args[key], bool):
            raise SetupError(f"{key} must be True or False, got {args[key]!r:.60}")
    steps = args["grad_accum_steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise SetupError(f"grad_accum_steps must be a positive integer, got {steps!r:.60}")
    if not isinstance(args["name"], str):
        raise SetupError(f"name must be a string, got {type(args['name']).__name__}")
    if args["setup"] is not None and not isinstance(args["setup"], dict):
        raise SetupError(f"setup must be a dict (Setup.to_dict()) or None, got {type(args['setup']).__name__}")
    notes = args["notes"]
    if not isinstance(notes, tuple | list) or not all(isinstance(n, str) for n in notes):
        raise SetupError(f"notes must be a tuple of strings, got {notes!r:.60}")
    pairs = args["unreliable"]
    if not isinstance(pairs, tuple | list) or not all(
            isinstance(u, tuple | list) and len(u) == 2 and all(isinstance(x, str) for x in u) for u in pairs):
        raise SetupError(f"unreliable must be a tuple of (step, phase) pairs, e.g. (('first', 'optimizer step'),), "
                         f"got {pairs!r:.60}")


_REAL_IN_FAKE = "Please convert all Tensors to FakeTensors"
"""The start of the AssertionError torch's FakeTensorMode raises when a real tensor reaches an op inside it
(torch/_subclasses/fake_tensor.py, ``validate``)."""

_OUTSIDE = ("build every tensor inside model_fn, batch_fn and loss_fn, which run in the fake mode (lambda: "
            "torch.randn(...), not a tensor made before the call), or pass fake=False to trace real tensors")
"""The way out of a real tensor inside a fake trace."""


def _is_real(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(t, FakeTensor)


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line, at most 200 characters of the message (torch's messages can hold a
    tensor's repr over many lines)."""
    text = " ".join(str(exc).split()).rstrip(".")
    return f"{type(exc).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


def _shapes(batch: Any) -> str:
    """The shapes and dtypes of ``batch``'s tensors, e.g. ``(4, 5) float32``, for a message (at most four)."""
    from torch.utils._pytree import tree_leaves

    leaves = [x for x in tree_leaves(batch) if isinstance(x, torch.Tensor)]
    text = ", ".join(f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}" for x in leaves[:4])
    return text + (", ..." if len(leaves) > 4 else "")


def user_call(what: str, fn: Any, *args: Any, batch: Any = None, fix: str = "") -> Any:
    """``fn(*args)``, one of the user's functions (``what`` names it in messages: ``"batch_fn()"``), with what it
    raises turned into one :class:`SetupError` line naming the function and the way out (``fix``, default "fix"
    and the function's name):

    - torch's AssertionError for a real tensor inside the fake mode: build the tensors inside the functions;
    - a RuntimeError of the forward (``batch`` given: the model's call on it), almost always a batch whose shapes or
      dtypes the model does not take (a matmul's "a and b must have same reduction dim"): the batch's shapes said;
    - anything else: the function's own error, to fix there.

    memlab's own errors pass through, and so does torch's ``DataDependentOutputException``, which
    :func:`~memlab.tracing.tracer.trace_step` answers with its own line (a fake tensor has no values).
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException

    try:
        return fn(*args)
    except (MemlabError, DataDependentOutputException):
        raise
    except Exception as exc:  # the boundary with the user's code: one line, never a traceback into torch
        if isinstance(exc, AssertionError) and _REAL_IN_FAKE in str(exc):
            raise SetupError(f"{what} used a real tensor, made outside the trace: {_OUTSIDE}") from None
        if batch is not None and isinstance(exc, RuntimeError):
            raise SetupError(f"{what} failed on the batch ({_shapes(batch)}): {_one_line(exc)}: the batch's shapes "
                             "or dtypes do not fit the model; make batch_fn return what the model takes") from None
        fix = fix or f"fix {what.split('(')[0].strip()}"
        raise SetupError(f"{what} raised {_one_line(exc)}: {fix}; it runs inside the fake mode, on tensors with "
                         "shapes and dtypes but no values") from None


def checked_model_of(model: Any, fake: bool = False) -> nn.Module:
    """``model`` (what ``model_fn()`` returned) if it is an ``nn.Module``; with ``fake``, one whose parameters and
    buffers are fake tensors (a module built before the call holds real ones)."""
    if not isinstance(model, nn.Module):
        raise SetupError(f"model_fn() returned {type(model).__name__}, not a torch.nn.Module built inside the "
                         "function")
    real = next((n for n, t in (*model.named_parameters(), *model.named_buffers()) if fake and _is_real(t)), None)
    if real is not None:
        raise SetupError(f"model_fn() returned a module whose {real!r} is a real tensor, made outside the trace: "
                         "build the module inside model_fn (lambda: MyModel()), not before it, or pass fake=False")
    return model


def checked_optimizer_of(optimizer: Any) -> Any:
    """``optimizer`` (what ``optimizer_fn(model)`` returned) if it has ``step()`` and ``zero_grad()``; None is
    refused (``optimizer_fn=None`` is how a trace runs without one)."""
    if optimizer is None:
        raise SetupError("optimizer_fn returned None: return the optimizer (e.g. torch.optim.AdamW("
                         "model.parameters())), or pass optimizer_fn=None to trace forward and backward only")
    if not all(callable(getattr(optimizer, a, None)) for a in ("step", "zero_grad")):
        raise SetupError(f"optimizer_fn returned {type(optimizer).__name__}, which has no step() and "
                         "zero_grad(set_to_none): return a torch.optim.Optimizer or a wrapper with both")
    return optimizer


def checked_context_of(ctx: Any) -> contextlib.AbstractContextManager[Any]:
    """``ctx`` (what ``forward_context()`` returned) if it is a context manager."""
    if not (hasattr(ctx, "__enter__") and hasattr(ctx, "__exit__")):
        raise SetupError(f"forward_context() returned {type(ctx).__name__}, not a context manager: pass a "
                         "function that makes one (lambda: torch.autocast('cpu', torch.bfloat16))")
    return ctx


def checked_batch_of(batch: Any, fake: bool = False) -> Any:
    """``batch`` if it is a tensor or a (nested) tuple, list or dict of tensors: what the tracker can count; with
    ``fake``, fake tensors (a tensor made before the call and returned by ``batch_fn`` is real)."""
    from torch.utils._pytree import tree_leaves

    leaves = tree_leaves(batch)
    odd = next((x for x in leaves if not isinstance(x, torch.Tensor)), None)
    if batch is None or not leaves or odd is not None:
        got = type(batch).__name__ if odd is None else f"{type(odd).__name__} {odd!r:.40} inside it"
        raise SetupError(f"batch_fn() must return a tensor or a tuple, list or dict of tensors (the inputs the trace "
                         f"counts), got {got}")
    if fake and any(_is_real(x) for x in leaves):
        raise SetupError("batch_fn() returned a real tensor, made outside the trace: make the batch inside batch_fn "
                         "(lambda: torch.randn(4, 8)), which runs in the fake mode, or pass fake=False")
    return batch


def checked_phases_of(rows: list[Any], unreliable: tuple[tuple[str, str], ...]) -> list[Any]:
    """``rows`` (a trace's :class:`~memlab.predict.memory.phases.PhaseRow` list) if at least one is reliable: the
    peak is taken over those, and ``unreliable`` that names every phase leaves none."""
    if rows and not any(r.reliable for r in rows):
        ran = ", ".join(f"({r.step!r}, {r.phase!r})" for r in rows)
        raise SetupError(f"unreliable names every phase the step ran ({ran}), so the trace has no peak: leave at "
                         "least one (step, phase) pair out of unreliable")
    return rows


def checked_loss_of(loss: Any, where: str) -> torch.Tensor:
    """``loss`` if backward can run from it: a one-element tensor with a gradient."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise SetupError(f"{where} must give a scalar loss tensor, got {shape}: pass loss_fn=lambda model, batch: "
                         "... .mean()")
    if not loss.requires_grad:
        raise SetupError(f"{where} gave a loss with no gradient (requires_grad=False): compute it from the model's "
                         "output, so backward reaches the parameters")
    return loss
