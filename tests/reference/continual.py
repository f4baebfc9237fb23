"""Continual-release baselines and error summaries (Fichtenberger et al. 2023, Table 1), for tests.

``dprelease`` plans a series with :func:`mechanisms.continual.square_root` or
:func:`mechanisms.continual.optimised`; the tests and ``benchmarks/continual_bench.py`` compare
them with the baselines here (sum of periods, the causal binary tree), the SVD bound none of them
beats, and the worst / mean standard error under ρ-zCDP.
"""

from __future__ import annotations

import math

import numpy as np

from dprelease.mechanisms.continual.factorisation import CausalFactorisation
from dprelease.mechanisms.continual.strategies import _workload
from dprelease.mechanisms.primitives.lower_bound import svd_bound_gram


def sum_of_periods(workload: np.ndarray) -> CausalFactorisation:
    """``A = I``, ``B = W``: each period measured once, figures summed.  O(kT²)."""
    work = _workload(workload)
    return CausalFactorisation(np.eye(work.shape[1]), work, "sum_of_periods")


def binary_tree(workload: np.ndarray) -> CausalFactorisation:
    """Every dyadic interval, measured when it completes; each figure at period t is the
    least-squares estimate from the nodes completed by t (Honaker 2015 restricted to those nodes,
    so causal).  Only nodes inside the horizon are measured (Δ₂² = ⌊log₂ T⌋ + 1).  The reference
    table's tree is the one over 2^⌈log₂ T⌉ leaves cut at T, every cut node kept, with full least
    squares; estimated causally that tree is worse than this one.  O(T⁴)."""
    work = _workload(workload)
    horizon = work.shape[1]
    nodes = [
        (start, start + 2**level)
        for level in range(int(math.log2(horizon)) + 1)
        for start in range(0, horizon - 2**level + 1, 2**level)
    ]
    nodes.sort(key=lambda node: (node[1], node[0]))
    strategy = np.zeros((len(nodes), horizon))
    for row, (start, stop) in enumerate(nodes):
        strategy[row, start:stop] = 1.0
    times = np.array([stop - 1 for _, stop in nodes])
    recombination = np.zeros((len(work), len(nodes)))
    for t in range(horizon):
        done = np.flatnonzero(times <= t)  # includes every leaf 0..t: full column rank
        solve = np.linalg.pinv(strategy[np.ix_(done, np.arange(t + 1))])
        rows = np.arange(t, len(work), horizon)
        recombination[np.ix_(rows, done)] = work[rows, : t + 1] @ solve
    return CausalFactorisation(strategy, recombination, "binary_tree", times=times)


def svd_bound_rmse(workload: np.ndarray, rho: float) -> float:
    """The SVD bound as a mean rmse at ρ-zCDP, event level: ``√(SVDB(WᵀW)/rows · 1/(2ρ))``; no
    factorisation, causal or not, has a smaller :func:`mean_rmse`.  O(T³)."""
    work = _workload(workload)
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be finite and > 0 (got {rho!r})")
    return math.sqrt(svd_bound_gram(work.T @ work) / len(work) / (2 * rho))


def _zcdp_variances(
    factorisation: CausalFactorisation, rho: float, unit: str, max_rows: int
) -> np.ndarray:
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be finite and > 0 (got {rho!r})")
    delta = factorisation.sensitivity(noise="gaussian", unit=unit, max_rows=max_rows)
    return factorisation.row_variances(delta**2 / (2 * rho))


def worst_rmse(
    factorisation: CausalFactorisation, rho: float, *, unit: str = "event", max_rows: int = 1
) -> float:
    """Largest standard error of a published figure under ρ-zCDP (σ² = Δ²/(2ρ))."""
    return math.sqrt(float(_zcdp_variances(factorisation, rho, unit, max_rows).max()))


def mean_rmse(
    factorisation: CausalFactorisation, rho: float, *, unit: str = "event", max_rows: int = 1
) -> float:
    """Root of the mean variance over published figures under ρ-zCDP."""
    return math.sqrt(float(_zcdp_variances(factorisation, rho, unit, max_rows).mean()))


def check_factorises(factorisation: CausalFactorisation, workload: np.ndarray) -> None:
    """Raise unless ``B·A`` equals ``workload`` to 1e-9 relative (of its largest entry)."""
    target = np.asarray(workload, dtype=np.float64)
    rows, horizon = factorisation.B.shape[0], factorisation.horizon
    if target.shape != (rows, horizon):
        raise ValueError(f"workload (shape {target.shape}) must be {rows} × {horizon}")
    error = float(np.abs(factorisation.B @ factorisation.A - target).max())
    scale = max(float(np.abs(target).max()), 1.0)
    if error > 1e-9 * scale:
        raise ValueError(
            f"{factorisation.name}: B·A differs from the workload by {error:.3g} "
            f"(must be <= 1e-9 × {scale:.3g})"
        )
