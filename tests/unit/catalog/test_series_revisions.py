"""Why a series has no ``revisions`` table: under every plan a series uses (square root for
cumulative counts alone, the optimised causal factorisation otherwise), ``A`` is square, lower-
triangular and invertible, so each period's measurement brings one new unknown (that period's
counts) and the least-squares estimate of a past period's rows from all measurements recorded so
far equals the figure published at that period.  Checked on random measurements (any noisy
values) for both plan kinds, after checking that what the series publishes (``B`` times the
measurements) is that least-squares estimate; and the same check finds revisions for a redundant
strategy (each period measured twice), so it can fail."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.planning.series import make_series_plan
from dprelease.mechanisms.continual import time_workload
from tests.unit.catalog.test_series_report import series_spec


def least_squares_upto(
    G: np.ndarray, period_of_row: np.ndarray, m: np.ndarray, upto: int
) -> np.ndarray:
    """Least-squares x_0..x_upto from the rows measured at periods ≤ ``upto``.  O(rows·T²)."""
    rows = period_of_row <= upto
    return np.linalg.lstsq(G[rows][:, : upto + 1], m[rows], rcond=None)[0]


def largest_revision(
    G: np.ndarray, period_of_row: np.ndarray, W: np.ndarray, horizon: int, m: np.ndarray
) -> float:
    """max |W_r·x̂(all measurements to t) − W_r·x̂(measurements to s)| over part rows r of period
    s and later periods t.  O(T² · rows · T²) for these small T."""
    estimates = [least_squares_upto(G, period_of_row, m, t) for t in range(horizon)]
    worst = 0.0
    for r in range(W.shape[0]):
        s = r % horizon
        published = W[r, : s + 1] @ estimates[s][: s + 1]
        for t in range(s, horizon):
            worst = max(
                worst, float(np.abs(W[r, : s + 1] @ estimates[t][: s + 1] - published).max())
            )
    return worst


@pytest.mark.parametrize(
    ("time_workload_parts", "kind"),
    [(["cumulative"], "square_root"), (["period", "cumulative", {"rolling": 3}], "optimised")],
)
def test_later_measurements_never_revise_a_published_figure(
    tmp_path: Path, time_workload_parts: list, kind: str
) -> None:
    spec = series_spec(tmp_path, horizon=8, time_workload=time_workload_parts)
    plan = make_series_plan(spec, make_plan(spec))
    assert plan.time_strategy.startswith(kind)
    T = plan.horizon
    A = plan.A
    assert A.shape == (T, T) and np.allclose(A, np.tril(A)) and np.all(np.abs(np.diag(A)) > 0)
    W = time_workload(spec.series.parts(), T)
    rng = np.random.default_rng(20261129)  # public randomness: arbitrary measurement values
    m = rng.normal(scale=50.0, size=(T, 3))
    # what a series publishes at period s is the least-squares estimate from periods <= s
    for r in range(W.shape[0]):
        s = r % T
        estimate = least_squares_upto(A, np.arange(T), m, s)
        np.testing.assert_allclose(
            plan.B[r, : s + 1] @ m[: s + 1], W[r, : s + 1] @ estimate, atol=1e-8 * 50 * T
        )
    assert largest_revision(A, np.arange(T), W, T, m) < 1e-8 * 50 * T


def test_a_redundant_strategy_would_revise_past_figures() -> None:
    T = 6
    A = np.tril(np.ones((T, T)))  # running totals, and each period's count measured again
    G = np.vstack([A, np.eye(T)])
    period_of_row = np.concatenate([np.arange(T), np.arange(T)])
    W = time_workload(["cumulative"], T)
    m = np.random.default_rng(7).normal(scale=50.0, size=(2 * T, 3))  # public randomness
    assert largest_revision(G, period_of_row, W, T, m) > 1.0
