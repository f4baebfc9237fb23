"""Baseline ε-LDP strategies: randomized response, RAPPOR, Hadamard, hierarchical and Fourier.

Each returns a validated :class:`~mechanisms.local.randomizer.LDPStrategy`; the local mechanism
reports their variances next to the optimised strategy's.

[McKenna20]: see :mod:`mechanisms.local`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from dprelease.mechanisms.local.randomizer import LDPStrategy, check_size, enforce_row_ratio
from dprelease.mechanisms.primitives.privacy import check_epsilon

# Largest domain RAPPOR may enumerate (2^n outputs).
RAPPOR_MAX_DOMAIN = 16


def _strategy(name: str, matrix: np.ndarray, epsilon: float) -> LDPStrategy:
    """The validated strategy, entries at the ratio bound lowered by one ulp (exact check)."""
    return LDPStrategy(name=name, Q=enforce_row_ratio(matrix, epsilon), epsilon=epsilon)


def randomized_response(n: int, *, epsilon: float) -> LDPStrategy:
    """Randomized response on ``n`` items: report the true item w.p. ∝ e^ε, any other ∝ 1.

    ``Q = ((e^ε - 1) I + 1 1^T) / (e^ε + n - 1)`` (``n x n``).

    Privacy: ε-LDP: every row holds one entry ∝ e^ε and the rest ∝ 1.

    References: [McKenna20] Example 2.7; Warner 1965."""
    n = check_size(n, minimum=2)
    epsilon = check_epsilon(epsilon)
    exp_epsilon = math.exp(epsilon)
    matrix = np.full((n, n), 1.0 / (exp_epsilon + n - 1.0))
    np.fill_diagonal(matrix, exp_epsilon / (exp_epsilon + n - 1.0))
    return _strategy("randomized_response", matrix, epsilon)


def rappor(n: int, *, epsilon: float) -> LDPStrategy:
    """Basic (one-time) RAPPOR: the one-hot encoding of the item with every bit flipped w.p.
    ``1 / (1 + e^{ε/2})``.

    Output ``o`` is the bit vector with binary expansion ``o`` (bit ``u`` = item ``u``), so the
    strategy has ``2^n`` rows; ``n`` is limited to 16.

    Privacy: ε-LDP: two one-hot vectors differ in two bits, each costing ε/2.

    References: [McKenna20] Table 1; Erlingsson, Pihur, Korolova, CCS 2014."""
    n = check_size(n, minimum=2)
    if n > RAPPOR_MAX_DOMAIN:
        raise ValueError(f"n ({n}) must be <= {RAPPOR_MAX_DOMAIN} for RAPPOR (2^n outputs)")
    epsilon = check_epsilon(epsilon)
    keep = math.exp(epsilon / 2.0) / (1.0 + math.exp(epsilon / 2.0))
    outputs = np.arange(2**n, dtype=np.int64)
    bits = (outputs[:, None] >> np.arange(n)) & 1  # O(2^n n)
    ones_per_output = bits.sum(axis=1)
    # Hamming distance to e_u: bits set elsewhere, plus bit u if it is clear.
    distance = ones_per_output[:, None] - bits + (1 - bits)
    matrix = keep ** (n - distance) * (1.0 - keep) ** distance
    return _strategy("rappor", matrix, epsilon)


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

    Privacy: ε-LDP: every entry is ∝ e^ε or ∝ 1 with the same normaliser for every item.

    References:
    [McKenna20] Table 1; Acharya, Sun, Zhang, "Hadamard response", AISTATS 2019 (general regime)."""
    n = check_size(n, minimum=2)
    epsilon = check_epsilon(epsilon)
    exp_epsilon = math.exp(epsilon)
    if blocks is None:  # the largest power of two strictly below min(e^ε, 2n)
        blocks = 1
        while 2 * blocks < min(exp_epsilon, 2.0 * n):
            blocks *= 2
    blocks = check_size(blocks, name="blocks")
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
    return _strategy(f"hadamard(blocks={blocks})", matrix, epsilon)


FrequencyOracle = Callable[..., LDPStrategy]
"""``oracle(n, *, epsilon)``: an ε-LDP strategy on ``n`` items, run on each level of
:func:`hierarchical`."""


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

    Privacy:
    ε-LDP: a uniform mixture over levels, with each level's oracle ε-LDP on the cells, is ε-LDP.

    References:
    [McKenna20] §6.1 (Hierarchical [13, 39]); Cormode, Kulkarni, Srivastava, PVLDB 2019; Wang et
    al., SIGMOD 2019.  Branching 4 with the Hadamard oracle as in the authors' code.
    """
    n = check_size(n, minimum=2)
    epsilon = check_epsilon(epsilon)
    branching = check_size(branching, name="branching", minimum=2)
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
    return _strategy(f"hierarchical(branching={branching}, oracle={oracle_name})", matrix, epsilon)


def fourier(d: int, *, epsilon: float, order: int | None = None) -> LDPStrategy:
    """Fourier mechanism for marginals on the binary domain ``{0, 1}^d`` (``n = 2^d`` items).

    The coefficient set ``T`` is every attribute subset with at most ``order`` attributes
    (default ``d``), the empty set included.  A user picks ``t ∈ T`` uniformly and reports the
    character ``χ_t(u) = (-1)^{popcount(t & u)}`` through binary randomized response (kept w.p.
    ``e^ε / (1 + e^ε)``).  Row ``2 i`` is "``t_i``, +1", row ``2 i + 1`` is "``t_i``, -1"; subsets are
    ordered by size, then lexicographically by attribute indices.  Item ``u``'s bit ``a`` is
    attribute ``a``.  With ``order < d`` the strategy only supports workloads that depend on
    marginals of at most ``order`` attributes.

    Privacy: ε-LDP: binary randomized response on a public, data-independent choice of ``t``.

    References: [McKenna20] §6.1 (Fourier [12]); Cormode, Kulkarni, Srivastava, SIGMOD 2018."""
    d = check_size(d, name="d")
    epsilon = check_epsilon(epsilon)
    order = d if order is None else check_size(order, name="order")
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
    return _strategy(f"fourier(order={order})", matrix, epsilon)


def baseline_strategies(
    shape: tuple[int, ...], ordered: tuple[bool, ...], *, epsilon: float
) -> dict[str, LDPStrategy]:
    """The baselines that apply to a domain.

    randomized_response and hadamard always; hierarchical (branching 4, Hadamard oracle) for one
    ordered attribute; rappor for at most 16 cells; fourier when every attribute is binary.
    """
    n = math.prod(shape)
    found = {
        "randomized_response": randomized_response(n, epsilon=epsilon),
        "hadamard": hadamard(n, epsilon=epsilon),
    }
    if len(shape) == 1 and ordered[0]:
        found["hierarchical"] = hierarchical(n, epsilon=epsilon)
    if n <= RAPPOR_MAX_DOMAIN:
        found["rappor"] = rappor(n, epsilon=epsilon)
    if all(size == 2 for size in shape):
        found["fourier"] = fourier(len(shape), epsilon=epsilon)
    return found
