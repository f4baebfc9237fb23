"""Low-Rank Mechanism as the paper states it (Yuan et al., PVLDB 2012), outside the product.

The paper's release ``B·(L·x + Lap(Δ(L)/ε)^r)`` on a raw vector (:func:`measure`, no choke point,
no ledger), its error (:func:`expected_total_error`, :func:`query_variances`), the error bounds
every exact decomposition obeys, the default rank, the L1-ball projection, and the random workload
families of §6.1.  The product (:mod:`mechanisms.lrm`) keeps only :func:`decompose` and answers by
least squares.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from dprelease.mechanisms.lrm.decomposition import (
    LowRankDecomposition,
    _finite_matrix,
    _positive_int,
    _project_rows,
)
from dprelease.mechanisms.primitives.linalg import l1_sensitivity
from dprelease.mechanisms.primitives.noise import NoiseSampler
from dprelease.mechanisms.primitives.privacy import check_epsilon


def project_columns_to_l1_ball(matrix: np.ndarray, *, radius: float = 1.0) -> np.ndarray:
    """Euclidean projection of every column onto ``{v : ‖v‖₁ ≤ radius}`` (Eq. 11). O(n r log r).

    Exact (sort-based, Duchi et al. 2008, Fig. 1, applied to |v| with the signs restored).
    Columns already inside the ball are returned unchanged.

    References
    ----------
    J. Duchi, S. Shalev-Shwartz, Y. Singer, T. Chandra, "Efficient projections onto the l1-ball
    for learning in high dimensions", ICML 2008.  LRM paper §5 (Eq. 11, one problem per column).
    """
    values = _finite_matrix(matrix, "matrix")
    if not (math.isfinite(radius) and radius > 0):
        raise ValueError(f"radius ({radius}) must be finite and > 0")
    return np.ascontiguousarray(_project_rows(np.ascontiguousarray(values.T), radius).T)


def workload_rank(workload: np.ndarray) -> int:
    """Numerical rank of ``W`` (numpy's default relative tolerance, σ_max·max(m, n)·eps). O(mn·min)."""
    matrix = _finite_matrix(workload, "W")
    return int(np.linalg.matrix_rank(matrix))


def default_rank(workload: np.ndarray) -> int:
    """``r = ⌈1.2·rank(W)⌉``, the paper's default (Table 1), in exact integer arithmetic."""
    workload_rank_value = workload_rank(workload)
    if workload_rank_value == 0:
        raise ValueError("W has rank 0 (all zero); there is nothing to decompose")
    return (6 * workload_rank_value + 4) // 5


def noise_on_data_error(workload: np.ndarray, *, epsilon: float) -> float:
    """Expected total squared error of noise on data, ``W·(x + Lap(1/ε)^n)``: ``2‖W‖²_F/ε²``.

    The paper's baseline M_D (NOD, "LM" in its experiments), §3.2 Eq. (4).
    """
    matrix = _finite_matrix(workload, "W")
    check_epsilon(epsilon)
    return float(2.0 * np.sum(matrix * matrix) / epsilon**2)


def error_bounds(workload: np.ndarray, *, epsilon: float) -> tuple[float, float]:
    """Bounds on the optimal LRM error: ``(2‖W‖²_*/n, 2·rank(W)·‖W‖²_F) / ε²``.

    Lower: every decomposition with ``B·L = W`` has ``Δ(L)²‖B‖²_F ≥ ‖W‖²_*/n`` (for the polar
    factor Y of W, ``‖W‖_* = ⟨Y, B·L⟩ ≤ Δ(L)·√n·‖B‖_F``; derived here, not in
    the paper).  Upper: Lemma 3's construction ``B = √k·UΣ``, ``L = Vᵀ/√k`` with k = rank(W), with
    the factor 2 of Lemma 1 that the paper's statement omits.  O(mn·min(m, n)).
    """
    matrix = _finite_matrix(workload, "W")
    check_epsilon(epsilon)
    singular_values = np.linalg.svd(matrix, compute_uv=False)
    nuclear = float(singular_values.sum())
    lower = 2.0 * nuclear**2 / matrix.shape[1]
    upper = 2.0 * workload_rank(matrix) * float(np.sum(singular_values**2))
    return lower / epsilon**2, upper / epsilon**2


def expected_total_error(
    W: np.ndarray,
    decomposition: LowRankDecomposition,
    *,
    epsilon: float,
    data_norm_sq: float = 1.0,
    data_sensitivity: float = 1.0,
) -> float:
    """Expected total squared error over the m queries of ``measure``: noise plus bias bound.

    ``2·(Δ_x·Δ(L)/ε)²·‖B‖²_F + ‖W − B·L‖²_F · data_norm_sq`` (Lemma 1 and Theorem 3 with γ²).
    The bias term is the paper's Cauchy-Schwarz bound ``‖(W − BL)x‖² ≤ ‖W − BL‖²_F·‖x‖²₂``:
    with the default ``data_norm_sq = 1`` it is the bias per unit squared L2 norm of the data;
    pass a public bound on ``Σ x_i²`` for a bound on real data.  Total, not per query (divide by
    m); the paper's experiments (§6, "Average Squared Error") report the same total.

    Parameters
    ----------
    W : ndarray, shape (m, n)
        The workload the decomposition answers (the bias is recomputed against it).
    decomposition : LowRankDecomposition
    epsilon : float
        Privacy budget of the release (> 0).
    data_norm_sq : float
        Assumed ``‖x‖²₂`` for the bias term (≥ 0).
    data_sensitivity : float
        L1 sensitivity Δ_x of the data vector (1 for unit counts).
    """
    workload = _finite_matrix(W, "W")
    _check_matching(workload, decomposition)
    check_epsilon(epsilon)
    _check_data_sensitivity(data_sensitivity)
    if not (math.isfinite(data_norm_sq) and data_norm_sq >= 0):
        raise ValueError(f"data_norm_sq ({data_norm_sq}) must be finite and >= 0")
    scale = data_sensitivity * l1_sensitivity(decomposition.L) / epsilon
    variance = 2.0 * scale * scale * query_scale(decomposition)
    residual = workload - decomposition.B @ decomposition.L  # O(mnr)
    return float(variance + float(np.sum(residual * residual)) * data_norm_sq)


def query_variances(
    decomposition: LowRankDecomposition, *, epsilon: float, data_sensitivity: float = 1.0
) -> np.ndarray:
    """Noise variance of each of the m released answers: ``2·(Δ_x·Δ(L)/ε)²·Σ_k B_ik²``.

    Lemma 1 row by row; the sum is the noise part of ``expected_total_error`` (no bias). O(mr).
    """
    if not isinstance(decomposition, LowRankDecomposition):
        raise TypeError(
            f"decomposition must be a LowRankDecomposition, got {type(decomposition).__name__}"
        )
    check_epsilon(epsilon)
    _check_data_sensitivity(data_sensitivity)
    scale = data_sensitivity * l1_sensitivity(decomposition.L) / epsilon
    return 2.0 * scale * scale * np.sum(decomposition.B * decomposition.B, axis=1)


def measure(
    x: np.ndarray,
    decomposition: LowRankDecomposition,
    *,
    epsilon: float,
    sampler: NoiseSampler,
    data_sensitivity: float = 1.0,
) -> np.ndarray:
    """Release ``B·(L·x + Lap(Δ_x·Δ(L)/ε)^r)``: noisy answers to the m workload queries (Eq. 6).

    Privacy: ε-DP for neighbours whose data vectors differ by at most ``data_sensitivity`` in
    L1 norm (default 1: one unit count, the paper's neighbours).  ``L·x`` then has L1 sensitivity
    ``data_sensitivity·Δ(L)``, with Δ(L) recomputed here from the returned ``L`` (never assumed
    to be 1); multiplying by the public ``B`` is post-processing.  The answers are biased by
    ``(B·L − W)·x`` when the decomposition is relaxed (see ``expected_total_error``).

    References
    ----------
    Yuan et al., PVLDB 2012, §4 Eq. (6), Lemma 1.
    """
    if not isinstance(decomposition, LowRankDecomposition):
        raise TypeError(
            f"decomposition must be a LowRankDecomposition, got {type(decomposition).__name__}"
        )
    data = np.asarray(x, dtype=np.float64)
    if data.shape != (decomposition.L.shape[1],):
        raise ValueError(
            f"x has shape {data.shape}; it must be a vector of length n = {decomposition.L.shape[1]}"
        )
    if not np.all(np.isfinite(data)):
        raise ValueError("x must be finite")
    check_epsilon(epsilon)
    _check_data_sensitivity(data_sensitivity)
    # Privacy obligation: the scale uses the actual Δ(L) of the L that is applied to x.
    scale = data_sensitivity * l1_sensitivity(decomposition.L) / epsilon
    noisy_intermediate = sampler.add_laplace(decomposition.L @ data, scale=scale)  # O(rn)
    return decomposition.B @ np.asarray(noisy_intermediate, dtype=np.float64)  # O(mr)


def wdiscrete_workload(
    m: int,
    n: int,
    *,
    rng: np.random.Generator,
    probability_one: float = 0.02,
    otherwise: float = -1.0,
) -> np.ndarray:
    """WDiscrete: each ``W_ij`` is 1 with probability 0.02 and ``otherwise`` (−1) else.

    The paper's text, read literally ("1 with probability 0.02 and −1 otherwise"): a dense ±1
    matrix.  ``otherwise=0.0`` gives the sparse 0/1 reading (§6 may mean either).
    """
    m, n = _positive_int(m, "m"), _positive_int(n, "n")
    _check_generator(rng)
    if not (0 <= probability_one <= 1):
        raise ValueError(f"probability_one ({probability_one}) must be in [0, 1]")
    if not math.isfinite(otherwise):
        raise ValueError(f"otherwise ({otherwise}) must be finite")
    return np.where(rng.random((m, n)) < probability_one, 1.0, float(otherwise))


def wrange_workload(m: int, n: int, *, rng: np.random.Generator) -> np.ndarray:
    """WRange: m range queries ``Σ_{a ≤ j ≤ b} x_j``, endpoints i.i.d. uniform on the domain.

    The two endpoints are drawn independently and sorted (a = b allowed): the paper (§6) does
    not say.  O(mn).
    """
    m, n = _positive_int(m, "m"), _positive_int(n, "n")
    _check_generator(rng)
    endpoints = np.sort(rng.integers(0, n, size=(m, 2)), axis=1)
    cells = np.arange(n)
    return ((cells >= endpoints[:, :1]) & (cells <= endpoints[:, 1:])).astype(np.float64)


def wrelated_workload(m: int, n: int, s: int, *, rng: np.random.Generator) -> np.ndarray:
    """WRelated: ``W = C·A`` with C (m×s) and A (s×n) i.i.d. N(0, 1); rank s almost surely."""
    m, n, s = _positive_int(m, "m"), _positive_int(n, "n"), _positive_int(s, "s")
    _check_generator(rng)
    if s > min(m, n):
        raise ValueError(f"s ({s}) must be <= min(m, n) = {min(m, n)}")
    correlation = rng.standard_normal((m, s))
    base = rng.standard_normal((s, n))
    return correlation @ base  # O(mns)


def _check_data_sensitivity(data_sensitivity: float) -> None:
    if not (
        isinstance(data_sensitivity, Real)
        and math.isfinite(data_sensitivity)
        and data_sensitivity > 0
    ):
        raise ValueError(f"data_sensitivity ({data_sensitivity}) must be finite and > 0")


def _check_generator(rng: np.random.Generator) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")


def _check_matching(workload: np.ndarray, decomposition: LowRankDecomposition) -> None:
    if not isinstance(decomposition, LowRankDecomposition):
        raise TypeError(
            f"decomposition must be a LowRankDecomposition, got {type(decomposition).__name__}"
        )
    expected = (decomposition.B.shape[0], decomposition.L.shape[1])
    if workload.shape != expected:
        raise ValueError(
            f"W has shape {workload.shape} but the decomposition answers shape {expected}"
        )


def query_scale(decomposition: LowRankDecomposition) -> float:
    """``Φ(B, L) = ‖B‖²_F`` (Definition 1)."""
    return float(np.sum(decomposition.B * decomposition.B))


def unit_noise_error(decomposition: LowRankDecomposition) -> float:
    """``Δ(L)²·‖B‖²_F``: total noise variance over the m answers per unit noise variance per unit
    data sensitivity (times ``2/ε²`` for the Laplace release; no bias). O(mr)."""
    return l1_sensitivity(decomposition.L) ** 2 * query_scale(decomposition)
