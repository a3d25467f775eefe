"""HBM traffic of one attention forward: standard (scores written out) vs FlashAttention tiling [dao2022]. No torch.

Counted as in the FlashAttention paper (Dao et al. 2022, Sec. 3.2, Algorithm 0 and Algorithm 1, Theorem 2), per
(batch, head), in elements of N x d (N = sequence length, d = head_dim) and N x N matrices:

- standard: read Q, K (2Nd), write S = QK^T (N^2), read S and write P = softmax(S) (2N^2), read P and V
  (N^2 + Nd), write O (Nd): 4Nd + 4N^2 elements;
- flash: K and V are read once (2Nd); for each of the T_c = ceil(N / B_c) column blocks, every block of Q and O
  is read and O written back (3Nd), plus the running max and sum (2N read, 2N written, fp32), with
  B_c = ceil(M / 4d) for an on-chip memory of M elements: 2Nd + T_c (3Nd + 4N) elements, Theta(N^2 d^2 / M).

Bytes multiply by the element size (the running statistics are counted at the same width, a small
approximation). Kernels that keep K, V and the statistics in registers and choose other block sizes move less;
this is the paper's model, not a profile.
"""

from __future__ import annotations

import functools
import math

from memlab.errors import SetupError
from memlab.predict.spec.validate import check_int

_pos = functools.partial(check_int, err=SetupError)
"""A count >= 1, or the :class:`SetupError` naming it (:func:`memlab.predict.spec.validate.check_int`)."""


def attention_hbm_bytes(batch: int, heads: int, seq: int, head_dim: int, *, kernel: str, element_bytes: int = 2,
                        sram_bytes: int = 192 * 1024) -> int:
    """HBM bytes one attention forward reads and writes, for ``kernel`` "standard" or "flash" (module docstring).

    ``sram_bytes``: on-chip memory one thread block can use (M x element_bytes); the default is the 192 KB of SRAM
    per A100 SM the paper quotes (Sec. 2.1), an upper bound (a kernel uses part of it, which raises the traffic).
    """
    b, a, n, d = _pos("batch", batch), _pos("heads", heads), _pos("seq", seq), _pos("head_dim", head_dim)
    if kernel == "standard":
        elements = 4 * n * d + 4 * n * n
    elif kernel == "flash":
        m = _pos("sram_bytes", sram_bytes) // _pos("element_bytes", element_bytes)
        block = max(1, math.ceil(m / (4 * d)))
        elements = 2 * n * d + math.ceil(n / block) * (3 * n * d + 4 * n)
    else:
        raise SetupError(f"kernel must be 'standard' or 'flash', got {kernel!r}")
    return b * a * elements * element_bytes
