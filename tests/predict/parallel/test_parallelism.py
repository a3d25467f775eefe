"""Pipeline bubble, scaling efficiency and cluster MFU [narayanan2021]."""

from __future__ import annotations

import math

import pytest

from memlab.errors import SetupError
from memlab.predict.parallel.efficiency import (
    cluster_utilisation,
    exposed_comm_for,
    pipeline_bubble_fraction,
    scaling_efficiency,
)


def test_bubble_is_p_minus_1_over_m_plus_p_minus_1() -> None:
    assert pipeline_bubble_fraction(8, 32) == pytest.approx(7 / 39)
    assert pipeline_bubble_fraction(1, 4) == 0.0
    # bubble time / ideal time is (p - 1) / m, Narayanan et al. 2021 Section 2.2
    f = pipeline_bubble_fraction(4, 12)
    assert f / (1 - f) == pytest.approx(3 / 12)


def test_interleaving_divides_the_bubble_time_by_v() -> None:
    f1, f2 = pipeline_bubble_fraction(16, 64), pipeline_bubble_fraction(16, 64, interleave=2)
    assert (f2 / (1 - f2)) == pytest.approx((f1 / (1 - f1)) / 2)


def test_more_micro_batches_shrink_the_bubble_below_five_percent() -> None:
    assert pipeline_bubble_fraction(8, 8) > 0.3
    assert pipeline_bubble_fraction(8, 256) < 0.05


def test_scaling_efficiency_is_one_for_linear_scaling() -> None:
    assert scaling_efficiency(8000.0, 1000.0, 8) == 1.0
    assert scaling_efficiency(4000.0, 1000.0, 8) == 0.5


def test_cluster_mfu_multiplies_the_losses_and_inverts() -> None:
    bubble = pipeline_bubble_fraction(8, 64)
    comm = exposed_comm_for(0.55, 0.40, bubble)
    res = cluster_utilisation(0.55, bubble_fraction=bubble, exposed_comm_fraction=comm)
    assert res.cluster_mfu == pytest.approx(0.40)
    assert res.scaling_efficiency == pytest.approx(0.40 / 0.55)
    assert math.isclose(res.to_dict()["device_mfu"], 0.55)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_counts_raise_setup_errors(bad: object) -> None:
    with pytest.raises(SetupError, match="stages"):
        pipeline_bubble_fraction(bad, 4)  # type: ignore[arg-type]


def test_a_cluster_mfu_above_what_the_bubble_leaves_is_refused() -> None:
    with pytest.raises(SetupError, match="bubble"):
        exposed_comm_for(0.5, 0.49, bubble_fraction=0.2)
    with pytest.raises(SetupError, match="fraction"):
        cluster_utilisation(0.5, bubble_fraction=1.0)
