"""The vetted samplers draw the declared distribution: KS at alpha = 1e-6, with power against 30% off.

Fixed false-failure rate: each KS test rejects a correct sampler with probability 1e-6.
Power: with 20,000 draws, a scale 30% too small or too large gives a KS statistic far above the
critical value, so the same test rejects it (checked below on the same draws).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dprelease.mechanisms.primitives.noise import OpenDPSampler

ALPHA = 1e-6
DRAWS = 20_000

pytestmark = pytest.mark.statistical


@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_laplace_has_the_declared_scale(scale: float) -> None:
    noise = OpenDPSampler(threads=2).add_laplace(np.zeros(DRAWS), scale=scale)
    assert stats.kstest(noise, stats.laplace(scale=scale).cdf).pvalue > ALPHA
    for wrong in (0.7 * scale, 1.3 * scale):
        assert stats.kstest(noise, stats.laplace(scale=wrong).cdf).pvalue < ALPHA


@pytest.mark.parametrize("sigma", [0.5, 3.0])
def test_gaussian_has_the_declared_scale(sigma: float) -> None:
    noise = OpenDPSampler(threads=2).add_gaussian(np.full(DRAWS, 10.0), sigma=sigma) - 10.0
    assert stats.kstest(noise, stats.norm(scale=sigma).cdf).pvalue > ALPHA
    for wrong in (0.7 * sigma, 1.3 * sigma):
        assert stats.kstest(noise, stats.norm(scale=wrong).cdf).pvalue < ALPHA
