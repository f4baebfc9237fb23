"""mechanisms.continual: time workloads, causal factorisations W = B·A, their error and checks."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable

import numpy as np
import pytest
from scipy.optimize import approx_fprime

from dprelease.mechanisms.continual import (
    CausalFactorisation,
    cumulative,
    optimised,
    period,
    rolling,
    square_root,
    square_root_coefficients,
    square_root_matrix,
    time_workload,
)
from dprelease.mechanisms.continual.strategies import _value_and_gradient, objective_value
from tests.reference.continual import (
    binary_tree,
    check_factorises,
    mean_rmse,
    sum_of_periods,
    svd_bound_rmse,
    worst_rmse,
)

STACKED = ["period", "cumulative", {"rolling": 12}]
SMALL = ["period", "cumulative", {"rolling": 3}]
STRATEGIES: dict[str, Callable[[np.ndarray], CausalFactorisation]] = {
    "sum_of_periods": sum_of_periods,
    "square_root": square_root,
    "binary_tree": binary_tree,
    "optimised_worst": optimised,
    "optimised_total": lambda w: optimised(w, objective="total"),
}
WORKLOADS = {
    "cumulative-12": cumulative(12),
    "stacked-13": time_workload(STACKED, 13),
    "rolling-3-of-7": rolling(7, 3),
    "period-1": period(1),
}


def test_square_root_coefficients_are_binomial_over_four_to_the_k() -> None:
    assert square_root_coefficients(5).tolist() == [1, 1 / 2, 3 / 8, 5 / 16, 35 / 128]


@pytest.mark.parametrize("horizon", [1, 2, 12, 120])
def test_the_square_root_squared_is_the_cumulative_matrix(horizon: int) -> None:
    root = square_root_matrix(horizon)
    assert np.allclose(root @ root, cumulative(horizon), rtol=0, atol=1e-12)
    assert np.array_equal(root, np.tril(root))


def test_workload_blocks() -> None:
    assert rolling(4, 2).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert np.array_equal(rolling(5, 5), cumulative(5)) and np.array_equal(rolling(5, 1), period(5))
    stacked = time_workload(STACKED, 13)
    assert stacked.shape == (39, 13)
    assert np.array_equal(stacked[13:26], cumulative(13)) and np.array_equal(
        stacked[26:], rolling(13, 12)
    )


def _is_causal(factorisation: CausalFactorisation) -> bool:
    """Dense re-check, independent of the class: uses of periods / measurements by time."""
    a, b, times, horizon = (
        factorisation.A,
        factorisation.B,
        factorisation.times,
        factorisation.horizon,
    )
    measured_ok = all(a[i, j] == 0 for i in range(len(a)) for j in range(horizon) if j > times[i])
    published_ok = all(
        b[r, i] == 0 for r in range(len(b)) for i in range(len(a)) if times[i] > r % horizon
    )
    return measured_ok and published_ok


@pytest.mark.parametrize("workload", WORKLOADS.values(), ids=WORKLOADS.keys())
@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
def test_every_factorisation_is_causal_and_factorises_the_workload(
    strategy: Callable[[np.ndarray], CausalFactorisation], workload: np.ndarray
) -> None:
    factorisation = strategy(workload)
    check_factorises(factorisation, workload)
    assert np.allclose(factorisation.B @ factorisation.A, workload, rtol=0, atol=1e-9)
    assert _is_causal(factorisation)


def test_construction_refuses_a_non_causal_measurement_or_estimate() -> None:
    upper = np.triu(np.ones((3, 3)))
    with pytest.raises(
        ValueError, match=r"A is not causal: row 0 \(measured at period 0\) uses period 1"
    ):
        CausalFactorisation(upper, np.eye(3), "bad")
    with pytest.raises(
        ValueError, match=r"B is not causal: row 0 \(published at period 0\) uses measurement 1"
    ):
        CausalFactorisation(np.eye(3), upper, "bad")
    # a node measured at period 2 that covers periods 0..2 may not feed a figure published at 1
    tree = np.array([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])
    with pytest.raises(ValueError, match=r"row 1 .* uses measurement 3 taken at period 2"):
        estimate = np.array([[1.0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]])
        CausalFactorisation(tree, estimate, "bad", times=np.array([0, 1, 2, 2]))


def test_check_factorises_fires_on_a_wrong_product() -> None:
    wrong = square_root(cumulative(6))
    with pytest.raises(
        ValueError, match=r"square_root: B·A differs from the workload by 1 \(must be <= 1e-9"
    ):
        check_factorises(wrong, cumulative(6) + np.eye(6))
    with pytest.raises(ValueError, match=r"workload \(shape \(6, 5\)\) must be 6 × 6"):
        check_factorises(wrong, np.ones((6, 5)))


def _brute_sensitivity(a: np.ndarray, order: int, unit: str, max_rows: int) -> float:
    """Largest ‖A·v‖ over every neighbouring contribution v (0..max_rows rows per period)."""
    horizon = a.shape[1]
    if unit == "event":
        vectors = [max_rows * np.eye(horizon)[j] for j in range(horizon)]
    else:
        vectors = [
            np.array(v, float) for v in itertools.product(range(max_rows + 1), repeat=horizon)
        ]
    return max(float(np.linalg.norm(a @ v, ord=order)) for v in vectors)


@pytest.mark.parametrize("unit", ["event", "person"])
@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
@pytest.mark.parametrize(
    "strategy", [sum_of_periods, square_root, binary_tree], ids=lambda f: f.__name__
)
def test_sensitivity_matches_brute_force_for_non_negative_strategies(
    strategy: Callable[[np.ndarray], CausalFactorisation], noise: str, unit: str
) -> None:
    factorisation = strategy(time_workload(STACKED[:2], 5))
    order = 2 if noise == "gaussian" else 1
    for max_rows in (1, 2):
        expected = _brute_sensitivity(factorisation.A, order, unit, max_rows)
        got = factorisation.sensitivity(noise=noise, unit=unit, max_rows=max_rows)
        assert got == pytest.approx(expected, rel=1e-12)


def test_person_sensitivity_bounds_a_signed_strategy_from_above() -> None:
    # A = C^{-1/2} (coefficients 1, -1/2, -1/8, ...), B = C·C^{1/2}: causal, with negative entries
    inverse_root = np.linalg.inv(square_root_matrix(5))
    signed = CausalFactorisation(np.tril(inverse_root), cumulative(5) @ square_root_matrix(5), "s")
    assert (signed.A < 0).any()
    for noise, order in (("gaussian", 2), ("laplace", 1)):
        brute = _brute_sensitivity(signed.A, order, "person", 2)
        assert brute <= signed.sensitivity(noise=noise, unit="person", max_rows=2) * (1 + 1e-12)
        event = signed.sensitivity(noise=noise)
        assert event == pytest.approx(_brute_sensitivity(signed.A, order, "event", 1), rel=1e-12)


REFERENCE = {  # T: (sum of periods, square root, SVD bound), reference/continual.md, rho = 0.5
    12: (3.46, 1.85, 1.55),
    60: (7.75, 2.37, 2.02),
    120: (10.95, 2.59, 2.23),
}


@pytest.mark.parametrize("horizon", REFERENCE)
def test_reference_figures_for_cumulative_counts(horizon: int) -> None:
    workload = cumulative(horizon)
    summed, root, bound = REFERENCE[horizon]
    assert worst_rmse(sum_of_periods(workload), 0.5) == pytest.approx(summed, abs=0.01)
    assert worst_rmse(square_root(workload), 0.5) == pytest.approx(root, abs=0.01)
    assert svd_bound_rmse(workload, 0.5) == pytest.approx(bound, abs=0.01)
    for strategy in (sum_of_periods, square_root, binary_tree):
        assert mean_rmse(strategy(workload), 0.5) >= svd_bound_rmse(workload, 0.5)


@pytest.mark.parametrize("horizon", [12, 60])
def test_optimised_beats_the_square_root_on_cumulative_counts_and_not_the_bound(
    horizon: int,
) -> None:
    workload, root = cumulative(horizon), square_root(cumulative(horizon))
    worst, total = optimised(workload), optimised(workload, objective="total")
    assert worst.name == "optimised_worst" and total.name == "optimised_total"
    assert worst_rmse(worst, 0.5) < worst_rmse(root, 0.5)
    assert mean_rmse(total, 0.5) < mean_rmse(root, 0.5)
    assert min(mean_rmse(worst, 0.5), mean_rmse(total, 0.5)) >= svd_bound_rmse(workload, 0.5)


def test_optimised_meets_the_issue_target_on_a_stacked_workload() -> None:
    workload = time_workload(STACKED, 60)
    best = min(worst_rmse(sum_of_periods(workload), 0.5), worst_rmse(square_root(workload), 0.5))
    assert worst_rmse(optimised(workload), 0.5) <= 0.9 * best


def test_optimised_is_deterministic_and_keeps_the_square_root_when_it_cannot_improve() -> None:
    workload = time_workload(STACKED, 12)
    assert np.array_equal(optimised(workload).A, optimised(workload).A)
    # one period: A = [1] is optimal, nothing to gain; the square root itself is returned
    assert optimised(period(1)).name == "square_root"


def test_a_singular_strategy_has_an_infinite_objective() -> None:
    lower = np.tril_indices(3)
    theta = np.eye(3)[lower]
    theta[-1] = 0.0  # A[2, 2] = 0
    value, gradient = _value_and_gradient(theta, cumulative(3), lower, None)
    assert value == np.inf and not gradient.any()


@pytest.mark.parametrize("p", [None, 4.0], ids=["total", "p-norm"])
def test_the_optimised_objective_and_its_gradient(p: float | None) -> None:
    workload = time_workload(SMALL, 5)
    lower = np.tril_indices(5)
    theta = np.random.default_rng(7).uniform(0.5, 1.5, len(lower[0]))
    value, gradient = _value_and_gradient(theta, workload, lower, p)
    numeric = approx_fprime(theta, lambda t: _value_and_gradient(t, workload, lower, p)[0], 1e-7)
    assert np.allclose(gradient, numeric, rtol=1e-4, atol=1e-5 * abs(value))
    if p is None:  # the value minimised is exactly the one reported
        a = np.zeros((5, 5))
        a[lower] = theta
        a /= np.linalg.norm(a, axis=0)
        reported = objective_value(
            CausalFactorisation(a, workload @ np.tril(np.linalg.inv(a)), "x"), "total"
        )
        assert value == pytest.approx(reported, rel=1e-10)


def test_variances_scale_with_sigma_and_rho() -> None:
    root = square_root(cumulative(4))
    assert np.allclose(root.row_variances(2.0), 2 * (root.B**2).sum(axis=1))
    delta2 = root.sensitivity() ** 2
    assert worst_rmse(root, 0.25) ** 2 == pytest.approx(root.row_variances(delta2 / 0.5).max())
    assert mean_rmse(root, 0.5, unit="person", max_rows=3) ** 2 == pytest.approx(
        root.row_variances(root.sensitivity(unit="person", max_rows=3) ** 2).mean()
    )


def test_a_factorisation_is_frozen_and_read_only() -> None:
    root = square_root(cumulative(3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        root.name = "other"  # type: ignore[misc]
    with pytest.raises(ValueError, match="read-only"):
        root.A[0, 0] = 2.0


BAD_CALLS: dict[str, tuple[Callable[[], object], str]] = {
    "horizon 0": (lambda: cumulative(0), "horizon must be an integer >= 1 (got 0)"),
    "horizon 1.5": (lambda: period(1.5), "horizon must be an integer >= 1 (got 1.5)"),  # type: ignore[arg-type]
    "horizon True": (
        lambda: square_root_coefficients(True),
        "horizon must be an integer >= 1 (got True)",
    ),
    "window 0": (
        lambda: rolling(5, 0),
        "rolling window must be an integer >= 1 (got 0)",
    ),
    "window 6": (
        lambda: rolling(5, 6),
        "rolling window must satisfy window <= horizon 5 (got 6)",
    ),
    "window 2.0": (lambda: rolling(5, 2.0), "rolling window must be an integer >= 1 (got 2.0)"),  # type: ignore[arg-type]
    "kind": (lambda: time_workload(["weekly"], 5), "time_workload part 'weekly' is not one of"),
    "bare rolling": (lambda: time_workload(["rolling"], 5), "part 'rolling' needs a window"),
    "mapping": (lambda: time_workload([{"window": 3}], 5), "part {'window': 3} must be one of"),
    "empty": (
        lambda: time_workload([], 5),
        "time_workload must be a non-empty list of parts (got [])",
    ),
    "string": (
        lambda: time_workload("period", 5),
        "must be a non-empty list of parts (got 'period')",
    ),
    "A 1-D": (
        lambda: CausalFactorisation(np.ones(3), np.eye(3), "x"),
        "A (shape (3,)) must be a non-empty 2-D",
    ),
    "A nan": (
        lambda: CausalFactorisation(np.diag([1, np.nan]), np.eye(2), "x"),
        "A must be finite",
    ),
    "B inf": (
        lambda: CausalFactorisation(np.eye(2), np.diag([1, np.inf]), "x"),
        "B must be finite",
    ),
    "A not square": (
        lambda: CausalFactorisation(np.ones((3, 2)), np.ones((2, 3)), "x"),
        "A (shape (3, 2)) must be square",
    ),
    "times float": (
        lambda: CausalFactorisation(np.eye(2), np.eye(2), "x", times=np.array([0.0, 1.0])),
        "times (shape (2,)) must be 2 integers",
    ),
    "times range": (
        lambda: CausalFactorisation(np.eye(2), np.eye(2), "x", times=np.array([0, 2])),
        "times must lie in 0..1 (got 0..2)",
    ),
    "B shape": (
        lambda: CausalFactorisation(np.eye(2), np.ones((3, 2)), "x"),
        "B (shape (3, 2)) must be kT × m",
    ),
    "noise": (
        lambda: square_root(cumulative(2)).sensitivity(noise="cauchy"),
        "noise 'cauchy' is not one of",
    ),
    "unit": (
        lambda: square_root(cumulative(2)).sensitivity(unit="household"),
        "unit 'household' is not one of",
    ),
    "max_rows": (
        lambda: square_root(cumulative(2)).sensitivity(max_rows=0),
        "max_rows must be an integer >= 1 (got 0)",
    ),
    "sigma2": (
        lambda: square_root(cumulative(2)).row_variances(-1.0),
        "sigma2 must be finite and >= 0 (got -1.0)",
    ),
    "rho 0": (
        lambda: worst_rmse(square_root(cumulative(2)), 0.0),
        "rho must be finite and > 0 (got 0.0)",
    ),
    "rho nan": (
        lambda: mean_rmse(square_root(cumulative(2)), float("nan")),
        "rho must be finite and > 0 (got nan)",
    ),
    "workload rows": (
        lambda: sum_of_periods(np.ones((3, 2))),
        "workload (shape (3, 2)) must be kT × T",
    ),
    "workload nan": (lambda: square_root(np.diag([1.0, np.nan])), "workload must be finite"),
    "workload zero": (lambda: optimised(np.zeros((2, 2))), "workload must have a non-zero entry"),
    "workload future": (
        lambda: binary_tree(np.ones((2, 2))),
        "workload row 0 (published at period 0) uses period 1",
    ),
    "objective": (
        lambda: optimised(cumulative(2), objective="median"),
        "objective 'median' is not one of",
    ),
    "objective value": (
        lambda: objective_value(square_root(cumulative(2)), "mean"),
        "objective 'mean' is not one of",
    ),
    "bound rho": (
        lambda: svd_bound_rmse(cumulative(2), -1.0),
        "rho must be finite and > 0 (got -1.0)",
    ),
}


@pytest.mark.parametrize("call", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_every_validator_fires_with_its_message(call: tuple[Callable[[], object], str]) -> None:
    function, message = call
    with pytest.raises(ValueError, match=re.escape(message)):
        function()
