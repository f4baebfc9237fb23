"""Accuracy targets hold in released tables: 2,000 simulated releases of a spec with three tables
and three different ``max_std_error`` targets.

Spec: a (6 values) × b (5) × c (4); tables {a, b} (target 6), {c} (target 2) and {a} (target 4),
Gaussian noise; ``plan`` finds the smallest ρ and the subset-space strategy weighted by
1/target².  Each release goes through the real path: ``ProtectedMarginals.measure`` at the
planned level with a seeded test sampler, then the mechanism's reconstruct.

What is checked, per table t:

* the covariance of its released errors, ``Σ_t = σ² W_t (AᵀA)⁺ W_tᵀ``, computed here from explicit
  matrices (A from the strategy's answers to unit vectors, W_t from the item's), independently of
  the product's variance formulas: its diagonal (every cell's variance) is at most target², and
  the binding table reaches its target (the level is the smallest);
* the errors follow it: ``q_{t,r} = e_{t,r}ᵀ Σ_t⁺ e_{t,r}`` is χ²(k_t) (k_t = rank Σ_t) in each
  release, so ``Q_t = Σ_r q_{t,r}`` over R = 2,000 independent releases is χ²(R·k_t).  Accepted
  when Q_t lies between its α/6 and 1 − α/6 quantiles (three tables, two sides: the false-failure
  rate is at most α = 1e-6).  Power: the same Q_t with the noise variance claimed 20% too small
  or 25% too large (a standard error off by about 11%) is rejected; the smallest table (4 cells,
  8,000 degrees of freedom) has a window of about ±9%.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dprelease.catalog.confidential.choke_point import ProtectedMarginals
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.release import planned_spec
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms.marginal_space import marginal_of
from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.noise import calibrate
from dprelease.mechanisms.primitives.protocol import MeasureContext
from tests.doubles import FreeAccountant, MemoryStore
from tests.samplers import SeededNumpyNoise

pytestmark = pytest.mark.statistical

ALPHA = 1e-6
RELEASES = 2000
SIZES = {"a": 6, "b": 5, "c": 4}
TARGETS = {"ab": 6.0, "c": 2.0, "a": 4.0}


def _spec():
    return parse_spec(
        {
            "name": "targets",
            "dataset": {"id": "targets", "budget": {"rho": 50}},
            "domain": {name: {"min": 0, "max": n - 1} for name, n in SIZES.items()},
            "workload": [
                {"name": "ab", "marginal": ["a", "b"], "max_std_error": TARGETS["ab"]},
                {"name": "c", "marginal": ["c"], "max_std_error": TARGETS["c"]},
                {"name": "a", "marginal": ["a"], "max_std_error": TARGETS["a"]},
            ],
            "mechanism": "marginal_space",
            "accuracy": {"noise": "gaussian"},
        }
    )


def _outside(statistic: float, dof: int) -> bool:
    low, high = stats.chi2.ppf(ALPHA / 6, dof), stats.chi2.isf(ALPHA / 6, dof)
    return not low <= statistic <= high


def test_released_errors_meet_their_targets(
    tmp_path, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    spec = _spec()
    plan = make_plan(spec, cache=StrategyStore(tmp_path / "strategies"))
    released = planned_spec(spec, plan)
    strategy, workload = plan.strategy, plan.workload
    assert workload is not None
    shape = workload.domain_shape
    cells = int(np.prod(shape))
    x = rng.integers(0, 40, cells).astype(np.float64)

    # the error covariance from explicit matrices, at the planned level
    unit = np.eye(cells)
    measured = np.column_stack([strategy.apply(column) for column in unit])
    level = calibrate(
        target=released.privacy_target(),
        sensitivity=strategy.sensitivity(noise="gaussian"),
        size=strategy.num_queries,
    )
    gram_inverse = np.linalg.pinv(measured.T @ measured)
    covariance, precision, rank = {}, {}, {}
    for item in workload.items:
        query = np.column_stack([item.answer(column) for column in unit])
        covariance[item.name] = level.variance * query @ gram_inverse @ query.T
        precision[item.name] = np.linalg.pinv(covariance[item.name], hermitian=True)
        rank[item.name] = int(np.linalg.matrix_rank(covariance[item.name], hermitian=True))
        assert np.diag(covariance[item.name]).max() <= TARGETS[item.name] ** 2 * (1 + 1e-9)
    binding = max(TARGETS, key=lambda n: np.diag(covariance[n]).max() / TARGETS[n] ** 2)
    assert np.diag(covariance[binding]).max() >= TARGETS[binding] ** 2 * (1 - 1e-6)

    protected = ProtectedMarginals(
        {axes: marginal_of(x, shape, axes) for axes in strategy.marginal_subsets},
        domain_shape=shape,
        contribution_bound=1,
    )
    context = MeasureContext(
        target=released.privacy_target(),
        accountant=FreeAccountant(),
        label="test",
        contribution_bound=1,
        input_fingerprint="f" * 64,
        dataset_id="targets",
        released=MemoryStore(),
    )
    sampler = SeededNumpyNoise(np.random.default_rng(20261128))
    monkeypatch.setattr(noise, "production_sampler", lambda: sampler)
    truth = {item.name: item.answer(x) for item in workload.items}
    statistic = dict.fromkeys(TARGETS, 0.0)
    for _ in range(RELEASES):
        answers = plan.mechanism.reconstruct(
            plan.mechanism.measure(strategy, protected, context=context), workload=workload
        )
        for name, true in truth.items():
            error = answers[name].estimates - true
            statistic[name] += float(error @ precision[name] @ error)
    for name, value in statistic.items():
        dof = RELEASES * rank[name]
        assert not _outside(value, dof), (name, value / dof)
        for wrong in (0.8, 1.25):  # power: a variance claimed 20-25% off (std error ~11%)
            assert _outside(value / wrong, dof), (name, wrong)
