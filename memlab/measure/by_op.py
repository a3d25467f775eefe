"""Which autograd operation keeps which tensor: a per-op listing of the bytes saved for backward.

:class:`~memlab.measure.accounting.SavedTensorRecorder` counts every distinct storage a forward pass leaves for
backward and the module that was running. This module adds the operation: after the forward it walks the autograd
graph from the output and reads each node's saved variables (the ``_saved_*`` attributes PyTorch's generated
``Node`` classes expose, e.g. ``MulBackward0._saved_self``), so each storage is named by the op that keeps it
(``TanhBackward0.result``, ``SoftmaxBackward0.result``, ``MmBackward0.self``...). A storage kept by several ops is
listed once, under the first op met walking back from the output. Storages the recorder saw but no graph node
names (non-reentrant checkpoint's inputs, custom autograd functions' ``save_for_backward``) are listed with op
``(not in a node)``. The listing is how a residual between a formula and a measurement is explained: group it by
op for one layer and each line is a tensor the formula does or does not count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from memlab.measure.accounting import SavedTensorRecorder, storage_key

if TYPE_CHECKING:
    import pandas as pd


def _saved_tensors(node: Any) -> list[tuple[str, torch.Tensor]]:
    out: list[tuple[str, torch.Tensor]] = []
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:  # freed, or a saved variable that cannot be unpacked
            continue
        items = value if isinstance(value, list | tuple) else [value]
        out += [(attr.removeprefix("_saved_"), v) for v in items if isinstance(v, torch.Tensor)]
    return out


def graph_saved(root: Any) -> dict[tuple[str, int], tuple[str, str]]:
    """Storage key -> (op name, saved-variable name) for every tensor the graph under ``root`` (a ``grad_fn``)
    saves, the first op met walking back from ``root`` winning."""
    owner: dict[tuple[str, int], tuple[str, str]] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for attr, t in _saved_tensors(node):
            key = storage_key(t)
            if key is not None and key not in owner:
                owner[key] = (node.name(), attr)
        stack += [nxt for nxt, _ in node.next_functions]
    return owner


def saved_by_op(model: nn.Module, forward: Callable[[], torch.Tensor]) -> pd.DataFrame:
    """Run ``forward()`` (returning the loss) under a recorder and list every saved storage with its module scope,
    the op that keeps it, dtype, shape and bytes. Parameters and buffers are excluded (they are model state)."""
    import pandas as pd

    rec = SavedTensorRecorder(model)
    with rec:
        loss = forward()
    owner = graph_saved(loss.grad_fn)
    rows = []
    for key, t in rec.by_storage().items():
        op, attr = owner.get(key, ("(not in a node)", ""))
        rows.append({"scope": t.scope, "op": op, "saved": attr, "dtype": t.dtype, "shape": t.shape,
                     "nbytes": t.nbytes})
    del loss
    return pd.DataFrame(rows, columns=["scope", "op", "saved", "dtype", "shape", "nbytes"])


def layer_listing(frame: pd.DataFrame, layer: str, tokens: int | None = None) -> pd.DataFrame:
    """The rows of one layer (scopes containing ``layer``, e.g. ``layers.0.``), grouped by op and dtype, with
    bytes per token when ``tokens`` is given; largest first."""
    part = frame[frame["scope"].str.contains(layer, regex=False)]
    out = (part.groupby(["op", "dtype"], as_index=False)
           .agg(tensors=("nbytes", "size"), nbytes=("nbytes", "sum"))
           .sort_values("nbytes", ascending=False, ignore_index=True))
    if tokens:
        out["bytes/token"] = out["nbytes"] / tokens
    return out
