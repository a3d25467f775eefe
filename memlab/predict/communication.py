"""Bytes a data-parallel training step moves per rank, by ZeRO stage [rajbhandari2019]. Bytes; no torch.

Convention (the ZeRO paper's, Sec. 7): the *volume* of a collective on one rank is the size of the buffer it
reduces or gathers, whatever the algorithm. An all-reduce is a reduce-scatter followed by an all-gather, so it
moves 2x its buffer; a reduce-scatter moves its (full) input, an all-gather its (full) output, a broadcast its
buffer. With Psi the bytes of one copy of the gradients (or parameters):

- DDP and ZeRO-1/2: all-reduce (or reduce-scatter + all-gather) of the gradients, 2 Psi per rank per step;
- ZeRO-3 / FSDP FULL_SHARD: all-gather of the parameters in forward and again in backward, reduce-scatter of the
  gradients, 3 Psi (1.5x data parallelism).

A ring implementation puts (N-1)/N of that volume on each rank's link (:func:`ring_wire_bytes`): the factor
that makes the volume independent of N.
"""

from __future__ import annotations

from memlab.errors import SetupError

COLLECTIVE_FACTOR = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}
"""Volume / buffer bytes of each collective (ZeRO's accounting: all-reduce = reduce-scatter + all-gather)."""


def collective_volume_bytes(op: str, buffer_bytes: int) -> int:
    """Volume one rank moves for one collective over a buffer of ``buffer_bytes`` (the full, unsharded size)."""
    if op not in COLLECTIVE_FACTOR:
        raise SetupError(f"unknown collective {op!r}: use one of {', '.join(COLLECTIVE_FACTOR)}")
    return COLLECTIVE_FACTOR[op] * int(buffer_bytes)


def zero_comm_bytes(param_bytes: int, stage: int, *, regather_in_backward: bool = True) -> dict[str, int]:
    """Predicted volume per rank per step by collective, for ZeRO ``stage`` 0-3 [rajbhandari2019, Sec. 7].

    ``param_bytes`` is Psi, one full copy of the parameters in the communicated dtype. Stages 0-2 move 2 Psi
    (reduce-scatter + all-gather, or one all-reduce); stage 3 adds the second all-gather of backward (3 Psi),
    which FSDP2 skips for modules kept unsharded after forward (``regather_in_backward=False``: 2 Psi, the
    ZeRO-2-like ``reshard_after_forward=False``).
    """
    if stage not in (0, 1, 2, 3):
        raise SetupError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    if not isinstance(param_bytes, int) or param_bytes < 0:
        raise SetupError(f"param_bytes must be a non-negative integer, got {param_bytes!r}")
    if stage < 3:
        return {"all_reduce": 2 * param_bytes} if stage == 0 else {"reduce_scatter": param_bytes,
                                                                   "all_gather": param_bytes}
    gathers = 2 if regather_in_backward else 1
    return {"all_gather": gathers * param_bytes, "reduce_scatter": param_bytes}


def ring_wire_bytes(volume_bytes: int | float, world_size: int) -> float:
    """Bytes each rank sends on its link for a ring collective of this volume: volume x (N-1)/N [thakur2005]."""
    if not isinstance(world_size, int) or world_size < 1:
        raise SetupError(f"world_size must be a positive integer, got {world_size!r}")
    return volume_bytes * (world_size - 1) / world_size
