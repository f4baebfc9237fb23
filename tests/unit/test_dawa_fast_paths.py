"""DAWA's fast paths give the numbers of the plain computations they replace.

GreedyH's golden section on Python floats (mechanisms/dawa/greedy_h.py) against the same search on
arrays, and the row-wise NaN quantile of the roughness estimate (mechanisms/dawa/uncertainty.py)
against ``np.nanquantile``.
"""

from __future__ import annotations

import numpy as np
import pytest

from dprelease.mechanisms.dawa import greedy_h
from dprelease.mechanisms.dawa.greedy_h import (
    _LAMBDA_GRID,
    _LAMBDA_GRID_STEP,
    _LAMBDA_MAX,
    _golden_section_on_arrays,
    _golden_section_per_node,
    greedy_h_strategy,
)
from dprelease.mechanisms.dawa.partition import Partition
from dprelease.mechanisms.dawa.uncertainty import _nan_quantile_rows
from tests.reference.dawa import ranges_workload


def random_rows(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    """Rows mixing scales, ties (rounded values), NaNs at a random rate and a few infinities."""
    values = rng.normal(size=(rows, width)) * 10.0 ** rng.uniform(-3, 6, size=(rows, 1))
    values[::3] = np.round(values[::3])
    values[rng.random((rows, width)) < rng.uniform(0.0, 0.9, size=(rows, 1))] = np.nan
    values[rng.random((rows, width)) < 0.02] = np.inf
    values[rng.random((rows, width)) < 0.02] = -np.inf
    return values


@pytest.mark.parametrize("quantile", [0.0, 0.1, 0.25, 0.5, 0.9, 0.999, 1.0])
@pytest.mark.parametrize("width", [1, 2, 3, 17, 40])
def test_nan_quantile_rows_equals_numpy_nanquantile(quantile: float, width: int) -> None:
    rng = np.random.default_rng(width * 1000 + int(quantile * 1000))
    rows = random_rows(rng, 400, width)
    rows[rows.shape[0] // 2] = np.nan  # an all-NaN row
    rows[-1] = np.nan
    rows[-1, width // 2] = 7.5  # a single value
    with np.errstate(invalid="ignore"):  # inf − inf between infinite neighbours: NaN in both
        with pytest.warns(RuntimeWarning, match="All-NaN slice"):
            expected = np.nanquantile(rows, quantile, axis=1)
        got = _nan_quantile_rows(rows, quantile)
    assert np.isnan(expected).any() and np.isfinite(expected).any()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0.0, equal_nan=True)
    assert got[-1] == 7.5


def test_nan_quantile_rows_of_nans_only_are_nan_without_a_warning() -> None:
    rows = np.full((3, 17), np.nan)
    rows[1, 4] = -2.0
    got = _nan_quantile_rows(rows, 0.9)  # warnings are errors in this suite
    np.testing.assert_array_equal(got, [np.nan, -2.0, np.nan])


def test_nan_quantile_rows_interpolates_between_order_statistics() -> None:
    # Values 0 … 10 shuffled, NaNs interleaved: position 0.9 · 10 = 9 exactly, 0.95 · 10 = 9.5.
    rng = np.random.default_rng(3)
    row = np.append(rng.permutation(np.arange(11.0)), [np.nan] * 6)[rng.permutation(17)]
    assert _nan_quantile_rows(row[None, :], 0.9)[0] == 9.0
    assert _nan_quantile_rows(row[None, :], 0.95)[0] == 9.5


def test_golden_section_per_node_equals_the_array_search_bit_for_bit() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        n = int(rng.integers(1, 40))
        e = rng.uniform(0.1, 100.0, n)
        mixed = rng.uniform(0.0, 500.0, n)
        d = rng.uniform(0.5, 20.0, n)
        start = rng.uniform(0.0, _LAMBDA_MAX, n)
        left = np.maximum(start - _LAMBDA_GRID_STEP, 0.0)
        right = np.minimum(start + _LAMBDA_GRID_STEP, _LAMBDA_MAX)
        node_left, node_right = _golden_section_per_node(left, right, e, mixed, d)
        array_left, array_right = _golden_section_on_arrays(left, right, e, mixed, d)
        np.testing.assert_array_equal(node_left, array_left)
        np.testing.assert_array_equal(node_right, array_right)
        assert np.all(node_right - node_left < 1e-9)  # the search ran: brackets shrank


@pytest.mark.parametrize("branching", [2, 3])
def test_greedy_h_lambdas_do_not_depend_on_the_golden_section_path(
    branching: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    n = 200
    ends = np.sort(rng.integers(0, n, (300, 2)), axis=1)
    workload = ranges_workload(ends[:, 0], ends[:, 1], n_cells=n)
    partition = Partition.singletons(n)
    monkeypatch.setattr(greedy_h, "_GOLDEN_PER_NODE_MAX_NODES", 0)
    on_arrays = greedy_h_strategy(workload, partition, branching=branching)
    monkeypatch.setattr(greedy_h, "_GOLDEN_PER_NODE_MAX_NODES", n)
    per_node = greedy_h_strategy(workload, partition, branching=branching)
    lambdas = np.concatenate(per_node.lambdas)
    assert np.any(~np.isin(lambdas, _LAMBDA_GRID))  # some λ came from the golden section
    for node_lam, array_lam in zip(per_node.lambdas, on_arrays.lambdas, strict=True):
        np.testing.assert_array_equal(node_lam, array_lam)
    assert per_node.error_trace == on_arrays.error_trace
