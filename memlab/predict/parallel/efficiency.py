"""Utilisation across devices: the pipeline bubble, scaling efficiency, and how per-device MFU compounds.

Sources:

- [narayanan2021] Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", Section 2.2: with p pipeline stages and m micro-batches per batch, the 1F1B schedule idles for
  (p - 1) micro-batch slots of forward and backward; the bubble time is (p - 1)/m of the ideal time, so the idle
  fraction of the whole iteration is (p - 1)/(m + p - 1). With v interleaved model chunks per device the bubble
  shrinks by v: (p - 1)/(v*m) of the ideal time.
- Scaling efficiency (weak scaling) = throughput on n devices / (n x throughput on one); the seed article 001
  [seed-001] calls it the expansion factor.

No torch; numbers only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

from memlab.errors import SetupError
from memlab.predict.spec.validate import check_int

_pos_int = functools.partial(check_int, err=SetupError)
"""A count >= 1, or the :class:`SetupError` naming it (:func:`memlab.predict.spec.validate.check_int`)."""


def _fraction(name: str, value: object, *, allow_one: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or value > 1 or (value == 1 and not allow_one):
        bound = "[0, 1]" if allow_one else "[0, 1)"
        raise SetupError(f"{name} must be a fraction in {bound}, got {value!r}")
    return float(value)


def pipeline_bubble_fraction(stages: int, micro_batches: int, interleave: int = 1) -> float:
    """Fraction of a pipeline-parallel iteration each device idles in the bubble [narayanan2021].

    1F1B (``interleave=1``): (p - 1)/(m + p - 1). Interleaved with v chunks per device, the bubble is
    (p - 1)/(v*m) of the ideal time, so the idle fraction is (p - 1)/(v*m + p - 1). ``stages=1`` gives 0.
    """
    p, m, v = _pos_int("stages", stages), _pos_int("micro_batches", micro_batches), _pos_int("interleave", interleave)
    return (p - 1) / (v * m + p - 1)


def scaling_efficiency(throughput_n: float, throughput_1: float, n_devices: int) -> float:
    """Weak-scaling efficiency: throughput on ``n_devices`` / (``n_devices`` x throughput on one device).

    Any throughput unit (tokens/s, samples/s) as long as both are in the same one. 1.0 is linear scaling.
    """
    for name, v in (("throughput_n", throughput_n), ("throughput_1", throughput_1)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise SetupError(f"{name} must be a positive finite throughput, got {v!r}")
    return float(throughput_n) / (_pos_int("n_devices", n_devices) * float(throughput_1))


@dataclass(frozen=True)
class ClusterUtilisation:
    """How a per-device MFU becomes a cluster's: each loss multiplies.

    ``cluster_mfu = device_mfu x (1 - bubble) x (1 - exposed_comm)``; ``scaling_efficiency`` is
    cluster_mfu / device_mfu (the same run's weak-scaling efficiency when nothing else changes).
    """

    device_mfu: float
    bubble_fraction: float
    exposed_comm_fraction: float
    cluster_mfu: float
    scaling_efficiency: float

    def to_dict(self) -> dict[str, float]:
        """Plain dict (a pandas row)."""
        return asdict(self)


def cluster_utilisation(device_mfu: float, *, bubble_fraction: float = 0.0,
                        exposed_comm_fraction: float = 0.0) -> ClusterUtilisation:
    """MFU of a whole run from one device's MFU, the pipeline bubble and communication not hidden by compute.

    ``device_mfu``: the MFU one device reaches while it computes (a fraction). ``bubble_fraction``: from
    :func:`pipeline_bubble_fraction` (0 without pipeline parallelism). ``exposed_comm_fraction``: the fraction
    of the step spent waiting for collectives that overlap did not hide (measured from a profile, or assumed:
    say so). The losses are independent time fractions, so they multiply.
    """
    mfu = _fraction("device_mfu", device_mfu, allow_one=True)
    bubble = _fraction("bubble_fraction", bubble_fraction)
    comm = _fraction("exposed_comm_fraction", exposed_comm_fraction)
    cluster = mfu * (1 - bubble) * (1 - comm)
    return ClusterUtilisation(mfu, bubble, comm, cluster, cluster / mfu if mfu else 0.0)


def exposed_comm_for(device_mfu: float, cluster_mfu: float, bubble_fraction: float = 0.0) -> float:
    """The exposed-communication fraction that turns ``device_mfu`` into ``cluster_mfu`` given the bubble:
    1 - cluster / (device x (1 - bubble)). The inverse of :func:`cluster_utilisation`; raises when the
    bubble alone already costs more than the gap."""
    mfu = _fraction("device_mfu", device_mfu, allow_one=True)
    target = _fraction("cluster_mfu", cluster_mfu, allow_one=True)
    bubble = _fraction("bubble_fraction", bubble_fraction)
    if mfu == 0 or target > mfu * (1 - bubble):
        raise SetupError(f"cluster_mfu={cluster_mfu} is above what device_mfu={device_mfu} leaves after a "
                         f"{bubble:.1%} bubble ({mfu * (1 - bubble):.3f}): lower the bubble or raise device_mfu")
    return 1 - target / (mfu * (1 - bubble))
