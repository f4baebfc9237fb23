"""The ε-LDP randomiser of the local model: the strategy matrix, its fingerprint, the client step.

Every user holds one item ``u`` of a domain of size ``n``.  A strategy is an ``m x n`` matrix ``Q``
whose column ``u`` is the distribution of the response a user with item ``u`` sends
(``Q[o, u] = Pr[response o | item u]``).  :class:`LDPStrategy` is validated ε-LDP at construction;
:func:`randomize` is the only privacy-relevant randomness of the model and runs on the user's
device.  Strategy design is data independent, and no central noise is added under LDP, so nothing
in ``mechanisms.local`` takes a ``NoiseSampler``.

[McKenna20]: see :mod:`mechanisms.local`."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType

import numpy as np

from dprelease.mechanisms.primitives.privacy import check_epsilon

# Rounding allowance on |sum_o Q[o, u] - 1| (the exact sum of the stored floats, via math.fsum).
# Sampling renormalises each column, so the effective privacy loss is at most
# epsilon + 2 * COLUMN_SUM_TOLERANCE / (1 - COLUMN_SUM_TOLERANCE).
COLUMN_SUM_TOLERANCE = 1e-12
# Client sampling works on the integer weights round(Q * 2^60) (exact cumulative sums in int64).
_SAMPLING_SCALE = 2.0**60
# Fingerprint format tag: bump when the canonical byte layout changes.
_FINGERPRINT_TAG = b"dprelease.ldp.strategy.v1"


@dataclass(frozen=True, kw_only=True, eq=False)
class LDPStrategy:
    """An ε-LDP strategy matrix ``Q[o, u] = Pr[response o | item u]`` (m×n, read-only float64
    copy), validated at construction for ``epsilon``.  ``name`` and ``details`` (public facts
    about how it was made: ``optimize_strategy``'s ``objective``, ``steps``, ``stopped_early``)
    are not part of the fingerprint.

    Privacy:
    Construction raises ``ValueError`` unless (Prop 2.6 of [McKenna20]) every entry is finite and
    > 0, every column sums to 1 within :data:`COLUMN_SUM_TOLERANCE` (exact float sum), and every
    row satisfies ``max_u Q[o, u] <= exp(epsilon) * min_u Q[o, u]`` in exact rational arithmetic
    on the stored floats (``exp(epsilon)`` is ``math.exp``, within one ulp of e^ε).  Entries must
    be strictly positive: an output that never occurs must be removed, and a zero next to a
    positive entry in one row is not ε-LDP for any ε.

    References: [McKenna20] Prop 2.6, Def 3.2."""

    name: str
    Q: np.ndarray = field(repr=False)
    epsilon: float
    details: Mapping[str, float | int | bool] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name ({self.name!r}) must be a non-empty string")
        epsilon = check_epsilon(self.epsilon)
        matrix = check_matrix(np.array(self.Q, dtype=np.float64, copy=True), name="Q")
        if not np.all(np.isfinite(matrix)):
            raise ValueError("Q must contain only finite values")
        if not np.all(matrix > 0.0):
            raise ValueError(
                f"Q entries must be > 0 (min {float(matrix.min())!r}); remove outputs that never occur"
            )
        _check_columns_sum_to_one(matrix)
        _check_row_ratios(matrix, epsilon)
        matrix.setflags(write=False)
        object.__setattr__(self, "Q", matrix)
        object.__setattr__(self, "epsilon", epsilon)
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    @property
    def num_outputs(self) -> int:
        """Number of possible responses ``m`` (rows of ``Q``)."""
        return int(self.Q.shape[0])

    @property
    def domain_size(self) -> int:
        """Number of item types ``n`` (columns of ``Q``)."""
        return int(self.Q.shape[1])


def _check_columns_sum_to_one(matrix: np.ndarray) -> None:
    # O(m n): exact float sums (math.fsum), one rounding per column.
    for column_index in range(matrix.shape[1]):
        total = math.fsum(matrix[:, column_index].tolist())
        if abs(total - 1.0) > COLUMN_SUM_TOLERANCE:
            raise ValueError(
                f"column {column_index} of Q sums to {total!r}; every column must sum to 1 "
                f"(tolerance {COLUMN_SUM_TOLERANCE})"
            )


def _check_row_ratios(matrix: np.ndarray, epsilon: float) -> None:
    # Privacy obligation (Prop 2.6, condition 1), checked exactly: max_u Q[o,u] <= e^eps min_u Q[o,u].
    exp_epsilon = Fraction(math.exp(epsilon))
    row_max = matrix.max(axis=1)
    row_min = matrix.min(axis=1)
    for row_index in range(matrix.shape[0]):
        bound = exp_epsilon * Fraction(float(row_min[row_index]))
        if Fraction(float(row_max[row_index])) > bound:
            ratio = float(row_max[row_index] / row_min[row_index])
            excess = float(Fraction(float(row_max[row_index])) / bound - 1)
            raise ValueError(
                f"row {row_index} of Q has max/min ratio {ratio!r}, above exp(epsilon) = "
                f"{math.exp(epsilon)!r} by a relative {excess:.3g}; the strategy is not "
                f"{epsilon}-LDP"
            )


def enforce_row_ratio(matrix: np.ndarray, epsilon: float) -> np.ndarray:
    """Lower entries by at most one ulp so that every row satisfies the exact ratio check.

    ``nextafter(fl(e^ε · min), 0)`` is <= the exact product under round-to-nearest, so the cap
    passes :func:`_check_row_ratios`.  Only entries already at the bound move.
    """
    row_min = matrix.min(axis=1)
    cap = np.nextafter(math.exp(epsilon) * row_min, 0.0)
    return np.minimum(matrix, cap[:, None])


def strategy_fingerprint(strategy: LDPStrategy) -> str:
    """SHA-256 hex digest of the canonical bytes of ``strategy.Q`` and ``strategy.epsilon``.

    The canonical bytes are a format tag, the shape as two little-endian int64, ``Q`` as
    little-endian float64 in C order and ``epsilon`` as a little-endian float64.  The name is
    excluded: two strategies with equal matrices and ε accept the same responses.  The pipeline
    uses it to check that a batch of responses was produced by the published strategy.
    """
    check_strategy(strategy)
    digest = hashlib.sha256()
    digest.update(_FINGERPRINT_TAG)
    digest.update(np.asarray(strategy.Q.shape, dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(strategy.Q, dtype="<f8").tobytes())
    digest.update(np.asarray([strategy.epsilon], dtype="<f8").tobytes())
    return digest.hexdigest()


def check_strategy(strategy: object) -> None:
    if not isinstance(strategy, LDPStrategy):
        raise ValueError(f"strategy ({type(strategy).__name__}) must be an LDPStrategy")


def check_matrix(values: np.ndarray, *, name: str) -> np.ndarray:
    """``values`` as a float64 array, checked: 2-D with at least one row and one column."""
    matrix = np.asarray(values, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] < 1 or matrix.shape[1] < 1:
        raise ValueError(f"{name} (shape {matrix.shape}) must be a non-empty 2-D matrix")
    return matrix


def check_indices(values: np.ndarray, *, name: str, size: int) -> np.ndarray:
    """``values`` as int64 indices, checked: a 1-D integer array with entries in ``[0, size)``."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} (shape {array.shape}) must be a 1-D array")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} (dtype {array.dtype}) must be integer indices")
    if array.size and (array.min() < 0 or array.max() >= size):
        raise ValueError(f"{name} must lie in [0, {size}) (got {array.min()}..{array.max()})")
    return array.astype(np.int64)


def check_size(n: int, *, name: str = "n", minimum: int = 1) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"{name} ({n!r}) must be an integer")
    if n < minimum:
        raise ValueError(f"{name} ({n}) must be >= {minimum}")
    return int(n)


def randomize(items: np.ndarray, strategy: LDPStrategy, *, rng: np.random.Generator) -> np.ndarray:
    """Client side: turn each true item index into a response index sampled from ``Q[:, item]``.

    Sampling is exact integer inverse-CDF sampling: column ``u`` becomes the integer weights
    ``k = round(2^60 Q[:, u])``, each user draws an exactly uniform integer below ``Σ_o k_o``
    (``rng.integers``) and reports the first output whose cumulative weight exceeds it, so output
    ``o`` has probability exactly ``k_o / Σ k``.  Returns an int64 array of response indices, one
    per item.  Cost ``O(m n + N log N)``.

    Privacy:
    This is the ε-LDP step, and it runs on the user's device: only the returned response may
    leave it.  ``rng`` is privacy-critical here.  On a real device it must be a fresh Generator
    seeded from OS entropy (``numpy.random.default_rng()`` with no seed, or one backed by
    ``secrets``/``os.urandom``), never a fixed, shared or logged seed: whoever knows the seed can
    invert the response.  Seeded generators are for simulation and tests only.  The realised
    probabilities ``k_o / Σ k`` differ from ``Q[o, u]`` by at most ``2^-61`` plus the column-sum
    rounding, so the realised privacy loss exceeds ε by at most about
    ``2^-60 / min Q + 2 COLUMN_SUM_TOLERANCE`` (below 1e-11 for the strategies built here).
    Entries below ``2^-61`` cannot be sampled faithfully and raise ``ValueError``.

    References: [McKenna20] §2 (M_Q(u) samples o ~ q_u)."""
    check_strategy(strategy)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng ({type(rng).__name__}) must be a numpy.random.Generator")
    item_array = check_indices(items, name="items", size=strategy.domain_size)
    if item_array.size == 0:
        return np.empty(0, dtype=np.int64)
    weights = np.rint(strategy.Q * _SAMPLING_SCALE).astype(np.int64)  # exact: power-of-two scale
    if np.any(weights <= 0):
        raise ValueError(
            f"Q has entries below 2^-61 (min {float(strategy.Q.min())!r}); they cannot be sampled"
        )
    cumulative = np.cumsum(weights, axis=0)  # O(m n), exact: totals < 2^61
    order = np.argsort(item_array, kind="stable")  # O(N log N)
    sorted_items = item_array[order]
    draws = rng.integers(0, cumulative[-1, sorted_items])  # exactly uniform below each total
    group_items, group_starts = np.unique(sorted_items, return_index=True)
    group_ends = np.append(group_starts[1:], sorted_items.size)
    responses = np.empty(item_array.size, dtype=np.int64)
    for item, start, end in zip(group_items, group_starts, group_ends, strict=True):
        # O(k log m) for the k users holding this item
        responses[order[start:end]] = np.searchsorted(
            cumulative[:, item], draws[start:end], side="right"
        )
    return responses
