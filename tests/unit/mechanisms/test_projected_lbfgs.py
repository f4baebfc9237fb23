"""The projected L-BFGS optimiser behind p-Identity: solutions, bounds, stopping, contract."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize

from dprelease.mechanisms.optimized import projected_lbfgs


def _least_squares(matrix: np.ndarray, target: np.ndarray) -> projected_lbfgs.Objective:
    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        residual = matrix @ x - target
        return float(residual @ residual), 2.0 * (matrix.T @ residual)

    return objective


def test_nonnegative_least_squares_matches_nnls() -> None:
    """min ‖Ax − b‖² over x ≥ 0 with several active bounds: the same point as scipy's NNLS."""
    rng = np.random.default_rng(3)  # public randomness: a test problem
    matrix = rng.standard_normal((40, 15))
    target = rng.standard_normal(40)
    expected, _ = scipy.optimize.nnls(matrix, target)
    assert 0 < np.count_nonzero(expected == 0.0) < 15  # bounds matter, but not all of them
    result = projected_lbfgs.minimize(
        _least_squares(matrix, target), np.ones(15), nonnegative=True, max_iterations=500
    )
    assert np.all(result.x >= 0.0)
    np.testing.assert_allclose(result.x, expected, atol=1e-6)
    assert result.converged


def test_unconstrained_rosenbrock_reaches_its_minimum() -> None:
    def rosenbrock(x: np.ndarray) -> tuple[float, np.ndarray]:
        return float(scipy.optimize.rosen(x)), scipy.optimize.rosen_der(x)

    start = np.array([-1.2, 1.0, -0.5, 0.8])
    result = projected_lbfgs.minimize(rosenbrock, start, nonnegative=False, max_iterations=2000)
    np.testing.assert_allclose(result.x, np.ones(4), atol=1e-5)
    # the bound is what keeps x ≥ 0 : without it the first coordinate goes negative on the way
    bounded = projected_lbfgs.minimize(rosenbrock, np.abs(start), nonnegative=True)
    np.testing.assert_allclose(bounded.x, np.ones(4), atol=1e-5)


def test_a_negative_start_is_projected_and_the_bound_holds_at_every_evaluation() -> None:
    seen: list[np.ndarray] = []
    target = np.array([-2.0, 3.0, -1.0, 0.5])

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        seen.append(x)
        return float(np.sum((x - target) ** 2)), 2.0 * (x - target)

    result = projected_lbfgs.minimize(objective, -np.ones(4), nonnegative=True)
    np.testing.assert_allclose(result.x, np.maximum(target, 0.0), atol=1e-9)
    assert all(np.all(x >= 0.0) for x in seen)


def test_points_are_never_written_after_their_evaluation() -> None:
    """p-Identity keeps a reference to its best point instead of copying 8 MB per iteration."""
    rng = np.random.default_rng(5)  # public randomness: a test problem
    matrix = rng.standard_normal((30, 12))
    target = rng.standard_normal(30)
    inner = _least_squares(matrix, target)
    evaluated: list[tuple[np.ndarray, np.ndarray]] = []

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        evaluated.append((x, x.copy()))
        return inner(x)

    projected_lbfgs.minimize(objective, np.ones(12), nonnegative=True, max_iterations=50)
    assert len(evaluated) > 5
    for reference, snapshot in evaluated:
        np.testing.assert_array_equal(reference, snapshot)


def test_callback_stops_and_counts_iterations() -> None:
    calls: list[tuple[int, float]] = []

    def stop_at_three(iteration: int, value: float) -> bool:
        calls.append((iteration, value))
        return iteration == 3

    result = projected_lbfgs.minimize(
        lambda x: (float(scipy.optimize.rosen(x)), scipy.optimize.rosen_der(x)),
        np.array([-1.2, 1.0]),
        nonnegative=False,
        callback=stop_at_three,
    )
    assert [iteration for iteration, _ in calls] == [1, 2, 3]
    assert result.iterations == 3 and not result.converged
    assert [value for _, value in calls] == sorted(value for _, value in calls)[::-1]  # descent
    assert result.fun == calls[-1][1]


def test_an_exception_from_the_objective_propagates() -> None:
    class Interrupted(Exception):
        pass

    count = {"calls": 0}

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        count["calls"] += 1
        if count["calls"] == 4:
            raise Interrupted
        return float(scipy.optimize.rosen(x)), scipy.optimize.rosen_der(x)

    with pytest.raises(Interrupted):
        projected_lbfgs.minimize(objective, np.array([-1.2, 1.0]), nonnegative=False)
    assert count["calls"] == 4


def test_a_non_finite_trial_is_backtracked() -> None:
    """Beyond x = 2 the objective is +inf (as p-Identity's is when M cannot be factored)."""

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        if np.any(x > 2.0):
            return float("inf"), np.zeros_like(x)
        return float(np.sum((x - 1.5) ** 2)), 2.0 * (x - 1.5)

    result = projected_lbfgs.minimize(objective, np.zeros(3), nonnegative=True)
    np.testing.assert_allclose(result.x, 1.5, atol=1e-8)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"memory": 0}, r"memory \(0\) must be >= 1"),
        ({"max_iterations": -1}, r"max_iterations \(-1\) must be >= 0"),
    ],
)
def test_invalid_settings_are_refused(options: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        projected_lbfgs.minimize(
            lambda x: (float(x @ x), 2.0 * x), np.ones(2), nonnegative=False, **options
        )
