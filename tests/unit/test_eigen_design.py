"""Deterministic tests of Eigen-Design, the SVD bound and the error helpers.

Test vectors come from the reference note /work/shared/reference/seed-eigen.md (sections 4 item 6,
8 and 9, "[recomputed]" values, which match the thesis's Table 4.1 where both exist).  Every
closed-form shortcut (spectra, minimisation, spectral error evaluation, the dual solver) is
checked against a dense or generic computation.  Cases above n = 256 live in
benchmarks/eigen_bench.py.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import scipy.optimize

from dprelease.catalog.confidential.choke_point import ProtectedCells
from dprelease.mechanisms.eigen.design import (
    EigenDesignStrategy,
    WorkloadSpectrum,
    eigen_design,
    minimize_workload,
    workload_spectrum,
)
from dprelease.mechanisms.primitives.linalg import l1_sensitivity
from dprelease.mechanisms.primitives.lower_bound import svd_bound_gram as svd_bound
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from tests.reference.eigen import (
    MeasurableDesign,
    all_range_gram,
    all_range_gram_nd,
    all_range_spectrum,
    cell_simplified_svd_bound,
    eigen_design_from_spectrum,
    eigen_design_speedup,
    k_way_cliques,
    kronecker_spectrum,
    l2_sensitivity,
    marginals_gram,
    marginals_spectrum,
    prefix_gram,
    spectrum_gram,
    svd_bound_from_spectrum,
    total_error_l1,
    total_error_l2,
    workload_variance_factor,
)

# ------------------------------------------------------------------------------------------------
# Helpers (competitor strategies from the thesis, note A11; dense workloads)
# ------------------------------------------------------------------------------------------------


def hierarchical_strategy(n: int) -> np.ndarray:
    """H_n: binary hierarchy of dyadic blocks, total row first, leaves last ((2n-1) x n)."""
    rows = []
    block = n
    while block >= 1:
        for start in range(0, n, block):
            row = np.zeros(n)
            row[start : start + block] = 1.0
            rows.append(row)
        block //= 2
    return np.array(rows)


def wavelet_strategy(n: int) -> np.ndarray:
    """Y_n: unnormalised Haar, total row then +1/-1 halves of every dyadic block (n x n)."""
    rows = [np.ones(n)]
    block = n
    while block >= 2:
        for start in range(0, n, block):
            row = np.zeros(n)
            row[start : start + block // 2] = 1.0
            row[start + block // 2 : start + block] = -1.0
            rows.append(row)
        block //= 2
    return np.array(rows)


def all_range_workload(n: int) -> np.ndarray:
    return np.array(
        [[1.0 if i <= c <= j else 0.0 for c in range(n)] for i in range(n) for j in range(i, n)]
    )


# ------------------------------------------------------------------------------------------------
# Workload Gram builders
# ------------------------------------------------------------------------------------------------


def test_all_range_gram_matches_dense_workload():
    workload = all_range_workload(7)
    np.testing.assert_array_equal(all_range_gram(7), workload.T @ workload)


def test_prefix_gram_matches_dense_workload():
    workload = np.tril(np.ones((6, 6)))  # row i = prefix [1, i]
    np.testing.assert_array_equal(prefix_gram(6), workload.T @ workload)


def test_all_range_gram_nd_is_the_cross_product():
    w1, w2 = all_range_workload(3), all_range_workload(4)
    product = np.kron(w1, w2)
    np.testing.assert_array_equal(all_range_gram_nd((3, 4)), product.T @ product)


def test_marginals_gram_matches_dense_workload():
    shape = (2, 3, 4)
    rows = []
    for clique in k_way_cliques(3, 2):
        marginal = np.ones((1, 1))
        for attribute, size in enumerate(shape):
            factor = np.eye(size) if attribute in clique else np.ones((1, size))
            marginal = np.kron(marginal, factor)
        rows.append(marginal)
    workload = np.vstack(rows)
    np.testing.assert_array_equal(marginals_gram(shape, k_way_cliques(3, 2)), workload.T @ workload)


# ------------------------------------------------------------------------------------------------
# Closed-form spectra against dense eigen-decompositions
# ------------------------------------------------------------------------------------------------


def assert_spectrum_matches(spectrum: WorkloadSpectrum, gram: np.ndarray) -> None:
    q = spectrum.eigenvectors
    np.testing.assert_allclose(q.T @ q, np.eye(spectrum.rank), atol=1e-12)
    np.testing.assert_allclose(spectrum_gram(spectrum), gram, atol=1e-10 * np.abs(gram).max())
    dense = np.sort(np.linalg.eigvalsh(gram))[::-1][: spectrum.rank]
    np.testing.assert_allclose(spectrum.eigenvalues, dense, rtol=1e-10)


@pytest.mark.parametrize("n", [1, 2, 5, 20], ids=lambda n: f"n={n}")
def test_all_range_spectrum_matches_dense(n):
    assert_spectrum_matches(all_range_spectrum(n), all_range_gram(n))


def test_kronecker_spectrum_matches_dense():
    spectrum = kronecker_spectrum(all_range_spectrum(4), all_range_spectrum(3))
    assert_spectrum_matches(spectrum, all_range_gram_nd((4, 3)))
    assert np.all(np.diff(spectrum.eigenvalues) <= 0)


@pytest.mark.parametrize(
    ("shape", "k"),
    [((2, 3, 4), 1), ((2, 3, 4), 2), ((3, 3), 2), ((2, 2, 2, 3), 2)],
    ids=["1way-2x3x4", "2way-2x3x4", "2way-3x3-identity", "2way-2x2x2x3"],
)
def test_marginals_spectrum_matches_dense(shape, k):
    cliques = k_way_cliques(len(shape), k)
    gram = marginals_gram(shape, cliques)
    spectrum = marginals_spectrum(shape, cliques)
    assert spectrum.rank == np.linalg.matrix_rank(gram)
    assert_spectrum_matches(spectrum, gram)


def test_workload_spectrum_drops_zero_eigenvalues():
    gram = marginals_gram((3, 4), [(0,), (1,)])  # rank 3 + 4 - 1 = 6 of 12
    spectrum = workload_spectrum(gram)
    assert spectrum.rank == 6
    np.testing.assert_allclose(spectrum_gram(spectrum), gram, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# SVD bound (reference note section 4 item 6, section 9)
# ------------------------------------------------------------------------------------------------

ALL_RANGE_SVDB = {
    2: 3.732051,
    4: 16.31224,
    8: 79.17234,
    16: 404.4829,
    32: 2095.567,
    64: 10787.15,
    128: 54677.51,
    256: 2.721630e5,
    512: 1.330722e6,
    1024: 6.400694e6,
    2048: 3.034182e7,
}


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64, 128, 256], ids=lambda n: f"ALLRANGE({n})")
def test_svd_bound_all_range_dense(n):
    assert f"{svd_bound(all_range_gram(n)):.6e}" == f"{ALL_RANGE_SVDB[n]:.6e}"


@pytest.mark.parametrize("n", list(ALL_RANGE_SVDB), ids=lambda n: f"ALLRANGE({n})")
def test_svd_bound_all_range_closed_form(n):
    spectrum = all_range_spectrum(n)
    # The note prints 7 significant digits.
    assert f"{svd_bound_from_spectrum(spectrum):.6e}" == f"{ALL_RANGE_SVDB[n]:.6e}"


def test_svd_bound_all_range_2_is_2_plus_sqrt3():
    assert svd_bound(all_range_gram(2)) == pytest.approx(2 + math.sqrt(3), rel=1e-14)


def test_svd_bound_all_range_64_by_32_and_multiplicativity():
    spectrum = kronecker_spectrum(all_range_spectrum(64), all_range_spectrum(32))
    value = svd_bound_from_spectrum(spectrum)
    assert value == pytest.approx(2.2605e7, rel=5e-5)
    assert value == pytest.approx(ALL_RANGE_SVDB[64] * ALL_RANGE_SVDB[32], rel=1e-6)


def test_svd_bound_all_range_twos_to_the_tenth():
    spectrum = kronecker_spectrum(*[all_range_spectrum(2)] * 10)
    assert svd_bound_from_spectrum(spectrum) == pytest.approx((2 + math.sqrt(3)) ** 10, rel=1e-12)
    assert svd_bound_from_spectrum(spectrum) == pytest.approx(5.2417e5, rel=1e-4)


def test_svd_bound_example_4_4_and_cell_simplified_bound():
    workload = np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    gram = workload.T @ workload
    assert svd_bound(gram) == pytest.approx(2.6095, abs=5e-5)
    assert cell_simplified_svd_bound(gram) == pytest.approx(2.5, rel=1e-12)


@pytest.mark.parametrize("n", [8, 64], ids=lambda n: f"ALLPREDICATE({n})")
def test_svd_bound_all_predicate_closed_form(n):
    # ALLPREDICATE(n): G = 2^(n-2) (I + J); SVDB = 2^(n-2)/n (n - 1 + sqrt(n+1))^2 (Cor 4.4).
    scale = 2.0 ** (n - 2)
    gram = scale * (np.eye(n) + np.ones((n, n)))
    expected = scale / n * (n - 1 + math.sqrt(n + 1)) ** 2
    assert svd_bound(gram) == pytest.approx(expected, rel=1e-12)


def test_all_predicate_1024_identity_ratio():
    n = 1024
    gram = np.eye(n) + np.ones((n, n))  # 2^(n-2) (I + J) rescaled; ratios are scale-free
    assert total_error_l2(gram, np.eye(n)) / svd_bound(gram) == pytest.approx(1.8841, abs=5e-5)


def test_two_way_marginals_8x16x16_svd_bound_and_identity():
    shape = (8, 16, 16)
    spectrum = marginals_spectrum(shape, k_way_cliques(3, 2))
    bound = svd_bound_from_spectrum(spectrum)
    assert bound == pytest.approx(1.3606e3, rel=5e-5)
    identity_error = float(np.sum(spectrum.eigenvalues))  # trace(G) with sensitivity 1
    assert identity_error / bound == pytest.approx(4.5156, abs=5e-5)


# ------------------------------------------------------------------------------------------------
# Total error of fixed strategies (section 9 Identity / H / Y columns)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "identity", "hierarchical", "wavelet"),
    [
        (16, 2.0174, 1.6258, 1.2709),
        (64, 4.2421, 1.7526, 1.4082),
        (256, 10.3947, 1.7780, 1.4849),
    ],
    ids=["ALLRANGE(16)", "ALLRANGE(64)", "ALLRANGE(256)"],
)
def test_total_error_l2_competitors(n, identity, hierarchical, wavelet):
    gram = all_range_gram(n)
    bound = ALL_RANGE_SVDB[n]
    assert total_error_l2(gram, np.eye(n)) / bound == pytest.approx(identity, abs=5e-5)
    assert total_error_l2(gram, hierarchical_strategy(n)) / bound == pytest.approx(
        hierarchical, abs=5e-5
    )
    assert total_error_l2(gram, wavelet_strategy(n)) / bound == pytest.approx(wavelet, abs=5e-5)


def test_total_error_l2_matches_frobenius_definition():
    # |W A^+|_F^2 * sensitivity^2 with an explicit workload and a rank-deficient strategy.
    rng = np.random.default_rng(7)
    workload = rng.integers(0, 2, size=(5, 6)).astype(float)
    strategy = np.vstack([workload, workload[:2]]) * 1.5
    expected = l2_sensitivity(strategy) ** 2 * np.sum((workload @ np.linalg.pinv(strategy)) ** 2)
    assert total_error_l2(workload.T @ workload, strategy) == pytest.approx(expected, rel=1e-9)
    expected_l1 = l1_sensitivity(strategy) ** 2 * np.sum((workload @ np.linalg.pinv(strategy)) ** 2)
    assert total_error_l1(workload.T @ workload, strategy) == pytest.approx(expected_l1, rel=1e-9)


@pytest.mark.parametrize("gram_as_factor", [True, False], ids=["factor", "dense"])
def test_singular_strategy_path_matches_eigendecomposition(gram_as_factor):
    # Pivoted-Cholesky shortcut for singular A^T A against the eigen-decomposition pseudo-inverse.
    from dprelease.mechanisms.eigen.design import _trace_gram_pinv, _trace_gram_pinv_eigh

    rng = np.random.default_rng(5)
    basis = rng.standard_normal((30, 12))
    strategy = rng.standard_normal((20, 12)) @ basis.T  # rank 12 of 30 cells
    workload = rng.standard_normal((9, 12)) @ basis.T  # inside the row space of the strategy
    normal_matrix, gram = strategy.T @ strategy, workload.T @ workload
    expected = _trace_gram_pinv_eigh(normal_matrix, gram)
    assert expected == pytest.approx(np.sum((workload @ np.linalg.pinv(strategy)) ** 2), rel=1e-8)
    if gram_as_factor:
        value = _trace_gram_pinv(normal_matrix, gram_factor=workload.T)
    else:
        value = _trace_gram_pinv(normal_matrix, gram=gram)
    assert value == pytest.approx(expected, rel=1e-8)


def test_total_error_rejects_a_strategy_that_does_not_support_the_workload():
    gram = all_range_gram(4)
    with pytest.raises(ValueError, match="does not support the workload"):
        total_error_l2(gram, np.eye(4)[:3])


def test_sensitivities():
    strategy = np.array([[3.0, -1.0], [4.0, 1.0]])
    assert l2_sensitivity(strategy) == pytest.approx(5.0)
    assert l1_sensitivity(strategy) == pytest.approx(7.0)


# ------------------------------------------------------------------------------------------------
# The weighting program: dual solver against a generic constrained solver
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
def test_weighting_program_matches_generic_solver(noise):
    spectrum = workload_spectrum(all_range_gram(12))
    q, sigma = spectrum.eigenvectors, spectrum.eigenvalues
    constraint, power = (q**2, 1) if noise == "gaussian" else (np.abs(q), 2)
    result = eigen_design(
        all_range_gram(12),
        noise=noise,
        complete=False,
        compare_svd_bound=False,
        solver_rtol=1e-9,
    )
    variables = result.weights**2 if noise == "gaussian" else result.weights
    np.testing.assert_allclose((constraint @ variables).max(), 1.0, rtol=1e-12)

    costs = sigma / sigma.max()
    start = np.ones(12) / (constraint @ np.ones(12)).max()
    generic = scipy.optimize.minimize(
        lambda x: costs @ x ** (-power),
        start,
        jac=lambda x: -power * costs * x ** (-power - 1),
        method="SLSQP",
        bounds=[(1e-9, None)] * 12,
        constraints=[
            {"type": "ineq", "fun": lambda x: 1 - constraint @ x, "jac": lambda x: -constraint}
        ],
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    assert result.total_error_before_completion == pytest.approx(
        generic.fun * sigma.max(), rel=1e-7
    )
    assert result.solver_relative_gap <= 1e-9


@pytest.mark.parametrize("power", [1, 2], ids=["l2", "l1"])
def test_constraint_generation_matches_the_direct_dual(power):
    # Many more cells than variables (the principal-vector program): the working-set solver must
    # reach the same optimum as the dual over all cells, with a valid certificate.
    from dprelease.mechanisms.eigen.design import _solve_weighting, _solve_weighting_dual

    spectrum = all_range_spectrum(256)
    q, sigma = spectrum.eigenvectors, spectrum.eigenvalues
    matrix = q**2 if power == 1 else np.abs(q)
    costs = np.append(sigma[:20], sigma[20:].sum())
    constraint = np.column_stack([matrix[:, :20], matrix[:, 20:].sum(axis=1)])
    assert constraint.shape[0] > 4 * constraint.shape[1]  # the working-set path is taken
    options = {"power": power, "rtol": 1e-8, "max_iterations": 20_000}
    working_set = _solve_weighting(costs, constraint, **options)
    direct = _solve_weighting_dual(costs, constraint, **options)
    assert working_set.relative_gap <= 1e-8
    assert direct.relative_gap <= 1e-8
    assert (constraint @ working_set.variables).max() == pytest.approx(1.0, rel=1e-12)
    assert working_set.primal == pytest.approx(direct.primal, rel=2e-8)
    assert working_set.primal == pytest.approx(costs @ working_set.variables ** (-power), rel=1e-12)
    assert working_set.dual <= direct.primal * (1 + 1e-12)


# ------------------------------------------------------------------------------------------------
# Eigen-Design on the section 9 vectors
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "after", "before"),
    [(16, 1.0415, 1.0884), (64, 1.0405, 1.0895), (256, 1.0353, 1.0776)],
    ids=["ALLRANGE(16)", "ALLRANGE(64)", "ALLRANGE(256)"],
)
def test_eigen_design_all_range(n, after, before):
    gram = all_range_gram(n)
    result = eigen_design(gram, compare_svd_bound=False)
    bound = ALL_RANGE_SVDB[n]
    assert result.source == "eigen_design"
    assert result.total_error / bound == pytest.approx(after, abs=5e-5)
    assert result.total_error_before_completion / bound == pytest.approx(before, abs=5e-5)
    assert result.svd_bound == pytest.approx(bound, rel=2e-7)
    assert result.solver_relative_gap <= 1e-7
    assert result.solver_iterations > 0
    # The reported error is the exact error of the returned dense A, whose sensitivity is 1.
    assert l2_sensitivity(result.A) == pytest.approx(1.0, rel=1e-12)
    assert total_error_l2(gram, result.A) == pytest.approx(result.total_error, rel=1e-9)


def test_eigen_design_before_completion_is_sum_sigma_over_weights():
    gram = all_range_gram(32)
    result = eigen_design(gram, complete=False, compare_svd_bound=False)
    assert result.A.shape == (32, 32)
    assert np.all(result.completion_weights == 0)
    expected = np.sum(result.eigenvalues_kept / result.weights**2)
    assert result.total_error == pytest.approx(expected, rel=1e-9)
    assert total_error_l2(gram, result.A) == pytest.approx(expected, rel=1e-9)


def test_completion_rows_fill_every_column_to_the_sensitivity():
    result = eigen_design(all_range_gram(32), compare_svd_bound=False)
    column_norms = np.sum(result.A**2, axis=0)
    np.testing.assert_allclose(column_norms, 1.0, rtol=1e-10)
    assert result.A.shape[0] == 32 + np.count_nonzero(result.completion_weights)


def test_svd_bound_candidate_with_completion_is_offered_when_better():
    # Reference note A14: on ALLRANGE the completed SVD-bound strategy beats Eigen-Design.
    gram = all_range_gram(64)
    plain = eigen_design(gram, compare_svd_bound=False)
    best = eigen_design(gram)
    assert best.source == "svd_bound"
    assert best.total_error < plain.total_error
    assert best.alternative_total_error == pytest.approx(plain.total_error, rel=1e-9)
    assert total_error_l2(gram, best.A) == pytest.approx(best.total_error, rel=1e-9)
    # A_l before completion has error n d0 / trace(sqrt G) times SVDB (Thm 4.10).
    eigenvalues, vectors = np.linalg.eigh(gram)
    root = (vectors * np.sqrt(eigenvalues)) @ vectors.T
    ratio = gram.shape[0] * np.max(np.diag(root)) / np.trace(root)
    assert best.total_error_before_completion / svd_bound(gram) == pytest.approx(ratio, rel=1e-9)


def test_eigen_design_is_optimal_on_tight_workloads():
    # 2-way marginals and ALLRANGE(2,...,2): SVDB is tight (Thms 4.8, 4.9), ED reaches it.
    marginals = marginals_gram((2, 3, 4), k_way_cliques(3, 2))
    result = eigen_design(marginals, compare_svd_bound=False)
    assert result.total_error / svd_bound(marginals) == pytest.approx(1.0, abs=5e-5)
    twos = all_range_gram_nd((2,) * 6)
    result = eigen_design(twos, compare_svd_bound=False)
    bound = (2 + math.sqrt(3)) ** 6
    assert result.total_error / bound == pytest.approx(1.0, abs=5e-5)
    assert total_error_l2(twos, np.eye(64)) / bound == pytest.approx((4 / (2 + math.sqrt(3))) ** 6)


def test_eigen_design_rank_deficient_workload_supports_it():
    gram = marginals_gram((3, 4, 2), [(0,), (1, 2)])
    rank = np.linalg.matrix_rank(gram)
    result = eigen_design(gram, complete=False, compare_svd_bound=False)
    assert result.eigenvalues_kept.size == rank
    assert np.linalg.matrix_rank(result.A) == rank
    assert total_error_l2(gram, result.A) == pytest.approx(result.total_error, rel=1e-8)
    assert result.total_error >= svd_bound(gram) * (1 - 1e-9)


def test_eigen_design_from_closed_form_spectrum_matches_dense():
    dense = eigen_design(all_range_gram(64), compare_svd_bound=False)
    spectral = eigen_design_from_spectrum(all_range_spectrum(64), compare_svd_bound=False)
    assert spectral.total_error == pytest.approx(dense.total_error, rel=1e-6)
    assert total_error_l2(all_range_gram(64), spectral.A) == pytest.approx(
        spectral.total_error, rel=1e-9
    )


def test_error_under_permuted_cells_equals_unpermuted():
    gram = all_range_gram(64)
    permutation = np.random.default_rng(3).permutation(64)
    permuted = gram[np.ix_(permutation, permutation)]
    original = eigen_design(gram, compare_svd_bound=False)
    shuffled = eigen_design(permuted, compare_svd_bound=False)
    assert shuffled.total_error == pytest.approx(original.total_error, rel=1e-6)
    best_original, best_shuffled = eigen_design(gram), eigen_design(permuted)
    assert best_shuffled.total_error == pytest.approx(best_original.total_error, rel=1e-6)
    # The wavelet strategy, by contrast, depends on the cell order (Table 5.2).
    wavelet = wavelet_strategy(64)
    assert total_error_l2(permuted, wavelet) > 3 * total_error_l2(gram, wavelet)


def test_minimisation_merges_duplicates_and_drops_zero_columns():
    rng = np.random.default_rng(11)
    base = rng.integers(0, 3, size=(9, 5)).astype(float)
    # Cells: 0..4 distinct, 5 duplicates 1, 6 is unused, 7 duplicates 3.
    workload = np.column_stack([base, base[:, 1], np.zeros(9), base[:, 3]])
    minimized = minimize_workload(workload.T @ workload)
    np.testing.assert_array_equal(minimized.column_of_cell, [0, 1, 2, 3, 4, 1, -1, 3])
    np.testing.assert_allclose(minimized.gram, base.T @ base)

    on_original = eigen_design(workload.T @ workload, compare_svd_bound=False)
    on_minimized = eigen_design(base.T @ base, compare_svd_bound=False)
    assert on_original.total_error == pytest.approx(on_minimized.total_error, rel=1e-7)
    assert total_error_l2(workload.T @ workload, on_original.A) == pytest.approx(
        on_original.total_error, rel=1e-8
    )
    np.testing.assert_array_equal(on_original.A[:, 6], 0.0)
    np.testing.assert_array_equal(on_original.A[:, 5], on_original.A[:, 1])


def test_semantically_equivalent_split_cells_get_equal_error():
    # Prop 5.1: splitting a cell into two identical columns does not change the error.
    gram = all_range_gram(16)
    cells = np.insert(np.arange(16), 5, 5)  # cell 5 appears twice
    split = gram[np.ix_(cells, cells)]
    assert eigen_design(split, compare_svd_bound=False).total_error == pytest.approx(
        eigen_design(gram, compare_svd_bound=False).total_error, rel=1e-7
    )


# ------------------------------------------------------------------------------------------------
# Section 5.2.2 speed-ups
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["separation", "principal"])
def test_speedups_are_no_better_than_full_before_completion(method):
    gram = all_range_gram(128)
    full = eigen_design(gram, complete=False, compare_svd_bound=False)
    fast = eigen_design_speedup(
        gram, method=method, complete=False, compare_svd_bound=False, group_size=8
    )
    assert fast.total_error >= full.total_error * (1 - 1e-6)
    assert fast.total_error < 1.3 * full.total_error
    assert l2_sensitivity(fast.A) == pytest.approx(1.0, rel=1e-12)


def test_principal_vectors_share_one_weight_beyond_k():
    result = eigen_design_speedup(
        all_range_gram(40), method="principal", principal_fraction=0.1, compare_svd_bound=False
    )
    np.testing.assert_allclose(result.weights[4:], result.weights[4])
    assert not np.allclose(result.weights[:4], result.weights[4])


def test_speedups_reduce_to_full_at_their_limits():
    gram = all_range_gram(32)
    full = eigen_design(gram, compare_svd_bound=False)
    everything_principal = eigen_design_speedup(
        gram, method="principal", principal_fraction=1.0, compare_svd_bound=False
    )
    one_group = eigen_design_speedup(
        gram, method="separation", group_size=32, compare_svd_bound=False
    )
    assert everything_principal.total_error == pytest.approx(full.total_error, rel=1e-6)
    assert one_group.total_error == pytest.approx(full.total_error, rel=1e-6)


# ------------------------------------------------------------------------------------------------
# eps-DP (L1) variant
# ------------------------------------------------------------------------------------------------


def test_l1_variant_has_unit_l1_sensitivity_and_exact_error():
    gram = all_range_gram(32)
    result = eigen_design(gram, noise="laplace", compare_svd_bound=False)
    assert result.noise == "laplace"
    assert l1_sensitivity(result.A) == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose(np.sum(np.abs(result.A), axis=0), 1.0, rtol=1e-10)
    assert total_error_l1(gram, result.A) == pytest.approx(result.total_error, rel=1e-9)
    before = np.sum(result.eigenvalues_kept / result.weights**2)
    assert result.total_error_before_completion == pytest.approx(before, rel=1e-9)
    assert result.total_error < result.total_error_before_completion


# ------------------------------------------------------------------------------------------------
# The strategy as a measurable object (mechanisms.primitives.protected.MeasurableStrategy)
# ------------------------------------------------------------------------------------------------


def test_strategy_protocol_sensitivity_apply_and_least_squares():
    result = MeasurableDesign(eigen_design(all_range_gram(8)))
    data = np.arange(8, dtype=float)
    assert result.name == "eigen_design"
    assert result.num_queries == result.design.A.shape[0]
    assert result.sensitivity(noise="gaussian") == pytest.approx(1.0, rel=1e-12)
    assert result.sensitivity(noise="laplace") == pytest.approx(l1_sensitivity(result.design.A))
    np.testing.assert_allclose(result.apply(data), result.design.A @ data)
    np.testing.assert_allclose(result.least_squares(result.apply(data)), data, atol=1e-9)


def test_least_squares_is_zero_on_cells_no_query_reads():
    workload = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])  # cell 1 is never read
    result = MeasurableDesign(eigen_design(workload.T @ workload))
    estimate = result.least_squares(result.apply(np.array([3.0, 7.0, 5.0])))
    np.testing.assert_allclose(estimate, [3.0, 0.0, 5.0], atol=1e-9)


class RecordingAccountant:
    def __init__(self) -> None:
        self.charges: list[tuple[PrivacyCost, str]] = []

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        self.charges.append((cost, label))
        return f"receipt-{len(self.charges)}"


def test_session_measures_an_eigen_design_strategy():
    # Contract with the choke point: sensitivity 1 times the contribution bound, one charge.
    result = MeasurableDesign(eigen_design(all_range_gram(8)))
    cells = ProtectedCells(np.arange(8.0), domain_shape=(8,), contribution_bound=2)
    accountant = RecordingAccountant()
    measurement = cells.measure(
        result, target=PrivacyCost(measure="zcdp", rho=0.5), accountant=accountant, label="ed"
    )
    assert measurement.noise.sensitivity == pytest.approx(2.0)
    assert measurement.values.shape == (result.num_queries,)
    assert len(accountant.charges) == 1
    assert result.least_squares(measurement.values).shape == (8,)


def test_workload_variance_factor_times_noise_variance_is_the_expected_error():
    gram = all_range_gram(16)
    strategy = hierarchical_strategy(16)
    factor = workload_variance_factor(gram, strategy)
    assert total_error_l2(gram, strategy) == pytest.approx(l2_sensitivity(strategy) ** 2 * factor)
    assert total_error_l1(gram, strategy) == pytest.approx(l1_sensitivity(strategy) ** 2 * factor)
    workload = all_range_workload(16)
    assert factor == pytest.approx(np.sum((workload @ np.linalg.pinv(strategy)) ** 2), rel=1e-9)


# ------------------------------------------------------------------------------------------------
# Value types
# ------------------------------------------------------------------------------------------------


def test_result_is_frozen_with_read_only_arrays():
    result = eigen_design(all_range_gram(8))
    assert isinstance(result, EigenDesignStrategy)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.total_error = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="read-only"):
        result.A[0, 0] = 1.0


# ------------------------------------------------------------------------------------------------
# Validators: every rule fires
# ------------------------------------------------------------------------------------------------

GRAM = all_range_gram(4)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: svd_bound(np.ones((2, 3))),
            "gram (shape (2, 3)) must be a non-empty square matrix",
        ),
        (lambda: svd_bound(np.array([[1.0, np.nan], [np.nan, 1.0]])), "gram must be finite"),
        (lambda: svd_bound(np.array([[1.0, 2.0], [0.0, 1.0]])), "gram must be symmetric"),
        (lambda: svd_bound(np.zeros((2, 2))), "gram must not be all zero"),
        (
            lambda: minimize_workload(np.array([[0.0, 1.0], [1.0, 0.0]])),
            "gram must have a positive diagonal entry",
        ),
        (
            lambda: total_error_l2(GRAM, np.eye(3)),
            "strategy has 3 columns but the workload has 4 cells",
        ),
        (lambda: total_error_l2(GRAM, np.full((4, 4), np.inf)), "strategy must be finite"),
        (
            lambda: total_error_l1(GRAM, np.zeros((0, 4))),
            "strategy (shape (0, 4)) must be a non-empty",
        ),
        (
            lambda: eigen_design(GRAM, noise="linf"),
            "noise ('linf') must be one of",
        ),
        (
            lambda: eigen_design_speedup(GRAM, method="fast"),
            "method ('fast') must be 'full', 'separation'",
        ),
        (
            lambda: eigen_design_speedup(GRAM, group_size=0),
            "group_size (0) must be an integer >= 1",
        ),
        (
            lambda: eigen_design_speedup(GRAM, principal_fraction=0.0),
            "principal_fraction (0.0) must be > 0 and <= 1",
        ),
        (
            lambda: eigen_design_speedup(GRAM, principal_fraction=1.5),
            "principal_fraction (1.5) must be > 0 and <= 1",
        ),
        (lambda: eigen_design(GRAM, solver_rtol=1.0), "solver_rtol (1.0) must be > 0 and < 1"),
        (
            lambda: eigen_design(GRAM, max_iterations=0),
            "max_iterations (0) must be an integer >= 1",
        ),
        (lambda: all_range_gram(0), "n (0) must be an integer >= 1"),
        (lambda: prefix_gram(2.5), "n (2.5) must be an integer >= 1"),
        (lambda: all_range_gram_nd(()), "shape must have at least one attribute"),
        (lambda: k_way_cliques(2, 3), "k (3) must be <= n_attributes (2)"),
        (lambda: marginals_gram((2, 2), []), "cliques must contain at least one clique"),
        (
            lambda: marginals_gram((2, 2), [(0, 0)]),
            "clique (0, 0) must list distinct attributes in 0..1",
        ),
        (
            lambda: marginals_spectrum((2, 2), [(2,)]),
            "clique (2,) must list distinct attributes in 0..1",
        ),
        (lambda: kronecker_spectrum(), "kronecker_spectrum needs at least one factor"),
        (
            lambda: WorkloadSpectrum(eigenvalues=np.array([]), eigenvectors=np.ones((2, 0))),
            "eigenvalues (shape (0,)) must be a non-empty 1-D array",
        ),
        (
            lambda: WorkloadSpectrum(eigenvalues=np.array([1.0]), eigenvectors=np.ones((2, 2))),
            "eigenvectors (shape (2, 2)) must be n_cells x 1",
        ),
        (
            lambda: WorkloadSpectrum(eigenvalues=np.array([1.0, 0.0]), eigenvectors=np.eye(2)),
            "eigenvalues must be finite and > 0",
        ),
        (
            lambda: WorkloadSpectrum(eigenvalues=np.array([1.0, 2.0]), eigenvectors=np.eye(2)),
            "eigenvalues must be sorted in decreasing order",
        ),
        (
            lambda: WorkloadSpectrum(
                eigenvalues=np.array([1.0]), eigenvectors=np.array([[np.nan]])
            ),
            "eigenvectors must be finite",
        ),
        (
            lambda: MeasurableDesign(eigen_design(GRAM)).sensitivity(noise="uniform"),
            "noise ('uniform') must be one of",
        ),
        (
            lambda: MeasurableDesign(eigen_design(GRAM)).least_squares(np.ones(2)),
            "y (shape (2,)) must have length",
        ),
    ],
    ids=lambda value: None if callable(value) else value[:40],
)
def test_validators_fire(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
