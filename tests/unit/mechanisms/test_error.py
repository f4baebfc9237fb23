"""Expected error against dense computations (the SVD bound's tests are in test_lower_bound.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dprelease.mechanisms.primitives.lower_bound import svd_bound
from dprelease.mechanisms.primitives.operators import AllRanges, Identity, Prefix, Total, kron_dense
from dprelease.mechanisms.primitives.strategies import FAMILIES, build_kron_strategy
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.reference.error import expected_error, support_residual


def _dense_gram(workload: Workload) -> np.ndarray:
    return sum(kron_dense(item.factors).T @ kron_dense(item.factors) for item in workload.items)


def _demo_like_workload() -> Workload:
    shape = (7, 3, 2)
    return Workload(
        domain_shape=shape,
        items=(
            WorkloadItem(name="cdf", factors=(Prefix(7), Total(3), Total(2))),
            WorkloadItem(name="ranges", factors=(AllRanges(7), Total(3), Total(2))),
            WorkloadItem(name="marg", factors=(Total(7), Identity(3), Identity(2))),
        ),
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_expected_error_matches_dense_trace(family: str) -> None:
    workload = _demo_like_workload()
    strategy = build_kron_strategy(
        family, attribute_roles=workload.attribute_roles((True, False, False))
    )
    dense_a = kron_dense(strategy.factors)
    dense_total = np.trace(_dense_gram(workload) @ np.linalg.pinv(dense_a.T @ dense_a))
    report = expected_error(workload, strategy, noise_variance=2.5)
    assert report.total_variance == pytest.approx(2.5 * dense_total, rel=1e-9)
    assert sum(report.item_total_variance.values()) == pytest.approx(report.total_variance)
    assert report.rmse == pytest.approx(np.sqrt(report.total_variance / workload.num_queries))
    # never below the SVD bound (L2-normalised comparison: error / sensitivity^2 vs SVDB)
    l2 = strategy.sensitivity(noise="gaussian")
    assert l2**2 * dense_total >= svd_bound(workload) * (1 - 1e-9)
    assert support_residual(workload, strategy) < 1e-9


def test_total_strategy_does_not_support_a_marginal() -> None:
    workload = _demo_like_workload()
    strategy = build_kron_strategy(
        "identity", attribute_roles=[(7, "total"), (3, "categorical"), (2, "categorical")]
    )
    assert support_residual(workload, strategy) > 0.1


def test_attribute_roles() -> None:
    roles = _demo_like_workload().attribute_roles((True, False, True))
    assert roles == [(7, "ordered"), (3, "categorical"), (2, "ordered")]
    summed = Workload(
        domain_shape=(4, 3), items=(WorkloadItem(name="t", factors=(Identity(4), Total(3))),)
    )
    assert summed.attribute_roles((True, True)) == [(4, "ordered"), (3, "total")]


def test_noise_variance_must_be_positive() -> None:
    workload = _demo_like_workload()
    strategy = build_kron_strategy(
        "identity", attribute_roles=workload.attribute_roles((True, False, False))
    )
    with pytest.raises(ValueError, match=r"noise_variance \(0.0\) must be > 0"):
        expected_error(workload, strategy, noise_variance=0.0)


def test_workload_validation_fires() -> None:
    with pytest.raises(ValueError, match="at least one item"):
        Workload(domain_shape=(3,), items=())
    with pytest.raises(ValueError, match="factor sizes"):
        Workload(domain_shape=(3,), items=(WorkloadItem(name="x", factors=(Identity(4),)),))
