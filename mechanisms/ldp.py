"""Local differential privacy (LDP) for linear counting queries: the workload factorization mechanism.

Every user holds one item ``u`` of a domain of size ``n``.  A mechanism is an ``m x n`` strategy
matrix ``Q`` whose column ``u`` is the distribution of the response a user with item ``u`` sends
(``Q[o, u] = Pr[response o | item u]``).  The server counts responses into ``y`` (``E[y] = Q x``)
and answers a workload ``W`` (``p x n``) with ``V y`` where ``V Q = W``.

This module holds the whole mechanism, with no I/O:

* strategy value type :class:`LDPStrategy` (validated ε-LDP at construction) and its fingerprint;
* baselines: :func:`randomized_response`, :func:`rappor`, :func:`hadamard`, :func:`hierarchical`,
  :func:`fourier`;
* the strategy optimiser of Problem 3.12 (:func:`optimize_strategy`);
* analysis: :func:`reconstruction` (Thm 3.10), :func:`per_type_variance` (Thm 3.4),
  :func:`worst_case_variance` (Cor 3.5), :func:`average_case_variance` (Cor 3.6),
  :func:`query_worst_case_variance`, :func:`lower_bound` (Cor 5.7);
* the protocol: :func:`randomize` (client side), :func:`count_responses` and :func:`estimate`
  (server side).

Strategy design is data independent (public); the only privacy-relevant randomness is the
client-side sampling in :func:`randomize`, which runs on the user's device.  Under LDP no central
noise is added, so nothing here takes a ``NoiseSampler``.

Variances are reported *per user*: multiply by the number of users ``N`` for the total (the
variance of ``V y`` is linear in the data vector ``x``, Thm 3.4).

References
----------
R. McKenna, R. K. Maity, A. Mazumdar, G. Miklau, "A workload-adaptive mechanism for linear queries
under local differential privacy", PVLDB 13(11), 2020 (referred to as [McKenna20] below).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Protocol

import numpy as np
import scipy.linalg

from mechanisms.checks import check_epsilon
from mechanisms.compute_limits import Progress, WorkLimit, report
from mechanisms.threads import single_threaded_blas

__all__ = [
    "FrequencyOracle",
    "LDPEstimate",
    "LDPStrategy",
    "average_case_variance",
    "count_responses",
    "estimate",
    "fourier",
    "hadamard",
    "hierarchical",
    "lower_bound",
    "optimize_strategy",
    "per_type_variance",
    "predict_seconds",
    "query_worst_case_variance",
    "randomize",
    "randomized_response",
    "rappor",
    "reconstruction",
    "strategy_fingerprint",
    "worst_case_variance",
]

# Rounding allowance on |sum_o Q[o, u] - 1| (the exact sum of the stored floats, via math.fsum).
# Sampling renormalises each column, so the effective privacy loss is at most
# epsilon + 2 * COLUMN_SUM_TOLERANCE / (1 - COLUMN_SUM_TOLERANCE).
COLUMN_SUM_TOLERANCE = 1e-12
# Relative eigenvalue cut-off for the pseudo-inverse of X = Q^T D^-1 Q, in units of n * machine eps.
_PINV_RTOL_ULPS = 1.0
# Relative Frobenius residual above which W is declared outside the row space of Q (V Q != W).
_ROW_SPACE_TOLERANCE = 1e-6
# Outputs whose lower bound z_o falls to this probability are removed by the optimiser.
_PRUNE_PROBABILITY = 1e-10
# Largest domain RAPPOR may enumerate (2^n outputs).
_RAPPOR_MAX_DOMAIN = 16
# Client sampling works on the integer weights round(Q * 2^60) (exact cumulative sums in int64).
_SAMPLING_SCALE = 2.0**60
# Fingerprint format tag: bump when the canonical byte layout changes.
_FINGERPRINT_TAG = b"dprelease.ldp.strategy.v1"


# --------------------------------------------------------------------------------------------
# Strategy value type
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class LDPStrategy:
    """An ε-LDP strategy matrix, validated at construction.

    Attributes
    ----------
    name:
        Human-readable mechanism name (not part of the fingerprint).
    Q:
        ``m x n`` float64 matrix, ``Q[o, u] = Pr[response o | item u]``; stored as a read-only copy.
    epsilon:
        The privacy parameter the matrix is certified for.
    details:
        Public facts about how the strategy was made (``optimize_strategy``: ``objective``,
        ``steps``, ``stopped_early``); empty otherwise.  Not part of the fingerprint.

    Privacy
    -------
    Construction raises ``ValueError`` unless (Prop 2.6 of [McKenna20]) every entry is finite and
    > 0, every column sums to 1 within :data:`COLUMN_SUM_TOLERANCE` (exact float sum), and every
    row satisfies ``max_u Q[o, u] <= exp(epsilon) * min_u Q[o, u]`` in exact rational arithmetic
    on the stored floats (``exp(epsilon)`` is ``math.exp``, within one ulp of e^ε).  Entries must
    be strictly positive: an output that never occurs must be removed, and a zero next to a
    positive entry in one row is not ε-LDP for any ε.

    References
    ----------
    [McKenna20] Prop 2.6, Def 3.2.
    """

    name: str
    Q: np.ndarray = field(repr=False)
    epsilon: float
    details: Mapping[str, float | int | bool] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name ({self.name!r}) must be a non-empty string")
        epsilon = check_epsilon(self.epsilon)
        matrix = np.array(self.Q, dtype=np.float64, copy=True)
        if matrix.ndim != 2 or matrix.shape[0] < 1 or matrix.shape[1] < 1:
            raise ValueError(f"Q (shape {matrix.shape}) must be a non-empty 2-D matrix")
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


def _enforce_row_ratio(matrix: np.ndarray, epsilon: float) -> np.ndarray:
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
    if not isinstance(strategy, LDPStrategy):
        raise ValueError(f"strategy ({type(strategy).__name__}) must be an LDPStrategy")
    digest = hashlib.sha256()
    digest.update(_FINGERPRINT_TAG)
    digest.update(np.asarray(strategy.Q.shape, dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(strategy.Q, dtype="<f8").tobytes())
    digest.update(np.asarray([strategy.epsilon], dtype="<f8").tobytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Baseline mechanisms
# --------------------------------------------------------------------------------------------


def _check_domain_size(n: int, *, name: str = "n", minimum: int = 1) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"{name} ({n!r}) must be an integer")
    if n < minimum:
        raise ValueError(f"{name} ({n}) must be >= {minimum}")
    return int(n)


def randomized_response(n: int, *, epsilon: float) -> LDPStrategy:
    """Randomized response on ``n`` items: report the true item w.p. ∝ e^ε, any other ∝ 1.

    ``Q = ((e^ε - 1) I + 1 1^T) / (e^ε + n - 1)`` (``n x n``).

    Privacy
    -------
    ε-LDP: every row holds one entry ∝ e^ε and the rest ∝ 1.

    References
    ----------
    [McKenna20] Example 2.7; Warner 1965.
    """
    n = _check_domain_size(n, minimum=2)
    epsilon = check_epsilon(epsilon)
    exp_epsilon = math.exp(epsilon)
    matrix = np.full((n, n), 1.0 / (exp_epsilon + n - 1.0))
    np.fill_diagonal(matrix, exp_epsilon / (exp_epsilon + n - 1.0))
    return LDPStrategy(
        name="randomized_response", Q=_enforce_row_ratio(matrix, epsilon), epsilon=epsilon
    )


def rappor(n: int, *, epsilon: float) -> LDPStrategy:
    """Basic (one-time) RAPPOR: the one-hot encoding of the item with every bit flipped w.p.
    ``1 / (1 + e^{ε/2})``.

    Output ``o`` is the bit vector with binary expansion ``o`` (bit ``u`` = item ``u``), so the
    strategy has ``2^n`` rows; ``n`` is limited to 16.

    Privacy
    -------
    ε-LDP: two one-hot vectors differ in two bits, each costing ε/2.

    References
    ----------
    [McKenna20] Table 1; Erlingsson, Pihur, Korolova, CCS 2014.
    """
    n = _check_domain_size(n, minimum=2)
    if n > _RAPPOR_MAX_DOMAIN:
        raise ValueError(f"n ({n}) must be <= {_RAPPOR_MAX_DOMAIN} for RAPPOR (2^n outputs)")
    epsilon = check_epsilon(epsilon)
    keep = math.exp(epsilon / 2.0) / (1.0 + math.exp(epsilon / 2.0))
    outputs = np.arange(2**n, dtype=np.int64)
    bits = (outputs[:, None] >> np.arange(n)) & 1  # O(2^n n)
    ones_per_output = bits.sum(axis=1)
    # Hamming distance to e_u: bits set elsewhere, plus bit u if it is clear.
    distance = ones_per_output[:, None] - bits + (1 - bits)
    matrix = keep ** (n - distance) * (1.0 - keep) ** distance
    return LDPStrategy(name="rappor", Q=_enforce_row_ratio(matrix, epsilon), epsilon=epsilon)


def _largest_power_of_two_below(value: float) -> int:
    power = 1
    while 2 * power < value:
        power *= 2
    return power


def _sylvester_hadamard_signs(rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Entries ``H[r, c] = (-1)^{popcount(r & c)}`` of the Sylvester-Hadamard matrix."""
    parity = np.bitwise_count(np.bitwise_and(rows[:, None], columns[None, :])) & 1
    return 1 - 2 * parity.astype(np.int64)


def hadamard(n: int, *, epsilon: float, blocks: int | None = None) -> LDPStrategy:
    """Hadamard response with ``blocks`` blocks of Sylvester-Hadamard rows.

    Item ``u`` is assigned to block ``u // (b - 1)`` and to column ``1 + u % (b - 1)`` of a
    ``b x b`` Sylvester-Hadamard matrix ``H_b`` (the all-ones column 0 is skipped).  Output rows
    are ``(block, r)`` pairs, ``K = blocks * b`` in all; ``Q[(k, r), u] ∝ e^ε`` if ``k`` is the
    item's block and ``H_b[r, column(u)] = +1``, and ∝ 1 otherwise.

    ``blocks=None`` picks the general-privacy-regime size: the largest power of two strictly below
    ``min(e^ε, 2n)``, with ``b = 2^ceil(log2(n / blocks + 1))``.  ``blocks=1`` is the
    high-privacy form of Table 1 (``K = 2^ceil(log2(n + 1))``).  Both agree when ``e^ε <= 2``.

    Privacy
    -------
    ε-LDP: every entry is ∝ e^ε or ∝ 1 with the same normaliser for every item.

    References
    ----------
    [McKenna20] Table 1; Acharya, Sun, Zhang, "Hadamard response", AISTATS 2019 (general regime).
    """
    n = _check_domain_size(n, minimum=2)
    epsilon = check_epsilon(epsilon)
    exp_epsilon = math.exp(epsilon)
    if blocks is None:
        blocks = _largest_power_of_two_below(min(exp_epsilon, 2.0 * n))
    blocks = _check_domain_size(blocks, name="blocks")
    if blocks & (blocks - 1):
        raise ValueError(f"blocks ({blocks}) must be a power of two")
    block_size = 2
    while blocks * (block_size - 1) < n:  # smallest power of two with blocks * (b - 1) >= n
        block_size *= 2
    items = np.arange(n)
    item_block = items // (block_size - 1)
    item_column = 1 + items % (block_size - 1)
    signs = _sylvester_hadamard_signs(np.arange(block_size), item_column)  # (b, n)
    num_outputs = blocks * block_size
    weights = np.ones((num_outputs, n))  # O(K n)
    for block in range(blocks):
        in_block = item_block == block
        rows = slice(block * block_size, (block + 1) * block_size)
        weights[rows, in_block] = np.where(signs[:, in_block] > 0, exp_epsilon, 1.0)
    column_total = (block_size / 2.0) * (exp_epsilon + 1.0) + (num_outputs - block_size)
    matrix = weights / column_total
    return LDPStrategy(
        name=f"hadamard(blocks={blocks})",
        Q=_enforce_row_ratio(matrix, epsilon),
        epsilon=epsilon,
    )


class FrequencyOracle(Protocol):
    """A histogram mechanism used for each level of :func:`hierarchical`."""

    def __call__(self, n: int, *, epsilon: float) -> LDPStrategy:
        """Return an ε-LDP strategy on ``n`` items."""
        ...


def hierarchical(
    n: int,
    *,
    epsilon: float,
    branching: int = 4,
    oracle: FrequencyOracle = hadamard,
) -> LDPStrategy:
    """Hierarchical mechanism for range queries: each user samples one tree level uniformly.

    Level ``L = 0, 1, ...`` (while ``branching^L < n``) groups items into cells of width
    ``branching^L``; item ``u`` falls in cell ``u // branching^L`` and the user runs ``oracle`` on
    the ``ceil(n / branching^L)`` cells of that level with the full ε.  The root (one cell) is not
    a level.  The strategy stacks the levels' matrices, divided by the number of levels.

    Privacy
    -------
    ε-LDP: a uniform mixture over levels, with each level's oracle ε-LDP on the cells, is ε-LDP.

    References
    ----------
    [McKenna20] §6.1 (Hierarchical [13, 39]); Cormode, Kulkarni, Srivastava, PVLDB 2019; Wang et
    al., SIGMOD 2019.  Branching 4 with the Hadamard oracle as in the authors' code.
    """
    n = _check_domain_size(n, minimum=2)
    epsilon = check_epsilon(epsilon)
    branching = _check_domain_size(branching, name="branching", minimum=2)
    items = np.arange(n)
    level_matrices = []
    width = 1
    while width < n:
        num_cells = -(-n // width)
        cell_strategy = oracle(num_cells, epsilon=epsilon)
        if not isinstance(cell_strategy, LDPStrategy) or cell_strategy.domain_size != num_cells:
            raise ValueError(f"oracle must return an LDPStrategy on {num_cells} items")
        if cell_strategy.epsilon > epsilon:
            raise ValueError(
                f"oracle returned epsilon ({cell_strategy.epsilon}) > epsilon ({epsilon})"
            )
        level_matrices.append(cell_strategy.Q[:, items // width])
        width *= branching
    matrix = np.vstack(level_matrices) / len(level_matrices)
    oracle_name = getattr(oracle, "__name__", type(oracle).__name__)
    return LDPStrategy(
        name=f"hierarchical(branching={branching}, oracle={oracle_name})",
        Q=_enforce_row_ratio(matrix, epsilon),
        epsilon=epsilon,
    )


def fourier(d: int, *, epsilon: float, order: int | None = None) -> LDPStrategy:
    """Fourier mechanism for marginals on the binary domain ``{0, 1}^d`` (``n = 2^d`` items).

    The coefficient set ``T`` is every attribute subset with at most ``order`` attributes
    (default ``d``), the empty set included.  A user picks ``t ∈ T`` uniformly and reports the
    character ``χ_t(u) = (-1)^{popcount(t & u)}`` through binary randomized response (kept w.p.
    ``e^ε / (1 + e^ε)``).  Row ``2 i`` is "``t_i``, +1", row ``2 i + 1`` is "``t_i``, -1"; subsets are
    ordered by size, then lexicographically by attribute indices.  Item ``u``'s bit ``a`` is
    attribute ``a``.  With ``order < d`` the strategy only supports workloads that depend on
    marginals of at most ``order`` attributes.

    Privacy
    -------
    ε-LDP: binary randomized response on a public, data-independent choice of ``t``.

    References
    ----------
    [McKenna20] §6.1 (Fourier [12]); Cormode, Kulkarni, Srivastava, SIGMOD 2018.
    """
    d = _check_domain_size(d, name="d")
    epsilon = check_epsilon(epsilon)
    order = d if order is None else _check_domain_size(order, name="order")
    if order > d:
        raise ValueError(f"order ({order}) must be <= d ({d})")
    subsets = [
        sum(1 << attribute for attribute in chosen)
        for size in range(order + 1)
        for chosen in itertools.combinations(range(d), size)
    ]
    keep = math.exp(epsilon) / (1.0 + math.exp(epsilon))
    signs = _sylvester_hadamard_signs(np.asarray(subsets, dtype=np.int64), np.arange(2**d))
    positive = np.where(signs > 0, keep, 1.0 - keep) / len(subsets)  # O(|T| 2^d)
    matrix = np.empty((2 * len(subsets), 2**d))
    matrix[0::2] = positive
    matrix[1::2] = 1.0 / len(subsets) - positive
    return LDPStrategy(
        name=f"fourier(order={order})", Q=_enforce_row_ratio(matrix, epsilon), epsilon=epsilon
    )


# --------------------------------------------------------------------------------------------
# Analysis: reconstruction, variance, lower bound
# --------------------------------------------------------------------------------------------


def _strategy_matrix(Q: LDPStrategy | np.ndarray) -> np.ndarray:
    matrix = Q.Q if isinstance(Q, LDPStrategy) else np.asarray(Q, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] < 1 or matrix.shape[1] < 1:
        raise ValueError(f"Q (shape {matrix.shape}) must be a non-empty 2-D matrix")
    if not np.all(np.isfinite(matrix)) or np.any(matrix < 0.0):
        raise ValueError("Q must contain only finite, non-negative values")
    if np.any(matrix.sum(axis=1) <= 0.0):
        raise ValueError("every row of Q must have a positive sum (remove unused outputs)")
    return matrix


def _workload_matrix(W: np.ndarray, num_columns: int | None = None) -> np.ndarray:
    workload = np.asarray(W, dtype=np.float64)
    if workload.ndim != 2 or workload.shape[0] < 1 or workload.shape[1] < 1:
        raise ValueError(f"W (shape {workload.shape}) must be a non-empty 2-D matrix")
    if not np.all(np.isfinite(workload)):
        raise ValueError("W must contain only finite values")
    if num_columns is not None and workload.shape[1] != num_columns:
        raise ValueError(
            f"W has {workload.shape[1]} columns but Q has {num_columns}; both must equal n"
        )
    return workload


@dataclass(frozen=True)
class _GlsFactors:
    """``A = D^-1 Q`` and the pseudo-inverse of ``X = Q^T D^-1 Q`` with its range projector."""

    scaled: np.ndarray  # A (m x n)
    gram_pinv: np.ndarray  # X^+ (n x n)
    range_projector: np.ndarray  # X^+ X (n x n)


def _gls_factors(matrix: np.ndarray) -> _GlsFactors:
    scaled = matrix / matrix.sum(axis=1, keepdims=True)
    gram = matrix.T @ scaled  # O(m n^2)
    gram = (gram + gram.T) / 2.0
    eigenvalues, eigenvectors = np.linalg.eigh(gram)  # O(n^3)
    cutoff = eigenvalues.max() * _PINV_RTOL_ULPS * gram.shape[0] * np.finfo(np.float64).eps
    keep = eigenvalues > cutoff
    basis = eigenvectors[:, keep]
    return _GlsFactors(
        scaled=scaled,
        gram_pinv=(basis / eigenvalues[keep]) @ basis.T,
        range_projector=basis @ basis.T,
    )


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

    References
    ----------
    [McKenna20] Theorem 3.10.
    """
    matrix = _strategy_matrix(Q)
    workload = _workload_matrix(W, matrix.shape[1])
    factors = _gls_factors(matrix)
    _check_row_space(workload.T @ workload, factors.range_projector)
    return (workload @ factors.gram_pinv) @ factors.scaled.T


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


@single_threaded_blas()
def per_type_variance(
    W: np.ndarray, Q: LDPStrategy | np.ndarray, V: np.ndarray | None = None
) -> np.ndarray:
    """Per-user variance ``σ²_u = Σ_i v_i^T Diag(q_u) v_i - (v_i^T q_u)^2`` for every item ``u``.

    The total squared error of ``V y`` on data ``x`` is ``σ² · x`` (Thm 3.4).  ``V=None`` uses the
    reconstruction of Thm 3.10 without forming it: with ``B = D^-1 Q X^+`` and ``G = W^T W``,
    ``σ²_u = [diag(B G B^T)^T Q]_u - G_uu``, cost ``O(m n^2 + n^3 + p n^2)``.  A given ``V`` must
    satisfy ``V Q = W``; then the cost is ``O(p m n)``.

    References
    ----------
    [McKenna20] Theorem 3.4, Corollaries 3.5 and 3.6.
    """
    matrix = _strategy_matrix(Q)
    workload = _workload_matrix(W, matrix.shape[1])
    if V is not None:
        reconstruction_matrix = _check_factorization(workload, matrix, V)
        return (reconstruction_matrix**2).sum(axis=0) @ matrix - (workload**2).sum(axis=0)
    workload_gram = workload.T @ workload  # O(p n^2)
    factors = _gls_factors(matrix)
    _check_row_space(workload_gram, factors.range_projector)
    return _per_type_variance_from_gram(workload_gram, matrix, factors)


def _per_type_variance_from_gram(
    workload_gram: np.ndarray, matrix: np.ndarray, factors: _GlsFactors
) -> np.ndarray:
    weights = factors.scaled @ factors.gram_pinv  # B (m x n), O(m n^2)
    squared_column_norms = np.einsum("ij,ij->i", weights @ workload_gram, weights)  # O(m n^2)
    return squared_column_norms @ matrix - np.diag(workload_gram)


def worst_case_variance(
    W: np.ndarray, Q: LDPStrategy | np.ndarray, V: np.ndarray | None = None
) -> float:
    """Worst-case total variance per user, ``L_worst / N = max_u σ²_u`` (Cor 3.5).

    Attained when all ``N`` users hold the worst item.  ``V=None`` uses Thm 3.10's reconstruction
    (what a release uses); ``V = W @ pinv(Q)`` gives the authors' README figures.

    References
    ----------
    [McKenna20] Corollary 3.5.
    """
    return float(per_type_variance(W, Q, V).max())


def average_case_variance(
    W: np.ndarray, Q: LDPStrategy | np.ndarray, V: np.ndarray | None = None
) -> float:
    """Average-case total variance per user, ``L_avg / N = mean_u σ²_u`` (Cor 3.6, ``x = N/n``).

    References
    ----------
    [McKenna20] Corollary 3.6, Theorem 3.9.
    """
    return float(per_type_variance(W, Q, V).mean())


@single_threaded_blas()
def query_worst_case_variance(
    W: np.ndarray, Q: LDPStrategy | np.ndarray, V: np.ndarray | None = None
) -> np.ndarray:
    """Per-query worst-case variance per user: ``max_u Σ_o V_io² Q_ou - W_iu²`` for each query ``i``.

    Data independent, so it may be published next to the answers (multiply by ``N``).
    Cost ``O(p m n)``: it forms ``V`` (Thm 3.10 when ``V=None``).

    References
    ----------
    [McKenna20] Theorem 3.4 (one row of ``V``).
    """
    matrix = _strategy_matrix(Q)
    workload = _workload_matrix(W, matrix.shape[1])
    if V is None:
        reconstruction_matrix = reconstruction(workload, matrix)
    else:
        reconstruction_matrix = _check_factorization(workload, matrix, V)
    return ((reconstruction_matrix**2) @ matrix - workload**2).max(axis=1)


@single_threaded_blas()
def lower_bound(W: np.ndarray, *, epsilon: float) -> float:
    """Lower bound on the worst-case variance per user of every ε-LDP factorization mechanism.

    ``L_worst / N >= (λ_1 + ... + λ_n)^2 / (n e^ε) - ||W||_F^2 / n`` with ``λ`` the singular
    values of ``W``.  It can be negative (vacuous) at large ε.

    References
    ----------
    [McKenna20] Theorem 5.6, Corollary 5.7.
    """
    workload = _workload_matrix(W)
    epsilon = check_epsilon(epsilon)
    n = workload.shape[1]
    singular_values = np.linalg.svd(workload, compute_uv=False)  # O(p n^2)
    return float(singular_values.sum() ** 2 / (n * math.exp(epsilon)) - np.sum(workload**2) / n)


# --------------------------------------------------------------------------------------------
# Strategy optimisation (Problem 3.12)
# --------------------------------------------------------------------------------------------

# SPG phase: non-monotone Armijo over the last few objective values (Birgin, Martinez, Raydan).
_SPG_MEMORY = 10
_ARMIJO_FRACTION = 1e-4
# Largest step, in units of (widest row window) / max |gradient|; beyond it every coordinate clips.
_MAX_STEP_WIDTHS = 1e3
# Paper-step phase: z moves by this fraction of Algorithm 2's beta / (n e^eps).  Chosen at
# n = 128 (worst case per user; benchmarks/ldp_bench.py): the paper's fraction 1 and 0.1 end
# clearly worse on Prefix eps=1 and All Range eps=4, and 0.01 matches or beats 0.03 and 0.1 on
# six workload/eps pairs.
_BOUND_STEP_FRACTION = 0.01
_STEP_GROWTH = 1.25
# A phase ends when the objective fell by less than `tolerance` (relative) over this many steps.
_PROGRESS_WINDOW = 50
# Projection root finding: stop when every column sums to 1 within m * this (the rounding of a sum
# of m terms), or after this many steps (bisection alone resolves a double in ~1100 halvings).
_PROJECTION_SUM_ULPS = 2.0**-52
_PROJECTION_MAX_STEPS = 200


def _project_columns(points: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Euclidean projection of every column of ``points`` onto ``{q : 1^T q = 1, lower <= q <= upper}``.

    The projection is ``clip(r + λ, lower, upper)`` where ``λ`` solves ``f(λ) = 1`` for the
    piecewise-linear, non-decreasing ``f(λ) = Σ_o clip(r_o + λ, lower_o, upper_o)`` (§4.1 of
    [McKenna20]; its Algorithm 1 finds the same ``λ`` by sorting the ``2m`` breakpoints).  Here
    ``λ`` is found by Newton steps on ``f`` (slope = number of free coordinates) inside a bracket
    ``f(a) <= 1 <= f(b)``, bisecting whenever a Newton step leaves it: a Newton step from a point
    on the root's linear piece lands on the root, so few steps are needed and the result is exact
    up to rounding.  Needs ``Σ lower <= 1 <= Σ upper``.  Cost ``O(n m)`` per step, on the columns
    not yet resolved.
    """
    shifted = np.ascontiguousarray(points.T)  # n x m: one projected column per row
    num_rows = shifted.shape[1]
    bracket_low = (lower - shifted).min(axis=1)  # f = Σ lower <= 1
    bracket_high = (upper - shifted).max(axis=1)  # f = Σ upper >= 1
    shift = np.clip((1.0 - shifted.sum(axis=1)) / num_rows, bracket_low, bracket_high)
    active = np.arange(shifted.shape[0])
    for _ in range(_PROJECTION_MAX_STEPS):
        moved = shifted[active] + shift[active, None]  # O(|active| m)
        excess = np.clip(moved, lower, upper).sum(axis=1) - 1.0
        unresolved = np.abs(excess) > num_rows * _PROJECTION_SUM_ULPS
        active, moved, excess = active[unresolved], moved[unresolved], excess[unresolved]
        if active.size == 0:
            break
        num_free = ((moved > lower) & (moved < upper)).sum(axis=1)
        current = shift[active]
        low = np.where(excess < 0, current, bracket_low[active])
        high = np.where(excess > 0, current, bracket_high[active])
        bracket_low[active], bracket_high[active] = low, high
        newton = current - excess / np.maximum(num_free, 1)
        inside = (num_free > 0) & (newton > low) & (newton < high)
        shift[active] = np.where(inside, newton, (low + high) / 2.0)
    projected = np.clip(shifted + shift[:, None], lower, upper)
    # One Newton step on the free coordinates removes the remaining rounding of the sums.
    free = (projected > lower) & (projected < upper)
    correction = (1.0 - projected.sum(axis=1)) / np.maximum(free.sum(axis=1), 1)
    projected = np.clip(projected + free * correction[:, None], lower, upper)
    return projected.T


@dataclass(frozen=True)
class _Evaluation:
    """Objective ``L(Q) = tr(X^-1 G)`` at one iterate, with what its gradient reuses."""

    value: float
    scaled: np.ndarray  # A = D^-1 Q
    cholesky: tuple[np.ndarray, bool]
    solved: np.ndarray  # X^-1 G


def _evaluate(matrix: np.ndarray, workload_gram: np.ndarray) -> _Evaluation | None:
    """``L(Q)``, or ``None`` when ``X = Q^T D^-1 Q`` is not numerically positive definite."""
    row_sums = matrix.sum(axis=1)
    if np.any(row_sums <= 0.0):
        return None
    scaled = matrix / row_sums[:, None]
    gram = matrix.T @ scaled  # O(m n^2)
    try:
        cholesky = scipy.linalg.cho_factor(gram, lower=True, check_finite=False)  # O(n^3)
    except np.linalg.LinAlgError:
        return None
    solved = scipy.linalg.cho_solve(cholesky, workload_gram, check_finite=False)  # O(n^3)
    value = float(np.trace(solved))
    if not math.isfinite(value) or value <= 0.0:
        return None
    return _Evaluation(value=value, scaled=scaled, cholesky=cholesky, solved=solved)


def _gradient(evaluation: _Evaluation) -> np.ndarray:
    """``∇_Q L = -2 A M + rowsum((A M) ∘ A) 1^T`` with ``M = X^-1 G X^-1``.  Cost ``O(m n^2 + n^3)``."""
    middle = scipy.linalg.cho_solve(evaluation.cholesky, evaluation.solved.T, check_finite=False)
    middle = (middle + middle.T) / 2.0
    scaled_middle = evaluation.scaled @ middle  # O(m n^2)
    row_terms = np.einsum("ij,ij->i", scaled_middle, evaluation.scaled)
    return -2.0 * scaled_middle + row_terms[:, None]


def _centered_gradient(evaluation: _Evaluation) -> np.ndarray:
    """The gradient minus its column means: the same projected steps (columns keep summing to 1),
    smaller shifts for the projection to resolve."""
    gradient = _gradient(evaluation)
    return gradient - gradient.mean(axis=0, keepdims=True)


def _lower_bound_gradient(
    gradient: np.ndarray,
    matrix: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    exp_epsilon: float,
) -> np.ndarray:
    """Chain rule of ``z -> L(Π_z(R))`` at ``Π_z(R) = matrix``, for the row lower bounds ``z``.

    For column ``u`` with free set ``F``, lower-bound set ``Lo`` and upper-bound set ``Up``,
    ``dλ_u/dz_o = -(1[o ∈ Lo] + e^ε 1[o ∈ Up]) / |F|``, so
    ``∂L/∂z_o = Σ_u (1[o ∈ Lo] + e^ε 1[o ∈ Up]) (g_ou - mean_F g_·u)``.  Cost ``O(m n)``.
    """
    at_lower = matrix == lower[:, None]
    at_upper = matrix == upper[:, None]
    free = ~(at_lower | at_upper)
    num_free = free.sum(axis=0)
    free_mean = np.where(num_free > 0, (gradient * free).sum(axis=0) / np.maximum(num_free, 1), 0)
    sensitivity = at_lower + exp_epsilon * at_upper
    return (sensitivity * (gradient - free_mean[None, :])).sum(axis=1)


def _made_progress(history: list[float], tolerance: float) -> bool:
    if len(history) <= _PROGRESS_WINDOW:
        return True
    return history[-1 - _PROGRESS_WINDOW] - history[-1] >= tolerance * history[-1]


@dataclass
class _Iterate:
    """Mutable optimiser state: ``Q``, its row bounds ``z <= Q[o, :] <= e^ε z`` and ``L(Q)``."""

    matrix: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    evaluation: _Evaluation
    gradient: np.ndarray  # centred ∇_Q L


def _spectral_projected_gradient(
    state: _Iterate,
    workload_gram: np.ndarray,
    *,
    max_steps: int,
    tolerance: float,
    limit: WorkLimit | None = None,
    progress: Progress | None = None,
) -> tuple[_Iterate, int]:
    """Phase 1: projected gradient with ``z`` fixed, Barzilai-Borwein step, non-monotone Armijo
    search along ``d = Π_z(Q - β ∇L) - Q`` (Birgin, Martinez, Raydan 2000).  The feasible set is a
    product of bounded simplices, so ``Q + t d`` stays feasible for ``t ∈ [0, 1]``.
    Each step costs ``O(m n^2 + n^3)`` plus a few ``O(m n)`` projection passes.  Returns the best
    iterate and the steps taken; stops early once ``limit`` has passed (checked before every
    objective evaluation).  ``progress(steps done / max_steps, message)`` after every step.
    """
    width = float(np.max(state.upper - state.lower))
    step = 0.5 / (state.matrix.shape[0] * max(float(np.abs(state.gradient).max()), 1e-300))
    history = [state.evaluation.value]
    best = state
    steps = 0
    while steps < max_steps and _made_progress(history, tolerance) and not _expired(limit):
        gradient_scale = max(float(np.abs(state.gradient).max()), 1e-300)
        step = min(step, _MAX_STEP_WIDTHS * width / gradient_scale)
        target = _project_columns(state.matrix - step * state.gradient, state.lower, state.upper)
        direction = target - state.matrix
        slope = float(np.sum(state.gradient * direction))
        if not slope < -1e-14 * state.evaluation.value:  # stationary for these bounds
            break
        reference = max(history[-_SPG_MEMORY:])
        fraction = 1.0
        trial = None
        while fraction > 1e-10 and not _expired(limit):
            candidate = state.matrix + fraction * direction
            trial = _evaluate(candidate, workload_gram)
            if trial is not None and trial.value <= reference + _ARMIJO_FRACTION * fraction * slope:
                break
            trial = None
            fraction *= 0.5
        if trial is None:
            break
        steps += 1
        new_gradient = _centered_gradient(trial)
        displacement = candidate - state.matrix
        curvature = float(np.sum(displacement * (new_gradient - state.gradient)))
        step = (
            float(np.sum(displacement**2)) / curvature
            if curvature > 0
            else _MAX_STEP_WIDTHS * width / max(float(np.abs(new_gradient).max()), 1e-300)
        )
        state = _Iterate(candidate, state.lower, state.upper, trial, new_gradient)
        history.append(trial.value)
        if trial.value < best.evaluation.value:
            best = state
        _step_report(progress, steps, max_steps, limit, "projected gradient", best)
    return best, steps


def _expired(limit: WorkLimit | None) -> bool:
    return limit is not None and limit.expired()


def _step_report(
    progress: Progress | None,
    steps: int,
    max_steps: int,
    limit: WorkLimit | None,
    phase: str,
    state: _Iterate,
) -> None:
    if progress is None:
        return
    share = steps / max(max_steps, 1)
    used = math.nan if limit is None else limit.fraction_used()
    report(
        progress,
        share if math.isnan(used) else max(share, used),
        f"LDP strategy, {phase}: step {steps} of at most {max_steps}, "
        f"objective {state.evaluation.value:.6g}",
    )


def _bound_descent(
    state: _Iterate,
    workload_gram: np.ndarray,
    *,
    epsilon: float,
    max_steps: int,
    tolerance: float,
    limit: WorkLimit | None = None,
    progress: Progress | None = None,
) -> tuple[_Iterate, int]:
    """Phase 2: Algorithm 2 of [McKenna20], ``z <- z - α ∇_z L``, ``Q <- Π_z(Q - β ∇_Q L)``, with
    ``α = 0.01 β / (n e^ε)`` and the exact chain rule for ``∇_z``.  Step search: halve ``β`` until
    the objective decreases with ``Σ z < 1 < e^ε Σ z``, then grow it by 25 %.  Rows whose ``z``
    reaches 1e-10 are removed before projecting, so columns still sum to 1.  Monotone.  Stops
    early once ``limit`` has passed (checked before every objective evaluation).
    """
    n = state.matrix.shape[1]
    exp_epsilon = math.exp(epsilon)
    step = 0.5 / (state.matrix.shape[0] * max(float(np.abs(state.gradient).max()), 1e-300))
    history = [state.evaluation.value]
    steps = 0
    while steps < max_steps and _made_progress(history, tolerance) and not _expired(limit):
        bound_gradient = _lower_bound_gradient(
            state.gradient, state.matrix, state.lower, state.upper, exp_epsilon
        )
        accepted = None
        gradient_scale = float(np.abs(state.gradient).max())
        while step * gradient_scale > 1e-12 * float(state.matrix.max()) and not _expired(limit):
            bound_step = _BOUND_STEP_FRACTION * step / (n * exp_epsilon)
            lower = np.maximum(state.lower - bound_step * bound_gradient, 0.0)
            keep = lower > _PRUNE_PROBABILITY
            lower = lower[keep]
            lower_total = math.fsum(lower.tolist())
            if lower.size >= n and lower_total < 1.0 and exp_epsilon * lower_total > 1.0:
                upper = _upper_bounds(lower, epsilon)
                candidate = _project_columns(
                    state.matrix[keep] - step * state.gradient[keep], lower, upper
                )
                trial = _evaluate(candidate, workload_gram)
                if trial is not None and trial.value < state.evaluation.value:
                    accepted = _Iterate(candidate, lower, upper, trial, _centered_gradient(trial))
                    step *= _STEP_GROWTH
                    break
            step *= 0.5
        if accepted is None:
            break
        state = accepted
        steps += 1
        history.append(state.evaluation.value)
        _step_report(progress, steps, max_steps, limit, "bound descent", state)
    return state, steps


def _upper_bounds(lower: np.ndarray, epsilon: float) -> np.ndarray:
    return math.exp(epsilon) * lower


def _random_start(
    num_rows: int, n: int, epsilon: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random start of §4: ``R ~ U[0,1]^{m x n}`` projected with ``z = (1 + e^-ε) / (2 m)``.

    This ``z`` makes a column with every entry at a bound put a fraction ``1 / (e^ε + 1)`` of its
    rows at the upper bound, the optimal subset size of subset selection.
    """
    lower = np.full(num_rows, (1.0 + math.exp(-epsilon)) / (2.0 * num_rows))
    start = rng.random((num_rows, n))
    return _project_columns(start, lower, _upper_bounds(lower, epsilon)), lower


@single_threaded_blas()
def optimize_strategy(
    W: np.ndarray,
    *,
    epsilon: float,
    rng: np.random.Generator,
    rows: int | None = None,
    iterations: int = 500,
    tolerance: float = 1e-5,
    initial: LDPStrategy | None = None,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> LDPStrategy:
    """Optimise an ε-LDP strategy for workload ``W`` (Problem 3.12 of [McKenna20]).

    Minimises the average-case objective ``L(Q) = tr[(Q^T D^-1 Q)^-1 W^T W]`` (Thm 3.11; the
    worst case is reported, Thm 5.1 bounds the gap) over ``(Q, z)`` with every column of ``Q`` in
    the bounded simplex ``{z <= q_u <= e^ε z, 1^T q_u = 1}`` (§4.1 projection).  Projected
    gradient descent with a step-size search, in two phases:

    1. ``z`` fixed at the start's bounds: spectral (Barzilai-Borwein) step, non-monotone
       backtracking along the projected-gradient direction, until stationary;
    2. Algorithm 2: ``z`` and ``Q`` move together, ``z`` by the exact chain rule through the
       projection with step ``0.01 β / (n e^ε)`` (the paper's step times 0.01); backtracking on
       ``β`` keeps it monotone; rows whose ``z`` reaches 1e-10 are removed.

    The start's ``z`` puts a fraction ``1 / (e^ε + 1)`` of each column's mass at the upper bound
    when every entry sits at a bound (the optimal subset size of subset selection); phase 1 gets
    most of the gain at ε = 1 in few, cheap steps, and phase 2 matters at large ε
    (``benchmarks/ldp_bench.py --n 128 --ablation`` measures each phase alone).  Each step costs
    ``O(m n^2 + n^3)`` plus a few ``O(m n)`` projection passes.

    Parameters
    ----------
    W:
        ``p x n`` workload; only ``W^T W`` is used.
    epsilon:
        Privacy parameter of the strategy.
    rng:
        Public randomness for the random start (``rows x n`` uniform, then projected).  The
        strategy is data independent, so the seed may be recorded to reproduce it.
    rows:
        Number of outputs ``m`` of the random start (default ``4 n``); phase 2 may prune rows.
    iterations:
        Maximum number of gradient steps over both phases.  Step cost and the gain from more
        steps: ``benchmarks/ldp_bench.py --iterations``.
    tolerance:
        A phase stops when the objective fell by less than this fraction over 50 steps.
    initial:
        Optional start strategy (for example a baseline) instead of the random start; it must
        have ``n`` columns and the same ε; its row minima are the start's ``z``.
    time_limit:
        Seconds; checked before every objective evaluation (one ``O(m n^2 + n^3)`` step).  Once
        it has passed, the best iterate so far (every iterate is a valid strategy) is returned
        with ``details["stopped_early"]`` True.  ``None``: no limit.
    progress:
        ``progress(fraction, message)`` after every step: steps done of ``iterations`` (or the
        share of the time limit used, if larger).

    Returns
    -------
    LDPStrategy
        Named ``"optimized"``, validated ε-LDP, with ``details``: ``objective`` (the average-case
        ``L(Q)`` of the optimised iterate; the returned matrix differs by at most one ulp per
        entry), ``steps`` and ``stopped_early``.

    Privacy
    -------
    Uses no data: the output is public, and ε-LDP by the exact checks of :class:`LDPStrategy`.

    References
    ----------
    [McKenna20] §3.2 (Problem 3.12), §4 (Algorithms 1 and 2, random start, m = 4n); Birgin,
    Martinez, Raydan, "Nonmonotone spectral projected gradient methods on convex sets", SIAM J.
    Optim. 10(4), 2000.
    """
    limit = WorkLimit(time_limit=time_limit)
    workload = _workload_matrix(W)
    epsilon = check_epsilon(epsilon)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng ({type(rng).__name__}) must be a numpy.random.Generator")
    n = workload.shape[1]
    if n < 2:
        raise ValueError(f"W has n = {n} columns; the domain must have at least 2 items")
    num_rows = 4 * n if rows is None else _check_domain_size(rows, name="rows")
    if num_rows < n:
        raise ValueError(f"rows ({num_rows}) must be >= n ({n}) for Q to have full column rank")
    iterations = _check_domain_size(iterations, name="iterations", minimum=0)
    if not (isinstance(tolerance, (int, float)) and 0.0 <= tolerance < 1.0):
        raise ValueError(f"tolerance ({tolerance!r}) must be in [0, 1)")
    workload_gram = workload.T @ workload  # O(p n^2)

    if initial is None:
        matrix, lower = _random_start(num_rows, n, epsilon, rng)
    else:
        if not isinstance(initial, LDPStrategy) or initial.domain_size != n:
            raise ValueError(f"initial must be an LDPStrategy on n = {n} items")
        if initial.epsilon != epsilon:
            raise ValueError(f"initial.epsilon ({initial.epsilon}) must equal epsilon ({epsilon})")
        matrix = np.array(initial.Q)
        lower = matrix.min(axis=1)
    upper = np.maximum(_upper_bounds(lower, epsilon), matrix.max(axis=1))
    evaluation = _evaluate(matrix, workload_gram)
    if evaluation is None:
        raise ValueError("the start strategy does not have full column rank (Q^T D^-1 Q singular)")
    state = _Iterate(matrix, lower, upper, evaluation, _centered_gradient(evaluation))
    state, spent = _spectral_projected_gradient(
        state,
        workload_gram,
        max_steps=iterations,
        tolerance=tolerance,
        limit=limit,
        progress=progress,
    )
    state, more = _bound_descent(
        state,
        workload_gram,
        epsilon=epsilon,
        max_steps=iterations - spent,
        tolerance=tolerance,
        limit=limit,
        progress=progress,
    )
    stopped = limit.expired()
    matrix = _enforce_row_ratio(state.matrix, epsilon)
    details = {
        "objective": state.evaluation.value,  # the matrix differs by at most one ulp per entry
        "steps": spent + more,
        "stopped_early": stopped,
    }
    report(
        progress, 1.0, f"LDP strategy: {spent + more} steps, objective {details['objective']:.6g}"
    )
    return LDPStrategy(name="optimized", Q=matrix, epsilon=epsilon, details=details)


# --------------------------------------------------------------------------------------------
# Protocol: client randomisation and server estimation
# --------------------------------------------------------------------------------------------


def randomize(items: np.ndarray, strategy: LDPStrategy, *, rng: np.random.Generator) -> np.ndarray:
    """Client side: turn each true item index into a response index sampled from ``Q[:, item]``.

    Sampling is exact integer inverse-CDF sampling: column ``u`` becomes the integer weights
    ``k = round(2^60 Q[:, u])``, each user draws an exactly uniform integer below ``Σ_o k_o``
    (``rng.integers``) and reports the first output whose cumulative weight exceeds it, so output
    ``o`` has probability exactly ``k_o / Σ k``.  Returns an int64 array of response indices, one
    per item.  Cost ``O(m n + N log N)``.

    Privacy
    -------
    This is the ε-LDP step, and it runs on the user's device: only the returned response may
    leave it.  ``rng`` is privacy-critical here.  On a real device it must be a fresh Generator
    seeded from OS entropy (``numpy.random.default_rng()`` with no seed, or one backed by
    ``secrets``/``os.urandom``), never a fixed, shared or logged seed: whoever knows the seed can
    invert the response.  Seeded generators are for simulation and tests only.  The realised
    probabilities ``k_o / Σ k`` differ from ``Q[o, u]`` by at most ``2^-61`` plus the column-sum
    rounding, so the realised privacy loss exceeds ε by at most about
    ``2^-60 / min Q + 2 COLUMN_SUM_TOLERANCE`` (below 1e-11 for the strategies built here).
    Entries below ``2^-61`` cannot be sampled faithfully and raise ``ValueError``.

    References
    ----------
    [McKenna20] §2 (M_Q(u) samples o ~ q_u).
    """
    if not isinstance(strategy, LDPStrategy):
        raise ValueError(f"strategy ({type(strategy).__name__}) must be an LDPStrategy")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng ({type(rng).__name__}) must be a numpy.random.Generator")
    item_array = np.asarray(items)
    if item_array.ndim != 1:
        raise ValueError(f"items (shape {item_array.shape}) must be a 1-D array")
    if item_array.size and not np.issubdtype(item_array.dtype, np.integer):
        raise ValueError(f"items (dtype {item_array.dtype}) must be integer item indices")
    item_array = item_array.astype(np.int64)
    n = strategy.domain_size
    if item_array.size and (item_array.min() < 0 or item_array.max() >= n):
        raise ValueError(f"items must lie in [0, {n}) (got {item_array.min()}..{item_array.max()})")
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


def count_responses(responses: np.ndarray, strategy: LDPStrategy) -> np.ndarray:
    """Server side: the response vector ``y`` (``y_o`` = number of users who sent ``o``)."""
    if not isinstance(strategy, LDPStrategy):
        raise ValueError(f"strategy ({type(strategy).__name__}) must be an LDPStrategy")
    response_array = np.asarray(responses)
    if response_array.ndim != 1:
        raise ValueError(f"responses (shape {response_array.shape}) must be a 1-D array")
    if response_array.size and not np.issubdtype(response_array.dtype, np.integer):
        raise ValueError(f"responses (dtype {response_array.dtype}) must be integer indices")
    m = strategy.num_outputs
    if response_array.size and (response_array.min() < 0 or response_array.max() >= m):
        raise ValueError(
            f"responses must lie in [0, {m}) (got {response_array.min()}..{response_array.max()})"
        )
    return np.bincount(response_array.astype(np.int64), minlength=m).astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class LDPEstimate:
    """Workload answers estimated from LDP responses.

    Attributes
    ----------
    answers:
        ``V y``, unbiased for ``W x`` (counts, not fractions).
    variance:
        Per-query variance estimate ``N/(N-1) · [(V∘V) y - (V y)^2 / N]`` (the sample variance of the
        users' contributions ``V[i, o_j]`` times ``N``).  Its expectation is the true variance plus
        ``N^2/(N-1) · Var_{u ~ x/N}(W_iu) >= 0``: conservative, and close when the variance per user
        dominates ``W_iu^2`` (the LDP regime).
    num_responses:
        ``N``, the number of responses counted.
    """

    answers: np.ndarray
    variance: np.ndarray
    num_responses: int


def estimate(response_counts: np.ndarray, V: np.ndarray) -> LDPEstimate:
    """Server side: answers ``V y`` with a per-query variance estimate from ``y`` alone.

    ``V`` is the reconstruction (``V Q = W``), normally :func:`reconstruction`'s.  Pure
    post-processing of the ε-LDP responses.  Cost ``O(p m)``.

    References
    ----------
    [McKenna20] Def 3.2 (M_{V,Q}(x) = V M_Q(x)), Thm 3.4.
    """
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


# --------------------------------------------------------------------------------------------
# Cost prediction (from sizes only)
# --------------------------------------------------------------------------------------------

# Seconds per optimiser step (one BLAS thread): 1.0e-3 + 1.28e-7·m·n + 3.2e-10·(m·n² + n³),
# a relative least-squares fit to the process time per step of optimize_strategy on prefix and
# identity workloads, ε = 1 and 4, n = 32…256, m = 4n (within 0.6-1.25× of every point), by
#   .venv/bin/python benchmarks/predict_bench.py --calibrate ldp
# Steps taken: 85-228 (n = 32), 78-358 (64), 91-500 (128), 23-500 (256) of the 500 allowed;
# modelled as 100 + 2n, capped by `iterations`.
_STEP_COEFFICIENTS = (1.0e-3, 1.28e-7, 3.2e-10)


def predict_seconds(n: int, *, rows: int | None = None, iterations: int = 500) -> float:
    """Predicted seconds of :func:`optimize_strategy` on an n-item domain, from sizes only.

    ``rows`` as in :func:`optimize_strategy` (default 4n).  ``min(iterations, 100 + 2n)`` steps
    of ``O(m n² + n³)`` each, calibrated on this machine (one BLAS thread).  O(1).
    """
    n = _check_domain_size(n)
    num_rows = 4 * n if rows is None else _check_domain_size(rows, name="rows")
    steps = min(_check_domain_size(iterations, name="iterations", minimum=0), 100 + 2 * n)
    fixed, per_entry, per_flop = _STEP_COEFFICIENTS
    per_step = fixed + per_entry * num_rows * n + per_flop * (num_rows * n * n + n**3)
    return steps * per_step
