"""Large vectors are noised in bounded chunks (memory O(threads × chunk)) without changing the
distribution: every chunk is at most ``_MAX_SHARD`` values, the output keeps its shape and order,
and the noise still has the declared scale (KS at alpha = 1e-6, with power against 30% off)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.noise import OpenDPSampler

ALPHA = 1e-6
DRAWS = 20_000

pytestmark = pytest.mark.statistical


def test_chunks_are_bounded_and_the_scale_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    original = noise._opendp_measurement

    def recording(kind, *, scale, size):  # type: ignore[no-untyped-def]
        sizes.append(size)
        return original(kind, scale=scale, size=size)

    monkeypatch.setattr(noise, "_MAX_SHARD", 3_000)
    monkeypatch.setattr(noise, "_MIN_SHARD", 1_000)
    monkeypatch.setattr(noise, "_opendp_measurement", recording)
    values = np.arange(DRAWS, dtype=np.float64).reshape(100, 200)
    noisy = OpenDPSampler(threads=2).add_laplace(values, scale=2.0)
    assert noisy.shape == values.shape
    assert sum(sizes) == DRAWS and max(sizes) <= 3_000 and len(sizes) == 7
    draws = (noisy - values).ravel()  # the same order: noise, not a shuffle of the values
    assert stats.kstest(draws, stats.laplace(scale=2.0).cdf).pvalue > ALPHA
    for wrong in (0.7 * 2.0, 1.3 * 2.0):
        assert stats.kstest(draws, stats.laplace(scale=wrong).cdf).pvalue < ALPHA
