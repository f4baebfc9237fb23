"""Derived statistics (mean, sum, quantiles): support queries against dense matrices, the error
algebra against explicit covariance matrices, estimators on exact data, spec validators, tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning.planner import build_workload
from dprelease.catalog.publishing.tables import DERIVED_VALUE_COLUMNS, derived_tables
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import derived_rows, item_num_queries
from dprelease.mechanisms import derived
from dprelease.mechanisms.derived import Z95, BinnedColumn
from dprelease.mechanisms.primitives.intervals import normal_quantile
from dprelease.mechanisms.primitives.operators import kron_dense
from dprelease.mechanisms.primitives.protocol import ItemAnswers

AGES = BinnedColumn.of_cells(np.arange(0, 50, 10), np.arange(9, 50, 10), integer=True)
"""Five integer cells 0-9, …, 40-49: representative 4.5, …, 44.5; records off by ≤ 4.5."""


def spec_with(*items: dict[str, Any], domain: dict[str, Any] | None = None) -> Any:
    return parse_spec(
        {
            "name": "t",
            "dataset": {"id": "d", "budget": {"epsilon": 10}},
            "domain": domain
            or {
                "sex": {"values": ["f", "m"]},
                "age": {"min": 0, "max": 49, "width": 10},
                "income": {"bins": [0, 10, 20, 50, 100]},
            },
            "workload": list(items),
            "privacy": {"epsilon": 1.0},
        }
    )


# --- binned columns -------------------------------------------------------------------------------


def test_binned_column_midpoints_edges_and_record_error() -> None:
    np.testing.assert_allclose(AGES.representative, [4.5, 14.5, 24.5, 34.5, 44.5])
    np.testing.assert_allclose(AGES.value_high, [9, 19, 29, 39, 49])
    assert AGES.integer
    assert AGES.max_record_error() == 4.5 and AGES.spread == 40 and AGES.low == 4.5
    bins = BinnedColumn.of_cells(np.array([0.0, 10, 20]), np.array([10.0, 20, 50]), integer=False)
    assert bins.max_record_error() == 15.0
    units = BinnedColumn.of_cells(np.arange(5), np.arange(5), integer=True)
    assert units.max_record_error() == 0.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(representative=np.array([1.0, 2.0])), "one value_low"),
        (dict(size=1), "at least 2 cells"),
        (dict(representative=np.array([0.0, 30.0, 25.0])), "lies outside the cell's values"),
        (dict(representative=np.array([9.0, 9.0, 9.0]), low=np.zeros(3)), "must not all be equal"),
        (dict(representative=np.array([np.nan, 15.0, 25.0])), "must be finite"),
    ],
)
def test_binned_column_validators_fire(kwargs: dict[str, Any], message: str) -> None:
    size = kwargs.pop("size", 3)
    high = np.arange(size) * 10.0 + 10
    low = kwargs.pop("low", high - 10)
    rep = kwargs.get("representative", (low + high) / 2)
    if size < 2:  # one cell: a valid representative but too few cells
        rep = np.array([5.0])
    with pytest.raises(ValueError, match=message):
        BinnedColumn(value_low=low, value_high=high, representative=rep, integer=False)


# --- support queries against dense matrices -------------------------------------------------------


@pytest.mark.parametrize("column_axis, by_axes", [(1, (0,)), (0, (2,)), (1, ()), (2, (0, 1))])
@pytest.mark.parametrize("kind", ["mean", "quantiles"])
def test_support_rows_and_grouping_match_the_dense_matrix(
    kind: str, column_axis: int, by_axes: tuple[int, ...]
) -> None:
    shape = (5, 5, 5)
    item = derived.support_item(
        name="x",
        kind=kind,
        domain_shape=shape,
        column_axis=column_axis,
        by_axes=by_axes,
        column=AGES,
    )
    x = np.random.default_rng(3).integers(0, 9, int(np.prod(shape))).astype(np.float64)
    grouped = derived.per_group(item, item.answer(x), column_axis=column_axis)
    np.testing.assert_allclose(
        grouped, derived.per_group(item, kron_dense(item.factors) @ x, column_axis=column_axis)
    )
    cube = np.moveaxis(x.reshape(shape), column_axis, -1)
    others = [a for a in range(3) if a != column_axis]
    summed = tuple(i for i, a in enumerate(others) if a not in by_axes)
    hist = cube.sum(axis=summed).reshape(-1, 5)  # (groups, cells), groups row-major
    expected = np.cumsum(hist, axis=1) if kind == "quantiles" else hist @ AGES.moments_matrix().T
    np.testing.assert_allclose(grouped, expected)


def test_support_item_refuses_inconsistent_axes() -> None:
    with pytest.raises(ValueError, match="has 4"):
        derived.support_item(
            name="x", kind="mean", domain_shape=(4,), column_axis=0, by_axes=(), column=AGES
        )
    with pytest.raises(ValueError, match="both the column and a group"):
        derived.support_item(
            name="x", kind="mean", domain_shape=(5, 2), column_axis=0, by_axes=(0,), column=AGES
        )


# --- error algebra against explicit covariance matrices -------------------------------------------


def _moments_variances(cov_cells: np.ndarray) -> np.ndarray:
    m = AGES.moments_matrix()
    return np.diag(m @ cov_cells @ m.T)[None, :]


@pytest.fixture
def cov_cells() -> np.ndarray:
    a = np.random.default_rng(7).normal(size=(5, 5))
    return a @ a.T + np.eye(5)  # correlated cell errors, as least squares produces


def test_sum_variance_is_exact_for_any_cell_covariance(cov_cells: np.ndarray) -> None:
    counts = np.array([[100.0, 50, 20, 10, 5]])
    estimates = counts @ AGES.moments_matrix().T
    rows = derived.moments(
        estimates,
        _moments_variances(cov_cells),
        np.array([["noise"] * 3]),
        column=AGES,
        mean=False,
    )
    rep = AGES.representative
    assert rows.estimate[0] == pytest.approx(counts[0] @ rep)
    assert rows.std_error[0] ** 2 == pytest.approx(rep @ cov_cells @ rep, rel=1e-9)
    assert rows.binning_error[0] == pytest.approx(4.5 * counts.sum())


def test_mean_variance_is_the_delta_method_with_the_covariance(cov_cells: np.ndarray) -> None:
    counts = np.array([[100.0, 50, 20, 10, 5]])
    estimates = counts @ AGES.moments_matrix().T
    rows = derived.moments(
        estimates,
        _moments_variances(cov_cells),
        np.array([["noise"] * 3]),
        column=AGES,
        mean=True,
    )
    rep = AGES.representative
    mean = counts[0] @ rep / counts.sum()
    gradient = (rep - mean) / counts.sum()  # ∂(Σ r h / Σ h)/∂h
    assert rows.estimate[0] == pytest.approx(mean)
    assert rows.std_error[0] ** 2 == pytest.approx(gradient @ cov_cells @ gradient, rel=1e-9)
    assert rows.ci_low[0] == pytest.approx(mean - Z95 * rows.std_error[0])
    assert rows.claimed[0] and rows.uncertainty[0] == "noise" and rows.binning_error[0] == 4.5
    # ignoring the covariance of numerator and denominator gives another (wrong) figure
    v = _moments_variances(cov_cells)[0]
    independent = 40**2 * (v[1] + (mean - 4.5) ** 2 / 40**2 * v[0]) / counts.sum() ** 2
    assert abs(independent - rows.std_error[0] ** 2) > 0.05 * rows.std_error[0] ** 2


def test_mean_of_an_indistinguishable_count_claims_no_interval() -> None:
    estimates = np.array([[1.0, 0.5, 0.0], [-3.0, 2.0, 3.5], [500.0, 100.0, -150.0]])
    variances = np.full((3, 3), 4.0)
    labels = np.array([["noise"] * 3, ["noise"] * 3, ["noise", "noise+bias", "noise"]])
    rows = derived.moments(estimates, variances, labels, column=AGES, mean=True)
    assert list(rows.uncertainty) == ["noise-only", "noise-only", "noise+bias"]
    assert list(rows.claimed) == [False, False, True]
    assert np.all((rows.estimate >= 4.5) & (rows.estimate <= 44.5))
    assert np.all(np.isfinite(rows.std_error) & (rows.std_error > 0))
    assert rows.ci_low[2] >= 4.5 and rows.ci_high[2] <= 44.5


def test_weakest_label_wins() -> None:
    labels = np.array([["noise", "noise"], ["noise+bias", "noise"], ["noise-only", "noise+bias"]])
    assert list(derived.weakest_label(labels)) == ["noise", "noise+bias", "noise-only"]


# --- quantiles ------------------------------------------------------------------------------------


def test_quantiles_of_exact_counts_interpolate_within_the_right_cell() -> None:
    counts = np.array([[10.0, 45, 25, 15, 5], [0, 0, 0, 0, 100]])
    cdf = np.cumsum(counts, axis=1)
    rows = derived.quantiles(
        cdf, np.full(cdf.shape, 1e-12), np.full(cdf.shape, "noise"), column=AGES, levels=(0.5, 0.9)
    )
    # group 0: median at 50 of 100 → cell 10-19 (F = 10, 55): 10 + ⌊10·40/45⌋ = 18
    # q0.9 at 90 → cell 30-39 (F = 80, 95): 30 + ⌊10·10/15⌋ = 36
    np.testing.assert_allclose(rows.estimate, [18, 36, 45, 49])
    np.testing.assert_allclose(rows.ci_low, [10, 30, 40, 40])
    np.testing.assert_allclose(rows.ci_high, [19, 39, 49, 49])
    np.testing.assert_allclose(rows.binning_error, 9.0)
    assert set(rows.uncertainty) == {"interval"}
    np.testing.assert_allclose(rows.std_error, (rows.ci_high - rows.ci_low + 1) / (2 * Z95))
    bins = BinnedColumn.of_cells(np.array([0.0, 1, 2]), np.array([1.0, 2, 4]), integer=False)
    real = derived.quantiles(
        np.array([[20.0, 60, 100]]),
        np.full((1, 3), 1e-12),
        np.full((1, 3), "noise"),
        column=bins,
        levels=(0.5,),
    )
    np.testing.assert_allclose(real.estimate, [1.75])  # 1 + (50 − 20)/40 of [1, 2)
    np.testing.assert_allclose(real.std_error, (2 - 1) / (2 * Z95))


def test_quantile_intervals_contain_the_estimate_and_widen_with_noise() -> None:
    rng = np.random.default_rng(11)
    counts = rng.integers(0, 40, (200, 5)).astype(np.float64)
    cdf = np.cumsum(counts, axis=1) + rng.normal(0, 6, (200, 5))
    for variance in (1.0, 36.0, 400.0):
        rows = derived.quantiles(
            cdf,
            np.full(cdf.shape, variance),
            np.full(cdf.shape, "noise"),
            column=AGES,
            levels=(0.1, 0.5, 0.9),
        )
        assert np.all(rows.ci_low <= rows.estimate) and np.all(rows.estimate <= rows.ci_high)
    wide = derived.quantiles(
        cdf, np.full(cdf.shape, 1e6), np.full(cdf.shape, "noise"), column=AGES, levels=(0.5,)
    )
    np.testing.assert_allclose(wide.ci_low, 0)  # the count is not located: the whole range
    np.testing.assert_allclose(wide.ci_high, 49)
    unclaimed = derived.quantiles(
        cdf, np.ones(cdf.shape), np.full(cdf.shape, "noise-only"), column=AGES, levels=(0.5,)
    )
    assert not unclaimed.claimed.any() and set(unclaimed.uncertainty) == {"noise-only"}


# --- spec -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "item, message",
    [
        ({"quantiles": {"of": "age", "q": [0.5, 1.0]}}, r"level 1.0 must lie strictly between"),
        ({"quantiles": {"of": "age", "q": [0.5, 0.5]}}, r"lists a level twice"),
        ({"quantiles": {"of": "age", "q": []}}, r"must list 1 to 99 levels"),
        ({"marginal": ["age"], "by": ["sex"]}, r"by applies only to derived items"),
        ({"prefix": "age", "representative": [1.0]}, r"representative applies only to derived"),
        ({"mean": "age", "by": ["sex", "sex"]}, r"lists an attribute twice"),
        ({"mean": "age", "by": ["age"]}, r"must not contain the column 'age'"),
        ({"mean": "sex"}, r"mean needs a numeric column .* 'sex' is categorical"),
        ({"sum": "age", "by": ["zip"]}, r"unknown attribute 'zip'"),
        (
            {"mean": "age", "representative": [1.0, 2.0]},
            r"representative lists 2 values but 'age' has 5",
        ),
        ({"mean": "age", "representative": [5.0, 15, 25, 35, 50]}, r"50 of cell 4 lies outside"),
        ({"mean": "age", "sum": "income"}, r"exactly one of .* \(got \['mean', 'sum'\]\)"),
    ],
)
def test_derived_spec_validators_fire(item: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        spec_with({"name": "d", **item})


def test_derived_items_build_support_queries_and_count_rows() -> None:
    spec = spec_with(
        {"name": "m", "mean": "age", "by": ["sex"]},
        {"name": "s", "sum": "income", "representative": [5.0, 15, 30, 60]},
        {"name": "q", "quantiles": {"of": "income", "q": [0.5, 0.9]}, "by": ["sex", "age"]},
    )
    workload = build_workload(spec)
    assert [i.name for i in workload.items] == ["m.moments", "s.moments", "q.cdf"]
    assert [i.num_queries for i in workload.items] == [6, 3, 40]
    assert [derived_rows(spec, i) for i in spec.workload] == [2, 1, 20]
    assert [item_num_queries(spec, i) for i in spec.workload] == [8, 4, 60]


def test_derived_tables_from_exact_answers() -> None:
    spec = spec_with(
        {"name": "m", "mean": "age", "by": ["sex"]},
        {"name": "s", "sum": "age"},
        {"name": "q", "quantiles": {"of": "age", "q": [0.5]}, "by": ["sex"]},
    )
    workload = build_workload(spec)
    x = np.random.default_rng(5).integers(1, 30, workload.num_cells).astype(np.float64)
    answers = {
        i.name: ItemAnswers(estimates=i.answer(x), variances=np.full(i.num_queries, 2.0))
        for i in workload.items
    }
    tables = derived_tables(spec, answers)
    ages = x.reshape(2, 5, 4).sum(axis=2)  # (sex, age cell)
    mean = tables["m"].to_pydict()
    assert list(mean) == ["sex", *DERIVED_VALUE_COLUMNS]
    assert mean["sex"] == ["f", "m"] and mean["statistic"] == ["mean", "mean"]
    np.testing.assert_allclose(mean["estimate"], ages @ AGES.representative / ages.sum(axis=1))
    total = tables["s"].to_pydict()
    assert total["statistic"] == ["sum"]
    np.testing.assert_allclose(total["estimate"], [ages.sum(axis=0) @ AGES.representative])
    np.testing.assert_allclose(total["binning_error"], [4.5 * ages.sum()])
    median = tables["q"].to_pydict()
    assert median["statistic"] == ["q0.5", "q0.5"] and median["uncertainty"] == ["interval"] * 2
    assert all(
        lo <= e <= hi
        for lo, e, hi in zip(median["ci_low"], median["estimate"], median["ci_high"], strict=True)
    )


def test_z95_is_the_normal_quantile_written_out() -> None:
    assert normal_quantile(0.95) == Z95  # the same float, not merely close
