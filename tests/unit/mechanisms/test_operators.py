"""Every implicit operator against its dense matrix: products, transpose, Gram, norms, variances."""

from __future__ import annotations

import numpy as np
import pytest

from dprelease.mechanisms.primitives.operators import (
    AllRanges,
    Factor,
    Identity,
    MatrixFactor,
    Prefix,
    Ranges,
    Total,
    kron_apply,
    kron_apply_transpose,
    kron_dense,
)
from dprelease.mechanisms.primitives.strategies import (
    hierarchical_strategy,
    identity_strategy,
    wavelet_strategy,
)

ZOO: dict[str, Factor] = {
    "identity-5": Identity(5),
    "total-6": Total(6),
    "prefix-7": Prefix(7),
    "all-ranges-6": AllRanges(6),
    "ranges-explicit": Ranges(8, [0, 2, 3, 7, 0], [7, 2, 5, 7, 3]),
    "dense-negative": MatrixFactor(np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])),
    "sparse-hierarchical-7-b3": hierarchical_strategy(7, branching=3),
    "sparse-wavelet-6": wavelet_strategy(6),
    "sparse-identity-4": identity_strategy(4),
}


def _reference(factor: Factor) -> np.ndarray:
    """Dense matrix built independently of the operator's own products."""
    if isinstance(factor, Identity):
        return np.eye(factor.n)
    if isinstance(factor, Total):
        return np.ones((1, factor.n))
    if isinstance(factor, Prefix):
        return np.tril(np.ones((factor.n, factor.n)))
    if isinstance(factor, Ranges):
        dense = np.zeros((factor.m, factor.n))
        for row, (lo, hi) in enumerate(zip(factor.lo, factor.hi, strict=True)):
            dense[row, lo : hi + 1] = 1
        return dense
    return factor.dense()


@pytest.mark.parametrize("factor", ZOO.values(), ids=ZOO.keys())
def test_products_match_dense(factor: Factor, rng: np.random.Generator) -> None:
    dense = _reference(factor)
    x = rng.normal(size=(factor.n, 3))
    y = rng.normal(size=(factor.m, 2))
    np.testing.assert_allclose(factor.matmat(x), dense @ x, atol=1e-12)
    np.testing.assert_allclose(factor.matvec(x[:, 0]), dense @ x[:, 0], atol=1e-12)
    np.testing.assert_allclose(factor.rmatmat(y), dense.T @ y, atol=1e-12)
    np.testing.assert_allclose(factor.T @ y[:, 0], dense.T @ y[:, 0], atol=1e-12)
    np.testing.assert_allclose(factor.dense(), dense, atol=1e-12)


@pytest.mark.parametrize("factor", ZOO.values(), ids=ZOO.keys())
def test_gram_norms_and_sensitivity_match_dense(factor: Factor) -> None:
    dense = _reference(factor)
    np.testing.assert_allclose(factor.gram(), dense.T @ dense, atol=1e-12)
    np.testing.assert_allclose(factor.column_norms(norm=1), np.abs(dense).sum(0), atol=1e-12)
    np.testing.assert_allclose(factor.column_norms(norm=2), np.sqrt((dense**2).sum(0)), atol=1e-12)
    assert factor.sensitivity(norm=1) == pytest.approx(np.abs(dense).sum(0).max())
    assert factor.sensitivity(norm=2) == pytest.approx(np.sqrt((dense**2).sum(0)).max())


@pytest.mark.parametrize("factor", ZOO.values(), ids=ZOO.keys())
def test_query_variances_match_dense(factor: Factor, rng: np.random.Generator) -> None:
    dense = _reference(factor)
    half = rng.normal(size=(factor.n, factor.n))
    covariance = half @ half.T
    np.testing.assert_allclose(
        factor.query_variances(covariance), np.diag(dense @ covariance @ dense.T), rtol=1e-10
    )


def test_kronecker_apply_and_transpose_match_dense(rng: np.random.Generator) -> None:
    factors = [Prefix(3), Total(4), AllRanges(3), hierarchical_strategy(5)]
    dense = kron_dense(factors)
    x = rng.normal(size=dense.shape[1])
    y = rng.normal(size=dense.shape[0])
    np.testing.assert_allclose(kron_apply(factors, x), dense @ x, atol=1e-10)
    np.testing.assert_allclose(kron_apply_transpose(factors, y), dense.T @ y, atol=1e-10)


def test_all_ranges_has_n_times_n_plus_one_over_two_queries() -> None:
    assert AllRanges(512).m == 512 * 513 // 2


@pytest.mark.parametrize(
    ("lo", "hi", "message"),
    [
        ([0, 3], [2], "matching"),
        ([2], [1], r"\[2, 1\] must satisfy"),
        ([-1], [1], "0 <= lo"),
        ([0], [9], "< n=8"),
    ],
    ids=["length-mismatch", "reversed", "negative", "past-end"],
)
def test_ranges_validation_fires(lo: list[int], hi: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Ranges(8, lo, hi)


def test_norm_must_be_one_or_two() -> None:
    with pytest.raises(ValueError, match=r"norm \(3\) must be 1"):
        Prefix(4).sensitivity(norm=3)
