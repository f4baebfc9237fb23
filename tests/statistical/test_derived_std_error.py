"""Derived statistics report honest uncertainty: means (delta method) and sums (exact linear
variance) have E[((estimate − truth)/std_error)²] = 1; quantile intervals cover the true quantile's
cell at least 95% of the time.

Each release goes through the real path: a spec with derived items → workload with their support
queries → the hierarchical mechanism's plan → ProtectedCells.measure with a seeded test sampler →
the mechanism's reconstruct → :func:`catalog.publishing.tables.derived_tables`.  The domain is sex (2) × age
0..49 in cells of 5 (10 cells) × region (3), ~2,400 people per sex, at ε = 1 (Laplace) and
ρ = 0.5 (Gaussian).  "Truth" is the statistic of the binned data (the representative values): the
binning error is reported separately and is not noise.

Fixed false-failure rate: the per-release mean of z² over the rows of a table is one sample; over
R = 2,000 releases the mean of those samples is tested against 1 with a normal (CLT) test at
alpha = 1e-6 (|t| > 4.89).  Power: the same samples with standard errors 10% too small or too
large are rejected by the same test.  Intervals: the coverage of the mean and sum intervals
(± 2.118·std_error under Laplace noise, ± 1.96·std_error under Gaussian) and of the quantile
intervals over all releases and rows is tested one-sided against 95% with an exact binomial test
at alpha = 1e-6; power: ± 1.96·0.8·std_error, and quantile intervals computed with the CDF's
standard errors divided by 5, are rejected.  The data put the
median exactly on a cell boundary, so a too-narrow interval does miss it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dprelease.catalog.confidential.choke_point import ProtectedCells
from dprelease.catalog.planning.planner import build_workload
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.publishing.tables import derived_tables
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import derived_column
from dprelease.mechanisms import derived
from dprelease.mechanisms.hierarchical import MECHANISM
from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import ItemAnswers, MeasureContext, PlanRequest
from tests.samplers import SeededNumpyNoise

pytestmark = pytest.mark.statistical

ALPHA = 1e-6
RELEASES = 2000
LEVELS = (0.5, 0.9)


class _Accountant:
    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        return "receipt"

    def holds(self, receipt_id: str) -> bool:
        return False


def _spec(privacy: dict[str, float]):
    return parse_spec(
        {
            "name": "derived",
            "dataset": {"id": "d", "budget": {"epsilon": 100}},
            "domain": {
                "sex": {"values": ["f", "m"]},
                "age": {"min": 0, "max": 49, "width": 5},
                "region": {"values": ["n", "s", "w"]},
            },
            "workload": [
                {"name": "age_mean", "mean": "age", "by": ["sex"]},
                {"name": "age_sum", "sum": "age", "by": ["region"]},
                {"name": "age_q", "quantiles": {"of": "age", "q": list(LEVELS)}, "by": ["sex"]},
                {"name": "sex_by_region", "marginal": ["sex", "region"]},
            ],
            "privacy": privacy,
        }
    )


def _cells() -> np.ndarray:
    """Counts (sex, age cell, region).  The median sits exactly on the boundary of cells 4 and 5
    (F_4 = 1,320 = N/2), where a too-narrow interval misses it often; sex m has reversed ages."""
    per_age = np.array([120, 150, 200, 260, 590, 470, 300, 250, 180, 120], dtype=np.float64)
    cells = np.stack([np.outer(ages, [0.5, 0.3, 0.2]) for ages in (per_age, per_age[::-1])])
    return cells.ravel()


def _rejects(samples: np.ndarray, expected: float) -> bool:
    t = (samples.mean() - expected) / (samples.std(ddof=1) / np.sqrt(samples.size))
    return bool(abs(t) > stats.norm.isf(ALPHA / 2))


def _binned_truth(spec, x: np.ndarray) -> dict[str, np.ndarray]:
    cube = x.reshape(2, 10, 3)
    rep = derived_column(spec, spec.workload[0]).representative
    by_sex, by_region = cube.sum(axis=2), cube.sum(axis=0).T
    cdf = np.cumsum(by_sex, axis=1)
    cell = np.array([[np.argmax(row >= q * row[-1]) for q in LEVELS] for row in cdf])
    return {
        "age_mean": by_sex @ rep / by_sex.sum(axis=1),
        "age_sum": by_region @ rep,
        "quantile_cell": cell.ravel(),
    }


@pytest.mark.parametrize(
    "privacy",
    [{"epsilon": 1.0}, {"rho": 0.5}],
    ids=["laplace", "gaussian"],
)
def test_derived_standard_errors_and_intervals_are_honest(
    privacy: dict[str, float], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = _spec(privacy)
    workload = build_workload(spec)
    target = spec.privacy_target()
    request = PlanRequest(
        workload=workload,
        ordered=(False, True, False),
        target=target,
        contribution_bound=1,
        options={},
        workload_fingerprint="d3" * 32,
    )
    strategy = MECHANISM.plan(request, cache=StrategyStore(tmp_path / "strategies"))
    x = _cells()
    protected = ProtectedCells(x, domain_shape=workload.domain_shape, contribution_bound=1)
    truth = _binned_truth(spec, x)
    context = MeasureContext(
        target=target,
        accountant=_Accountant(),
        label="test",
        contribution_bound=1,
        input_fingerprint="f" * 64,
        dataset_id="d",
        released=StrategyStore(tmp_path / "released"),
    )
    monkeypatch.setattr(noise, "production_sampler", lambda: SeededNumpyNoise(rng))
    rng = np.random.default_rng(20261125)
    column = derived_column(spec, spec.workload[0])
    edges = column.value_low[truth["quantile_cell"]], column.value_high[truth["quantile_cell"]]
    z2 = {name: {1.0: [], 0.9: [], 1.1: []} for name in ("age_mean", "age_sum")}
    covered, covered_narrow = [], []
    linear_covered: list[bool] = []  # means and sums: truth within [ci_low, ci_high]
    linear_narrow: list[bool] = []  # the same with ±1.96·std_error·0.8 (a wrong scale)
    for _ in range(RELEASES):
        answers = MECHANISM.reconstruct(
            MECHANISM.measure(strategy, protected, context=context), workload=workload
        )
        tables = derived_tables(spec, answers)
        for name, per_factor in z2.items():
            table = tables[name]
            z = (table["estimate"].to_numpy() - truth[name]) / table["std_error"].to_numpy()
            assert set(table["uncertainty"].to_pylist()) == {"noise"}
            low, high = table["ci_low"].to_numpy(), table["ci_high"].to_numpy()
            linear_covered += list((low <= truth[name]) & (truth[name] <= high))
            linear_narrow += list(np.abs(z) <= 1.96 * 0.8)
            for factor, samples in per_factor.items():
                samples.append(float(np.mean((z / factor) ** 2)))
        quantile = tables["age_q"]
        covered += list(
            (quantile["ci_low"].to_numpy() <= edges[0])
            & (quantile["ci_high"].to_numpy() >= edges[1])
        )
        narrow = _narrow_quantiles(workload.items[2], answers, column)
        covered_narrow += list((narrow.ci_low <= edges[0]) & (narrow.ci_high >= edges[1]))
    for name, per_factor in z2.items():
        honest = np.asarray(per_factor[1.0])
        assert not _rejects(honest, 1.0), (name, honest.mean())
        for factor in (0.9, 1.1):  # power: standard errors 10% off are rejected
            assert _rejects(np.asarray(per_factor[factor]), 1.0), (name, factor)
    assert not _below_95(linear_covered), np.mean(linear_covered)
    assert _below_95(linear_narrow), np.mean(linear_narrow)  # power
    assert not _below_95(covered), np.mean(covered)
    assert _below_95(covered_narrow), np.mean(covered_narrow)  # power


def _below_95(covered: list[bool]) -> bool:
    """One-sided exact binomial test: coverage below 95% at ``ALPHA``."""
    test = stats.binomtest(int(np.sum(covered)), len(covered), 0.95, alternative="less")
    return bool(test.pvalue < ALPHA)


def _narrow_quantiles(support, answers: dict[str, ItemAnswers], column) -> derived.DerivedRows:
    """The quantile intervals with the CDF's standard errors divided by 5 (a wrong scale)."""
    found = answers[support.name]
    estimates = derived.per_group(support, found.estimates, column_axis=1)
    variances = derived.per_group(support, found.variances, column_axis=1) / 25
    labels = np.full(estimates.shape, "noise")
    return derived.quantiles(estimates, variances, labels, column=column, levels=LEVELS)
