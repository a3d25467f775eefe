"""Trace one training step of any PyTorch model on fake tensors: the exact bytes PyTorch would hold, at full scale.

The model, its optimizer and a batch are built under ``torch._subclasses.fake_tensor.FakeTensorMode`` (tensors
with shapes and dtypes but no data: nothing is allocated), then two steps run under
``torch.distributed._tools.mem_tracker.MemTracker`` [pytorch-memtracker], which counts every storage by category
(parameters, buffers, gradients, optimizer states, activations, temporaries, inputs). memlab adds phases: the peak
*inside* forward, backward, the optimizer step and zero_grad, for the **first** step (optimizer state appears inside
it) and the **steady** one. The same code on real tensors (``fake=False``) is the check: tests assert fake == real
byte for byte.

Three ways in:

- :func:`memlab.tracing.gpt.trace_gpt` for the reference GPT under a :class:`~memlab.predict.spec.setup.Setup`;
- :func:`memlab.tracing.hf.trace_hf` for a Hugging Face causal LM built from its config (never a download);
- :func:`trace` for your own module::

    import torch
    from memlab.tracing.tracer import trace

    t = trace(
        model_fn=lambda: torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU(),
                                             torch.nn.Linear(16384, 4096)),
        batch_fn=lambda: torch.randn(64, 1024, 4096),
        optimizer_fn=lambda m: torch.optim.AdamW(m.parameters(), foreach=True),
        loss_fn=lambda m, x: m(x).square().mean(),
    )
    print(t.peak_bytes / 2**30, t.peak_phase)   # GiB and where the peak is, on a laptop
    t.to_frame()                                 # bytes by phase and category

Found when this was built (torch 2.13): the model must be built under a device context inside the fake mode;
a library that moves or casts parameters after creating them (peft's adapters, ``module.to(dtype)``) works because
:func:`movable_fake_parameters` lets ``Module._apply`` swap fake parameters (the fake mode's memo holds weak
references to them, and ``torch.utils.swap_tensors`` refuses a tensor with one); MemTracker's module statistics
are reset between the steps, frozen parameters get no gradient hook (:func:`fast_mem_tracker`), and fake ``cuda``
tensors abort in autograd on a CPU-only torch, so traces run on CPU; what CUDA adds that no trace sees is listed as
named terms with their sources (:data:`CUDA_TERMS`).

The tracker also logs every storage it books and drops, in order (:func:`allocation_log`, :attr:`Trace.allocations`):
what the CUDA caching allocator would be asked. :meth:`Trace.replay` runs that log through memlab's model of the
allocator (:mod:`memlab.predict.gpu`) for the reserved and active bytes a GPU would show, phase by phase; on CPU fake
tensors the replay's requested bytes are the trace's bytes exactly (tests/tracing/test_trace_allocations.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from copy import deepcopy
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import nn

from memlab.errors import SetupError
from memlab.model.hf import quant_state_tensors, quiet_logger
from memlab.model.step import Meter, Step, train_step
from memlab.predict.gpu.alloc_conf import AllocatorConfig, parse_alloc_conf
from memlab.predict.gpu.allocator import AllocationLog
from memlab.predict.gpu.replay import Replay, replay
from memlab.predict.memory.phases import PhaseRow, find_phase
from memlab.tracing.arguments import (
    check_trace_arguments,
    checked_batch_of,
    checked_context_of,
    checked_loss_of,
    checked_model_of,
    checked_optimizer_of,
    checked_phases_of,
    user_call,
)

CATEGORIES = ("parameters", "buffers", "gradients", "optimizer states", "activations", "temporaries", "inputs")
"""Trace categories, in display order (MemTracker's Parameter, Buffer, Gradient, Optstate, Activation, Temp,
Other; tensors made inside the optimizer step that do not survive it move from optimizer states to temporaries)."""

_FROM_TRACKER = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients", "Optstate":
                 "optimizer states", "Activation": "activations", "Temp": "temporaries", "Other": "inputs"}

CUDA_TERMS: tuple[dict[str, str], ...] = (
    {"term": "allocation rounding",
     "size": "every block rounded up to 512 B (requests up to 1 MiB share 2 MiB small-pool segments); modelled by "
             "Trace.replay() / memlab trace --gpu",
     "source": "PyTorch CUDACachingAllocator.cpp, kMinBlockSize = 512, kSmallSize = 1 MiB, kSmallBuffer = 2 MiB"},
    {"term": "caching allocator reserve and fragmentation",
     "size": "reserved - allocated, workload-dependent; modelled by Trace.replay() / memlab trace --gpu "
             "(memlab.predict.gpu: the allocator's rules replayed on the traced allocations)",
     "source": "torch.cuda.memory_stats(): reserved_bytes.all.peak - allocated_bytes.all.peak"},
    {"term": "CUDA context", "size": "254-426 MiB outside the allocator with lazy module loading (counted in the "
     "--gpu verdict, memlab.predict.gpu.device)",
     "source": "pytorch/pytorch#86509, #107667, #109888; unslothai/unsloth-zoo#1053"},
    {"term": "cuBLAS / cuBLASLt workspaces", "size": "8,519,680 B (32 MiB on sm90) + 1 MiB per (handle, stream), "
     "two handles in training (counted in the --gpu verdict); flash/efficient attention allocate their own scratch",
     "source": "PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp"},
)
"""What a CUDA run holds that a CPU trace cannot see: a ``--gpu`` verdict adds them (memlab.predict.gpu.device)."""


@dataclass(frozen=True)
class Trace:
    """Bytes one training step holds, from a traced step (fake or real tensors). Bytes throughout.

    ``phases``: one :class:`~memlab.predict.memory.phases.PhaseRow` per (step, phase) with ``peak_bytes`` (the most
    held at once inside the phase), ``end_bytes``, ``by_category`` (the categories at the phase's peak),
    ``end_by_category``
    and ``reliable``. ``peak_*`` is the largest reliable phase peak over both steps.
    ``modules``: per module of the steady step, ``activation_bytes`` its forward leaves behind for backward
    (MemTracker's post-forward minus pre-forward activations; parents include their children).
    """

    model: str
    setup: dict[str, Any]
    fake: bool
    phases: tuple[PhaseRow, ...]
    peak_bytes: int
    peak_phase: str
    peak_step: str
    peak_by_category: dict[str, int]
    modules: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    cuda_terms: tuple[dict[str, str], ...] = CUDA_TERMS
    torch_version: str = field(default=torch.__version__)
    host_bytes: int = 0
    """Bytes activation offload (``Setup.offload_activations``) copied to the host in the last forward; 0 without."""
    paged_bytes: int = 0
    """A paged optimizer's states (paged-adamw, paged-adam-8bit) held at the end: CUDA managed memory on a GPU,
    outside torch's allocator, so in no phase's bytes (:data:`PAGED_DEVICE`); the estimate's ``paged_bytes``."""
    allocations: AllocationLog = field(default=AllocationLog(), repr=False, compare=False)
    """Every storage the tracker saw made and freed, in order, with the phases' spans (:func:`allocation_log`): what
    the CUDA caching allocator would be asked; :meth:`replay` runs it through the allocator model. Not in
    :meth:`to_dict`."""

    def phase(self, name: str, step: str = "steady") -> PhaseRow:
        """The row of one phase of one step (``first`` or ``steady``;
        :func:`~memlab.predict.memory.phases.find_phase`)."""
        return find_phase(self.phases, name, step)

    def peak_of(self, step: str) -> int:
        """Largest (reliable) phase peak of the ``first`` or ``steady`` step."""
        return max(r.peak_bytes for r in self.phases if r.step == step and r.reliable)

    def components(self) -> dict[str, int]:
        """The steady step's bytes under the estimator's component names: ``params`` and ``optimizer`` held after
        zero_grad, ``grads`` held after the optimizer step, ``activations`` what the forward leaves alive (its
        activations and the token ids; the scalar loss and the labels included). Training traces only."""
        end = self.phase("zero_grad").end_by_category
        fwd = self.phase("forward").end_by_category
        return {"params": end["parameters"], "grads": self.phase("optimizer step").end_by_category["gradients"],
                "optimizer": end["optimizer states"], "activations": fwd["activations"] + fwd["inputs"]}

    def top_modules(self, n: int = 8, *, leaves_only: bool = True) -> list[dict[str, Any]]:
        """The ``n`` modules whose forward keeps the most bytes for backward (leaf modules by default)."""
        names = [m["module"] for m in self.modules]
        rows = [m for m in self.modules
                if not leaves_only or not any(o.startswith(m["module"] + ".") for o in names)]
        return sorted(rows, key=lambda m: -m["activation_bytes"])[:n]

    def modules_by_kind(self, n: int = 8) -> list[dict[str, Any]]:
        """Leaf modules grouped over their layer index (``GPT.blocks.*.mlp.up``): count and activation bytes summed,
        the ``n`` largest first."""
        import re

        groups: dict[str, dict[str, Any]] = {}
        for m in self.top_modules(len(self.modules)):
            key = re.sub(r"\.\d+(?=\.|$)", ".*", m["module"])
            g = groups.setdefault(key, {"module": key, "count": 0, "activation_bytes": 0})
            g["count"] += 1
            g["activation_bytes"] += m["activation_bytes"]
        return sorted(groups.values(), key=lambda g: -g["activation_bytes"])[:n]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field but :attr:`allocations` (the event log; :meth:`replay` reads it)."""
        return asdict(replace(self, allocations=AllocationLog()), dict_factory=_without_allocations)

    def replay(self, config: AllocatorConfig | str | None = None, *, capacity_bytes: int | None = None) -> Replay:
        """This step's allocations replayed through the CUDA caching allocator model
        (:func:`memlab.predict.gpu.replay.replay`): peak reserved, active and requested bytes, whole and per phase.
        ``config``: an :class:`~memlab.predict.gpu.alloc_conf.AllocatorConfig` or a ``PYTORCH_CUDA_ALLOC_CONF``
        string (torch's defaults when None). A model of the allocator run on the traced sizes, not a GPU
        measurement; on a trace with no log (a trace made before logs existed) it refuses in one line. Every event
        is replayed, those of phases the trace marks unreliable too (the allocator state runs through them), so
        the replay's whole-log peaks count them where :attr:`peak_bytes` leaves them out: read those phases' rows
        with their ``reliable`` flag."""
        if not self.allocations.events:
            raise SetupError("this trace has no allocation log to replay (trace it again with this memlab)")
        if not isinstance(config, AllocatorConfig):
            config = parse_alloc_conf(config)
        return replay(self.allocations, config, capacity_bytes=capacity_bytes)

    def to_frame(self) -> Any:
        """pandas DataFrame, one row per (step, phase): peak and end bytes and each category at the peak."""
        import pandas as pd

        rows = [{"step": r.step, "phase": r.phase, "peak_bytes": r.peak_bytes, "end_bytes": r.end_bytes,
                 **{c: r.by_category.get(c, 0) for c in CATEGORIES}} for r in self.phases]
        return pd.DataFrame(rows)


def _without_allocations(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {k: v for k, v in items if k != "allocations"}


# -- the phase recorder over MemTracker ------------------------------------------------------------------------
PAGED_DEVICE = torch.device("cpu", 1)
"""The device key under which the tracker books a paged optimizer's states (made under
:func:`memlab.model.optimizers.paged_allocation`): CUDA managed memory, outside torch's allocator, so outside every
phase's bytes; :attr:`Trace.paged_bytes` reads it. (bitsandbytes' paged states are themselves CPU-device tensors over
a managed pointer, ``F.get_paged``: a real run's tracker would book them under another device too.)"""


def _allocator_total(snap: dict[Any, dict[Any, int]]) -> int:
    """The bytes of a tracker snapshot on every device but :data:`PAGED_DEVICE` (what an allocator holds)."""
    return sum(int(d.get("Total", 0)) for dev, d in snap.items() if dev != PAGED_DEVICE)


def _categories(snap: dict[Any, dict[Any, int]]) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for dev, dev_snap in snap.items():
        if dev == PAGED_DEVICE:
            continue
        for key, value in dev_snap.items():
            name = _FROM_TRACKER.get(getattr(key, "value", str(key)))
            if name is not None:
                out[name] += int(value)
    return out


class PhaseRecorder(Meter):
    """A :class:`~memlab.model.step.Meter` that records one :class:`~memlab.predict.memory.phases.PhaseRow` per phase
    from a MemTracker (:func:`fast_mem_tracker`) into :attr:`rows`: peak and end bytes, in total and by
    :data:`CATEGORIES`. The tracker's global peak is re-based at each phase start (private fields of
    torch.distributed._tools.mem_tracker, stable since torch 2.5); its module statistics are reset before each
    forward (MemTracker keeps one call per module). Use ``with recorder.phase(step, name):`` around each phase."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.rows: list[PhaseRow] = []
        self.marks: list[tuple[str, str, int, int]] = []
        """(step, phase, first event, end event) of each phase in the tracker's ``events`` (:func:`allocation_log`)."""

    def _total(self, snap: dict[Any, dict[Any, int]]) -> int:
        return _allocator_total(snap)

    @contextlib.contextmanager
    def phase(self, step: str, name: str) -> Iterator[None]:
        """Record phase ``name`` of ``step`` (``first``/``steady``): append its row when the block ends."""
        mt = self.tracker
        if name.startswith("forward"):
            mt.reset_mod_stats()
        current = mt.get_tracker_snapshot("current")
        mt._peak_mem_snap = deepcopy(current)
        mt._peak_mem = {dev: int(d.get("Total", 0)) for dev, d in current.items()}
        events = getattr(mt, "events", ())
        first = len(events)
        yield
        self.marks.append((step, name, first, len(events)))
        end, peak = mt.get_tracker_snapshot("current"), mt.get_tracker_snapshot("peak")
        peak_total, end_total = self._total(peak), self._total(end)
        if end_total > peak_total:  # nothing dispatched after the last allocation (a peak is read per op)
            peak, peak_total = end, end_total
        by_cat, end_cat = _categories(peak), _categories(end)
        if name == "optimizer step":  # made in the step and freed before its end: temporaries, not states
            moved = max(0, by_cat["optimizer states"] - end_cat["optimizer states"])
            by_cat["optimizer states"] -= moved
            by_cat["temporaries"] += moved
        self.rows.append(PhaseRow(step, name, peak_total, end_bytes=end_total, by_category=by_cat,
                                  end_by_category=end_cat))


class _NoHook:
    """A removable handle that removes nothing (a frozen parameter's stand-in for MemTracker's gradient hooks)."""

    def remove(self) -> None:
        return None


_NO_HOOK = _NoHook()


MOD_TRACKER_WARNING = "The module hierarchy tracking maybe be messed up"
"""The UserWarning torch's ModTracker raises when a module's forward starts while it is open (mod_tracker.py
``_get_append_fn``: peft's wrappers re-enter modules); the byte counts do not depend on the module hierarchy."""


@contextlib.contextmanager
def quiet_mod_tracker() -> Iterator[None]:
    """Keep ModTracker's hierarchy warning (:data:`MOD_TRACKER_WARNING`) out of what memlab prints, and undo the
    global ``warnings.formatwarning`` the tracker installs before it warns, so later warnings print as before."""
    import warnings

    fmt = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MOD_TRACKER_WARNING, category=UserWarning)
        try:
            yield
        finally:
            warnings.formatwarning = fmt


def _track_paged(tracker: Any, reftype: Any, t: torch.Tensor) -> bool:
    """Inside :func:`memlab.model.optimizers.paged_allocation`, book ``t``'s new storages under :data:`PAGED_DEVICE`
    in ``tracker`` (a paged optimizer's state: managed memory, which no phase of the allocator holds) and return True;
    outside it, False (the tracker books ``t`` as usual). Relies on MemTracker's private ``_WINFO`` and
    ``_update_snap`` (torch 2.5+), as :func:`fast_mem_tracker` does."""
    from memlab.model.optimizers import paging

    if not paging():
        return False
    from torch.distributed._tools.common_utils import get_untyped_storages
    from torch.distributed._tools.mem_tracker import _UpdateType, _WeakRefInfo

    for st in get_untyped_storages(t):
        if tracker._WINFO.get(st, None) is None:
            winfo, w_st = _WeakRefInfo.create_winfo(st, PAGED_DEVICE, reftype, tracker._delete_callback)
            tracker._WINFO[st] = (winfo, w_st)
            if winfo.mem_consumed > 0:
                tracker._update_snap(_UpdateType.ADD, winfo)
    return True


class _AllocationEvents:
    """A MemTracker mixin that logs, in :attr:`events`, every storage the tracker books (``(key, bytes)``) and drops
    (``(key,)``; a resize is both), but a paged optimizer's (:data:`PAGED_DEVICE`): :func:`allocation_log`. Hooks
    ``MemTracker._update_snap`` (private, torch 2.5+), through which every booking goes; the key is the tracker's
    record of the storage (``id`` of its ``_WeakRefInfo``, unique while the storage lives)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from torch.distributed._tools.mem_tracker import _UpdateType

        super().__init__(*args, **kwargs)
        self.events: list[tuple[int, int] | tuple[int]] = []
        self._kinds = (_UpdateType.ADD, _UpdateType.DEL, _UpdateType.SIZE)

    def _update_snap(self, u_type: Any, winfo: Any, old_mem_consumed: int | None = None,
                     old_reftype: Any = None) -> None:
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)  # type: ignore[misc]
        add, delete, resize = self._kinds
        if u_type is add:
            if winfo.device != PAGED_DEVICE:
                self.events.append((id(winfo), winfo.mem_consumed))
        elif u_type is delete:
            if winfo.device != PAGED_DEVICE:
                self.events.append((id(winfo),))
        elif u_type is resize and winfo.device != PAGED_DEVICE:
            if old_mem_consumed:
                self.events.append((id(winfo),))
            if winfo.mem_consumed:
                self.events.append((id(winfo), winfo.mem_consumed))


def fast_mem_tracker() -> Any:
    """A new ``torch.distributed._tools.mem_tracker.MemTracker`` whose per-op peak update visits only the modules
    running now (the stock one walks every module it has seen on every op: half of a 7B trace's time) and copies a
    new peak's snapshot shallowly (its deepcopy of a category -> int map took a tenth of the rest). Same numbers;
    relies on its private fields (torch 2.5+). Enter it (``with tracker:``) around the traced work."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker

    class FastMemTracker(_AllocationEvents, MemTracker):
        _by_fqn: dict[str, Any]
        _seen = -1
        _quiet: tuple[contextlib.ExitStack, ...] = ()  # one per open ``with`` (the tracker is re-entrant)

        def __enter__(self) -> Any:
            quiet = contextlib.ExitStack()
            quiet.enter_context(quiet_mod_tracker())
            self._quiet = (*self._quiet, quiet)
            return super().__enter__()

        def __exit__(self, *args: Any) -> None:
            try:
                super().__exit__(*args)
            finally:
                *rest, quiet = self._quiet
                self._quiet = tuple(rest)
                quiet.close()

        def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True) -> Any:
            # The stock tracker registers a gradient hook on every parameter of a module it enters, and
            # Tensor.register_hook raises on a frozen one ("cannot register a hook on a tensor that doesn't require
            # gradient"): a frozen parameter (peft's base weights, a frozen layer) gets a no-op handle pair instead,
            # so it is counted as a parameter and never waits for a gradient it will not have.
            if install_grad_hooks:
                handles = self._param_to_grad_hook_handles
                for param in module.parameters():
                    if not param.requires_grad and handles.get(param, None) is None:
                        handles[param] = (_NO_HOOK, _NO_HOOK)
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _track(self, reftype: Any, t: torch.Tensor) -> None:
            if not _track_paged(self, reftype, t):
                super()._track(reftype, t)

        def _update_peak_stats(self, peak_state: Any) -> None:  # dict(snap): a category -> int map, as deepcopy
            curr = self._curr_mem_snap
            if self._seen != len(self.memory_tracking):
                self._by_fqn = {st.mod_fqn: st for st in self.memory_tracking.values()}
                self._seen = len(self.memory_tracking)
            for fqn in self._mod_tracker.parents:
                stats = self._by_fqn.get(fqn)
                snaps = None if stats is None else stats.snapshots.get(peak_state)
                if snaps is None:
                    continue
                for dev, dev_snap in curr.items():
                    total = dev_snap[_TOTAL_KEY]
                    if stats.local_peak.get(dev, 0) < total:
                        stats.local_peak[dev] = total
                        snaps[-1][dev] = dict(dev_snap)
            for dev, dev_snap in curr.items():
                total = dev_snap[_TOTAL_KEY]
                if self._peak_mem.get(dev, 0) < total:
                    self._peak_mem[dev] = total
                    self._peak_mem_snap[dev] = dict(dev_snap)

    return FastMemTracker()


def allocation_log(tracker: Any, recorder: PhaseRecorder, source: str = "") -> AllocationLog:
    """The :class:`~memlab.predict.gpu.allocator.AllocationLog` of a traced run: the storages ``tracker`` (a
    :func:`fast_mem_tracker`) booked and dropped, in order (a storage's key is its tracker record's ``id``, unique
    while it lives), and each phase ``recorder`` timed as its span of events. Storages that existed before the
    tracker (the model's parameters, the optimizer, the batch) come first, as allocations in the order
    ``track_external`` books them; their creation order and anything freed before it is not seen."""
    return AllocationLog(tuple(getattr(tracker, "events", ())), tuple(recorder.marks), source)


def module_rows(tracker: Any) -> tuple[dict[str, Any], ...]:
    """One row per module a MemTracker saw run forward (its last call): ``module`` (the qualified name),
    ``activation_bytes`` (activations after its forward minus before: what it leaves for backward; parents include
    their children), ``peak_forward_bytes`` and ``peak_backward_bytes`` (all bytes held at its forward's and
    backward's peak). Bytes; :attr:`Trace.modules` holds them."""
    from torch.distributed._tools.mem_tracker import _ModState

    out = []
    for stats in tracker.memory_tracking.values():
        snaps = stats.snapshots
        pre, post = snaps.get(_ModState.PRE_FW), snaps.get(_ModState.POST_FW)
        if not pre or not post:
            continue
        act = _categories(post[-1])["activations"] - _categories(pre[-1])["activations"]
        peak_fw = _allocator_total(snaps.get(_ModState.PEAK_FW, [{}])[-1])
        peak_bw = _allocator_total(snaps.get(_ModState.PEAK_BW, [{}])[-1])
        out.append({"module": stats.mod_fqn, "activation_bytes": act, "peak_forward_bytes": peak_fw,
                    "peak_backward_bytes": peak_bw})
    return tuple(out)


def default_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """The scalar loss of ``model`` on ``batch``: ``model(**batch)`` for a dict, ``model(*batch)`` for a tuple, else
    ``model(batch)``; the output's ``.loss`` when it has one (Hugging Face), else the output itself, which must be a
    one-element tensor (SetupError otherwise)."""
    out = model(**batch) if isinstance(batch, dict) else model(*batch) if isinstance(batch, tuple) else model(batch)
    loss = getattr(out, "loss", None)
    if loss is None:
        loss = out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise SetupError("the model's output is not a scalar loss: pass loss_fn=lambda model, batch: ...")
    return loss


@dataclass
class _UserStep:
    """:func:`trace`'s arguments as the :class:`~memlab.model.step.Step` that :func:`train_step` runs."""

    optimizer: Any
    context: Callable[[], contextlib.AbstractContextManager[Any]]
    backward_fn: Callable[[torch.Tensor], None] | None
    set_to_none: bool
    grad_accum_steps: int

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return self.context()

    def backward(self, loss: torch.Tensor) -> None:
        user_call("backward_fn(loss)" if self.backward_fn else "the backward (loss.backward())",
                  self.backward_fn or torch.Tensor.backward, loss)

    def step(self) -> None:
        user_call("optimizer.step()", self.optimizer.step)

    def zero_grad(self) -> None:
        user_call("optimizer.zero_grad()", lambda: self.optimizer.zero_grad(set_to_none=self.set_to_none))

    def state_holder(self) -> Any:
        return self.optimizer


@contextlib.contextmanager
def movable_fake_parameters(mode: Any) -> Iterator[None]:
    """Inside ``mode`` (a FakeTensorMode), let ``nn.Module.to()``/``_apply`` replace fake parameters.

    ``Module._apply`` swaps a fake parameter with its converted copy through ``torch.utils.swap_tensors``, which
    refuses any tensor with a weak reference, and the fake mode's meta converter keeps one to every fake parameter
    in its memo (``tensor_memo``, a WeakValueDictionary): so peft's ``_move_adapter_to_device_of_base_layer`` fails
    with "_apply(): Couldn't swap Linear.weight". This drops the two tensors' memo entries just before each swap
    (the memo only saves re-converting a tensor; nothing here converts real tensors) and restores the function
    after. Bytes are untouched: the swap itself is torch's.
    """
    import torch.utils as tutils

    original = tutils.swap_tensors
    memo = getattr(getattr(getattr(mode, "fake_tensor_converter", None), "meta_converter", None), "tensor_memo", None)

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        if memo is not None:
            for key in [k for k, v in memo.items() if v is t1 or v is t2]:
                del memo[key]
        original(t1, t2)

    tutils.swap_tensors = swap
    try:
        yield
    finally:
        tutils.swap_tensors = original


def _run(mode: Any, model_fn: Callable[[], nn.Module], batch_fn: Callable[[], Any], step_fn: Callable[[nn.Module], Any],
         loss_fn: Any) -> tuple[list[PhaseRow], tuple[dict[str, Any], ...], int, int, AllocationLog]:
    """The two traced steps of :func:`trace_step`: (phase rows, module rows, bytes offloaded to the host, a paged
    optimizer's managed bytes, the allocation log)."""
    movable = movable_fake_parameters(mode) if not isinstance(mode, contextlib.nullcontext) \
        else contextlib.nullcontext()
    with mode, torch.device("cpu"):
        with movable:
            model = model_fn()
            step = step_fn(model)
        batch = batch_fn()
        tracker = fast_mem_tracker()
        optimizer = step.state_holder()
        inner = getattr(optimizer, "optimizer", optimizer)  # a master-weight wrapper holds the torch optimizer
        tracker.track_external(model, *(o for o in (inner,) if isinstance(o, torch.optim.Optimizer)), batch)
        from torch.distributed._tools.mem_tracker import _MemRefType

        for t in quant_state_tensors(model):  # a 4-bit base's constants: no parameters, but part of the weights
            tracker._update_and_maybe_create_winfos(t, _MemRefType.PARAM)
        extra = getattr(optimizer, "memlab_state_tensors", None)
        if callable(extra):  # a wrapper's master copy and fp32 buffers: optimizer states and gradients

            for role, tensors in extra().items():
                kind = _MemRefType.GRAD if role == "grads" else _MemRefType.OPT
                for t in tensors:
                    tracker._update_and_maybe_create_winfos(t, kind)
        rec = PhaseRecorder(tracker)
        update = optimizer is not None
        with tracker:
            for label in ("first", "steady"):
                train_step(step, lambda: loss_fn(model, batch), meter=rec, label=label, optimizer_step=update,
                           zero_grad=update)
            modules = module_rows(tracker)  # the steady step's (last) micro-batch
            paged = int(tracker.get_tracker_snapshot("current").get(PAGED_DEVICE, {}).get("Total", 0))
    offload = getattr(step, "offload", None)  # activation offload's books: what the last forward copied to the host
    log = allocation_log(tracker, rec, "fake-tensor trace" if not isinstance(mode, contextlib.nullcontext)
                         else "real-tensor trace (CPU)")
    return rec.rows, modules, (offload.host_bytes if offload is not None else 0), paged, log


def trace_step(model_fn: Callable[[], nn.Module], batch_fn: Callable[[], Any], step_fn: Callable[[nn.Module], Step],
               *, loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None, fake: bool = True,
               name: str = "model", setup: dict[str, Any] | None = None, notes: tuple[str, ...] = (),
               unreliable: tuple[tuple[str, str], ...] = ()) -> Trace:
    """Trace two :func:`~memlab.model.step.train_step` calls of ``step_fn(model_fn())`` on ``batch_fn()``: what
    :func:`trace` and the GPT and HF traces run. ``step_fn`` returns the step (a
    :class:`~memlab.model.step.TrainingStep`, with ``state_holder()`` giving the optimizer or None for no update);
    the other arguments are :func:`trace`'s."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    loss_fn = loss_fn or default_loss
    mode = FakeTensorMode(allow_non_fake_inputs=False) if fake else contextlib.nullcontext()
    try:
        rows, modules, host, paged, log = _run(mode, model_fn, batch_fn, step_fn, loss_fn)
    except DataDependentOutputException as exc:
        raise SetupError(f"the step reads a tensor's value ({exc.func}), which a fake tensor does not have (e.g. "
                         "torch.optim.Adafactor's for-loop, a loss scaler's finite check): trace with fake=False at "
                         "a small shape, or use an implementation without data-dependent control flow") from None
    rows = checked_phases_of([replace(r, reliable=(r.step, r.phase) not in unreliable) for r in rows], unreliable)
    best = max((r for r in rows if r.reliable), key=lambda r: r.peak_bytes)
    return Trace(model=name, setup=dict(setup or {}), fake=fake, phases=tuple(rows), peak_bytes=best.peak_bytes,
                 peak_phase=best.phase, peak_step=best.step, peak_by_category=dict(best.by_category),
                 modules=modules, notes=tuple(notes), host_bytes=host, paged_bytes=paged, allocations=log)


# -- the generic tracer ----------------------------------------------------------------------------------------
def trace(model_fn: Callable[[], nn.Module], batch_fn: Callable[[], Any],
          optimizer_fn: Callable[[nn.Module], Any] | None = None, *,
          loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
          forward_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
          backward_fn: Callable[[torch.Tensor], None] | None = None, fake: bool = True, grad_accum_steps: int = 1,
          set_to_none: bool = True, name: str = "model", setup: dict[str, Any] | None = None,
          notes: tuple[str, ...] = (), unreliable: tuple[tuple[str, str], ...] = ()) -> Trace:
    """Trace two training steps of ``model_fn()`` on ``batch_fn()`` with ``optimizer_fn(model)`` (module docstring).

    ``model_fn``/``batch_fn``/``optimizer_fn`` run inside the fake mode and a ``torch.device("cpu")`` context, so
    build tensors there (never ``.to()`` a fake parameter). ``loss_fn(model, batch)`` returns the scalar loss
    (default: ``model(**batch).loss`` for a dict, ``model(*batch)`` for a tuple, else ``model(batch)``).
    ``forward_context`` (e.g. autocast), ``backward_fn`` (e.g. a loss scaler) and ``optimizer_fn`` returning an
    object with ``step()`` and ``zero_grad(set_to_none)`` cover precision wrappers. ``fake=False`` runs the same on
    real CPU tensors (the check). Each step runs ``grad_accum_steps`` micro-batches before the optimizer step.
    ``unreliable`` (step, phase) pairs are kept in ``phases`` with ``reliable=False`` and left out of the peak.
    ``optimizer_fn=None`` traces forward and backward only; an ``optimizer_fn`` that returns None is refused. An
    argument of the wrong kind, or a function returning the wrong kind (a model that is no ``nn.Module``, a batch
    that is no tensor or tuple/list/dict of tensors, a loss that is no scalar tensor with a gradient, a context that
    is no context manager), raises one :class:`SetupError` naming the argument; so does anything one of the
    functions raises (:func:`~memlab.tracing.arguments.user_call`: a batch whose shapes the model does not take, a
    real tensor made outside the trace, the function's own bug) and an ``unreliable`` naming every phase.
    """
    check_trace_arguments(model_fn=model_fn, batch_fn=batch_fn, optimizer_fn=optimizer_fn, loss_fn=loss_fn,
                          forward_context=forward_context, backward_fn=backward_fn, fake=fake,
                          grad_accum_steps=grad_accum_steps, set_to_none=set_to_none, name=name, setup=setup,
                          notes=notes, unreliable=unreliable)
    user_loss = loss_fn or default_loss
    context = forward_context or contextlib.nullcontext
    forward = "loss_fn(model, batch)" if loss_fn is not None else "the model's forward (the default loss_fn)"
    fix = "" if loss_fn is not None else "pass loss_fn=lambda model, batch: <a scalar loss>, calling the model right"

    def checked_model() -> nn.Module:
        return checked_model_of(user_call("model_fn()", model_fn), fake)

    def checked_batch() -> Any:
        return checked_batch_of(user_call("batch_fn()", batch_fn), fake)

    def checked_loss(model: nn.Module, batch: Any) -> torch.Tensor:
        return checked_loss_of(user_call(forward, user_loss, model, batch, batch=batch, fix=fix),
                               "loss_fn" if loss_fn is not None else "the model's output")

    def checked_context() -> contextlib.AbstractContextManager[Any]:
        return checked_context_of(user_call("forward_context()", context))

    def step_fn(model: nn.Module) -> _UserStep:
        optimizer = None
        if optimizer_fn is not None:
            optimizer = checked_optimizer_of(user_call("optimizer_fn(model)", optimizer_fn, model))
        return _UserStep(optimizer, checked_context, backward_fn, set_to_none, grad_accum_steps)

    with quiet_logger("torch._subclasses.fake_tensor", logging.CRITICAL):  # torch logs a failing kernel's traceback
        return trace_step(checked_model, checked_batch, step_fn, loss_fn=checked_loss, fake=fake, name=name,
                          setup=setup, notes=tuple(notes), unreliable=tuple(tuple(u) for u in unreliable))

