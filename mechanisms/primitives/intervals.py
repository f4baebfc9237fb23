"""Two-sided confidence intervals of released estimates: the quantile that matches the error law.

Most estimates combine several noise draws (least squares over many measurements), so their error
is close to normal and the interval is ``estimate ± z·std_error`` with ``z = Φ⁻¹(1 − α/2)``.  An
estimate whose error is exactly **one Laplace draw** (a cell measured once by an identity strategy
under ε-DP, then copied) is not close to normal: ``Laplace(b)`` has ``std = √2·b`` and
``P(|L| > t) = exp(−t/b)``, so the exact two-sided interval is ``± b·ln(1/α)``, about ``2.12·std``
at 95% (the normal ``1.96·std`` covers only 93.7%).

:func:`kron_single_term_rows` tells which rows of a Kronecker workload item are answered by a single
measurement of a Kronecker strategy: the least-squares answer ``W(AᵀA)⁺Aᵀy`` factors over the
attributes, and a Kronecker product of rows has one non-zero iff every factor row has one.

Public and data-free: everything here reads the public strategy, workload and noise scale only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dprelease.mechanisms.primitives.operators import Factor, Ranges

# Relative size below which an entry of a least-squares row counts as zero (floating-point noise of
# a pseudo-inverse; genuine weights are O(1/n) or larger for any domain this package accepts).
SINGLE_TERM_TOLERANCE = 1e-9


def _check_level(level: float) -> float:
    if not (isinstance(level, float | int) and 0 < level < 1):
        raise ValueError(f"level ({level}) must lie strictly between 0 and 1")
    return float(level)


def normal_quantile(level: float = 0.95) -> float:
    """``z`` of the two-sided normal interval ``± z·σ`` at ``level``.

    >>> round(normal_quantile(0.95), 6)
    1.959964
    """
    from scipy.special import ndtri  # imported here: 0.1 s that loading a spec never needs

    level = _check_level(level)
    return float(ndtri(0.5 + level / 2.0))


def laplace_quantile(level: float = 0.95) -> float:
    """``t/σ`` of the exact two-sided interval of one Laplace draw: ``ln(1/(1 − level))/√2``.

    ``Laplace(b)`` has ``σ = √2·b`` and ``P(|L| > t) = exp(−t/b)``; at 0.95 the half-width is
    ``b·ln 20 ≈ 2.996·b ≈ 2.118·σ``.

    >>> round(laplace_quantile(0.95), 4), round(laplace_quantile(0.95) * math.sqrt(2), 4)
    (2.1183, 2.9957)
    """
    level = _check_level(level)
    return math.log(1.0 / (1.0 - level)) / math.sqrt(2.0)


INTERVALS = ("normal", "laplace", "none")
"""How a row's interval is formed: normal quantile, exact Laplace quantile, or no interval."""


def distinct_strings(values: np.ndarray) -> set[str]:
    """The distinct values of a label array (one label or one per row), as strings.  O(rows) hashes:
    ``np.unique(values.astype(str))`` was ~20x slower, a fixed cost of every released table."""
    return {str(v) for v in set(np.asarray(values, dtype=object).ravel().tolist())}


def interval_half_widths(
    std_error: np.ndarray,
    *,
    interval: str | np.ndarray,
    level: float = 0.95,
) -> np.ndarray:
    """Half-width of each row's two-sided interval at ``level`` (NaN where ``interval`` is none).

    ``interval`` (one value, or one per row) is ``"laplace"`` when the row's error is exactly one
    Laplace draw, ``"normal"`` otherwise, and ``"none"`` when no interval is claimed.
    """
    std = np.asarray(std_error, dtype=np.float64)
    kind = np.asarray(interval, dtype=object)
    if kind.ndim and kind.shape != std.shape:
        raise ValueError(
            f"interval (shape {kind.shape}) must be one value or one per row ({std.shape})"
        )
    unknown = sorted(distinct_strings(kind) - set(INTERVALS))
    if unknown:
        raise ValueError(f"interval values {unknown} must be one of {INTERVALS}")
    quantile = np.where(
        kind == "laplace",
        laplace_quantile(level),
        np.where(kind == "normal", normal_quantile(level), np.nan),
    )
    return std * quantile


def single_term_rows(rows: np.ndarray, *, tolerance: float = SINGLE_TERM_TOLERANCE) -> np.ndarray:
    """Whether each row of a reconstruction matrix has exactly one non-zero entry.

    Entries below ``tolerance`` × the row's largest magnitude are zero.  O(size of ``rows``).
    """
    matrix = np.atleast_2d(np.asarray(rows, dtype=np.float64))
    largest = np.abs(matrix).max(axis=1, keepdims=True)
    nonzero = np.abs(matrix) > tolerance * np.where(largest > 0, largest, 1.0)
    return np.count_nonzero(nonzero, axis=1) == 1


def kron_single_term_rows(
    workload_factors: Sequence[Factor],
    strategy_factors: Sequence[Factor],
    gram_pinvs: Sequence[np.ndarray],
) -> np.ndarray:
    """Rows of ``⊗W_i`` whose least-squares answer from ``⊗A_i`` uses one measurement only.

    ``gram_pinvs`` are the strategy's ``(A_iᵀA_i)⁺``.  The answer matrix is ``⊗ W_i(A_iᵀA_i)⁺A_iᵀ``;
    a row of it has one non-zero iff every factor row does.  Rows are in row-major (Kronecker)
    order, as the item's answers.  O(Σ m_i n_i p_i).
    """
    if not len(workload_factors) == len(strategy_factors) == len(gram_pinvs):
        raise ValueError(
            f"workload_factors ({len(workload_factors)}), strategy_factors "
            f"({len(strategy_factors)}) and gram_pinvs ({len(gram_pinvs)}) must have one entry "
            "per attribute"
        )
    flags = np.ones(1, dtype=bool)
    for workload, strategy, pinv in zip(
        workload_factors, strategy_factors, gram_pinvs, strict=True
    ):
        right = np.asarray(pinv) @ strategy.dense().T  # n × p
        flags = np.logical_and.outer(flags, _factor_single_term_rows(workload, right)).ravel()
    return flags


ROW_BLOCK_ENTRIES = 1 << 22
"""Entries of one block of answer rows (32 MB): bounds the peak for 500,500 ranges × 2,000 queries."""


def _factor_single_term_rows(workload: Factor, right: np.ndarray) -> np.ndarray:
    """:func:`single_term_rows` of ``workload.dense() @ right`` in row blocks of at most
    :data:`ROW_BLOCK_ENTRIES` entries; range factors use prefix differences of ``right`` (O(m p)),
    never their dense ``m × n`` matrix."""
    m, p = workload.m, right.shape[1]
    block = max(1, ROW_BLOCK_ENTRIES // max(p, 1))
    if isinstance(workload, Ranges):
        prefix = np.vstack([np.zeros((1, p)), np.cumsum(right, axis=0)])
        lo, hi = workload.lo, workload.hi
        parts = [
            single_term_rows(prefix[hi[i : i + block] + 1] - prefix[lo[i : i + block]])
            for i in range(0, m, block)
        ]
        return np.concatenate(parts)
    return single_term_rows(workload.dense() @ right)
