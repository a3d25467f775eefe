"""Random token batches for the reference runs: the same seeded tokens on every device.

Every measurement in :mod:`memlab.run` trains or serves on random token ids (the bytes and FLOPs of a step do not
depend on which tokens). They are drawn by a CPU generator seeded with ``seed`` and then moved, so a CPU run and a
GPU run see the same batch.
"""

from __future__ import annotations

import torch


def token_ids(vocab_size: int, batch: int, length: int, device: torch.device | str = "cpu",
              seed: int = 0) -> torch.Tensor:
    """A ``batch`` x ``length`` tensor of random token ids in ``[0, vocab_size)`` (int64), on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=gen).to(device)


def token_batch(vocab_size: int, batch: int, seq: int, device: torch.device | str = "cpu",
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, tgt)``: ``batch`` x ``seq`` inputs and their next-token targets (the same ids shifted by one), each
    in its own storage, as a data loader yields them."""
    data = token_ids(vocab_size, batch, seq + 1, device, seed)
    return data[:, :-1].clone(), data[:, 1:].clone()
