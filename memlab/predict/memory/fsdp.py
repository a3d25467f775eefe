"""FSDP2 as the estimator models it: the wrapping plan's units, their shards, and what is gathered when.

One :class:`FsdpPlan` per (model, setup) says which modules are ``fully_shard`` units [pytorch-fsdp2], which of them
reshard after forward, in which dtype parameters are gathered and gradients reduced (``MixedPrecisionPolicy``), and
whether the loss is computed inside the root module. The torch side that applies the same plan is
:func:`memlab.model.fsdp.shard_model` (the trace and the gloo ranks both call it); this module is pure arithmetic.

What FSDP2 holds, read from torch 2.13's ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` and
``_fsdp_state.py`` [pytorch-fsdp2-internals] and checked against memlab's own trace
(:func:`memlab.tracing.gpt.trace_gpt` over a fake process group; :mod:`memlab.studies.setup_draws`):

- at rest every parameter, gradient and optimizer state is a dim-0 shard, padded to ``ceil(d0 / N)`` rows (rank 0
  always holds a full chunk): :func:`rank0_shard_elements`;
- ``unshard`` all-gathers a unit into one flat buffer of ``N`` x its padded shard and copies it out into the full
  parameters. In forward, the buffer is freed only at the *next* unit's copy-out (overlap of copy-out and the next
  all-gather), and the last unit's buffer at the root's post-forward; in backward, right after copy-out;
- the root module is never resharded after forward when ``reshard_after_forward`` is left to FSDP
  (``_lazy_init``: "the parameters would be freed and all-gathered immediately"); ``Setup.fsdp_reshard_root``
  passes True, and the root is then gathered from its pre-forward to its post-forward and again from its
  pre-backward; other units reshard after forward when asked (ZeRO-3) and otherwise stay gathered until their
  backward (ZeRO-2, ``SHARD_GRAD_OP``);
- ``CPUOffloadPolicy`` (``Setup.fsdp_offload``): the shards (parameters, gradients, optimizer states) live on the
  host and the optimizer steps there; what is gathered, buffered and unsharded is as without it, on the device;
- in backward each unit prefetches the previous unit in forward order (``_backward_prefetch``): the next unit's
  all-gather buffer exists while a unit's backward runs; a unit's unsharded gradients exist until its
  post-backward reduce-scatter (the root's at the very end of backward).

Units: bytes and elements on ONE rank. No torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.precision import DTYPE_BYTES

FSDP_UNITS = ("blocks", "torchtitan")
"""Wrapping plans: ``blocks`` (each block a unit; the embedding, final norm and head belong to the root) and
``torchtitan`` (torchtitan v0.2.2 ``apply_fsdp``: the embedding, each block, and the final norm + head as units of
their own; the root holds nothing else)."""
FSDP_LOSS = ("inside", "outside")
"""Where the loss is computed: ``inside`` the root module's forward (the reference GPT's ``model(idx, targets)``) or
``outside`` it (torchtitan: ``loss_fn(model(idx), labels)``)."""


def rank0_shard_elements(shape: tuple[int, ...], ranks: int) -> int:
    """Elements of rank 0's FSDP2 shard of a parameter of ``shape``: ``ceil(d0 / ranks)`` rows of dim 0 (FSDP2 pads
    dim 0 to a multiple of ``ranks``; rank 0's chunk is always full). A scalar counts as one row."""
    if not shape:
        return 1
    rows = math.ceil(shape[0] / ranks)
    return rows * math.prod(shape[1:])


@dataclass(frozen=True)
class FsdpUnit:
    """One ``fully_shard`` unit: its name, full and rank-0-shard elements, and whether it reshards after forward."""

    name: str
    full_elements: int
    shard_elements: int
    """Rank 0's padded shard, summed over the unit's parameters (the all-gather buffer is ``ranks`` times it)."""
    reshard_after_forward: bool
    kind: str
    """``root``, ``embed``, ``block`` or ``head``."""


@dataclass(frozen=True)
class FsdpPlan:
    """The units in forward order (the root first: its pre-forward runs first) and the dtypes of the policy."""

    units: tuple[FsdpUnit, ...]
    ranks: int
    gather_bytes: float
    """Bytes per element of a gathered parameter (``MixedPrecisionPolicy.param_dtype``, else the stored dtype)."""
    grad_bytes: float
    """Bytes per element of an unsharded gradient (the gathered dtype: autograd computes it in that dtype)."""
    reduce_bytes: float
    """Bytes per element of the reduce-scatter input (``reduce_dtype``, else the gathered dtype)."""
    loss_inside: bool
    units_name: str
    offload: bool = False
    """CPUOffloadPolicy: the shards live on the host (``Setup.fsdp_offload``)."""
    storage_bytes: float = 4.0
    """Bytes per element of a stored shard (what the offload copies to the device before an all-gather)."""

    @property
    def shard_elements(self) -> int:
        """Rank 0's parameter elements (all units)."""
        return sum(u.shard_elements for u in self.units)

    def full(self, u: FsdpUnit) -> float:
        """Bytes of ``u``'s gathered parameters."""
        return u.full_elements * self.gather_bytes

    def buffer(self, u: FsdpUnit) -> float:
        """Bytes of ``u``'s all-gather buffer (``ranks`` x the padded shard, gathered dtype)."""
        return self.ranks * u.shard_elements * self.gather_bytes

    def of_kind(self, kind: str) -> tuple[FsdpUnit, ...]:
        """The units of one kind, in forward order."""
        return tuple(u for u in self.units if u.kind == kind)


def fsdp_applies(setup: Any) -> bool:
    """True when ``setup`` runs FSDP2: training, ZeRO stage 2 or 3 over more than one data-parallel rank."""
    return setup.mode == "train" and setup.zero_stage >= 2 and setup.world_size > 1


def _unit_of(name: str, units: str) -> str:
    if name.startswith("blocks."):
        return "blocks." + name.split(".")[1]
    if units == "torchtitan":
        return "embed" if name.startswith(("tok_emb.", "pos_emb.")) else "head"
    return "root"


@functools.lru_cache(maxsize=256)
def fsdp_plan(config: TransformerConfig, ranks: int, zero_stage: int, units: str, loss: str, gather_bytes: float,
              reduce_bytes: float, reshard_root: bool = False, offload: bool = False,
              storage_bytes: float = 4.0) -> FsdpPlan:
    """The :class:`FsdpPlan` of ``config`` sharded over ``ranks`` (cached). ZeRO-3 reshards blocks and the
    embedding after forward, ZeRO-2 does not; the root never does (FSDP2's default), nor torchtitan's final
    norm + head unit ("FSDP would prefetch them immediately after the forward pass", torchtitan v0.2.2
    ``apply_fsdp``). A tied embedding stays in one unit with the head (FSDP2 refuses a parameter in two groups)."""
    groups: dict[str, list[tuple[int, ...]]] = {}
    for name, shape, _ in config.param_shapes():
        key = _unit_of(name, units)
        if config.tied_embeddings and units == "torchtitan" and key in ("embed", "head"):
            key = "root"
        groups.setdefault(key, []).append(shape)
    order = ["root"] + (["embed"] if "embed" in groups else []) + [f"blocks.{i}" for i in range(config.n_layers)] \
        + (["head"] if "head" in groups else [])
    out = []
    for key in order:
        shapes = groups.get(key, [])
        if not shapes and key == "root":
            continue
        kind = "block" if key.startswith("blocks.") else key
        reshard = (zero_stage == 3 and kind in ("block", "embed")) or (reshard_root and kind == "root")
        out.append(FsdpUnit(key, sum(math.prod(s) for s in shapes), sum(rank0_shard_elements(s, ranks) for s in shapes),
                            reshard, kind))
    return FsdpPlan(tuple(out), ranks, gather_bytes, gather_bytes, reduce_bytes, loss == "inside", units, offload,
                    storage_bytes)


def plan_of(config: TransformerConfig, setup: Any) -> FsdpPlan | None:
    """The setup's :class:`FsdpPlan` (None when FSDP2 does not apply, :func:`fsdp_applies`)."""
    if not fsdp_applies(setup) or setup.tp > 1:
        return None
    pol = setup.policy
    gather = DTYPE_BYTES[pol.fsdp_param_dtype] if pol.fsdp_param_dtype else pol.param_bytes
    reduce = DTYPE_BYTES[pol.fsdp_reduce_dtype] if pol.fsdp_reduce_dtype else gather
    return fsdp_plan(config, setup.world_size, setup.zero_stage, setup.fsdp_units, setup.fsdp_loss, gather, reduce,
                     setup.fsdp_reshard_root, setup.fsdp_offload, pol.param_bytes)


def moments(p: FsdpPlan) -> dict[str, float]:
    """Bytes FSDP2 adds to each moment of the step that :func:`memlab.predict.memory.phases.training_phases` models.

    - ``forward``: at the loss, the units still gathered (the root; every unit under ZeRO-2) plus, with the loss
      inside the root, the last unit's all-gather buffer (freed at the root's post-forward);
    - ``block_forward``: inside the last block's forward (full recompute's moment): the units still gathered before
      it, the block and its own all-gather buffer;
    - ``copy_out``: at the last block's copy-out, before its forward runs: as ``block_forward`` plus the all-gather
      buffer of the unit before it, freed only at this copy-out (the trace's forward peak under full recompute at
      small widths: the torchtitan peer's debug model at 8 ranks, 918,272 B above the block's own moment);
    - ``start`` of backward: what forward left gathered plus, when the loss is inside a root that holds
      parameters, the prefetched all-gather buffer of the last unit that was resharded (the root's pre-backward
      runs on the loss; otherwise the prefetch comes after the loss's backward);
    - ``bottom`` (the first block's backward): the root and head units' parameters and unsharded gradients (the
      root reduces at the end of backward), the block, the prefetched buffer of the unit before it, and the
      reduce-scatter input FSDP2 keeps of the block after it (``reduce_scatter_max_input_buffers = 1``);
    - ``end``: the root's post-backward: its unsharded gradients and their reduce-scatter input;
    - ``mid``, ``mid_blocks``: block ``k``'s backward (:func:`_mid_backward`) at ``k = 1`` or ``k = mid_blocks``
      (``L - 2``; 0 where not modelled), whichever the per-block slope favours: each block below ``k`` still holds
      its saved tensors and has no gradient shard yet (:func:`memlab.predict.memory.phases.training_phases`).
    ``grads_unsharded_root``: the root's gradient bytes that are *full* rather than sharded at the bottom and end.
    """
    units = p.units
    held_after_fwd = sum(p.full(u) for u in units if not u.reshard_after_forward)
    # a root that reshards after forward (Setup.fsdp_reshard_root) is gathered until its post-forward: through
    # every block's forward and a loss computed inside it; its pre-backward gathers it again
    root_resharded = sum(p.full(u) for u in p.of_kind("root") if u.reshard_after_forward)
    last = units[-1]
    fwd = held_after_fwd + (p.buffer(last) + root_resharded if p.loss_inside else 0)
    blocks = p.of_kind("block")
    lb = blocks[-1]
    before = sum(p.full(u) for u in units[:units.index(lb)] if not u.reshard_after_forward or u.kind == "root")
    block_fwd = before + p.full(lb) + p.buffer(lb)
    # at the last block's copy-out the unit before it still holds its all-gather buffer (freed at this copy-out)
    copy_out = before + p.full(lb) + p.buffer(lb) + p.buffer(units[units.index(lb) - 1]) \
        if units.index(lb) > 0 else block_fwd
    resharded = [u for u in units if u.reshard_after_forward and u.kind != "root"]
    # The root's pre-backward hook sits on its output: with the loss inside, on the loss, so its prefetch comes
    # first in backward; otherwise (or with a root that holds no parameters) after the loss's backward
    root_first = p.loss_inside and bool(p.of_kind("root"))
    start = held_after_fwd + ((p.buffer(resharded[-1]) if resharded else 0) + root_resharded if root_first else 0)
    b0 = blocks[0]
    i0 = units.index(b0)
    prev = units[i0 - 1] if i0 > 0 else None
    root_like = [u for u in units if u.kind in ("root", "head")]
    root_params = sum(p.full(u) for u in root_like if u.kind == "root")
    root_grads = sum(u.full_elements for u in root_like if u.kind == "root") * p.grad_bytes
    # the root is gathered since its pre-backward: nothing of it is prefetched
    bottom = root_params + p.full(b0) + (p.buffer(prev) if prev is not None and prev.reshard_after_forward
                                         and prev.kind != "root" else 0)
    if len(blocks) > 1:
        bottom += p.ranks * blocks[1].shard_elements * p.reduce_bytes
    # modelled where it was read: the torchtitan plan under ZeRO-3 (block 0 prefetches the embedding unit)
    prefetched = prev is not None and prev.reshard_after_forward and prev.kind != "root"
    mid_blocks = len(blocks) - 2 if len(blocks) >= 3 and blocks[1].reshard_after_forward and prefetched else 0
    return {"forward": fwd, "block_forward": block_fwd, "copy_out": copy_out, "start": start, "bottom": bottom,
            "mid": _mid_backward(p, blocks, prev) if mid_blocks else 0.0, "mid_blocks": mid_blocks,
            "root_grads_full": root_grads, "end": root_grads + sum(p.ranks * u.shard_elements for u in root_like
                                                                   if u.kind == "root") * p.reduce_bytes}


def _mid_backward(p: FsdpPlan, blocks: tuple[FsdpUnit, ...], prev: FsdpUnit | None) -> float:
    """FSDP2's bytes at block ``k``'s backward (``1 <= k <= L - 2``) beyond the bottom moment's FSDP2 bytes: with
    the blocks resharded after forward (ZeRO-3), block ``k - 1``'s all-gather buffer is prefetched where the bottom
    block prefetches the unit before it (the embedding under the torchtitan plan, nothing for the root): the
    difference. Every block below ``k`` is sharded, and block ``k + 1``'s reduce-scatter input is the size of
    block 1's that the bottom counts. Read from the trace of the torchtitan peer (``FSDPMemTracker``'s all-gather
    and reduce-scatter categories, block by block). Modelled (:func:`moments`' ``mid_blocks``) with 3 blocks or more
    where block 0 prefetches a unit resharded after forward (the torchtitan plan's embedding) under ZeRO-3. Elsewhere
    the moment stays named (:func:`unmodelled`): under ZeRO-2 the blocks below ``k`` are still gathered since forward,
    and with the root before block 0 (the ``blocks`` plan) the same form overshoots the trace, because the bottom
    moment it starts from is itself above it there (it counts every block's checkpointed input): a setup_draws draw
    under ZeRO-2 3 % above, ci-gqa under the ``blocks`` plan 0.3 MB more above than the bottom moment."""
    return p.buffer(blocks[0]) - (p.buffer(prev) if prev is not None else 0)


def unmodelled(p: FsdpPlan, grad_bytes: float) -> dict[str, tuple[float, tuple[str, ...]]]:
    """FSDP2 moments :func:`moments` does not model, each with the most it can add (bytes on rank 0) and the phases
    it falls in, for the estimate to name: ``first all-gathers`` (forward: at a unit's copy-out the previous unit's
    buffer is still alive; modelled at the last block's copy-out under full recompute of every block, ``copy_out``,
    not at the first units' nor the torchtitan head unit's), ``mid-backward`` (backward: a block between the first
    and the last one holds itself, the next unit's prefetched buffer and its own unsharded gradients while the
    sharded ones of later blocks exist: at most one gathered block and one block of gradients beyond the bottom
    moment; the prefetch and the blocks below are modelled for the torchtitan plan under ZeRO-3, ``mid``, and what
    is left there is the block's own backward tensors, which the bottom-block term counts short), and with a root
    resharded after forward and the loss outside it, the root's all-gather after the
    loss's backward (backward: its parameters and all-gather buffer beside the loss's gradients)."""
    blocks = p.of_kind("block")
    b = blocks[0]
    root = [u for u in p.of_kind("root") if u.reshard_after_forward]
    regather = sum(p.full(u) + p.buffer(u) for u in root) if not p.loss_inside else 0.0
    return {"FSDP2 root gathered again after the loss's backward (reshard_root, loss outside)": (regather,
                                                                                              ("backward",)),
            "FSDP2 CPU offload: a unit's shard copied to the device for its all-gather, and its reduce-scatter "
            "output before the copy to the host": (max(u.shard_elements for u in p.units)
                                                   * (p.storage_bytes + p.reduce_bytes) if p.offload else 0.0,
                                                   ("forward", "backward")),
            "FSDP2 first all-gathers (first unit's buffer until block 0's copy-out)": (p.buffer(p.units[0]),
                                                                                       ("forward",)),
            "FSDP2 mid-backward moment (a gathered block and its unsharded gradients)":
                (p.full(b) + b.full_elements * grad_bytes if len(blocks) > 1 else 0.0, ("backward",))}
