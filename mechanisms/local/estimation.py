"""Server side of the local model: the reconstruction ``V``, its variances, estimates from responses.

The server counts responses into ``y`` (``E[y] = Q x``) and answers a workload ``W`` (``p x n``)
with ``V y`` where ``V Q = W``.  Variances are reported *per user*: multiply by the number of users
``N`` for the total (the variance of ``V y`` is linear in the data vector ``x``, Thm 3.4).  Pure
post-processing of ε-LDP responses.

[McKenna20]: see :mod:`mechanisms.local`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dprelease.mechanisms.local.randomizer import LDPStrategy, check_matrix
from dprelease.mechanisms.primitives.privacy import check_epsilon
from dprelease.mechanisms.primitives.threads import single_threaded_blas

# Relative eigenvalue cut-off for the pseudo-inverse of X = Q^T D^-1 Q, in units of n * machine eps.
_PINV_RTOL_ULPS = 1.0
# Relative Frobenius residual above which W is declared outside the row space of Q (V Q != W).
_ROW_SPACE_TOLERANCE = 1e-6


def _strategy_matrix(Q: LDPStrategy | np.ndarray) -> np.ndarray:
    matrix = check_matrix(Q.Q if isinstance(Q, LDPStrategy) else Q, name="Q")
    if not np.all(np.isfinite(matrix)) or np.any(matrix < 0.0):
        raise ValueError("Q must contain only finite, non-negative values")
    if np.any(matrix.sum(axis=1) <= 0.0):
        raise ValueError("every row of Q must have a positive sum (remove unused outputs)")
    return matrix


def workload_matrix(W: np.ndarray, num_columns: int | None = None) -> np.ndarray:
    workload = check_matrix(W, name="W")
    if not np.all(np.isfinite(workload)):
        raise ValueError("W must contain only finite values")
    if num_columns is not None and workload.shape[1] != num_columns:
        raise ValueError(
            f"W has {workload.shape[1]} columns but Q has {num_columns}; both must equal n"
        )
    return workload


def _gls_factors(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A = D^-1 Q`` (m x n), the pseudo-inverse ``X^+`` of ``X = Q^T D^-1 Q`` and its range
    projector ``X^+ X`` (n x n each)."""
    scaled = matrix / matrix.sum(axis=1, keepdims=True)
    gram = matrix.T @ scaled  # O(m n^2)
    gram = (gram + gram.T) / 2.0
    eigenvalues, eigenvectors = np.linalg.eigh(gram)  # O(n^3)
    cutoff = eigenvalues.max() * _PINV_RTOL_ULPS * gram.shape[0] * np.finfo(np.float64).eps
    keep = eigenvalues > cutoff
    basis = eigenvectors[:, keep]
    return scaled, (basis / eigenvalues[keep]) @ basis.T, basis @ basis.T


def _check_row_space(workload_gram: np.ndarray, range_projector: np.ndarray) -> None:
    # ||W (I - P)||_F^2 = tr(G (I - P)) for the orthogonal projector P onto the row space of Q.
    total = float(np.trace(workload_gram))
    residual = total - float(np.sum(workload_gram * range_projector))
    if residual > _ROW_SPACE_TOLERANCE**2 * total:
        raise ValueError(
            f"W is not in the row space of Q (relative residual {math.sqrt(max(residual, 0) / total):.3g}); "
            "no V with V Q = W exists, the strategy cannot answer this workload"
        )


@single_threaded_blas()
def reconstruction(W: np.ndarray, Q: LDPStrategy | np.ndarray) -> np.ndarray:
    """The reconstruction ``V = W (Q^T D^-1 Q)^+ Q^T D^-1`` of Thm 3.10 (``p x m``).

    It is the minimum-variance unbiased linear reconstruction for the average case (generalised
    least squares with the response covariance), and ``V Q = W`` whenever ``W`` lies in the row
    space of ``Q`` (otherwise ``ValueError``).  ``D = Diag(Q 1)``.  Cost ``O(m n^2 + n^3 + p n m)``.

    References: [McKenna20] Theorem 3.10."""
    matrix = _strategy_matrix(Q)
    workload = workload_matrix(W, matrix.shape[1])
    scaled, gram_pinv, range_projector = _gls_factors(matrix)
    _check_row_space(workload.T @ workload, range_projector)
    return (workload @ gram_pinv) @ scaled.T


@single_threaded_blas()
def per_type_variance(W: np.ndarray, Q: LDPStrategy | np.ndarray) -> np.ndarray:
    """Per-user variance ``σ²_u = Σ_i v_i^T Diag(q_u) v_i - (v_i^T q_u)^2`` for every item ``u``
    of the reconstruction ``V`` of Thm 3.10, without forming it.

    The total squared error of ``V y`` on data ``x`` is ``σ² · x`` (Thm 3.4).  With
    ``B = D^-1 Q X^+`` and ``G = W^T W``, ``σ²_u = [diag(B G B^T)^T Q]_u - G_uu``, cost
    ``O(m n^2 + n^3 + p n^2)``.

    References: [McKenna20] Theorem 3.4, Corollaries 3.5 and 3.6."""
    matrix = _strategy_matrix(Q)
    workload = workload_matrix(W, matrix.shape[1])
    workload_gram = workload.T @ workload  # O(p n^2)
    scaled, gram_pinv, range_projector = _gls_factors(matrix)
    _check_row_space(workload_gram, range_projector)
    weights = scaled @ gram_pinv  # B (m x n), O(m n^2)
    squared_column_norms = np.einsum("ij,ij->i", weights @ workload_gram, weights)  # O(m n^2)
    return squared_column_norms @ matrix - np.diag(workload_gram)


@single_threaded_blas()
def lower_bound(W: np.ndarray, *, epsilon: float) -> float:
    """Lower bound on the worst-case variance per user of every ε-LDP factorization mechanism.

    ``L_worst / N >= (λ_1 + ... + λ_n)^2 / (n e^ε) - ||W||_F^2 / n`` with ``λ`` the singular
    values of ``W``.  It can be negative (vacuous) at large ε.

    References: [McKenna20] Theorem 5.6, Corollary 5.7."""
    workload = workload_matrix(W)
    epsilon = check_epsilon(epsilon)
    n = workload.shape[1]
    singular_values = np.linalg.svd(workload, compute_uv=False)  # O(p n^2)
    return float(singular_values.sum() ** 2 / (n * math.exp(epsilon)) - np.sum(workload**2) / n)


@dataclass(frozen=True, kw_only=True)
class LDPEstimate:
    """Workload answers ``V y`` estimated from ``num_responses = N`` LDP responses, unbiased for
    ``W x`` (counts, not fractions).

    ``variance`` is the per-query estimate ``N/(N-1) · [(V∘V) y - (V y)^2 / N]`` (the sample
    variance of the users' contributions ``V[i, o_j]`` times ``N``).  Its expectation is the true
    variance plus ``N^2/(N-1) · Var_{u ~ x/N}(W_iu) >= 0``: conservative, and close when the
    variance per user dominates ``W_iu^2`` (the LDP regime)."""

    answers: np.ndarray
    variance: np.ndarray
    num_responses: int


def estimate(response_counts: np.ndarray, V: np.ndarray) -> LDPEstimate:
    """Server side: answers ``V y`` with a per-query variance estimate from ``y`` alone.

    ``V`` is the reconstruction (``V Q = W``), normally :func:`reconstruction`'s.  Pure
    post-processing of the ε-LDP responses.  Cost ``O(p m)``.

    References: [McKenna20] Def 3.2 (M_{V,Q}(x) = V M_Q(x)), Thm 3.4."""
    counts = np.asarray(response_counts, dtype=np.float64)
    reconstruction_matrix = np.asarray(V, dtype=np.float64)
    if counts.ndim != 1:
        raise ValueError(f"response_counts (shape {counts.shape}) must be a 1-D array")
    if reconstruction_matrix.ndim != 2 or reconstruction_matrix.shape[1] != counts.size:
        raise ValueError(
            f"V (shape {reconstruction_matrix.shape}) must be p x m with m = {counts.size}"
        )
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError("response_counts must be finite and >= 0")
    if not np.all(np.isfinite(reconstruction_matrix)):
        raise ValueError("V must contain only finite values")
    num_responses = float(counts.sum())
    if num_responses < 2:
        raise ValueError(f"response_counts total ({num_responses}) must be >= 2")
    answers = reconstruction_matrix @ counts
    second_moment = (reconstruction_matrix**2) @ counts
    variance = num_responses / (num_responses - 1.0) * (second_moment - answers**2 / num_responses)
    return LDPEstimate(
        answers=answers,
        variance=np.maximum(variance, 0.0),
        num_responses=round(num_responses),
    )
