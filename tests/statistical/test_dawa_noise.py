"""Step 1 of DAWA adds Laplace noise of the declared scale to every candidate interval's cost.

The noisy costs are never released, so the test reads them back through a recording sampler and
standardises each residual by the scale that ``seed-dawa.md`` §3.5 derives (written out here, not
taken from the code): ``(Δ̄ + Δ_b)/ε₁`` per interval or ``2Δ̄/ε₁`` for all, with
``Δ_b = 2 − 2/|b|`` and ``Δ̄ = 2 − 2/L_max``.  A KS test against Laplace(0, 1) must pass at the
declared scale and reject scales 30% off, each at a false-failure rate of α = 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from tests.reference.dawa import private_partition
from tests.samplers import SeededNumpyNoise

pytestmark = pytest.mark.statistical

ALPHA = 1e-6
EPSILON_1 = 0.4
EPSILON_2 = 1.2


class RecordingNoise(SeededNumpyNoise):
    """Seeded Laplace noise that keeps each call's (input, output)."""

    def __init__(self, seed: int) -> None:
        super().__init__(np.random.default_rng(seed))
        self.pairs: list[tuple[np.ndarray, np.ndarray]] = []

    def add_laplace(self, values: np.ndarray, *, scale: float) -> np.ndarray:
        noisy = super().add_laplace(values, scale=scale)
        self.pairs.append((np.asarray(values, dtype=float).copy(), noisy.copy()))
        return noisy


def declared_scale(length: int, max_length: int, scale_rule: str) -> float:
    bucket = 2 - 2 / length
    largest = 2 - 2 / max_length
    return (
        (largest + bucket) / EPSILON_1 if scale_rule == "per_interval" else 2 * largest / EPSILON_1
    )


def standardised_residuals(n: int, intervals: str, scale_rule: str, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).poisson(20.0, n).astype(float)
    sampler = RecordingNoise(seed)
    private_partition(
        x,
        epsilon=EPSILON_1,
        measurement_epsilon=EPSILON_2,
        sampler=sampler,
        intervals=intervals,
        scale_rule=scale_rule,
    )
    max_length = n if intervals == "all" else 1 << (n.bit_length() - 1)
    residuals = []
    for values, noisy in sampler.pairs:
        length = n - values.size + 1
        residuals.append((noisy - values) / declared_scale(length, max_length, scale_rule))
    return np.concatenate(residuals)


CASES = {
    "dyadic-per-interval": (1024, "dyadic", "per_interval", 101),
    "dyadic-uniform": (1000, "dyadic", "uniform", 102),
    "all-per-interval": (150, "all", "per_interval", 103),
}


@pytest.mark.parametrize(("n", "intervals", "scale_rule", "seed"), CASES.values(), ids=CASES.keys())
def test_noisy_costs_have_the_declared_laplace_scale(
    n: int, intervals: str, scale_rule: str, seed: int
) -> None:
    z = standardised_residuals(n, intervals, scale_rule, seed)
    assert z.size > 8900
    assert scipy.stats.kstest(z, "laplace").pvalue > ALPHA


@pytest.mark.parametrize("wrong_factor", [1.3, 0.7], ids=["scale+30%", "scale-30%"])
@pytest.mark.parametrize(("n", "intervals", "scale_rule", "seed"), CASES.values(), ids=CASES.keys())
def test_a_scale_30_percent_off_is_rejected(
    n: int, intervals: str, scale_rule: str, seed: int, wrong_factor: float
) -> None:
    """Power check: the same residuals standardised by a wrong scale fail the KS test."""
    z = standardised_residuals(n, intervals, scale_rule, seed)
    assert scipy.stats.kstest(z / wrong_factor, "laplace").pvalue < ALPHA
