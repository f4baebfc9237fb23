"""Causal factorisations of a time workload ``W`` (kT × T) that a series is planned with.

* :func:`square_root`: ``A = C^{1/2}``, the square root of the cumulative matrix (Fichtenberger,
  Henzinger, Upadhyay 2023), ``B = W·A⁻¹`` (``A = B = C^{1/2}`` for cumulative counts).
* :func:`optimised`: L-BFGS over lower-triangular ``A`` (Denisov et al. 2022), never worse than
  the square root by its own objective.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import solve_triangular

from dprelease.mechanisms.continual.factorisation import CausalFactorisation
from dprelease.mechanisms.continual.workloads import positive_int
from dprelease.mechanisms.primitives.threads import single_threaded_blas

OBJECTIVES = ("total", "worst")
WORST_P_SCHEDULE = (16.0, 64.0, 256.0)
"""p-norms of the row variances minimised in turn for ``worst`` (‖v‖_p → max v as p grows)."""
MAX_ITERATIONS = 2000
"""L-BFGS-B iterations per objective (per p-norm surrogate for ``worst``)."""


def _workload(workload: np.ndarray) -> np.ndarray:
    """``workload`` as float64 after checking it is kT × T, finite and causal in every block."""
    array = np.asarray(workload, dtype=np.float64)
    if (
        array.ndim != 2
        or array.shape[1] < 1
        or array.shape[0] < 1
        or array.shape[0] % array.shape[1]
    ):
        raise ValueError(f"workload (shape {array.shape}) must be kT × T with k, T >= 1")
    if not np.all(np.isfinite(array)):
        raise ValueError("workload must be finite (it has a NaN or infinite entry)")
    if not array.any():
        raise ValueError("workload must have a non-zero entry (it asks for nothing)")
    horizon = array.shape[1]
    future = np.nonzero(
        array * (np.arange(horizon)[None, :] > (np.arange(len(array)) % horizon)[:, None])
    )
    if future[0].size:
        r, j = int(future[0][0]), int(future[1][0])
        raise ValueError(
            f"workload row {r} (published at period {r % horizon}) uses period {j}; "
            "a figure may use only periods up to its own"
        )
    return array


def square_root_coefficients(horizon: int, *, power: float = 0.5) -> np.ndarray:
    """Coefficients of ``(1 − x)^{-power}``: ``c_k = c_{k−1}·(k − 1 + power)/k``.  O(T).

    ``power = 1/2``: binom(2k, k)/4^k = 1, 1/2, 3/8, 5/16, …; ``power = −1/2``: the inverse's.
    """
    ks = np.arange(1, positive_int(horizon, name="horizon"))
    return np.concatenate([[1.0], np.cumprod((ks - 1 + power) / ks)])


def _toeplitz(coefficients: np.ndarray) -> np.ndarray:
    lag = np.subtract.outer(np.arange(len(coefficients)), np.arange(len(coefficients)))
    return np.where(lag >= 0, coefficients[np.clip(lag, 0, None)], 0.0)


def square_root_matrix(horizon: int) -> np.ndarray:
    """``C^{1/2}``: lower-triangular Toeplitz of :func:`square_root_coefficients`.  O(T²)."""
    return _toeplitz(square_root_coefficients(horizon))


def square_root(workload: np.ndarray) -> CausalFactorisation:
    """``A = C^{1/2}``, ``B = W·C^{-1/2}`` (the inverse in closed form, power −1/2).  O(kT³)."""
    work = _workload(workload)
    inverse = _toeplitz(square_root_coefficients(work.shape[1], power=-0.5))
    return CausalFactorisation(square_root_matrix(work.shape[1]), work @ inverse, "square_root")


def objective_value(factorisation: CausalFactorisation, objective: str) -> float:
    """``Δ₂(A)²·Σ_r ‖B_r‖²`` (total) or ``Δ₂(A)²·max_r ‖B_r‖²`` (worst): variances at σ² = Δ²."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
    variances = factorisation.row_variances(factorisation.sensitivity() ** 2)
    return float(variances.sum() if objective == "total" else variances.max())


def _value_and_gradient(
    theta: np.ndarray, work: np.ndarray, lower: tuple[np.ndarray, np.ndarray], p: float | None
) -> tuple[float, np.ndarray]:
    """The objective of A with unit columns (Δ₂ = 1) and its gradient in the lower-triangular
    entries of A: with ``p = None`` exactly ``objective_value(·, "total")``, else the p-norm of the
    row variances (≥ the worst, within a factor kT^{1/p}).  O(kT³) per call."""
    horizon = work.shape[1]
    strategy = np.zeros((horizon, horizon))
    strategy[lower] = theta
    if not np.all(np.diag(strategy)):  # singular A (a zero diagonal entry): no finite B
        return math.inf, np.zeros_like(theta)
    norms = np.linalg.norm(strategy, axis=0)
    unit = strategy / norms
    inverse = solve_triangular(unit, np.eye(horizon), lower=True)
    recombination = work @ inverse
    variances = np.einsum("ij,ij->i", recombination, recombination)
    if p is None:
        value, weights = float(variances.sum()), np.ones_like(variances)
    else:
        top = variances.max()
        value = top * float(((variances / top) ** p).sum()) ** (1 / p)
        weights = (variances / value) ** (p - 1)
    # d/dÃ Σ w_r ‖(W Ã⁻¹)_r‖² = −2 Bᵀ diag(w) B Ã⁻ᵀ, then through Ã = A·diag(1/‖a_j‖)
    grad_unit = -2 * recombination.T @ (weights[:, None] * recombination) @ inverse.T
    grad = grad_unit / norms - strategy * ((strategy * grad_unit).sum(axis=0) / norms**3)
    return value, grad[lower]


@single_threaded_blas()
def optimised(workload: np.ndarray, *, objective: str = "worst") -> CausalFactorisation:
    """Minimise the objective over lower-triangular A (L-BFGS-B from the square root), B = W·A⁻¹.

    ``total``: ``Δ₂²·tr(BBᵀ)``, smooth.  ``worst``: ``Δ₂²·max_r ‖B_r‖²`` through its p-norm
    surrogates (:data:`WORST_P_SCHEDULE`, each started from the last); the returned factorisation is
    compared with the square root by the exact :func:`objective_value`, and the better is returned.
    Deterministic (no randomness); one BLAS thread.  O(:data:`MAX_ITERATIONS` · kT³) per surrogate.
    """
    from scipy.optimize import minimize  # imported here: 0.2 s a recorded series plan never needs

    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
    baseline = square_root(workload)
    work = _workload(workload)
    horizon = work.shape[1]
    lower = np.tril_indices(horizon)
    theta = baseline.A[lower].copy()
    for p in (None,) if objective == "total" else WORST_P_SCHEDULE:
        result = minimize(
            _value_and_gradient,
            theta,
            args=(work, lower, p),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": MAX_ITERATIONS, "maxcor": 20},
        )
        theta = result.x
    strategy = np.zeros((horizon, horizon))
    strategy[lower] = theta
    if not np.all(np.diag(strategy)):
        return baseline
    strategy /= np.linalg.norm(strategy, axis=0)
    inverse = solve_triangular(strategy, np.eye(horizon), lower=True)
    found = CausalFactorisation(strategy, work @ inverse, f"optimised_{objective}")
    if objective_value(found, objective) < objective_value(baseline, objective):
        return found
    return baseline
