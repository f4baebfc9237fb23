"""Marginal-space releases report honest standard errors: E[((estimate − truth)/std_error)²] = 1.

Each release goes through the real path (plan, ProtectedMarginals.measure with a seeded test
sampler, the mechanism's marginal-space reconstruct) on a small domain (3 × 4 × 5, all 1- and
2-way marginals, 47 cells per release), for Laplace (ε) and Gaussian (ρ) noise.

Fixed false-failure rate: the per-release mean of z² over cells is one sample; over R = 400
independent releases the mean of those samples is tested against 1 with a normal (CLT) test at
alpha = 1e-6 (two-sided, |t| > 4.89), the spread estimated from the same samples.  A 1e-6 band
of about ±0.03 around 1 follows.  Power: the same samples with standard errors 10% too small
(E[z²] = 1.23) or too large (0.83) are rejected by the same test.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from dprelease.catalog.confidential.choke_point import ProtectedMarginals
from dprelease.mechanisms.marginal_space import MECHANISM, marginal_of
from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.operators import Identity, Total
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import MeasureContext, PlanRequest
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.doubles import FreeAccountant, MemoryStore
from tests.samplers import SeededNumpyNoise

pytestmark = pytest.mark.statistical

ALPHA = 1e-6
RELEASES = 400
SHAPE = (3, 4, 5)


def _workload() -> Workload:
    subsets = [c for k in (1, 2) for c in itertools.combinations(range(3), k)]
    return Workload(
        domain_shape=SHAPE,
        items=tuple(
            WorkloadItem(
                name=f"m{''.join(map(str, axes))}",
                factors=tuple(Identity(n) if i in axes else Total(n) for i, n in enumerate(SHAPE)),
            )
            for axes in subsets
        ),
    )


def _rejects(samples: np.ndarray, expected: float) -> bool:
    t = (samples.mean() - expected) / (samples.std(ddof=1) / np.sqrt(samples.size))
    return bool(abs(t) > stats.norm.isf(ALPHA / 2))


@pytest.mark.parametrize(
    "target",
    [PrivacyCost(measure="pure", epsilon=1.0), PrivacyCost(measure="zcdp", rho=0.5)],
    ids=["laplace", "gaussian"],
)
def test_squared_standardised_errors_average_one(
    target: PrivacyCost, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(20261125)
    workload = _workload()
    x = rng.integers(0, 50, workload.num_cells).astype(np.float64)
    request = PlanRequest(
        workload=workload,
        ordered=(True,) * 3,
        target=target,
        contribution_bound=1,
        options={},
        workload_fingerprint="5a" * 32,
    )
    strategy = MECHANISM.plan(request, cache=MemoryStore())
    protected = ProtectedMarginals(
        {axes: marginal_of(x, SHAPE, axes) for axes in strategy.marginal_subsets},
        domain_shape=SHAPE,
        contribution_bound=1,
    )
    truth = {item.name: item.answer(x) for item in workload.items}
    context = MeasureContext(
        target=target,
        accountant=FreeAccountant(),
        label="test",
        contribution_bound=1,
        input_fingerprint="f" * 64,
        dataset_id="test",
        released=MemoryStore(),
    )
    sampler = SeededNumpyNoise(rng)
    monkeypatch.setattr(noise, "production_sampler", lambda: sampler)
    per_release = {1.0: [], 0.9: [], 1.1: []}
    for _ in range(RELEASES):
        answers = MECHANISM.reconstruct(
            MECHANISM.measure(strategy, protected, context=context), workload=workload
        )
        z = np.concatenate(
            [
                (answers[name].estimates - truth[name]) / np.sqrt(answers[name].variances)
                for name in truth
            ]
        )
        for factor, samples in per_release.items():
            samples.append(float(np.mean((z / factor) ** 2)))
    honest = np.asarray(per_release[1.0])
    assert not _rejects(honest, 1.0), honest.mean()
    assert 0.8 <= honest.mean() <= 1.25  # the acceptance band
    for factor in (0.9, 1.1):  # power: standard errors 10% off are rejected
        assert _rejects(np.asarray(per_release[factor]), 1.0)
