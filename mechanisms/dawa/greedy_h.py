"""DAWA's Step 2 (Li thesis §6.4): GreedyH budget fractions over a tree of buckets, least squares.

The tree ``A = diag(f)·Y`` is measured with one Laplace scale (:class:`HierarchicalStrategy`), so
ordinary least squares on ``A`` is the weighted least squares of Program 6.4.1.

GreedyH never forms a dense matrix: every quantity in eq. (6.11) is a vector recursion (the
Sherman–Morrison update of ``M_q⁻¹𝟏``) plus per-node squared norms of the reduced workload, so
allocation costs O((pieces + k) log k) instead of the thesis's O(mk log k + k²), and least squares
applies ``M⁻¹`` in O(k log k).  A level's leftover single node is carried up unchanged instead of
getting a duplicate parent.  λ is searched on a 100-point grid over [0, 0.99] and refined by golden
section."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from dprelease.mechanisms.dawa.partition import IntervalWorkload, Partition, _one_per
from dprelease.mechanisms.primitives.linalg import read_only

# GreedyH's search range for λ (λ = 1 would give the subtree no budget and make M singular).
_LAMBDA_MAX = 0.99
_LAMBDA_GRID = np.linspace(0.0, _LAMBDA_MAX, 100)
_LAMBDA_GRID_STEP = _LAMBDA_MAX / 99
_GOLDEN_ITERATIONS = 40
_LAMBDA_CHUNK = 1 << 15
_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0
# Levels with at most this many queried nodes run the golden section on Python floats: a step
# then costs a few float operations per node instead of a dozen array calls for the level.
_GOLDEN_PER_NODE_MAX_NODES = 32


class _BucketPieces:
    """The workload rewritten over buckets, ``Ŵ = W·E`` (Prop. 6.2), kept as pieces.

    Piece ``p`` of row ``r`` contributes ``w_first`` at bucket ``first``, ``w_mid`` at every bucket
    strictly between ``first`` and ``last``, and ``w_last`` at ``last`` (when ``last > first``).
    """

    def __init__(self, workload: IntervalWorkload, partition: Partition) -> None:
        bucket = partition.bucket_of_cell()
        starts, sizes = partition.starts, partition.sizes
        ends = partition.boundaries[1:]
        self.row = workload.row
        self.first = bucket[workload.lo]
        self.last = bucket[workload.hi]
        weight = workload.weight
        first_cover = np.minimum(workload.hi + 1, ends[self.first]) - workload.lo
        self.w_first = weight * first_cover / sizes[self.first]
        last_cover = workload.hi + 1 - starts[self.last]
        self.w_last = np.where(self.last > self.first, weight * last_cover / sizes[self.last], 0.0)
        self.w_mid = weight
        self.one_piece_per_row = np.unique(self.row).size == self.row.size

    def node_sq_norms(self, u: np.ndarray, bounds: np.ndarray) -> np.ndarray:
        """``‖Ŵ[:, q] u[q]‖²`` for every node ``q = [bounds[i], bounds[i+1])``.  O(pieces + k).

        A piece meets at most two nodes partially (those holding its first and last bucket);
        nodes strictly between are covered with coefficient ``w_mid`` and contribute
        ``w_mid² (Σ_q u)²``.  Pieces of one row cannot both meet such a covered node.
        """
        n_nodes = bounds.size - 1
        prefix = np.concatenate(([0.0], np.cumsum(u)))
        node_sum = prefix[bounds[1:]] - prefix[bounds[:-1]]
        node_of_bucket = np.repeat(np.arange(n_nodes), np.diff(bounds))
        first, last = self.first, self.last
        first_node, last_node = node_of_bucket[first], node_of_bucket[last]
        same = first_node == last_node
        # Part of the piece inside its first node: buckets first … first_end.
        first_end = np.where(same, last, bounds[first_node + 1] - 1)
        mid_lo = first + 1
        mid_hi = np.maximum(np.minimum(first_end, last - 1) + 1, mid_lo)
        in_first = (
            self.w_first * u[first]
            + self.w_mid * (prefix[mid_hi] - prefix[mid_lo])
            + np.where(same, self.w_last * u[last], 0.0)
        )
        split = ~same
        in_last = (
            self.w_mid[split] * (prefix[last[split]] - prefix[bounds[last_node[split]]])
            + self.w_last[split] * u[last[split]]
        )
        if self.one_piece_per_row:
            partial = np.bincount(first_node, in_first**2, minlength=n_nodes) + np.bincount(
                last_node[split], in_last**2, minlength=n_nodes
            )
        else:  # sum the pieces of one row inside one node before squaring.  O(P log P)
            key = np.concatenate(
                (
                    self.row * n_nodes + first_node,
                    self.row[split] * n_nodes + last_node[split],
                )
            )
            unique_key, inverse = np.unique(key, return_inverse=True)
            row_node_sum = np.bincount(inverse, np.concatenate((in_first, in_last)))
            partial = np.bincount(unique_key % n_nodes, row_node_sum**2, minlength=n_nodes)
        covered = np.zeros(n_nodes + 1)
        np.add.at(covered, first_node[split] + 1, self.w_mid[split] ** 2)
        np.add.at(covered, last_node[split], -(self.w_mid[split] ** 2))
        return partial + np.cumsum(covered)[:n_nodes] * node_sum**2


def _build_tree(n_leaves: int, branching: int) -> list[np.ndarray]:
    """Level bounds of the bottom-up tree (§6.4.1): every ``branching`` consecutive nodes get a
    parent; a level's leftover single node is carried up unchanged (it is not a new query)."""
    levels = [np.arange(n_leaves + 1, dtype=np.int64)]
    while levels[-1].size > 2:
        below = levels[-1]
        levels.append(np.append(below[:-1][::branching], below[-1]))
    return levels


def _first_children(levels: Sequence[np.ndarray], level: int) -> np.ndarray:
    return np.searchsorted(levels[level - 1], levels[level][:-1])


def _group_sizes(levels: Sequence[np.ndarray], level: int) -> np.ndarray:
    """Number of children of every node of ``level`` (1: a carried node, not a query)."""
    return np.diff(np.append(_first_children(levels, level), levels[level - 1].size - 1))


def _tree_depths(levels: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Depth ``l`` of every node (root 0); a carried node keeps the depth of its single child."""
    depths = [np.zeros(0)] * len(levels)
    depths[-1] = np.zeros(1)
    for level in range(len(levels) - 1, 0, -1):
        group = _group_sizes(levels, level)
        depths[level - 1] = np.repeat(depths[level] + (group >= 2), group)
    return depths


def _sherman_morrison(lam: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``c = λ²/((1−λ)² + λ²d)`` and ``g = (1 − c·d)/(1−λ)²``.

    With ``B = blkdiag(M_children⁻¹)``, ``u = B𝟏`` and ``d = 𝟏ᵀB𝟏``:
    ``M_q⁻¹ = (B − c·u uᵀ)/(1−λ)²`` (thesis §6.4.3), hence ``M_q⁻¹𝟏 = g·u``.
    """
    c = lam**2 / ((1.0 - lam) ** 2 + lam**2 * d)
    return c, (1.0 - c * d) / (1.0 - lam) ** 2


def _local_error(lam: np.ndarray, *, e: np.ndarray, mixed: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Eq. (6.11) with ``mixed = μa + (1−μ)a′`` precomputed (same operations, same order).  O(1) per λ."""
    lam_sq = lam**2
    keep_sq = (1.0 - lam) ** 2
    return (e - mixed * lam_sq / (keep_sq + lam_sq * d)) / keep_sq


def _golden_section_per_node(
    left: np.ndarray, right: np.ndarray, e: np.ndarray, mixed: np.ndarray, d: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Golden-section brackets after ``_GOLDEN_ITERATIONS`` steps, node by node on Python floats.

    Same IEEE operations in the same order as :func:`_golden_section_on_arrays` (``x·x`` is what
    ``x**2`` computes on arrays), so the same brackets; no per-step array call.
    O(nodes · iterations)."""
    inv_phi = _INV_PHI
    final_left, final_right = [], []
    for lo, hi, e_q, mixed_q, d_q in zip(
        left.tolist(), right.tolist(), e.tolist(), mixed.tolist(), d.tolist(), strict=True
    ):
        for _ in range(_GOLDEN_ITERATIONS):
            step = inv_phi * (hi - lo)
            inner_left = hi - step
            inner_right = lo + step
            lam_sq, keep = inner_left * inner_left, 1.0 - inner_left
            keep_sq = keep * keep
            error_left = (e_q - mixed_q * lam_sq / (keep_sq + lam_sq * d_q)) / keep_sq
            lam_sq, keep = inner_right * inner_right, 1.0 - inner_right
            keep_sq = keep * keep
            error_right = (e_q - mixed_q * lam_sq / (keep_sq + lam_sq * d_q)) / keep_sq
            if error_left < error_right:
                hi = inner_right
            else:
                lo = inner_left
        final_left.append(lo)
        final_right.append(hi)
    return np.array(final_left, dtype=np.float64), np.array(final_right, dtype=np.float64)


def _golden_section_on_arrays(
    left: np.ndarray, right: np.ndarray, e: np.ndarray, mixed: np.ndarray, d: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Golden-section brackets after ``_GOLDEN_ITERATIONS`` steps, all nodes at once.
    O(nodes · iterations)."""
    for _ in range(_GOLDEN_ITERATIONS):
        step = _INV_PHI * (right - left)
        inner_left = right - step
        inner_right = left + step
        go_left = _local_error(inner_left, e=e, mixed=mixed, d=d) < _local_error(
            inner_right, e=e, mixed=mixed, d=d
        )
        right = np.where(go_left, inner_right, right)
        left = np.where(go_left, left, inner_left)
    return left, right


def _minimise_local_error(
    e: np.ndarray, a: np.ndarray, a_prime: np.ndarray, d: np.ndarray, mu: np.ndarray
) -> np.ndarray:
    """λ ∈ [0, 0.99] minimising (6.11) per node: 100-point grid, then golden section.  O(nodes)."""
    lam = np.zeros(e.size)
    for chunk in range(0, e.size, _LAMBDA_CHUNK):
        part = slice(chunk, chunk + _LAMBDA_CHUNK)
        part_e, part_d, part_mu = e[part], d[part], mu[part]
        mixed = part_mu * a[part] + (1.0 - part_mu) * a_prime[part]
        on_grid = _local_error(
            _LAMBDA_GRID[None, :], e=part_e[:, None], mixed=mixed[:, None], d=part_d[:, None]
        )
        pick = np.argmin(on_grid, axis=1)  # first minimum: λ = 0 wins ties
        grid_lam = _LAMBDA_GRID[pick]
        grid_value = on_grid[np.arange(pick.size), pick]
        left = np.maximum(grid_lam - _LAMBDA_GRID_STEP, 0.0)
        right = np.minimum(grid_lam + _LAMBDA_GRID_STEP, _LAMBDA_MAX)
        golden_section = (
            _golden_section_per_node
            if pick.size <= _GOLDEN_PER_NODE_MAX_NODES
            else _golden_section_on_arrays
        )
        left, right = golden_section(left, right, part_e, mixed, part_d)
        refined = (left + right) / 2.0
        better = _local_error(refined, e=part_e, mixed=mixed, d=part_d) < grid_value
        lam[part] = np.where(better, refined, grid_lam)
    return lam


@dataclass(frozen=True, kw_only=True, eq=False)
class HierarchicalStrategy:
    """Step 2's measurement: a tree of bucket intervals with GreedyH budget fractions.

    Level 0 holds the buckets, the last level the root.  Node ``q`` keeps the fraction ``λ_q`` of
    the budget that reaches it and passes ``1 − λ_q`` down, so its budget fraction is
    ``f_q = λ_q Π_{ancestors}(1 − λ)`` (leaves keep all that reaches them) and every leaf-to-root
    path sums to 1 (eq. 6.6).  The measured matrix is ``A = diag(f)·Y`` over the rows with
    ``f_q > 0``; it is public and data-independent given the partition.

    Privacy:
    Measuring ``A·B(x)`` with Laplace scale ``Δ(A)/ε₂`` is ε₂-DP (Theorem 6.3): ``Δ(A)`` is the
    largest path sum of ``f`` (1 up to rounding).  It is the same as Laplace(1/(f_q ε₂)) per node.

    References: Li thesis §6.4.1–6.4.3, Program 6.4.1."""

    partition: Partition
    """The buckets the tree is built on."""
    level_bounds: tuple[np.ndarray, ...]
    """Node boundaries (in buckets) per level; level 0 is ``0 … k``, the last is ``[0, k]``."""
    lambdas: tuple[np.ndarray, ...]
    """λ of every node of levels 1 … top (0 for a carried node, which is not a query)."""
    error_trace: float
    """``tr(ŴᵀŴ (AᵀA)⁻¹)``: the workload's total variance per unit Laplace variance and ε₂ = 1."""
    name: str = "dawa-greedy-h"
    fractions: tuple[np.ndarray, ...] = field(init=False)
    """Budget fraction ``f_q`` of ε₂ for every node of every level (0 = not measured)."""

    def __post_init__(self) -> None:
        levels = tuple(read_only(b, np.int64) for b in self.level_bounds)
        k = self.partition.n_buckets
        if not levels or not np.array_equal(levels[0], np.arange(k + 1)):
            raise ValueError(f"level_bounds[0] must be 0 … n_buckets ({k})")
        if not np.array_equal(levels[-1], [0, k]):
            raise ValueError(f"level_bounds[-1] ({levels[-1]}) must be the root [0, {k}]")
        if len(self.lambdas) != len(levels) - 1:
            raise ValueError(
                f"lambdas has {len(self.lambdas)} levels but level_bounds has {len(levels) - 1} "
                "above the leaves"
            )
        lambdas, group_sizes = [], [np.zeros(0, dtype=np.int64)]
        for level in range(1, len(levels)):
            if not np.all(np.isin(levels[level], levels[level - 1])):
                raise ValueError(f"level_bounds[{level}] must be nested in level {level - 1}")
            lam = np.asarray(self.lambdas[level - 1], dtype=np.float64)
            if lam.shape != (levels[level].size - 1,):
                raise ValueError(
                    f"lambdas[{level - 1}] (shape {lam.shape}) must have one entry per node"
                )
            if np.any((lam < 0) | (lam >= 1)) or not np.all(np.isfinite(lam)):
                raise ValueError(f"lambdas[{level - 1}] must lie in [0, 1)")
            group_sizes.append(_group_sizes(levels, level))
            if np.any(lam[group_sizes[level] < 2] != 0):
                raise ValueError(f"lambdas[{level - 1}] must be 0 at carried (single-child) nodes")
            lambdas.append(read_only(lam))
        object.__setattr__(self, "level_bounds", levels)
        object.__setattr__(self, "lambdas", tuple(lambdas))
        # Budget fractions, top-down.  O(k)
        fractions: list[np.ndarray] = [np.zeros(0)] * len(levels)
        reaching = np.ones(1)
        for level in range(len(levels) - 1, 0, -1):
            lam = lambdas[level - 1]
            fractions[level] = read_only(lam * reaching)
            reaching = np.repeat(reaching * (1.0 - lam), group_sizes[level])
        fractions[0] = read_only(reaching)
        object.__setattr__(self, "fractions", tuple(fractions))

    @property
    def n_buckets(self) -> int:
        """Number of buckets ``k`` (tree leaves)."""
        return self.partition.n_buckets

    @property
    def num_queries(self) -> int:
        """Number of measured tree nodes (``f_q > 0``)."""
        return int(sum(np.count_nonzero(f) for f in self.fractions))

    def query_buckets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lo, hi, weight)`` of every measured query: ``weight · Σ_{lo ≤ j < hi} s_j`` (buckets),
        level by level from the leaves up, nodes left to right."""
        lo, hi, weight = [], [], []
        for bounds, fraction in zip(self.level_bounds, self.fractions, strict=True):
            asked = fraction > 0
            lo.append(bounds[:-1][asked])
            hi.append(bounds[1:][asked])
            weight.append(fraction[asked])
        return np.concatenate(lo), np.concatenate(hi), np.concatenate(weight)

    def matrix(self) -> sp.csr_array:
        """``A`` over buckets (rows as :meth:`query_buckets`), sparse.  O(k log k) non-zeros."""
        lo, hi, weight = self.query_buckets()
        lengths = hi - lo
        first = np.repeat(lo - (np.cumsum(lengths) - lengths), lengths)
        return sp.csr_array(
            (
                np.repeat(weight, lengths),
                (np.repeat(np.arange(lo.size), lengths), first + np.arange(lengths.sum())),
            ),
            shape=(lo.size, self.n_buckets),
        )

    def sensitivity(self, *, norm: int = 1) -> float:
        """Largest column norm of ``A`` over cells: L1 = max path sum of ``f`` (1), or L2."""
        if norm not in (1, 2):
            raise ValueError(f"norm ({norm}) must be 1 or 2")
        per_bucket = self.fractions[0] ** norm
        for bounds, fraction in zip(self.level_bounds[1:], self.fractions[1:], strict=True):
            per_bucket = per_bucket + np.repeat(fraction**norm, np.diff(bounds))
        return float(per_bucket.max() ** (1.0 / norm))

    def answer_buckets(self, bucket_counts: np.ndarray) -> np.ndarray:
        """``A·s``: the weighted tree answers for bucket counts ``s``.  O(k log k)."""
        counts = _one_per(bucket_counts, self.n_buckets, name="bucket_counts", per="bucket")
        prefix = np.concatenate(([0.0], np.cumsum(counts)))
        lo, hi, weight = self.query_buckets()
        return weight * (prefix[hi] - prefix[lo])

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``A·B(x)`` from the confidential cells ``x`` (the session's ``apply``).  O(n + k log k)."""
        return self.answer_buckets(self.partition.bucket_totals(x))

    def least_squares(self, noisy_answers: np.ndarray) -> np.ndarray:
        """``ŝ = (AᵀA)⁻¹ Aᵀ y``: bucket estimates from the noisy answers (post-processing).

        ``AᵀA = M_root`` is applied through the Sherman–Morrison recursion of §6.4.3 from the leaves
        up (``M_leaf = 1``), never formed.  O(k log k).
        """
        answers = _one_per(noisy_answers, self.num_queries, name="noisy_answers", per="query")
        lo, hi, weight = self.query_buckets()
        # Aᵀy: each query adds weight·y on its bucket range.  O(queries + k)
        spread = np.zeros(self.n_buckets + 1)
        np.add.at(spread, lo, weight * answers)
        np.add.at(spread, hi, -weight * answers)
        estimate = np.cumsum(spread)[:-1]
        u = np.ones(self.n_buckets)  # M_q⁻¹𝟏 of the current level's nodes, concatenated
        d = np.ones(self.n_buckets)  # 𝟏ᵀM_q⁻¹𝟏
        for level in range(1, len(self.level_bounds)):
            bounds = self.level_bounds[level]
            sizes = np.diff(bounds)
            lam = self.lambdas[level - 1]
            d_children = np.add.reduceat(d, _first_children(self.level_bounds, level))
            c, g = _sherman_morrison(lam, d_children)
            node_total = np.add.reduceat(estimate, bounds[:-1])
            estimate = (estimate - np.repeat(c * node_total, sizes) * u) / np.repeat(
                (1.0 - lam) ** 2, sizes
            )
            u = u * np.repeat(g, sizes)
            d = d_children * g
        return estimate


def greedy_h_strategy(
    workload: IntervalWorkload, partition: Partition, *, branching: int = 2
) -> HierarchicalStrategy:
    """GreedyH (Program 6.4.1 without the measurement): budget fractions for the bucket tree.

    Public and data-independent given the (already private) partition.  The tree is built bottom-up
    with ``branching`` children per node; nodes are visited level by level and each picks the
    ``λ`` minimising eq. (6.11) with ``μ = branching^{−depth/2}``; the unbiased trace
    ``tr(Ĝ_{qq} M_q⁻¹)`` is passed up.  O((pieces + k) log k) time, O(pieces + k) memory.

    References: Li thesis §6.4.2–6.4.3, Program 6.4.1."""
    if not isinstance(branching, int | np.integer) or branching < 2:
        raise ValueError(f"branching ({branching}) must be an integer >= 2")
    if workload.n_cells != partition.n_cells:
        raise ValueError(
            f"workload has {workload.n_cells} cells but the partition covers {partition.n_cells}"
        )
    pieces = _BucketPieces(workload, partition)
    levels = _build_tree(partition.n_buckets, branching)
    depths = _tree_depths(levels)
    u = np.ones(partition.n_buckets)  # M_q⁻¹𝟏 per node of the current level, concatenated
    d = np.ones(partition.n_buckets)  # 𝟏ᵀM_q⁻¹𝟏
    own = pieces.node_sq_norms(u, levels[0])  # ‖Ŵ_q M_q⁻¹𝟏‖²; G_jj at the leaves
    trace = own.copy()  # tr(Ĝ_qq M_q⁻¹); G_jj at the leaves (M_leaf = 1)
    lambdas = []
    for level in range(1, len(levels)):
        first = _first_children(levels, level)
        group = _group_sizes(levels, level)
        e = np.add.reduceat(trace, first)
        a_prime = np.add.reduceat(own, first)
        d_children = np.add.reduceat(d, first)
        a = pieces.node_sq_norms(u, levels[level])  # O(pieces + k)
        lam = np.zeros(group.size)
        query = group >= 2
        mu = float(branching) ** (-depths[level] / 2.0)
        lam[query] = _minimise_local_error(
            e[query], a[query], a_prime[query], d_children[query], mu[query]
        )
        c, g = _sherman_morrison(lam, d_children)
        trace = (e - c * a) / (1.0 - lam) ** 2
        u = u * np.repeat(g, np.diff(levels[level]))
        d = d_children * g
        own = a * g**2
        lambdas.append(lam)
    return HierarchicalStrategy(
        partition=partition,
        level_bounds=tuple(levels),
        lambdas=tuple(lambdas),
        error_trace=float(trace[0]),
    )
