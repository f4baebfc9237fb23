"""Expected error and the SVD lower bound against dense computations and seed-eigen.md §9."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mechanisms.error import expected_error, support_residual, svd_bound
from mechanisms.operators import AllRanges, Identity, Prefix, Ranges, Total, kron_dense
from mechanisms.strategies import FAMILIES, build_kron_strategy
from mechanisms.workload import Workload, WorkloadItem


def _dense_gram(workload: Workload) -> np.ndarray:
    return sum(kron_dense(item.factors).T @ kron_dense(item.factors) for item in workload.items)


def _dense_svdb(workload: Workload) -> float:
    eigenvalues = np.clip(np.linalg.eigvalsh(_dense_gram(workload)), 0, None)
    return float(np.sqrt(eigenvalues).sum() ** 2 / workload.num_cells)


@pytest.mark.parametrize(
    ("n", "expected"),
    [(16, 404.4829), (64, 10787.15), (256, 2.721630e5), (1024, 6.400694e6)],
    ids=["ALLRANGE(16)", "ALLRANGE(64)", "ALLRANGE(256)", "ALLRANGE(1024)"],
)
def test_svd_bound_all_ranges_matches_seed_eigen(n: int, expected: float) -> None:
    workload = Workload(domain_shape=(n,), items=(WorkloadItem(name="r", factors=(AllRanges(n),)),))
    assert svd_bound(workload) == pytest.approx(expected, rel=1e-6)


def test_svd_bound_2d_all_ranges_64_by_32() -> None:
    """ALLRANGE(64,32): 2.2605e7 (Table 4.1: 2.261e7); a single Kronecker item, per-factor spectra."""
    workload = Workload(
        domain_shape=(64, 32),
        items=(WorkloadItem(name="r", factors=(AllRanges(64), AllRanges(32))),),
    )
    assert svd_bound(workload) == pytest.approx(2.2605e7, rel=1e-4)


def test_svd_bound_two_way_marginals_8_16_16() -> None:
    shape = (8, 16, 16)
    items = tuple(
        WorkloadItem(
            name=f"m{a}{b}",
            factors=tuple(
                Identity(n) if axis in (a, b) else Total(n) for axis, n in enumerate(shape)
            ),
        )
        for a, b in itertools.combinations(range(3), 2)
    )
    assert svd_bound(Workload(domain_shape=shape, items=items)) == pytest.approx(1.3606e3, rel=1e-4)


def test_svd_bound_of_mixed_union_equals_dense() -> None:
    shape = (6, 2, 3)
    items = (
        WorkloadItem(name="cdf", factors=(Prefix(6), Total(2), Total(3))),
        WorkloadItem(name="marg", factors=(Identity(6), Identity(2), Total(3))),
        WorkloadItem(name="rng", factors=(AllRanges(6), Total(2), Identity(3))),
        WorkloadItem(name="tot", factors=(Total(6), Total(2), Total(3))),
        WorkloadItem(name="few", factors=(Ranges(6, [0, 2], [3, 5]), Identity(2), Total(3))),
    )
    workload = Workload(domain_shape=shape, items=items)
    assert svd_bound(workload) == pytest.approx(_dense_svdb(workload), rel=1e-7)


def test_svd_bound_is_none_when_too_large() -> None:
    items = (
        WorkloadItem(name="a", factors=(Prefix(5000), Total(2))),
        WorkloadItem(name="b", factors=(AllRanges(5000), Identity(2))),
    )
    assert svd_bound(Workload(domain_shape=(5000, 2), items=items)) is None


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
    l2 = strategy.sensitivity(norm=2)
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
