"""The product's max-variance design (mechanisms.primitives.max_variance) against ResidualPlanner's
certified optimum (tests.reference.residual_planner), the dense strategy matrix, and its own
certificate and validators."""

from __future__ import annotations

import numpy as np
import pytest

from dprelease.mechanisms.primitives.marginal_objectives import (
    item_row_variances,
    marginal_weights_max_variance,
)
from dprelease.mechanisms.primitives.marginal_strategies import (
    marginal_weights_l2,
    subset_strategy,
)
from dprelease.mechanisms.primitives.operators import Identity, Prefix, Total
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.reference.residual_planner import ResidualProgram, all_marginals

ADULT = (85, 9, 100, 16, 7, 15, 6, 5, 2, 100, 100, 99, 42, 2)  # the bundled domain's sizes


def marginals(sizes: tuple[int, ...], tables: list[tuple[int, ...]]) -> Workload:
    return Workload(
        domain_shape=sizes,
        items=tuple(
            WorkloadItem(
                name="-".join(map(str, table)) or "total",
                factors=tuple(Identity(n) if i in table else Total(n) for i, n in enumerate(sizes)),
            )
            for table in tables
        ),
    )


@pytest.mark.parametrize(
    ("sizes", "tables", "largest"),
    [
        (ADULT, all_marginals(14, (0, 1, 2, 3)), 253.605),  # Xiao et al., Table 4 (ρ = 0.5)
        (ADULT, all_marginals(14, (1, 2, 3)), 253.428),
        ((3, 4, 5, 2), [(0, 1), (1, 2, 3), (0, 3), (2,)], None),
        ((2, 7, 3), [(0, 1, 2), (1,)], None),
    ],
    ids=["adult-0-3", "adult-1-3", "mixed", "nested"],
)
def test_the_design_reaches_the_certified_optimum(sizes, tables, largest) -> None:
    workload = marginals(sizes, tables)
    design = marginal_weights_max_variance(workload)
    optimum, _ = ResidualProgram.for_marginals(sizes, tables).max_variance_optimum()
    assert design.largest_variance == pytest.approx(optimum, rel=1e-9)
    if largest is not None:
        assert design.largest_variance == pytest.approx(largest, abs=1e-3)
    assert design.lower_bound <= design.largest_variance <= design.lower_bound * (1 + 1e-6)
    assert not design.weights.stopped_early
    strategy = subset_strategy(design.weights, name="max-variance")
    assert strategy.sensitivity(noise="gaussian") == pytest.approx(1.0, rel=1e-12)
    # the variances it claims are the strategy's own, item by item
    for item, variance in zip(workload.items, design.item_variances, strict=True):
        assert strategy.item_unit_variances(item).max() == pytest.approx(variance, rel=1e-9)
    assert max(design.item_variances) == pytest.approx(design.largest_variance, rel=1e-12)


def test_it_trades_total_error_for_the_worst_cell() -> None:
    """Power: the sum-optimal design (the SVD bound) leaves Adult's worst cell 60x noisier, and
    the max-variance design pays for its worst cell with a larger total."""
    workload = marginals(ADULT, all_marginals(14, (1, 2, 3)))
    design = marginal_weights_max_variance(workload)
    total = marginal_weights_l2(workload)
    strategy = subset_strategy(total, name="total")
    worst = max(strategy.item_unit_variances(item).max() for item in workload.items)
    assert worst > 60 * design.largest_variance
    assert design.weights.unit_total_error > total.unit_total_error


def test_row_variances_equal_the_dense_strategy() -> None:
    """``a_{t,T} / μ_T`` summed per item equals diag(W (AᵀA)⁺ Wᵀ) from explicit matrices."""
    sizes = (2, 3, 4)
    workload = marginals(sizes, [(0, 1), (1, 2), (0,), ()])
    design = marginal_weights_max_variance(workload)
    strategy = subset_strategy(design.weights, name="dense")
    measured = np.column_stack([strategy.apply(cell) for cell in np.eye(2 * 3 * 4)])
    inverse = np.linalg.pinv(measured.T @ measured)
    for item, variance in zip(workload.items, design.item_variances, strict=True):
        query = np.column_stack([item.answer(cell) for cell in np.eye(2 * 3 * 4)])
        np.testing.assert_allclose(np.diag(query @ inverse @ query.T), variance, rtol=1e-9)
    assert item_row_variances(workload).shape == (4, 2**3)


def test_a_stopped_search_is_flagged_and_its_bounds_still_hold() -> None:
    workload = marginals(ADULT, all_marginals(14, (1, 2, 3)))
    design = marginal_weights_max_variance(workload, max_steps=2)
    optimum, _ = ResidualProgram.for_marginals(
        ADULT, all_marginals(14, (1, 2, 3))
    ).max_variance_optimum()
    assert design.weights.stopped_early
    assert design.weights.iterations == 2
    assert design.lower_bound <= optimum <= design.largest_variance
    assert design.largest_variance > optimum * (1 + 1e-6)


def test_a_workload_with_other_queries_is_refused_by_item_name() -> None:
    workload = Workload(
        domain_shape=(4, 3),
        items=(
            WorkloadItem(name="cells", factors=(Identity(4), Identity(3))),
            WorkloadItem(name="age_cdf", factors=(Prefix(4), Total(3))),
        ),
    )
    with pytest.raises(
        ValueError, match="max_variance needs a workload of marginals; item 'age_cdf'"
    ):
        marginal_weights_max_variance(workload)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gap": 0.0}, r"gap \(0.0\) must be in \(0, 1\)"),
        ({"gap": 1.0}, r"gap \(1.0\) must be in \(0, 1\)"),
        ({"max_steps": 0}, r"max_steps \(0\) must be >= 1"),
        ({"time_limit": 0.0}, r"time_limit \(0.0\) must be > 0 seconds or None"),
    ],
)
def test_invalid_search_settings_are_refused(options, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        marginal_weights_max_variance(marginals((3, 2), [(0,), (1,)]), **options)


def test_item_scales_weigh_the_tables() -> None:
    """A scale of 4 on one table (a target standard error half as large): the design equalises
    the scaled variances, so that table gets a larger share of the budget."""
    workload = marginals((3, 4, 5), [(0, 1), (1, 2), (0, 2)])
    plain = marginal_weights_max_variance(workload)
    scales = {"0-1": 4.0, "1-2": 1.0, "0-2": 1.0}
    weighted = marginal_weights_max_variance(workload, item_scales=scales)
    strategy = subset_strategy(weighted.weights, name="weighted")
    for item, scaled in zip(workload.items, weighted.item_variances, strict=True):
        raw = strategy.uniform_unit_variance(item)
        assert scaled == pytest.approx(scales[item.name] * raw, rel=1e-9)
    raw_first = weighted.item_variances[0] / 4.0
    assert raw_first < plain.item_variances[0]  # the tight table gets more of the budget
    assert weighted.largest_variance > plain.largest_variance  # and pays for it in scaled terms


def test_invalid_item_scales_are_refused() -> None:
    workload = marginals((3, 2), [(0,), (1,)])
    with pytest.raises(ValueError, match=r"item_scales \{'0': 0.0\} must be finite and > 0"):
        marginal_weights_max_variance(workload, item_scales={"0": 0.0, "1": 1.0})
