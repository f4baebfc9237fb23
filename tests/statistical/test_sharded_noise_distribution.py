"""Sharded noise has the calibrated distribution and independent shards (alpha = 1e-6, with power).

The choke point splits 60,000 zero answers into 6 shards, noised through a shard mapper by the
vetted sampler (``noise_shard``, as on a worker).  Fixed false-failure rate: each KS test rejects
correct noise with probability 1e-6; the independence check bounds the 15 pairwise correlations of
shard noise at |z| < 5.6 (Bonferroni: 15 x P(|N(0,1)| > 5.6) < 1e-6).  Power: the same KS statistic
rejects a scale 10% off (its CDF distance, ~0.018 for Laplace and ~0.023 for Gaussian, is 1.6-2x
the critical value 0.011 at 60,000 draws, whose own spread is ~0.002), and the correlation check
rejects shards whose noise repeats (what a seed shared across workers would produce).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pytest
from scipy import stats

from dprelease.catalog.confidential.choke_point import ProtectedCells
from dprelease.mechanisms.primitives.noise import NoiseShard, NoisyShard
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.strategies import build_kron_strategy
from tests.privacy.test_noise_and_session import _SpyAccountant

ALPHA = 1e-6
DRAWS = 60_000
SHARDS = 6
Z_LIMIT = 5.6  # two-sided: 15 pairs x 2.1e-8 < 1e-6

pytestmark = pytest.mark.statistical


def _in_order(function, shards: Sequence[NoiseShard]) -> list[NoisyShard]:  # type: ignore[no-untyped-def]
    return [function(shard) for shard in shards]


def _sharded_noise(target: PrivacyCost) -> tuple[np.ndarray, float]:
    strategy = build_kron_strategy("identity", attribute_roles=[(DRAWS, "categorical")])
    cells = ProtectedCells(np.zeros(DRAWS), domain_shape=(DRAWS,), contribution_bound=1)
    result = cells.with_shard_mapper(_in_order, shard_size=DRAWS // SHARDS).measure(
        strategy, target=target, accountant=_SpyAccountant([]), label="t"
    )
    return result.values, result.noise.scale


def _max_abs_z(pieces: Sequence[np.ndarray]) -> float:
    """Largest |z| of the pairwise Pearson correlations (z = r·sqrt(n) under independence)."""
    n = pieces[0].size
    return max(abs(stats.pearsonr(a, b).statistic) * np.sqrt(n) for a, b in combinations(pieces, 2))


@pytest.mark.parametrize(
    ("target", "law"),
    [
        (PrivacyCost(measure="pure", epsilon=0.5), stats.laplace),
        (PrivacyCost(measure="zcdp", rho=0.5), stats.norm),
    ],
    ids=["laplace", "gaussian"],
)
def test_sharded_noise_has_the_calibrated_scale_and_independent_shards(
    target: PrivacyCost, law: stats.rv_continuous
) -> None:
    values, scale = _sharded_noise(target)
    assert stats.kstest(values, law(scale=scale).cdf).pvalue > ALPHA
    for wrong in (0.9 * scale, 1.1 * scale):
        assert stats.kstest(values, law(scale=wrong).cdf).pvalue < ALPHA
    pieces = np.split(values, SHARDS)
    assert _max_abs_z(pieces) < Z_LIMIT
    repeated = [pieces[0], pieces[0] + 0.0, *pieces[2:]]  # as if two shards shared a seed
    assert _max_abs_z(repeated) > Z_LIMIT
