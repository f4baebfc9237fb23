"""Gram-first strategy computation: every structured Gram shortcut against the dense WᵀW.

Each factor's closed-form Gram, Gram trace and sum, ``a·I + b·J`` test, spectrum, row norms,
largest entry and (batched) query variances are checked against the explicit query matrix; the
workload Gram (a sum over items of Kronecker products of factor Grams), the per-query variances of
a Kronecker item under a dense covariance, and the dense strategy's error and support check are
checked against computations that use the explicit ``m × N`` workload.  The last test plans
Eigen-Design on all ranges of 2,048 cells under a 2 GB address-space limit (issue 19: it used to
allocate the 2,098,176 × 2,048 workload, 32 GiB).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dprelease.mechanisms.primitives.dense import DenseStrategy
from dprelease.mechanisms.primitives.operators import (
    AllRanges,
    Centring,
    Factor,
    Identity,
    MatrixFactor,
    Prefix,
    Ranges,
    Total,
    gram_ij_parts,
    kron_dense,
    kron_matrices,
    kron_query_variances,
)
from dprelease.mechanisms.primitives.strategies import hierarchical_strategy, wavelet_strategy
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

RNG = np.random.default_rng(20261122)
_LO = RNG.integers(0, 40, size=3000)
_HI = np.minimum(_LO + RNG.integers(0, 15, size=3000), 39)

ZOO: dict[str, Factor] = {
    "identity-5": Identity(5),
    "total-6": Total(6),
    "prefix-7": Prefix(7),
    "prefix-1": Prefix(1),
    "all-ranges-9": AllRanges(9),
    "ranges-3000-over-40": Ranges(40, _LO, _HI),
    "ranges-singletons": Ranges(4, [0, 1, 2, 3], [0, 1, 2, 3]),
    "centring-6": Centring(6),
    "dense-negative": MatrixFactor(np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])),
    "dense-a-I-plus-b-J": MatrixFactor(np.vstack([2.0 * np.eye(4), np.ones((1, 4))])),
    "sparse-hierarchical-7": hierarchical_strategy(7),
    "sparse-wavelet-6": wavelet_strategy(6),
}


def _explicit(factor: Factor) -> np.ndarray:
    """The query matrix built independently of the operator's own products and Grams."""
    n = factor.n
    if isinstance(factor, Identity):
        return np.eye(n)
    if isinstance(factor, Total):
        return np.ones((1, n))
    if isinstance(factor, Prefix):
        return np.tril(np.ones((n, n)))
    if isinstance(factor, Centring):
        return np.eye(n) - 1.0 / n
    if isinstance(factor, Ranges):
        dense = np.zeros((factor.m, n))
        for row, (lo, hi) in enumerate(zip(factor.lo, factor.hi, strict=True)):
            dense[row, lo : hi + 1] = 1.0
        return dense
    return factor.dense()


@pytest.mark.parametrize("factor", ZOO.values(), ids=ZOO.keys())
def test_factor_gram_and_its_summaries_match_dense(factor: Factor) -> None:
    w = _explicit(factor)
    gram = w.T @ w
    np.testing.assert_allclose(factor.gram(), gram, atol=1e-12)
    assert factor.gram_trace() == pytest.approx(np.trace(gram), rel=1e-12)
    assert factor.gram_sum() == pytest.approx(gram.sum(), rel=1e-12, abs=1e-12)
    assert factor.max_abs() == pytest.approx(np.abs(w).max())
    np.testing.assert_allclose(factor.row_norms_squared(), (w**2).sum(axis=1), atol=1e-12)
    np.testing.assert_allclose(
        np.sort(factor.gram_eigenvalues()),
        np.sort(np.clip(np.linalg.eigvalsh(gram), 0.0, None)),
        atol=1e-9 * max(1.0, float(np.abs(gram).max())),
    )
    parts = factor.gram_ij()
    n = factor.n
    if parts is None:
        assert gram_ij_parts(gram) is None
    else:
        a, b = parts
        np.testing.assert_allclose(a * np.eye(n) + b * np.ones((n, n)), gram, atol=1e-12)


def test_gram_ij_parts_recognises_exactly_the_a_i_plus_b_j_matrices() -> None:
    assert gram_ij_parts(3.0 * np.eye(4) + 0.5) == pytest.approx((3.0, 0.5))
    assert gram_ij_parts(np.array([[7.0]])) == (7.0, 0.0)
    almost = 3.0 * np.eye(4) + 0.5
    almost[1, 2] += 1e-6
    assert gram_ij_parts(almost) is None
    assert Prefix(5).gram_ij() is None and AllRanges(5).gram_ij() is None


@pytest.mark.parametrize("factor", ZOO.values(), ids=ZOO.keys())
def test_batched_query_variances_match_dense(factor: Factor) -> None:
    w = _explicit(factor)
    n = factor.n
    halves = RNG.normal(size=(3, 2, n, n))
    covariances = np.einsum("abij,abkj->ikab", halves, halves)  # (n, n, 3, 2), PSD per batch
    expected = np.einsum("qi,ikab,qk->qab", w, covariances, w)
    np.testing.assert_allclose(factor.query_variances(covariances), expected, rtol=1e-10)
    np.testing.assert_allclose(
        factor.query_variances(covariances[:, :, 1, 0]), expected[:, 1, 0], rtol=1e-10
    )


@pytest.mark.parametrize(
    "factors",
    [
        (AllRanges(7),),
        (Prefix(3), Total(4), AllRanges(3)),
        (Identity(2), Ranges(5, [0, 1, 4], [4, 2, 4]), Centring(3)),
        (hierarchical_strategy(5), MatrixFactor(np.array([[1.0, -1.0, 2.0]]))),
    ],
    ids=["one-attribute", "prefix-total-ranges", "identity-ranges-centring", "explicit"],
)
def test_kron_query_variances_match_the_explicit_product(factors) -> None:
    w = kron_dense(factors)
    half = RNG.normal(size=(w.shape[1], w.shape[1]))
    covariance = half @ half.T
    np.testing.assert_allclose(
        kron_query_variances(factors, covariance),
        np.einsum("ij,jk,ik->i", w, covariance, w),
        rtol=1e-10,
    )
    with pytest.raises(ValueError, match="must be"):
        kron_query_variances(factors, covariance[:-1, :-1])


def _mixed_workload() -> Workload:
    shape = (6, 2, 3)
    return Workload(
        domain_shape=shape,
        items=(
            WorkloadItem(name="cdf", factors=(Prefix(6), Total(2), Total(3))),
            WorkloadItem(name="marg", factors=(Identity(6), Identity(2), Total(3))),
            WorkloadItem(name="rng", factors=(AllRanges(6), Total(2), Identity(3))),
            WorkloadItem(name="few", factors=(Ranges(6, [0, 2], [3, 5]), Identity(2), Total(3))),
            WorkloadItem(
                name="explicit",
                factors=(Total(6), MatrixFactor(np.array([[1.0, 2.0]])), Centring(3)),
            ),
        ),
    )


def test_workload_gram_is_the_sum_of_kronecker_products_of_factor_grams() -> None:
    workload = _mixed_workload()
    explicit = np.vstack(
        [kron_matrices([_explicit(f) for f in item.factors]) for item in workload.items]
    )
    np.testing.assert_allclose(workload.dense_gram(), explicit.T @ explicit, atol=1e-10)
    np.testing.assert_allclose(workload.dense_matrix(), explicit, atol=1e-12)
    for item in workload.items:
        rows = kron_matrices([_explicit(f) for f in item.factors])
        np.testing.assert_allclose(item.dense_gram(), rows.T @ rows, atol=1e-10)


def test_dense_gram_and_dense_matrix_refuse_before_any_work() -> None:
    big = Workload(domain_shape=(9000,), items=(WorkloadItem(name="p", factors=(Prefix(9000),)),))
    with pytest.raises(ValueError, match=r"9,000-cell domain needs 0\.6 GiB; the limit is 8,192"):
        big.dense_gram()
    with pytest.raises(ValueError, match=r"36-cell domain needs 0\.0 GiB; the limit is 20 cells"):
        _mixed_workload().dense_gram(max_cells=20)
    ranges = Workload(
        domain_shape=(2048,), items=(WorkloadItem(name="r", factors=(AllRanges(2048),)),)
    )
    with pytest.raises(ValueError, match=r"2,098,176 × 2,048 \(32\.02 GiB\); the limit is"):
        ranges.dense_matrix()


def test_dense_strategy_error_and_support_come_from_grams() -> None:
    workload = _mixed_workload()
    strategy = DenseStrategy(name="s", matrix=RNG.normal(size=(40, workload.num_cells)))
    covariance = np.linalg.pinv(strategy.matrix.T @ strategy.matrix)
    for item in workload.items:
        w = kron_matrices([_explicit(f) for f in item.factors])
        variances = np.einsum("ij,jk,ik->i", w, covariance, w)
        np.testing.assert_allclose(strategy.item_unit_variances(item), variances, rtol=1e-8)
        assert strategy.item_unit_total(item) == pytest.approx(variances.sum(), rel=1e-8)
    assert strategy.support_residual(workload) < 1e-8
    # rank-deficient: measures only the first 30 directions of a 36-cell domain
    narrow = DenseStrategy(name="narrow", matrix=np.eye(workload.num_cells)[:30])
    explicit = workload.dense_matrix()
    projector = np.linalg.pinv(narrow.matrix) @ narrow.matrix
    entry_residual = np.abs(explicit - explicit @ projector).max()
    assert entry_residual > 0.1
    assert narrow.support_residual(workload) >= entry_residual  # an upper bound on the old check


def test_eigen_design_plans_all_ranges_of_2048_cells_in_2_gb() -> None:
    """The eigen mechanism's plan on all ranges of 2,048 cells (Gram, Eigen-Design, expected
    error, support check, SVD bound) under RLIMIT_AS = 2 GiB: TOTAL/SVDB ≤ 1.028 (thesis 4.1)."""
    root = Path(__file__).resolve().parents[3]
    result = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "eigen_plan_child.py"), "2048", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
        env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ratio, identity, residual, _seconds, peak_gib = (float(v) for v in result.stdout.split())
    assert 1.0 <= ratio <= 1.028 < identity
    assert residual < 1e-6
    assert peak_gib < 2.0
