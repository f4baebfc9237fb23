"""ResidualPlanner's optimum (tests.reference.residual_planner) against the paper, dense matrices
and the product's subset-space design.

The reference is what issue 28's objectives will be checked against, so it is itself checked
three ways: its closed forms reproduce the numbers of Xiao et al. (Tables 2–3, and optima
recomputed from the same formulas); its privacy cost and per-cell variances equal those of the
explicit residual matrices and generalised least squares on a small domain; and its sum-of-variances
optimum equals the product's L2 design (the SVD bound) on workloads with unequal attribute sizes.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from scipy.linalg import block_diag

from dprelease.mechanisms.primitives.marginal_strategies import marginal_weights_l2
from dprelease.mechanisms.primitives.operators import Identity, Total
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.reference.residual_planner import ResidualProgram, all_marginals

ADULT = (85, 9, 100, 16, 7, 15, 6, 5, 2, 100, 100, 99, 42, 2)  # the bundled domain's sizes


@pytest.mark.parametrize(
    ("sizes", "degrees", "rmse"),
    [
        (ADULT, (0, 1, 2, 3), 10.665),
        (ADULT, (1, 2, 3), 10.665),
        (ADULT, (1,), 3.047),
        (ADULT, (2,), 6.359),
        (ADULT, (3,), 10.515),
        ((10,) * 10, (0, 1, 2, 3), 9.348),
        ((10,) * 15, (1, 2, 3), 17.378),
        ((10,) * 20, (0, 1, 2, 3), 26.917),
    ],
    ids=["adult-0-3", "adult-1-3", "adult-1", "adult-2", "adult-3", "d10", "d15", "d20"],
)
def test_total_variance_optimum_reproduces_the_paper(sizes, degrees, rmse: float) -> None:
    program = ResidualProgram.for_marginals(sizes, all_marginals(len(sizes), degrees))
    total, scales = program.total_variance_optimum()
    assert program.rmse(total) == pytest.approx(rmse, abs=5e-4)
    assert program.privacy_cost(scales) == pytest.approx(1.0, rel=1e-12)
    assert float(program.cells @ program.table_variances(scales)) == pytest.approx(total, rel=1e-12)


@pytest.mark.parametrize(
    ("degrees", "largest"), [((0, 1, 2, 3), 253.605), ((1, 2, 3), 253.428)], ids=["0-3", "1-3"]
)
def test_max_variance_optimum_reproduces_the_paper(degrees, largest: float) -> None:
    program = ResidualProgram.for_marginals(ADULT, all_marginals(14, degrees))
    value, scales = program.max_variance_optimum()
    assert value == pytest.approx(largest, abs=1e-3)
    assert program.privacy_cost(scales) == pytest.approx(1.0, rel=1e-12)
    assert program.table_variances(scales).max() == pytest.approx(value, rel=1e-12)
    # the total-variance design leaves some cell far noisier (HDMM's: 6,677)
    sum_optimal = program.table_variances(program.total_variance_optimum()[1]).max()
    assert sum_optimal > 2 * value


def test_no_design_at_the_same_cost_has_a_smaller_largest_variance(
    rng: np.random.Generator,
) -> None:
    """Power of the certificate: random designs and perturbations of the optimum, rescaled to
    pcost 1, never beat the value returned (it is a lower bound, not just a feasible point)."""
    program = ResidualProgram.for_marginals((3, 4, 5, 2), all_marginals(4, (1, 2)))
    value, scales = program.max_variance_optimum(gap=1e-9)
    candidates = [rng.uniform(0.1, 10.0, scales.size) for _ in range(200)]
    candidates += [scales * rng.uniform(0.9, 1.1, scales.size) for _ in range(200)]
    for candidate in candidates:
        candidate = candidate * program.privacy_cost(candidate)  # pcost 1
        assert program.table_variances(candidate).max() >= value * (1 - 1e-9)


def test_max_variance_refuses_to_return_an_uncertified_value() -> None:
    program = ResidualProgram.for_marginals(ADULT, all_marginals(14, (1, 2, 3)))
    with pytest.raises(RuntimeError, match="no certified optimum in 2 steps"):
        program.max_variance_optimum(iterations=2)


def _difference(n: int) -> np.ndarray:
    """``Sub_n``: rows e_j − e_{j+1}."""
    return np.eye(n)[:-1] - np.eye(n)[1:]


def _residual(sizes: tuple[int, ...], subset: tuple[int, ...]) -> np.ndarray:
    factors = [_difference(n) if i in subset else np.ones((1, n)) for i, n in enumerate(sizes)]
    return _kron(factors)


def _kron(factors: list[np.ndarray]) -> np.ndarray:
    return functools.reduce(np.kron, factors, np.ones((1, 1)))


def test_cost_and_variances_equal_the_dense_residual_mechanism(rng: np.random.Generator) -> None:
    """pcost = Σ p_A/σ²_A and Var_S = Σ c_{S,A} σ²_A against explicit R_A, covariances
    σ²_A (Sub Subᵀ)^{⊗A} and the generalised least-squares estimate of every marginal."""
    sizes = (2, 3, 4)
    tables = [(0, 1), (1, 2), (0,), ()]
    program = ResidualProgram.for_marginals(sizes, tables)
    scales = rng.uniform(0.5, 3.0, len(program.residuals))
    blocks = [_residual(sizes, subset) for subset in program.residuals]
    covariances = [
        scale * _kron([_difference(sizes[i]) @ _difference(sizes[i]).T for i in subset])
        for scale, subset in zip(scales, program.residuals, strict=True)
    ]
    # privacy cost of one cell changing: Σ_A (R_A e_j)ᵀ Σ_A⁻¹ (R_A e_j), the same for every cell
    per_cell = sum(
        np.einsum("ij,ij->j", block, np.linalg.solve(covariance, block))
        for block, covariance in zip(blocks, covariances, strict=True)
    )
    np.testing.assert_allclose(per_cell, program.privacy_cost(scales), rtol=1e-10)
    measured = np.vstack(blocks)
    precision = np.linalg.inv(block_diag(*covariances))
    estimate_covariance = np.linalg.pinv(measured.T @ precision @ measured)
    for table, variance in zip(tables, program.table_variances(scales), strict=True):
        query = _kron([np.eye(n) if i in table else np.ones((1, n)) for i, n in enumerate(sizes)])
        cells = np.diag(query @ estimate_covariance @ query.T)
        np.testing.assert_allclose(cells, variance, rtol=1e-9)


@pytest.mark.parametrize(
    ("sizes", "tables"),
    [
        ((3, 4, 5, 2), [(0, 1), (1, 2, 3), (0, 3), (2,)]),
        ((2, 7, 3), [(0, 1, 2), (1,)]),
        (ADULT, all_marginals(14, (1, 2, 3))),
    ],
    ids=["mixed", "nested", "adult-1-3"],
)
def test_total_variance_optimum_equals_the_products_l2_design(sizes, tables) -> None:
    """Two independent computations of the matrix-mechanism optimum on marginals: the residual
    closed form and the product's subset-space L2 design (at the SVD bound)."""
    workload = Workload(
        domain_shape=sizes,
        items=tuple(
            WorkloadItem(
                name="-".join(map(str, table)),
                factors=tuple(Identity(n) if i in table else Total(n) for i, n in enumerate(sizes)),
            )
            for table in tables
        ),
    )
    program = ResidualProgram.for_marginals(sizes, tables)
    total, _ = program.total_variance_optimum()
    assert marginal_weights_l2(workload).unit_total_error == pytest.approx(total, rel=1e-9)
