"""Exact byte accounting, independent of the device.

Two things are counted here, both deduplicated by storage (two views of one buffer count once):

- model states: parameters, gradients and optimizer state of a model and its optimizer, including sharded
  tensors (a DTensor counts its local shard, ``to_local()``; FSDP1 flat parameters count their flat storage);
- activations saved for backward, recorded with ``torch.autograd.graph.saved_tensors_hooks`` while a forward
  pass runs. Parameters and module buffers are excluded (they are model state, not activations). Non-reentrant
  ``torch.utils.checkpoint`` saves its inputs through the same hooks, so recompute policies are counted too.

On a CPU these counts are the measured truth (there is no allocator to ask). On CUDA they sit beside the
allocator's numbers; the difference is what the allocator adds (cache, fragmentation, workspaces).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    import pandas as pd


def storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    """A key that is equal for all views of one live storage (None for empty or meta tensors)."""
    if t.device.type == "meta":
        return None
    st = t.untyped_storage()
    if st.nbytes() == 0:
        return None
    return (str(t.device), st.data_ptr())


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage this rank holds: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def unique_storage_bytes(tensors: Iterable[torch.Tensor], device: torch.device | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and aliases counted once).

    With ``device``, only storages on that device count (an optimizer's CPU step counters are not GPU memory).
    """
    return _count_new(tensors, set(), device)


def _count_new(tensors: Iterable[torch.Tensor | None], seen: set[tuple[str, int]], device: torch.device | None) -> int:
    """Bytes of the storages behind ``tensors`` not yet in ``seen`` (which is updated), on ``device`` if given."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = _local(t)
        key = storage_key(t)
        if key is None or key in seen or not _on(t, device):
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def _on(t: torch.Tensor, device: torch.device | None) -> bool:
    if device is None:
        return True
    return t.device.type == device.type and (device.index is None or t.device.index in (None, device.index))


def _state_tensors(state: Any) -> Iterator[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for v in state.values():
            yield from _state_tensors(v)
    elif isinstance(state, list | tuple):
        for v in state:
            yield from _state_tensors(v)


@dataclass(frozen=True)
class ModelStates:
    """Bytes of a model's persistent training state on this rank, by storage.

    ``optimizer_by_key`` splits optimizer state by its state-dict key (``exp_avg``, ``exp_avg_sq``, ``step``,
    ``momentum_buffer``, ...), plus ``master`` for fp32 master weights and ``master_grad`` for fp32 gradient
    buffers kept by a mixed-precision wrapper.
    """

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    buffers_bytes: int
    optimizer_by_key: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """params + grads + optimizer (buffers are reported but not part of the three-way split)."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def to_dict(self) -> dict[str, object]:
        return {
            "params_bytes": self.params_bytes,
            "grads_bytes": self.grads_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "buffers_bytes": self.buffers_bytes,
            "total_bytes": self.total_bytes,
            **{f"optimizer_{k}_bytes": v for k, v in self.optimizer_by_key.items()},
        }


def optimizer_state_bytes(
    optimizer: Any, exclude: Iterable[torch.Tensor] = (), device: torch.device | None = None
) -> dict[str, int]:
    """Bytes of optimizer state by key, deduplicated by storage; ``exclude`` storages (the params) are skipped.

    Works for any ``torch.optim.Optimizer`` (its ``state`` dict), ``ZeroRedundancyOptimizer`` (the state of this
    rank's partition, held by its ``optim``) and for wrappers that expose
    ``memlab_state_tensors()`` returning ``{key: [tensors]}`` (memlab's master-weight wrapper does; its
    ``grads`` key, fp32 buffers that replace the 16-bit gradients, is reported here too and counted as
    gradients by :func:`model_states`). With ``device``, only storages on that device count.
    """
    seen = {k for t in exclude if (k := storage_key(_local(t))) is not None}
    groups: dict[str, list[torch.Tensor]] = {}
    extra = getattr(optimizer, "memlab_state_tensors", None)
    if callable(extra):
        for key, tensors in extra().items():
            groups.setdefault(key, []).extend(tensors)
    # Wrappers hold the real optimizer: memlab's MasterWeights as ``optimizer``, torch's ZeroRedundancyOptimizer
    # its local shard's optimizer as ``optim`` (its own ``state`` stays empty).
    inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "optim", None) or optimizer
    for per_param in getattr(inner, "state", {}).values():
        for key, value in per_param.items():
            groups.setdefault(str(key), []).extend(_state_tensors(value))
    return {key: _count_new(tensors, seen, device) for key, tensors in groups.items()}


def model_states(model: nn.Module, optimizer: Any = None, *, device: torch.device | None = None) -> ModelStates:
    """Exact bytes of parameters, their gradients, optimizer state and buffers on this rank.

    ``device`` restricts the count to storages on that device (None: every device).
    """
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    by_key = optimizer_state_bytes(optimizer, params + grads, device) if optimizer is not None else {}
    wrapper_grads = by_key.pop("grads", 0)
    return ModelStates(
        params_bytes=unique_storage_bytes(params, device),
        grads_bytes=unique_storage_bytes(grads, device) + wrapper_grads,
        optimizer_bytes=sum(by_key.values()),
        buffers_bytes=unique_storage_bytes(model.buffers(), device),
        optimizer_by_key=by_key,
    )


@dataclass(frozen=True)
class SavedTensor:
    """One storage kept for backward: its bytes, the first view seen, and where it was saved."""

    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    category: str
    scope: str
    grad_fn: str | None


@dataclass(frozen=True)
class SavedActivations:
    """What a forward pass left for backward, one row per distinct storage."""

    tensors: tuple[SavedTensor, ...]

    @property
    def total_bytes(self) -> int:
        """Sum of distinct saved storages, bytes."""
        return sum(t.nbytes for t in self.tensors)

    def by_category(self) -> dict[str, int]:
        """Bytes per category, in first-seen order."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.category] = out.get(t.category, 0) + t.nbytes
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per saved storage (nbytes, dtype, shape, category, scope, grad_fn)."""
        import pandas as pd

        return pd.DataFrame([t.__dict__ for t in self.tensors])


Categorize = Callable[[torch.Tensor, tuple[nn.Module, ...]], str]


def _owners(tensors: Iterable[torch.Tensor]) -> dict[tuple[str, int], torch.Tensor]:
    """Each storage key of ``tensors`` with a tensor that holds it (the last one, for tied weights)."""
    return {k: t for t in tensors if (k := storage_key(_local(t))) is not None}


def _own_state(module: nn.Module) -> list[torch.Tensor]:
    """The module's own parameters and buffers (not its children's)."""
    return [*module.parameters(recurse=False), *module.buffers(recurse=False)]


def _default_category(t: torch.Tensor, scope: tuple[nn.Module, ...]) -> str:
    return type(scope[-1]).__name__ if scope else "other"


class SavedTensorRecorder:
    """Record every tensor autograd saves for backward while the ``with`` block runs.

    ``model`` (optional) gives a module scope to each saved tensor through forward pre/post hooks, and its
    parameters and buffers are excluded (the storages they hold when the tensor is saved: a module may swap one
    during its forward, see :meth:`_is_state`). ``categorize(tensor, scope)`` names a category; by default the class
    name of the innermost module. The hooks leave the saved tensors untouched, so memory and results are those
    of an unobserved run. Use: ``with SavedTensorRecorder(model) as rec: loss = model(x, y)`` then
    ``rec.result()``. Exit autocast *inside* the block so its weight-cast cache is already released.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        exclude: Iterable[torch.Tensor] = (),
        categorize: Categorize | None = None,
    ) -> None:
        self._model = model
        self._categorize = categorize or _default_category
        self._state = list(exclude)
        if model is not None:
            self._state += list(model.parameters()) + list(model.buffers())
        self._owners = _owners(self._state)
        self._seen: dict[tuple[str, int], SavedTensor] = {}
        self._scope: list[nn.Module] = []
        self._names: dict[int, str] = {}
        self._handles: list[Any] = []
        self._hooks: Any = None

    # -- module scope ------------------------------------------------------------------------------------
    def _push(self, module: nn.Module, *_: Any) -> None:
        self._scope.append(module)

    def _pop(self, module: nn.Module, *_: Any) -> None:
        self._owners.update(_owners(_own_state(module)))  # a storage it swapped in during its forward
        # Pop back to (and including) this module, which also repairs the stack after an exception.
        while self._scope:
            if self._scope.pop() is module:
                break

    def _is_state(self, key: tuple[str, int]) -> bool:
        """Whether ``key`` is the storage a parameter, buffer or excluded tensor holds *now*.

        A module may swap a parameter's storage during its forward: bitsandbytes' ``Linear4bit`` casts its bias
        in place on its first call (``bias.data = bias.data.to(x.dtype)``, bitsandbytes/nn/modules.py), freeing
        the old storage, whose address the allocator may then hand to an activation. A key remembered from before
        the swap would drop that activation from the count (a measured step 128 or 256 B short, in some runs
        only); so every key is checked against its owner's current storage, and the running module's own
        parameters and buffers are looked at again before each save.
        """
        if self._scope:
            self._owners.update(_owners(_own_state(self._scope[-1])))
        owner = self._owners.get(key)
        if owner is not None and storage_key(_local(owner)) != key:  # swapped since: look them all up again
            self._owners = _owners(self._state)
            owner = self._owners.get(key)
        return owner is not None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(_local(t))
        if key is None or key in self._seen or self._is_state(key):
            return t
        scope = tuple(self._scope)
        self._seen[key] = SavedTensor(
            nbytes=t.untyped_storage().nbytes(),
            dtype=str(t.dtype).removeprefix("torch."),
            shape=tuple(t.shape),
            category=self._categorize(t, scope),
            scope=self._names.get(id(scope[-1]), type(scope[-1]).__name__) if scope else "",
            grad_fn=t.grad_fn.name() if t.grad_fn is not None else None,
        )
        return t

    def __enter__(self) -> SavedTensorRecorder:
        if self._model is not None:
            for name, mod in self._model.named_modules():
                self._names[id(mod)] = name or type(mod).__name__
                self._handles.append(mod.register_forward_pre_hook(self._push))
                self._handles.append(mod.register_forward_hook(self._pop, always_call=True))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._scope.clear()

    def result(self) -> SavedActivations:
        """The distinct saved storages recorded so far."""
        return SavedActivations(tuple(self._seen.values()))

    def by_storage(self) -> dict[tuple[str, int], SavedTensor]:
        """The recorded rows keyed by :func:`storage_key` (to join with an autograd-graph walk)."""
        return dict(self._seen)
