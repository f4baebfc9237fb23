"""A series' published errors follow the predicted standard errors: 500 simulated series of 12
periods through the real measurement path (each period's protected counts combined by the choke
point as the time strategy's row asks, measured at the plan's unit level with a seeded test
sampler) and the real estimator (:func:`catalog.series.period_answers`), no Prefect.

Spec: region (3) × age (4), tables {region} and the total, time workload [period, cumulative,
{rolling: 3}] (an optimised causal factorisation ``W = B·A``), ρ = 0.5 event level.

What is checked, per cell table:

* every published standard error equals, independently of the product's variance formulas,
  ``σ·‖B_r‖·√(W (SᵀS)⁺ Wᵀ)_jj`` (S, W: explicit cell strategy and query matrices from unit
  vectors), and the plan's predicted worst standard error (at the textbook σ) is the largest of
  them up to OpenDP's calibration slack;
* the errors follow the full covariance ``Σ = σ²·(B Bᵀ) ⊗ C`` of one series' published figures
  (all parts, all periods, all cells; C = W (SᵀS)⁺ Wᵀ): ``q = eᵀ Σ⁺ e`` is χ²(rank Σ) per series,
  so the sum over R = 500 independent series is χ²(R·rank Σ).  Accepted between its α/4 and
  1 − α/4 quantiles (two tables, two sides: false-failure rate at most α = 1e-6).  Power: the
  same statistic with σ claimed 10% too small or too large is rejected.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dprelease.catalog.confidential.choke_point import ProtectedCells, ProtectedMarginals
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.planning.series import make_series_plan
from dprelease.catalog.series import period_answers
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms.marginal_space import marginal_of
from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import MeasureContext
from tests.doubles import FreeAccountant
from tests.samplers import SeededNumpyNoise
from tests.unit.catalog.test_spec_series import raw_series_spec

pytestmark = pytest.mark.statistical

ALPHA = 1e-6
SERIES = 500
HORIZON = 12


def _protected(plan, x: np.ndarray, shape: tuple[int, ...]):
    if plan.mechanism.input_kind == "cells":
        return ProtectedCells(x, domain_shape=shape, contribution_bound=1)
    subsets = plan.strategy.marginal_subsets
    tables = {axes: marginal_of(x, shape, axes) for axes in subsets}
    return ProtectedMarginals(tables, domain_shape=shape, contribution_bound=1)


def _outside(statistic: float, dof: int, tables: int) -> bool:
    tail = ALPHA / (2 * tables)
    return not stats.chi2.ppf(tail, dof) <= statistic <= stats.chi2.isf(tail, dof)


def test_published_errors_follow_the_predicted_standard_errors(
    tmp_path, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    raw = raw_series_spec()
    raw["series"] = {
        "period": "file",
        "horizon": HORIZON,
        "time_workload": ["period", "cumulative", {"rolling": 3}],
    }
    spec = parse_spec(raw)
    plan = make_plan(spec)
    series_plan = make_series_plan(spec, plan)
    workload = plan.workload
    assert workload is not None
    shape = workload.domain_shape
    cells = int(np.prod(shape))
    parts = series_plan.parts

    unit = np.eye(cells)
    strategy_matrix = np.column_stack([plan.strategy.apply(column) for column in unit])
    gram_inverse = np.linalg.pinv(strategy_matrix.T @ strategy_matrix)
    cell_cov = {}
    for item in workload.items:
        query = np.column_stack([item.answer(column) for column in unit])
        cell_cov[item.name] = query @ gram_inverse @ query.T
    time_cov = series_plan.B @ series_plan.B.T  # rows block-major: part b, period t
    time_precision = np.linalg.pinv(time_cov, hermitian=True)
    time_rank = int(np.linalg.matrix_rank(time_cov, hermitian=True))

    sampler = SeededNumpyNoise(np.random.default_rng(20261129))
    monkeypatch.setattr(noise, "production_sampler", lambda: sampler)
    context = MeasureContext(
        target=PrivacyCost(measure="zcdp", rho=series_plan.rho_unit),
        accountant=FreeAccountant(),
        label="series test",
        contribution_bound=1,
        input_fingerprint="f" * 64,
        dataset_id="monthly",
        released=None,
    )
    statistic = dict.fromkeys(cell_cov, 0.0)
    largest: dict[str, list[float]] = {}  # the first series' worst published standard errors
    scale = None
    for _ in range(SERIES):
        counts = rng.integers(0, 30, (HORIZON, cells)).astype(np.float64)
        protected = [_protected(plan, x, shape) for x in counts]
        measurements, errors = [], {name: [] for name in cell_cov}
        for t in range(HORIZON):
            combined = type(protected[0]).combination(
                protected[: t + 1], list(series_plan.A[t, : t + 1])
            )
            measured = plan.mechanism.measure(plan.strategy, combined, context=context)
            scale = measured.noise.scale
            measurements.append(measured.values)
            answers = period_answers(
                series_plan, plan, workload, np.vstack(measurements), scale=scale, period=t
            )
            for b, part in enumerate(parts):
                row = series_plan.B[b * HORIZON + t]
                truth = series_plan.factorisation.B[b * HORIZON + t] @ series_plan.A @ counts
                for item in workload.items:
                    published = answers[f"{item.name}.{part}"]
                    expected = scale**2 * float(row @ row) * np.diag(cell_cov[item.name])
                    np.testing.assert_allclose(published.variances, expected, rtol=1e-8)
                    errors[item.name].append(published.estimates - item.answer(truth))
                    if len(largest.get(f"{item.name}.{part}", [])) == t:
                        largest.setdefault(f"{item.name}.{part}", []).append(
                            float(np.sqrt(published.variances).max())
                        )
        for item in workload.items:
            # rows of e in time-row order (part-major), matching time_cov: put them there
            by_period = np.array(errors[item.name]).reshape(HORIZON, len(parts), -1)
            e = by_period.transpose(1, 0, 2).reshape(len(parts) * HORIZON, -1)
            cell_precision = np.linalg.pinv(cell_cov[item.name], hermitian=True)
            statistic[item.name] += float(np.trace(time_precision @ e @ cell_precision @ e.T))
    assert scale is not None and scale >= series_plan.sigma * (1 - 1e-9)
    assert scale <= series_plan.sigma * 1.01  # OpenDP's slack is small
    for name, value in statistic.items():
        cell_rank = int(np.linalg.matrix_rank(cell_cov[name], hermitian=True))
        dof = SERIES * time_rank * cell_rank
        q = value / scale**2
        assert not _outside(q, dof, len(statistic)), (name, q / dof)
        for wrong in (0.9, 1.1):  # power: σ claimed 10% off
            assert _outside(q / wrong**2, dof, len(statistic)), (name, wrong)
    predicted = series_plan.predicted_std_errors()  # at the textbook σ
    assert predicted.keys() == largest.keys()
    for name, values in largest.items():
        np.testing.assert_allclose(
            np.array(predicted[name]) * scale / series_plan.sigma, values, rtol=1e-8
        )
