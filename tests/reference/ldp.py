"""Local-model figures only tests and benchmarks read: [McKenna20]'s worst- and average-case
variances, per-query worst case, the response count of an in-memory array, and the optimiser's
running-time model.  A release reads :func:`mechanisms.local.estimation.per_type_variance`."""

from __future__ import annotations

import numpy as np

from dprelease.mechanisms.local.estimation import (
    _ROW_SPACE_TOLERANCE,
    _strategy_matrix,
    per_type_variance,
    reconstruction,
    workload_matrix,
)
from dprelease.mechanisms.local.randomizer import (
    LDPStrategy,
    check_indices,
    check_size,
    check_strategy,
)
from dprelease.mechanisms.primitives.threads import single_threaded_blas


def _check_factorization(workload: np.ndarray, matrix: np.ndarray, V: np.ndarray) -> np.ndarray:
    reconstruction_matrix = np.asarray(V, dtype=np.float64)
    expected_shape = (workload.shape[0], matrix.shape[0])
    if reconstruction_matrix.shape != expected_shape:
        raise ValueError(
            f"V (shape {reconstruction_matrix.shape}) must have shape {expected_shape}"
        )
    residual = np.linalg.norm(reconstruction_matrix @ matrix - workload)
    if residual > _ROW_SPACE_TOLERANCE * max(np.linalg.norm(workload), 1.0):
        raise ValueError(
            f"V @ Q must equal W (residual {residual:.3g}); V is not an unbiased reconstruction"
        )
    return reconstruction_matrix


def per_type_variance_of(
    W: np.ndarray, Q: LDPStrategy | np.ndarray, V: np.ndarray | None = None
) -> np.ndarray:
    """:func:`mechanisms.local.estimation.per_type_variance` for a given reconstruction ``V``
    (``V Q = W``; cost ``O(p m n)``), or for Thm 3.10's when ``V`` is None ([McKenna20] Thm 3.4)."""
    if V is None:
        return per_type_variance(W, Q)
    matrix = _strategy_matrix(Q)
    workload = workload_matrix(W, matrix.shape[1])
    reconstruction_matrix = _check_factorization(workload, matrix, V)
    return (reconstruction_matrix**2).sum(axis=0) @ matrix - (workload**2).sum(axis=0)


def worst_case_variance(
    W: np.ndarray, Q: LDPStrategy | np.ndarray, V: np.ndarray | None = None
) -> float:
    """Worst-case total variance per user, ``L_worst / N = max_u σ²_u`` ([McKenna20] Cor 3.5),
    attained when all users hold the worst item.  ``V=None``: Thm 3.10's reconstruction (what a
    release uses); ``V = W @ pinv(Q)`` gives the authors' README figures."""
    return float(per_type_variance_of(W, Q, V).max())


def average_case_variance(
    W: np.ndarray, Q: LDPStrategy | np.ndarray, V: np.ndarray | None = None
) -> float:
    """Average-case total variance per user, ``L_avg / N = mean_u σ²_u`` ([McKenna20] Cor 3.6,
    Thm 3.9; ``x = N/n``)."""
    return float(per_type_variance_of(W, Q, V).mean())


@single_threaded_blas()
def query_worst_case_variance(
    W: np.ndarray, Q: LDPStrategy | np.ndarray, V: np.ndarray | None = None
) -> np.ndarray:
    """Per-query worst-case variance per user, ``max_u Σ_o V_io² Q_ou - W_iu²`` ([McKenna20]
    Thm 3.4 on one row of ``V``).  Cost ``O(p m n)``: it forms ``V`` (Thm 3.10's when
    ``V=None``)."""
    matrix = _strategy_matrix(Q)
    workload = workload_matrix(W, matrix.shape[1])
    if V is None:
        reconstruction_matrix = reconstruction(workload, matrix)
    else:
        reconstruction_matrix = _check_factorization(workload, matrix, V)
    return ((reconstruction_matrix**2) @ matrix - workload**2).max(axis=1)


def count_responses(responses: np.ndarray, strategy: LDPStrategy) -> np.ndarray:
    """The response vector ``y`` (``y_o`` = number of users who sent ``o``) of an array."""
    check_strategy(strategy)
    m = strategy.num_outputs
    counts = np.bincount(check_indices(responses, name="responses", size=m), minlength=m)
    return counts.astype(np.int64)


# Seconds per optimiser step (one BLAS thread): 1.0e-3 + 1.28e-7·m·n + 3.2e-10·(m·n² + n³),
# a relative least-squares fit to the process time per step of optimize_strategy on prefix and
# identity workloads, ε = 1 and 4, n = 32…256, m = 4n (within 0.6-1.25× of every point), by
#   .venv/bin/python benchmarks/predict_bench.py --calibrate ldp
# Steps taken: 85-228 (n = 32), 78-358 (64), 91-500 (128), 23-500 (256) of the 500 allowed;
# modelled as 100 + 2n, capped by `iterations`.
_STEP_COEFFICIENTS = (1.0e-3, 1.28e-7, 3.2e-10)


def predict_seconds(n: int, *, rows: int | None = None, iterations: int = 500) -> float:
    """Predicted seconds of :func:`mechanisms.local.optimizer.optimize_strategy` on an n-item
    domain, from sizes only.

    ``rows`` as in ``optimize_strategy`` (default 4n).  ``min(iterations, 100 + 2n)`` steps
    of ``O(m n² + n³)`` each, calibrated on this machine (one BLAS thread).  O(1).
    """
    n = check_size(n)
    num_rows = 4 * n if rows is None else check_size(rows, name="rows")
    steps = min(check_size(iterations, name="iterations", minimum=0), 100 + 2 * n)
    fixed, per_entry, per_flop = _STEP_COEFFICIENTS
    per_step = fixed + per_entry * num_rows * n + per_flop * (num_rows * n * n + n**3)
    return steps * per_step
