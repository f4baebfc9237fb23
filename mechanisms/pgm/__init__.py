"""``reconstruct: pgm``: consistent, non-negative marginal tables from noisy marginal measurements.

Like private-pgm (McKenna, Sheldon, Miklau 2019; APPGM, McKenna et al. 2021), minimise the squared
measurement loss ``‖A x − y‖²`` over the *local-consistency* relaxation of the marginal polytope
(one non-negative table per clique, overlapping tables agreeing on shared sub-marginals), to a
relative tolerance (1e-6 by default), with the marginal-space structure
(:mod:`mechanisms.marginal_space`):

* consistent clique tables are ``μ_S = Σ_{T⊆S} spread_S(v_T)`` for centred components ``v_T``,
  and the loss is diagonal in them: ``‖A(x − x̂)‖² = Σ_T λ_T ‖v_T − v̂_T‖²`` with
  ``λ_T = μ_T / Π_{i∉T} n_i`` (``μ_T`` the eigenvalue of ``AᵀA`` on T, ``v̂_T`` least squares);
* non-negativity is split off with ADMM (Boyd et al. 2011, §5): a closed-form component step and
  a clip at 0.  One iteration is O(Σ_S |table_S| · 2^|S|) (:func:`solver_size`).

The total is held at its least-squares estimate (else inflating poorly measured low-order
marginals would lift negative cells).  The result is exactly consistent and non-negative: the last
iterate is mixed with the uniform tables of the same total by the smallest weight that lifts every
cell to ≥ 1e-9 of its uniform level.  Its error is not least squares' closed form (the estimator
is biased towards the polytope) and is measured empirically, never from the confidential data.

:func:`chow_liu_tree` and :func:`sample_tree` fit a tree-structured model to consistent tables
(maximum spanning tree of pairwise mutual informations, as MST does) and draw synthetic records:
post-processing of released values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import minimum_spanning_tree

from dprelease.mechanisms.primitives.subset_family import maximal_masks, set_bits, submasks

DEFAULT_TOLERANCE = 1e-6
DEFAULT_MAX_ITERATIONS = 3000
_RHO_BALANCE = 10.0  # residual balancing (Boyd §3.4.1): adapt ρ when residuals differ by >10×
_RHO_FACTOR = 2.0
_RELAXATION = 1.6
_FLOOR = 1e-9  # every cell ends ≥ 1e-9 × its uniform level, so round-off never makes it < 0
_CHECK_EVERY = 10  # residuals cost two more passes: checked every 10 iterations


def solver_size(domain_shape: Sequence[int], cliques: Iterable[int]) -> int:
    """Non-zeros of the spread operator ``B`` (``Σ_S |table_S| · 2^|S|`` over the maximal
    cliques): the solver's memory is ~24 bytes per non-zero (``B`` and ``Bᵀ``). O(cliques · d).

    >>> solver_size((2, 3, 4), [0b011, 0b001])
    24
    """
    shape = tuple(int(n) for n in domain_shape)
    return sum(
        math.prod(shape[a] for a in set_bits(s)) * 2 ** s.bit_count()
        for s in maximal_masks(cliques)
    )


@dataclass(frozen=True, kw_only=True)
class ConsistentMarginals:
    """Consistent, non-negative tables over ``cliques`` (bitmasks over ``domain_shape``).

    ``iterations`` and the final relative ``residual`` describe the solve; ``mixing`` is the
    weight of the uniform tables mixed in to make every cell non-negative.
    """

    domain_shape: tuple[int, ...]
    components: Mapping[int, np.ndarray]
    iterations: int
    residual: float
    mixing: float

    def marginal(self, mask: int) -> np.ndarray:
        """The table over ``mask``'s ascending axes (any subset of a clique). O(|table| 2^|mask|)."""
        shape = self.domain_shape
        axes = tuple(set_bits(mask))
        table = np.zeros(tuple(shape[a] for a in axes))
        for t in submasks(mask):
            part = self.components.get(t)
            if part is None:
                raise ValueError(f"no clique covers the attributes {axes}")
            spread = [shape[a] if t >> a & 1 else 1 for a in axes]
            divisor = math.prod(shape[a] for a in axes if not t >> a & 1)
            table += part.reshape(spread) / divisor
        return table


class _Lattice:
    """Cliques, their sub-components and the spread operator ``B`` (sparse) with its adjoint.

    Components are packed into one flat vector (ascending subset), clique tables into another
    (ascending clique); ``B`` has ``Σ_S |table_S| · 2^|S|`` non-zeros.
    """

    def __init__(self, shape: tuple[int, ...], cliques: Sequence[int]) -> None:
        self.shape = shape
        self.d = len(shape)
        self.cliques = list(cliques)
        self.closure = sorted({t for s in self.cliques for t in submasks(s)})
        self.offsets = self._offsets(self.closure)
        self.starts = self._offsets(self.cliques)
        rows, cols, data = [], [], []
        for s in self.cliques:
            axes = tuple(set_bits(s))
            sizes = self.table_shape(s)
            grid = np.indices(sizes).reshape(len(sizes), math.prod(sizes))  # cell index per axis
            cells = self.starts[s] + np.arange(grid.shape[1])
            for t in submasks(s):
                keep = [k for k, a in enumerate(axes) if t >> a & 1]
                sub = self.table_shape(t)
                flat = np.ravel_multi_index(tuple(grid[k] for k in keep), sub) if keep else 0
                rows.append(cells)
                cols.append(self.offsets[t] + flat + np.zeros_like(cells))
                data.append(np.full(cells.size, 1.0 / self._divisor(s, t)))
        self.num_cells = sum(math.prod(self.table_shape(s)) for s in self.cliques)
        self.num_components = sum(math.prod(self.table_shape(t)) for t in self.closure)
        self.matrix = csr_matrix(
            (np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))),
            shape=(self.num_cells, self.num_components),
        )
        self.transpose = self.matrix.T.tocsr()
        self.centring = self._centring_operators()
        # BᵀB on component T: Σ_{S ⊇ T} 1 / Π_{i∈S∖T} n_i  (spreads of distinct T are orthogonal)
        self.beta = self.expand(
            {
                t: sum(1.0 / self._divisor(s, t) for s in self.cliques if t & ~s == 0)
                for t in self.closure
            }
        )

    def _offsets(self, masks: Sequence[int]) -> dict[int, int]:
        offsets, at = {}, 0
        for mask in masks:
            offsets[mask] = at
            at += math.prod(self.table_shape(mask))
        return offsets

    def _divisor(self, s: int, t: int) -> float:
        return float(math.prod(self.shape[a] for a in set_bits(s & ~t)))

    def table_shape(self, mask: int) -> tuple[int, ...]:
        return tuple(self.shape[a] for a in set_bits(mask))

    def expand(self, values: Mapping[int, float]) -> np.ndarray:
        """One value per component, repeated over its entries."""
        return np.concatenate(
            [np.full(math.prod(self.table_shape(t)), float(values[t])) for t in self.closure]
        )

    def pack(self, parts: Mapping[int, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.ravel(parts[t]) for t in self.closure])

    def unpack(self, flat: np.ndarray) -> dict[int, np.ndarray]:
        return self._tables(flat, self.offsets, self.closure)

    def _tables(
        self, flat: np.ndarray, offsets: Mapping[int, int], masks: Sequence[int]
    ) -> dict[int, np.ndarray]:
        return {
            m: flat[offsets[m] : offsets[m] + math.prod(self.table_shape(m))].reshape(
                self.table_shape(m)
            )
            for m in masks
        }

    def _centring_operators(self) -> list[tuple[csr_matrix, csr_matrix]]:
        """Per axis slot k: ``(R_k, P_k)`` with ``R_k x`` the means of every component along its
        k-th axis and ``P_k`` broadcasting them back; ``x − P_k R_k x`` centres that axis.
        nnz O(num_components) each."""
        degree = max(len(set_bits(t)) for t in self.closure)
        operators = []
        for k in range(degree):
            entries, groups, weights, at = [], [], [], 0
            for t in self.closure:
                sizes = self.table_shape(t)
                if len(sizes) <= k:
                    continue
                grid = np.indices(sizes).reshape(len(sizes), -1)
                rest = tuple(grid[j] for j in range(len(sizes)) if j != k)
                other = tuple(n for j, n in enumerate(sizes) if j != k)
                line = np.ravel_multi_index(rest, other) if rest else np.zeros(grid.shape[1], int)
                entries.append(self.offsets[t] + np.arange(grid.shape[1]))
                groups.append(at + line)
                weights.append(np.full(grid.shape[1], 1.0 / sizes[k]))
                at += math.prod(other)
            rows, cols = np.concatenate(groups), np.concatenate(entries)
            means = csr_matrix(
                (np.concatenate(weights), (rows, cols)), shape=(at, self.num_components)
            )
            spread = csr_matrix((np.ones(rows.size), (cols, rows)), shape=(self.num_components, at))
            operators.append((means, spread))
        return operators

    def centre(self, flat: np.ndarray) -> np.ndarray:
        """Project every component onto its centred space ``V_T``. O(num_components · degree)."""
        out = np.array(flat, dtype=np.float64, copy=True)
        for means, spread in self.centring:
            out -= spread @ (means @ out)
        return out

    def forward_flat(self, v: np.ndarray) -> np.ndarray:
        """``B v``: all clique tables, packed. O(nnz)."""
        return self.matrix @ v

    def adjoint_flat(self, z: np.ndarray) -> np.ndarray:
        """``Bᵀ z`` restricted to the centred component spaces. O(nnz + Σ_T |T table| |T|)."""
        return self.centre(self.transpose @ z)


def consistent_marginals(
    *,
    domain_shape: Sequence[int],
    cliques: Iterable[int],
    estimates: Mapping[int, np.ndarray],
    precisions: Mapping[int, float],
    tolerance: float = DEFAULT_TOLERANCE,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
) -> ConsistentMarginals:
    """The non-negative, consistent tables over ``cliques`` closest to the least-squares
    components ``estimates`` (``v̂_T`` for every subset T of a clique) in the measurement loss
    ``Σ_T precisions[T] · ‖v_T − v̂_T‖²``, with the total ``v_∅`` held at ``v̂_∅``.

    Stops when the relative primal and dual residuals are below ``tolerance`` or after
    ``max_iterations`` (both public: the solve sees only noisy values).  O(iterations ·
    Σ_S |table_S| 2^|S|).  Raises ``ValueError`` naming the field when an input is missing or
    not usable."""
    shape = tuple(int(n) for n in domain_shape)
    cliques = maximal_masks(cliques)
    if not cliques:
        raise ValueError("cliques: at least one clique is needed")
    if not tolerance > 0:
        raise ValueError(f"tolerance ({tolerance}) must be > 0")
    if max_iterations < 1:
        raise ValueError(f"max_iterations ({max_iterations}) must be >= 1")
    closure = sorted({t for s in cliques for t in submasks(s)})
    weight = {}
    for t in closure:
        if t not in estimates or t not in precisions:
            raise ValueError(
                f"estimates/precisions: component {tuple(set_bits(t))} of a clique is missing"
            )
        weight[t] = float(precisions[t])
        if not (math.isfinite(weight[t]) and weight[t] >= 0):
            raise ValueError(f"precisions[{tuple(set_bits(t))}] ({weight[t]}) must be >= 0")
    scale = max(weight.values())
    if not scale > 0:
        raise ValueError("precisions: at least one component must be measured (precision > 0)")
    lattice = _Lattice(shape, cliques)
    target = lattice.pack({t: np.asarray(estimates[t], dtype=np.float64) for t in closure})
    lam = 2.0 * lattice.expand({t: w / scale for t, w in weight.items()})  # scale-free minimiser
    total = slice(lattice.offsets[0], lattice.offsets[0] + 1)
    beta = lattice.beta
    rho = 1.0
    v = target.copy()
    z = np.maximum(lattice.forward_flat(v), 0.0)
    u = np.zeros_like(z)
    residual, iterations = math.inf, 0
    for iterations in range(1, max_iterations + 1):
        v = (lam * target + rho * lattice.adjoint_flat(z - u)) / (lam + rho * beta)
        v[total] = target[total]  # the total is held at its estimate (as private-pgm does)
        bv = lattice.forward_flat(v)
        # over-relaxation (Boyd §3.4.3) with α = _RELAXATION: fewer iterations
        mixed = _RELAXATION * bv + (1 - _RELAXATION) * z
        z_old = z
        z = np.maximum(mixed + u, 0.0)
        u += mixed - z
        if iterations % _CHECK_EVERY and iterations < max_iterations:
            continue
        # relative primal ‖Bv − z‖ and dual ρ‖Bᵀ(z − z_old)‖ residuals (Boyd §3.3.1)
        primal = np.linalg.norm(bv - z) / max(np.linalg.norm(bv), np.linalg.norm(z), 1e-300)
        dual = np.linalg.norm(lattice.adjoint_flat(z - z_old)) / max(
            np.linalg.norm(lattice.adjoint_flat(u)), 1e-300
        )
        residual = float(max(primal, dual))
        if residual < tolerance:
            break
        if primal > _RHO_BALANCE * dual:
            rho *= _RHO_FACTOR
            u /= _RHO_FACTOR
        elif dual > _RHO_BALANCE * primal:
            rho /= _RHO_FACTOR
            u *= _RHO_FACTOR
    components, mixing = _lift_to_nonnegative(lattice, v)
    return ConsistentMarginals(
        domain_shape=shape,
        components=lattice.unpack(components),
        iterations=iterations,
        residual=residual,
        mixing=mixing,
    )


def _lift_to_nonnegative(lattice: _Lattice, v: np.ndarray) -> tuple[np.ndarray, float]:
    """``(1 − t)·v + t·uniform`` (same total) for the smallest t lifting every clique table's
    cells to ≥ ``_FLOOR`` × its uniform level; all-zero tables when the total itself is not
    positive. O(nnz of B)."""
    at = lattice.offsets[0]
    total = float(v[at])
    if not total > 0:
        return np.zeros_like(v), 1.0
    tables = lattice.forward_flat(v)
    starts = np.array([lattice.starts[s] for s in lattice.cliques])
    sizes = np.array([math.prod(lattice.table_shape(s)) for s in lattice.cliques], dtype=float)
    low = np.minimum.reduceat(tables, starts)
    level = total / sizes  # the uniform table's cells
    floor = _FLOOR * level  # a margin far above round-off (~1e-16 × level)
    lifted = low < floor
    mixing = float(np.max(((floor - low) / (level - low))[lifted])) if lifted.any() else 0.0
    components = (1.0 - mixing) * v
    components[at] = total
    return components, mixing


def mutual_information(table: np.ndarray) -> float:
    """Mutual information (nats) of a non-negative 2-way table. O(cells).

    >>> round(mutual_information(np.array([[1.0, 0.0], [0.0, 1.0]])), 6)
    0.693147
    """
    p = np.asarray(table, dtype=np.float64)
    total = p.sum()
    if not total > 0:
        return 0.0
    p = p / total
    outer = p.sum(axis=1, keepdims=True) * p.sum(axis=0, keepdims=True)
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / outer[mask])))


@dataclass(frozen=True, kw_only=True)
class TreeModel:
    """A forest over the attributes: ``parent[i]`` (−1 for a root), 1-way tables and, per child,
    the 2-way table (parent axis first) it is sampled from."""

    domain_shape: tuple[int, ...]
    parent: tuple[int, ...]
    order: tuple[int, ...]
    one_way: Mapping[int, np.ndarray]
    pairs: Mapping[int, np.ndarray]


def chow_liu_tree(
    *,
    domain_shape: Sequence[int],
    one_way: Mapping[int, np.ndarray],
    two_way: Mapping[tuple[int, int], np.ndarray],
) -> TreeModel:
    """Maximum spanning forest of the pairwise mutual informations (Chow & Liu 1968) over the
    available pairs ``two_way[(i, j)]`` (i < j, axes i then j).  O(d² + Σ pair cells)."""
    shape = tuple(int(n) for n in domain_shape)
    d = len(shape)
    missing = [i for i in range(d) if i not in one_way]
    if missing:
        raise ValueError(f"one_way: attributes {missing} have no table")
    scores = {pair: mutual_information(table) for pair, table in two_way.items()}
    parent = [-1] * d
    adjacency: dict[int, list[int]] = {i: [] for i in range(d)}
    if scores:
        top = max(scores.values()) + 1.0  # positive weights: a zero would mean "no edge"
        rows, cols = zip(*scores, strict=True)
        graph = coo_matrix(([top - s for s in scores.values()], (rows, cols)), shape=(d, d)).tocsr()
        forest = minimum_spanning_tree(graph)
        for i, j in zip(*forest.nonzero(), strict=True):
            adjacency[int(i)].append(int(j))
            adjacency[int(j)].append(int(i))
    order: list[int] = []
    seen: set[int] = set()
    for root in range(d):  # breadth first from each unvisited attribute
        if root in seen:
            continue
        seen.add(root)
        queue = [root]
        while queue:
            node = queue.pop(0)
            order.append(node)
            for nxt in sorted(adjacency[node]):
                if nxt not in seen:
                    seen.add(nxt)
                    parent[nxt] = node
                    queue.append(nxt)
    pairs = {}
    for child, up in enumerate(parent):
        if up >= 0:
            table = two_way[(min(up, child), max(up, child))]
            pairs[child] = table if up < child else table.T
    return TreeModel(
        domain_shape=shape,
        parent=tuple(parent),
        order=tuple(order),
        one_way={i: np.asarray(one_way[i], dtype=np.float64) for i in range(d)},
        pairs=pairs,
    )


def _probabilities(weights: np.ndarray, *, what: str) -> np.ndarray:
    weights = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    total = weights.sum()
    if not total > 0:
        raise ValueError(f"{what} has no positive mass to sample from")
    return weights / total


def sample_tree(model: TreeModel, *, rows: int, rng: np.random.Generator) -> np.ndarray:
    """``rows`` records (an int64 array ``rows × d`` of cell indices) drawn from ``model``:
    roots from their 1-way tables, each child from its table's row for the parent's value.
    O(rows · d + Σ pair cells)."""
    if rows < 0:
        raise ValueError(f"rows ({rows}) must be >= 0")
    d = len(model.domain_shape)
    out = np.zeros((rows, d), dtype=np.int64)
    for node in model.order:
        up = model.parent[node]
        n = model.domain_shape[node]
        if up < 0:
            p = _probabilities(model.one_way[node], what=f"the table of attribute {node}")
            out[:, node] = rng.choice(n, size=rows, p=p)
            continue
        table = model.pairs[node]
        values = out[:, up]
        fallback = model.one_way[node]
        for value in np.unique(values):
            where = np.flatnonzero(values == value)
            row = table[value] if np.max(table[value]) > 0 else fallback  # rounding-level rows
            p = _probabilities(row, what=f"the table of attributes ({up}, {node})")
            out[where, node] = rng.choice(n, size=where.size, p=p)
    return out
