"""Strategies chosen in the space of attribute subsets: cost 2^d, independent of the domain size.

For attributes ``1..d`` (sizes ``n_i``, ``N = Π n_i`` cells, row-major) and a subset ``T`` (bitmask,
bit i ⇔ attribute i), ``Q_T = ⊗_i (P⁰_i if i ∈ T else P¹_i)`` with ``P¹ = J/n`` (the mean
direction) and ``P⁰ = I − J/n`` (the centred space); the ``Q_T`` are orthogonal projectors of rank
``r_T = Π_{i∈T}(n_i − 1)`` that sum to ``I_N`` (``P⁰ + P¹ = I`` per attribute).  Any strategy whose
Gram is ``AᵀA = Σ_T μ_T Q_T`` answers a workload ``W`` (any Kronecker items) with total squared
error ``Δ² · Σ_T g_T / μ_T`` per unit noise variance, where ``g_T = tr(WᵀW Q_T)`` factorises over
each item's attributes (each factor's Gram trace and sum suffice: no Gram is formed).

Two strategy families, both a weighted union of Kronecker terms, one per subset:

* ``basis="centred"`` (L2 noise: ρ-zCDP, (ε, δ)): term ``w_T · ⊗_i (C_i if i ∈ T else 1ᵀ)`` with
  ``C = I − J/n`` (:class:`~mechanisms.primitives.operators.Centring`), i.e. the T-marginal centred along every
  attribute of T.  Its Gram is ``w_T² c_T Q_T`` (``c_T = Π_{i∉T} n_i``), so each eigenspace is
  measured from one marginal.  :func:`marginal_weights_l2` is Eigen-Design in this basis: the
  optimum ``μ_T ∝ √(g_T / r_T)`` in closed form, total error ``(Σ_T √(g_T r_T))² / N``, which for
  workloads of marginals (every factor's Gram ``a·I + b·J``) *equals the SVD bound* (Li thesis
  Thm 4.9).
* ``basis="marginal"`` (HDMM's marginals template; L1 or L2): term ``w_S · M_S`` (the S-marginal),
  ``μ_T = Σ_{S⊇T} w_S² c_S``; :func:`marginal_weights_l1` optimises the weights for Laplace noise
  (``Δ₁ = Σ w_S``), starting from the workload's own marginals and from random points.

A plain union of marginals cannot reach the L2 bound in general: the weights it would need are the
Möbius inverse of ``√λ``, which is negative for some subsets of Adult's 1–3-way workload.

The algebra: plain marginals ``w_S M_S`` have Gram ``Σ_S w_S² B_S`` with
``B_S = ⊗_i (I if i ∈ S else J)``, whose eigenvalue on ``Q_T`` is a superset sum (zeta transform,
O(d 2^d); :func:`superset_sums` and its Möbius inverse).  :func:`search_marginal_weights` is the one
search of HDMM's template: :func:`marginal_weights_template` runs it for ``marginal_space`` and for
``optimized`` on marginal workloads, :func:`mechanisms.optimized.search.marginals_template` on the
projections of any Kronecker Gram terms (:func:`workload_projections`).

:class:`SubsetStrategy` evaluates either family for planning in O(items · 2^k) (k = attributes an
item does not sum out) and measures small domains through the equivalent
:class:`~mechanisms.primitives.union.UnionStrategy` (:meth:`SubsetStrategy.to_union`).

*Privacy*: everything here reads only the public workload and spends nothing; ``rng`` is public
randomness (restart points).  References: Li thesis ch. 4–5 (SVD bound, Eigen-Design, Thm 4.9);
McKenna et al., HDMM, PVLDB 11(10) 2018, §6 (marginals template; ideas only, no code).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np

from dprelease.mechanisms.primitives.compute_limits import Progress
from dprelease.mechanisms.primitives.noise import (
    SENSITIVITY_NORM,
    NoiseKind,
    noise_for_norm,
    validate_noise,
)
from dprelease.mechanisms.primitives.operators import Centring
from dprelease.mechanisms.primitives.protocol import (
    LeastSquaresAnswers,
)
from dprelease.mechanisms.primitives.strategies import identity_strategy, total_strategy
from dprelease.mechanisms.primitives.subset_family import (
    MAX_FAMILY_SUBSETS,
    MAX_MARGINAL_ATTRIBUTES,
    SubsetFamily,
    closure_size_bound,
    per_subset_product,
    set_bits,
    submasks,
)
from dprelease.mechanisms.primitives.threads import single_threaded_blas
from dprelease.mechanisms.primitives.union import UnionStrategy, UnionTerm
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem, item_subset

SubsetBasis = Literal["centred", "marginal"]
BASES: tuple[str, ...] = ("centred", "marginal")
DEFAULT_L1_RESTARTS = 16
"""Random starts of the L1 template after the workload's own marginals (O(d 2^d) per evaluation)."""
_POSITIVE_RTOL = 1e-12


def validate_domain_sizes(domain_sizes: Sequence[int]) -> tuple[int, ...]:
    """Return ``domain_sizes`` as a tuple of ints after checking 1 ≤ d ≤ 20 and every n_i ≥ 1."""
    sizes = tuple(int(n) for n in domain_sizes)
    if not 1 <= len(sizes) <= MAX_MARGINAL_ATTRIBUTES:
        raise ValueError(
            f"domain_sizes has {len(sizes)} attributes; the marginals algebra needs 1 to "
            f"{MAX_MARGINAL_ATTRIBUTES}"
        )
    if any(n < 1 for n in sizes):
        raise ValueError(f"domain_sizes ({sizes}) must all be >= 1")
    return sizes


def eigenspace_multiplicities(domain_sizes: Sequence[int]) -> np.ndarray:
    """``Π_{i∈U} (n_i − 1)``: the dimension of eigenspace ``P_U``."""
    return per_subset_product([float(n - 1) for n in domain_sizes], [1.0] * len(domain_sizes))


def ij_subset_eigenvalues(
    parts: Sequence[tuple[float, float]], domain_sizes: Sequence[int]
) -> np.ndarray:
    """Eigenvalue of ``⊗_i (a_i I + b_i J)`` on every eigenspace ``P_U``: ``a_i`` on the centred
    part (i ∈ U), ``a_i + b_i n_i`` on the mean direction (i ∉ U). O(2^d)."""
    return per_subset_product(
        [a for a, _ in parts], [a + b * n for (a, b), n in zip(parts, domain_sizes, strict=True)]
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class SubsetWorkload:
    """A workload's projections ``g_T = tr(WᵀW Q_T)`` on the subset eigenspaces of ``family``."""

    domain_shape: tuple[int, ...]
    projections: np.ndarray
    """``g_T``, one per subset of ``family`` (round-off below 1e-12 of the total set to 0)."""
    diagonal: bool
    """True when ``WᵀW = Σ_T λ_T Q_T`` exactly (every factor's Gram is ``a·I + b·J``)."""
    own_subsets: tuple[int, ...]
    """Per item, the bitmask of the attributes it does not sum out (its own marginal)."""
    family: SubsetFamily = None  # type: ignore[assignment]
    """The subsets ``projections`` hold; default: every subset of ``domain_shape``."""

    def __post_init__(self) -> None:
        if self.family is None:
            object.__setattr__(self, "family", SubsetFamily.every_subset(self.domain_shape))

    @property
    def num_cells(self) -> float:
        return self.family.num_cells

    def multiplicities(self) -> np.ndarray:
        """``r_T = Π_{i∈T}(n_i − 1)``."""
        return self.family.multiplicities()

    def eigenvalues(self) -> np.ndarray:
        """``λ_T = g_T / r_T`` (0 where ``r_T = 0``): the Gram's spectrum when ``diagonal``."""
        r = self.multiplicities()
        return np.divide(self.projections, r, out=np.zeros_like(self.projections), where=r > 0)


def _gram_parts(trace: float, total: float, n: int) -> tuple[float, float]:
    """A Gram's centred part ``tr(G P⁰)`` and mean part ``tr(G P¹) = 1ᵀG1 / n`` from its trace
    and entry sum."""
    return max(trace - total / n, 0.0), total / n


def _projections(grams: Iterable[tuple[float, float, int]]) -> np.ndarray:
    """``tr(⊗_i G_i Q_T)`` for every T (bit i ⇔ centred) from each ``G_i``'s (trace, entry sum, n).
    O(2^d)."""
    centred, means = zip(*(_gram_parts(*gram) for gram in grams), strict=True)
    return per_subset_product(centred, means)


def _drop_round_off(total: np.ndarray) -> np.ndarray:
    """Projections below 1e-12 of the total set to 0 (round-off of a zero eigenspace)."""
    floor = _POSITIVE_RTOL * max(float(total.sum()), np.finfo(np.float64).tiny)
    return np.where(total > floor, total, 0.0)


def own_subset(item: WorkloadItem) -> int:
    """Bitmask of the attributes whose factor has a centred part (the item's own marginal):
    ``g_T(item) = 0`` unless ``T`` is a subset of it. O(1) for a marginal, else O(d)."""
    mask = item_subset(item)
    if mask is not None:
        return mask
    parts = [f.gram_ij() for f in item.factors]
    return sum(1 << i for i, part in enumerate(parts) if part is None or part[0] != 0.0)


def item_support(item: WorkloadItem, family: SubsetFamily) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, g_T)``: the item's non-zero projections ``tr(W_itemᵀW_item Q_T)`` and their
    positions in ``family`` (−1 for a subset the family lacks). O(2^d) on the lattice; on a
    closed family O(2^k · k) for a marginal keeping k attributes, O(d + 2^k) otherwise."""
    if family.is_lattice:
        dense = _projections((f.gram_trace(), f.gram_sum(), f.n) for f in item.factors)
        support = np.flatnonzero(dense)
        return support, dense[support]
    sizes = family.sizes
    mask = item_subset(item)
    if mask is not None:  # centred part n − 1 on a kept attribute, mean part n on a summed one
        kept = set_bits(mask)
        centred = {i: float(sizes[i] - 1) for i in kept}
        means = dict.fromkeys(kept, 1.0)
        rest = family.num_cells / math.prod(float(sizes[i]) for i in kept)
    else:
        parts = [_gram_parts(f.gram_trace(), f.gram_sum(), f.n) for f in item.factors]
        mask = own_subset(item)
        kept = set_bits(mask)
        centred = {i: parts[i][0] for i in kept}
        means = {i: parts[i][1] for i in kept}
        rest = math.prod(parts[i][1] for i in range(len(parts)) if not mask >> i & 1)
    subsets = list(submasks(mask))
    values = np.array(
        [rest * math.prod(centred[i] if t >> i & 1 else means[i] for i in kept) for t in subsets]
    )
    positions = np.array([_position_or_missing(family, t) for t in subsets], dtype=np.int64)
    nonzero = values > 0
    return positions[nonzero], values[nonzero]


def _position_or_missing(family: SubsetFamily, mask: int) -> int:
    position = family.position(mask)
    return -1 if position is None else position


def workload_projections(terms: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """``tr(WᵀW Q_T)`` for ``WᵀW = Σ_t ⊗_i G_{t,i}`` (dense Gram terms). O(Σ n_i² + 2^d) per term."""
    per_term = [
        _projections((float(np.trace(g)), float(g.sum()), g.shape[0]) for g in term)
        for term in terms
    ]
    return _drop_round_off(np.sum(per_term, axis=0))


def subset_workload(workload: Workload, *, weighted: bool = False) -> SubsetWorkload:
    """The workload's subset-space projections: on every subset up to
    ``MAX_MARGINAL_ATTRIBUTES`` attributes (O(items · 2^d)), else on the downward closure of the
    items' own marginals (a workload of marginals: O(items + Σ 2^|R|); otherwise O(items · d)
    more).  Identity and total factors cost O(1); other factors one product each (no Gram).

    ``weighted``: the projections of ``Σ_items w_item W_itemᵀW_item`` (what optimisers minimise
    under per-item weights; ``g_T`` is linear in the Gram, so each item's part is scaled)."""
    shape = workload.domain_shape
    scale = weighted and workload.weighted  # unit weights: the unweighted sums, bit for bit
    marginal = [item_subset(item) for item in workload.items]
    own = tuple(
        own_subset(item) if mask is None else mask
        for item, mask in zip(workload.items, marginal, strict=True)
    )
    family = SubsetFamily.for_masks(shape, own)
    diagonal = all(mask is not None for mask in marginal) or all(
        f.gram_ij() is not None for item in workload.items for f in item.factors
    )
    total = np.zeros(len(family))
    if not family.is_lattice and all(mask is not None for mask in marginal):
        # g_T = r_T Σ_{R ⊇ T} N / |R|: one superset sum over the tables' own subsets
        kept_cells = np.array([math.prod(shape[i] for i in set_bits(m)) for m in own], float)
        positions = np.array([family.position(m) for m in own], dtype=np.int64)
        per_table = family.num_cells / kept_cells
        if scale:
            per_table = per_table * np.array([item.weight for item in workload.items])
        per_table = np.bincount(positions, weights=per_table, minlength=len(family))
        total = family.multiplicities() * family.superset_sums(per_table)
    else:
        for item in workload.items:
            positions, values = item_support(item, family)
            np.add.at(total, positions, item.weight * values if scale else values)
    return SubsetWorkload(
        domain_shape=shape,
        projections=_drop_round_off(total),
        diagonal=diagonal,
        own_subsets=own,
        family=family,
    )


def marginals_sensitivity(weights: np.ndarray, *, noise: NoiseKind) -> float:
    """L1 (``Σ|w_S|``) or L2 (``√Σ w_S²``) sensitivity: each marginal's columns have one 1."""
    validate_noise(noise)
    weights = np.asarray(weights, dtype=np.float64)
    if noise == "laplace":
        return float(np.abs(weights).sum())
    return float(np.sqrt(np.sum(weights**2)))


def as_family(family: SubsetFamily | Sequence[int]) -> SubsetFamily:
    """``family`` itself, or every subset of the domain sizes it lists."""
    return family if isinstance(family, SubsetFamily) else SubsetFamily.every_subset(family)


def marginals_unit_error(
    weights: np.ndarray, projections: np.ndarray, family: SubsetFamily | Sequence[int]
) -> float:
    """``tr(G X⁺)`` for ``X = Σ w_S² B_S``; ``inf`` if the strategy does not support ``G``."""
    family = as_family(family)
    squared = np.asarray(weights, dtype=np.float64) ** 2
    return _unit_trace(family.superset_sums(squared * family.summed_out_sizes()), projections)


def _unit_trace(mu: np.ndarray, projections: np.ndarray) -> float:
    """``Σ_T g_T / μ_T`` (``inf`` when some ``g_T > 0`` has ``μ_T`` at round-off). O(2^d)."""
    needed = projections > 0
    if np.any(needed & ~(mu > _POSITIVE_RTOL * max(float(mu.max()), np.finfo(np.float64).tiny))):
        return math.inf
    return float(np.sum(projections[needed] / mu[needed]))


def marginals_loss_and_gradient(
    params: np.ndarray,
    projections: np.ndarray,
    family: SubsetFamily | Sequence[int],
    noise: NoiseKind,
) -> tuple[float, np.ndarray]:
    """``Δ(w)² · tr(G X(w)⁺)`` and its gradient in the weights ``w`` (scale invariant). O(d 2^d).

    With ``θ = w²``, ``λ = zeta(θ ∘ m)`` and ``f = Σ_U g_U / λ_U``:
    ``∂f/∂θ_S = −m_S Σ_{U ⊆ S} g_U / λ_U²`` (a subset-sum transform).
    """
    family = as_family(family)
    sizes_out = family.summed_out_sizes()
    theta = params * params
    eigenvalues = family.superset_sums(theta * sizes_out)
    needed = projections > 0
    safe = np.where(needed, eigenvalues, 1.0)
    f = float(np.sum(np.where(needed, projections / safe, 0.0)))
    d_theta = -sizes_out * family.subset_sums(np.where(needed, projections / safe**2, 0.0))
    if noise == "laplace":
        sensitivity = float(np.sum(params))
        d_sensitivity_sq = 2.0 * sensitivity * np.ones_like(params)
    else:
        sensitivity = float(np.sqrt(np.sum(theta)))
        d_sensitivity_sq = 2.0 * params
    loss = sensitivity**2 * f
    gradient = d_sensitivity_sq * f + sensitivity**2 * 2.0 * params * d_theta
    return loss, gradient


@dataclass(frozen=True, kw_only=True)
class WeightSearch:
    """The best weights a (possibly time-bounded) template search found."""

    weights: np.ndarray
    """2^d nonnegative weights, normalised to sensitivity 1 in the search's norm."""
    unit_error: float
    """``Δ(w)² · tr(G X(w)⁺)`` at unit noise variance per unit sensitivity."""
    iterations: int
    runs: int
    """Starting points optimised (fully or, when ``stopped_early``, the last one partly)."""
    stopped_early: bool
    """True when the time limit cut a run short or skipped planned runs."""
    seconds: float


def search_marginal_weights(
    projections: np.ndarray,
    family: SubsetFamily | Sequence[int],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int,
    starts: Sequence[np.ndarray] = (),
    max_iterations: int = 1000,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> WeightSearch:
    """Nonnegative weights (normalised to sensitivity 1) minimising the expected error.

    L-BFGS-B from each of ``starts`` (e.g. the workload's own marginals) and then from
    ``restarts`` ``Uniform(0, 1)`` points drawn from ``rng`` (the objective is not convex: a zero
    weight is a stationary direction, so restarts explore other supports).  The weights of the
    family's maximal subsets are kept ≥ 1e-6 (relative) so every eigenvalue stays positive;
    weights below 1e-4 of the largest are dropped when that costs < 1e-6 relative error.
    ``time_limit`` stops the current run at its next iteration and skips the rest (the first run
    always takes one iteration, so weights are returned, with ``stopped_early``).  One evaluation
    is O(d 2^d).
    """
    import scipy.optimize  # imported here: 0.2 s that planning from the strategy store never needs

    started = time.perf_counter()
    if not isinstance(family, SubsetFamily):
        family = SubsetFamily.every_subset(validate_domain_sizes(family))
    size = len(family)
    if restarts < 0:
        raise ValueError(f"restarts ({restarts}) must be >= 0")
    if time_limit is not None and not time_limit >= 0:
        raise ValueError(f"time_limit ({time_limit}) must be >= 0 seconds or None")
    initial = [np.asarray(x, dtype=np.float64) for x in starts]
    for x in initial:
        if x.shape != (size,) or not np.all(np.isfinite(x)) or np.any(x < 0) or not x.any():
            raise ValueError(f"every start must be {size:,} finite weights >= 0, not all 0")
    if not initial and restarts == 0:
        raise ValueError("need at least one start or restart")
    deadline = math.inf if time_limit is None else started + time_limit
    floored = family.maximal_positions()
    scale = max(float(projections.max()), 1e-300)
    normalised = projections / scale
    best_weights, best_loss, iterations, runs, stopped = np.zeros(size), np.inf, 0, 0, False
    total_runs = len(initial) + restarts

    def objective(params: np.ndarray, level: float = 1.0) -> tuple[float, np.ndarray]:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            loss, gradient = marginals_loss_and_gradient(params, normalised, family, noise)
        if not (np.isfinite(loss) and np.all(np.isfinite(gradient))):
            return math.inf, np.zeros_like(params)  # a weight vector that loses support
        return loss / level, gradient / level

    def stop_at_deadline(intermediate_result: scipy.optimize.OptimizeResult) -> None:
        if time.perf_counter() > deadline:
            raise StopIteration

    with single_threaded_blas():
        for run in range(total_runs):
            if run > 0 and time.perf_counter() > deadline:
                stopped = True
                break
            start = initial[run] if run < len(initial) else rng.random(size)
            start = np.array(start, dtype=np.float64)
            start /= marginals_sensitivity(start, noise=noise)  # the objective is scale-free
            bounds = [(0.0, None)] * size
            for position in floored:
                bounds[position] = (1e-6 * float(start.mean()), None)
                start[position] = max(start[position], bounds[position][0])
            # Divide by the starting loss so L-BFGS-B's relative-reduction test (which compares
            # against max(|f|, 1)) sees f ≈ 1: with f ≪ 1 it stopped after one iteration.
            level, _ = objective(start)
            level = level if math.isfinite(level) and level > 0 else 1.0
            result = scipy.optimize.minimize(
                objective,
                start,
                args=(level,),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                callback=stop_at_deadline,
                options={"maxiter": max_iterations, "ftol": 1e-13, "gtol": 1e-10},
            )
            iterations += int(result.nit)
            runs += 1
            stopped = stopped or time.perf_counter() > deadline
            loss = float(result.fun) * level
            if math.isfinite(loss) and loss < best_loss:
                best_loss, best_weights = loss, np.maximum(result.x, 0.0)
            if progress is not None:
                progress(
                    (run + 1) / total_runs,
                    f"marginals template: start {run + 1} of {total_runs}, "
                    f"best unit error {best_loss * scale:.6g}",
                )
    if not np.isfinite(best_loss):
        raise ValueError("the marginals template found no weights that support the workload")
    best_weights = best_weights / marginals_sensitivity(best_weights, noise=noise)
    error = marginals_unit_error(best_weights, normalised, family)
    pruned = np.where(best_weights >= 1e-4 * best_weights.max(), best_weights, 0.0)
    pruned = pruned / marginals_sensitivity(pruned, noise=noise)
    pruned_error = marginals_unit_error(pruned, normalised, family)
    if pruned_error <= error * (1 + 1e-6):
        best_weights, error = pruned, pruned_error
    return WeightSearch(
        weights=best_weights,
        unit_error=error * scale,
        iterations=iterations,
        runs=runs,
        stopped_early=stopped,
        seconds=time.perf_counter() - started,
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class MarginalWeights:
    """One weight per attribute subset (bit i = attribute i) and what the weights achieve.

    ``basis="centred"``: term ``w_T ⊗ (C_i if i ∈ T else 1ᵀ)``; ``"marginal"``: term ``w_S M_S``
    (identity on S, total elsewhere).  Weights are normalised to sensitivity 1 for ``noise``.
    """

    domain_shape: tuple[int, ...]
    basis: SubsetBasis
    weights: np.ndarray
    noise: NoiseKind
    """Laplace: L1 sensitivity (ε-DP); Gaussian: L2 sensitivity (ρ-zCDP or (ε, δ))."""
    unit_total_error: float
    """``Δ² · tr(WᵀW (AᵀA)⁺)``: total squared error at unit noise variance per unit Δ (multiply
    by ``1/(2ρ)``, ``2/ε²`` or ``(σ/Δ)²``); ``rmse = √(variance · unit_total_error / m)``."""
    lower_bound: float | None = None
    """The SVD bound in the same unit when the workload is diagonal in subset space, else None."""
    stopped_early: bool = False
    """True when ``time_limit`` stopped the search (the weights are the best found by then)."""
    iterations: int = 0
    seconds: float = 0.0
    family: SubsetFamily = None  # type: ignore[assignment]
    """The subsets ``weights`` hold (default: every subset of ``domain_shape``)."""

    def __post_init__(self) -> None:
        if self.basis not in BASES:
            raise ValueError(f"basis ({self.basis!r}) must be one of {BASES}")
        validate_noise(self.noise)
        object.__setattr__(self, "domain_shape", tuple(int(n) for n in self.domain_shape))
        if self.family is None:
            object.__setattr__(self, "family", SubsetFamily.every_subset(self.domain_shape))
        size = len(self.family)
        weights = np.array(self.weights, dtype=np.float64, copy=True)  # frozen below
        if weights.shape != (size,) or not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError(f"weights must be {size:,} finite values >= 0 (one per subset)")
        if not weights.any():
            raise ValueError("weights must not all be 0")
        weights.setflags(write=False)
        object.__setattr__(self, "weights", weights)

    @property
    def subsets(self) -> np.ndarray:
        """Bitmasks with a non-zero weight (the measured terms), ascending (Python ints beyond
        62 attributes)."""
        positions = np.flatnonzero(self.weights > 0)
        if self.family.is_lattice:
            return positions
        dtype = np.int64 if len(self.domain_shape) < 63 else object
        return np.array(self.family.masks_at(positions), dtype=dtype)

    def weight_of(self, mask: int) -> float:
        """The weight of subset ``mask`` (0 when the family does not hold it)."""
        return self.family.value_at(self.weights, int(mask))

    def strategy_eigenvalues(self) -> np.ndarray:
        """``μ_T``: the strategy Gram's eigenvalue on each ``Q_T`` of the family. O(d 2^d) on
        the lattice, O(Σ 2^|S|) on a closed family."""
        squared = self.weights**2 * self.family.summed_out_sizes()  # c_T = Π_{i∉T} n_i
        if self.basis == "centred":
            return squared
        return self.family.superset_sums(squared)

    def sensitivity(self, *, noise: NoiseKind) -> float:
        """Largest column norm of the stacked terms (every column has the same norm). O(d 2^d)."""
        validate_noise(noise)
        if self.basis == "marginal":
            return marginals_sensitivity(self.weights, noise=noise)
        sizes = np.array(self.domain_shape, dtype=np.float64)
        if noise == "gaussian":  # ‖C column‖² = 1 − 1/n, ‖1ᵀ column‖² = 1
            squared = self.family.kept_products((sizes - 1.0) / sizes)
            return float(np.sqrt(np.sum(self.weights**2 * squared)))
        # ‖C column‖₁ = 2 (n − 1) / n, ‖1ᵀ column‖₁ = 1
        return float(np.sum(self.weights * self.family.kept_products(2.0 * (sizes - 1.0) / sizes)))

    @property
    def num_answers(self) -> int:
        """Noisy answers measured: ``Π_{i∈S} n_i`` per weighted subset."""
        shape = self.domain_shape
        return sum(math.prod(shape[i] for i in set_bits(int(mask))) for mask in self.subsets)

    def to_parameters(self) -> dict[str, Any]:
        """JSON-able record (non-zero weights by bitmask) that :meth:`from_parameters` rebuilds."""
        return {
            "basis": self.basis,
            "norm": SENSITIVITY_NORM[self.noise],  # the token entries have always stored
            "subset_weights": {str(int(s)): self.weight_of(s) for s in self.subsets},
            "unit_total_error": self.unit_total_error,
            "lower_bound": self.lower_bound,
            "stopped_early": self.stopped_early,
            "iterations": self.iterations,
        }

    @classmethod
    def from_parameters(
        cls, domain_shape: tuple[int, ...], parameters: dict[str, Any]
    ) -> MarginalWeights:
        stored = {int(mask): float(value) for mask, value in parameters["subset_weights"].items()}
        family = SubsetFamily.for_masks(domain_shape, stored)
        weights = np.zeros(len(family))
        for mask, value in stored.items():
            weights[family.position(mask)] = value
        return cls(
            domain_shape=domain_shape,
            family=family,
            basis=parameters["basis"],
            weights=weights,
            noise=noise_for_norm(int(parameters["norm"])),
            unit_total_error=float(parameters["unit_total_error"]),
            lower_bound=parameters.get("lower_bound"),
            stopped_early=bool(parameters.get("stopped_early", False)),
            iterations=int(parameters.get("iterations", 0)),
        )


def subset_unit_error(weights: MarginalWeights, projections: np.ndarray) -> float:
    """``Δ² · Σ_T g_T / μ_T`` for projections ``g`` (``inf`` if the weights do not support them)."""
    trace = _unit_trace(weights.strategy_eigenvalues(), projections)
    return weights.sensitivity(noise=weights.noise) ** 2 * trace


def _check_time_limit(time_limit: float | None) -> None:
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit ({time_limit}) must be > 0 seconds or None")


def marginal_weights_l2(
    workload: Workload | SubsetWorkload,
    *,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> MarginalWeights:
    """Eigen-Design in subset space for L2 noise: centred-marginal weights ``w_T² c_T ∝ √(g_T/r_T)``.

    Closed form, O(items · 2^d) (on a closed family O(items + Σ 2^|R|)): each eigenspace ``Q_T``
    gets weight ``μ_T ∝ √λ_T`` (Cauchy–Schwarz on ``Δ₂² · Σ g_T/μ_T`` with
    ``Δ₂² = Σ μ_T r_T / N``), so the total error is ``(Σ_T √(g_T r_T))² / N``: the SVD bound
    exactly when the workload is diagonal (all marginals).  ``time_limit`` is never needed.
    """
    _check_time_limit(time_limit)
    started = time.perf_counter()
    subset = workload if isinstance(workload, SubsetWorkload) else subset_workload(workload)
    g = subset.projections
    r = subset.multiplicities()
    if not g.any():
        raise ValueError("the workload has no non-zero query")
    roots = np.sqrt(g * r)  # √(g_T r_T) = r_T √λ_T
    mu = np.divide(np.sqrt(g), np.sqrt(r), out=np.zeros_like(g), where=r > 0)  # √λ_T
    mu *= subset.num_cells / float(roots.sum())  # Δ₂² = Σ μ_T r_T / N = 1
    weights = np.sqrt(mu / subset.family.summed_out_sizes())
    result = MarginalWeights(
        domain_shape=subset.domain_shape,
        family=subset.family,
        basis="centred",
        weights=weights,
        noise="gaussian",
        unit_total_error=float(roots.sum()) ** 2 / subset.num_cells,
        lower_bound=_bound(subset),
        seconds=time.perf_counter() - started,
    )
    if progress is not None:
        progress(1.0, f"subset-space Eigen-Design: {result.subsets.size} centred marginals")
    return result


def marginal_weights_template(
    workload: Workload | SubsetWorkload,
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int = DEFAULT_L1_RESTARTS,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> MarginalWeights:
    """HDMM's marginals template: weights ``w_S`` of plain marginals minimising ``Δ² Σ g_T/μ_T``.

    Starts from the workload's own marginals (weight 1 each, so never worse than measuring every
    table) and then ``restarts`` random points; L-BFGS-B, O(d 2^d) per evaluation.  Beyond
    ``MAX_MARGINAL_ATTRIBUTES`` attributes it runs on the downward closure of the workload's
    tables, from their own marginals only (O(Σ 2^|R|) per evaluation).
    """
    _check_time_limit(time_limit)
    validate_noise(noise)
    subset = workload if isinstance(workload, SubsetWorkload) else subset_workload(workload)
    family = subset.family
    start = np.zeros(len(family))
    start[[family.position(mask) for mask in set(subset.own_subsets)]] = 1.0
    search = search_marginal_weights(
        subset.projections,
        family,
        noise=noise,
        rng=rng,
        restarts=restarts if family.is_lattice else 0,
        starts=(start,),
        time_limit=time_limit,
        progress=progress,
    )
    return MarginalWeights(
        domain_shape=subset.domain_shape,
        family=family,
        basis="marginal",
        weights=search.weights,
        noise=noise,
        unit_total_error=search.unit_error,
        lower_bound=_bound(subset),
        stopped_early=search.stopped_early,
        iterations=search.iterations,
        seconds=search.seconds,
    )


def marginal_weights_l1(
    workload: Workload | SubsetWorkload,
    *,
    rng: np.random.Generator,
    restarts: int = DEFAULT_L1_RESTARTS,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> MarginalWeights:
    """Marginal weights for Laplace noise (ε-DP, L1 sensitivity ``Σ w_S``); see
    :func:`marginal_weights_template`."""
    return marginal_weights_template(
        workload,
        noise="laplace",
        rng=rng,
        restarts=restarts,
        time_limit=time_limit,
        progress=progress,
    )


def _bound(subset: SubsetWorkload) -> float | None:
    """The SVD bound ``(Σ_T r_T √λ_T)² / N`` when the workload is diagonal in subset space."""
    if not subset.diagonal:
        return None
    roots = np.sqrt(np.clip(subset.eigenvalues(), 0.0, None)) * subset.multiplicities()
    return float(roots.sum()) ** 2 / subset.num_cells


def marginal_workload_reason(workload: Workload) -> str | None:
    """Why ``workload`` is not a union of marginals the subset space serves (None when it is):
    an item with other queries, or more than ``MAX_FAMILY_SUBSETS`` subsets below the tables
    (beyond ``MAX_MARGINAL_ATTRIBUTES`` attributes). O(items)."""
    masks = []
    for item in workload.items:
        mask = item_subset(item)
        if mask is None:
            return f"answers marginals only; item {item.name!r} has other queries"
        masks.append(mask)
    if len(workload.domain_shape) > MAX_MARGINAL_ATTRIBUTES:
        bound = closure_size_bound(masks)
        if bound > MAX_FAMILY_SUBSETS:
            return (
                f"the tables have up to {bound:,} attribute subsets below them; at most "
                f"{MAX_FAMILY_SUBSETS:,}"
            )
    return None


@dataclass(frozen=True, kw_only=True, eq=False)
class SubsetStrategy(LeastSquaresAnswers):
    """A subset-weighted strategy with the pipeline's strategy interface.

    Planning (sensitivity, per-item error, per-query variances, support) works in subset space for
    any number of cells; measuring (``apply``) and ``answers`` go through the equivalent
    :class:`~mechanisms.primitives.union.UnionStrategy`, so they need a domain that fits in memory.
    """

    name: str
    weights: MarginalWeights
    parameters: dict[str, object] = field(default_factory=dict)

    @property
    def domain_shape(self) -> tuple[int, ...]:
        return self.weights.domain_shape

    @property
    def num_queries(self) -> int:
        return self.weights.num_answers

    def sensitivity(self, *, noise: NoiseKind) -> float:
        return self.weights.sensitivity(noise=noise)

    def to_union(self) -> UnionStrategy:
        """The same strategy as explicit Kronecker terms (cached)."""
        return self._union_strategy

    # Cached in the instance's __dict__ (allowed on a frozen dataclass); the names differ from the
    # list slots ``_union``/``_inverse`` that pickles written before kept, so those still load.
    @cached_property
    def _union_strategy(self) -> UnionStrategy:
        shape = self.domain_shape
        measured = Centring if self.weights.basis == "centred" else identity_strategy
        terms = tuple(
            UnionTerm(
                weight=self.weights.weight_of(mask),
                factors=tuple(
                    measured(n) if mask >> i & 1 else total_strategy(n) for i, n in enumerate(shape)
                ),
            )
            for mask in self.weights.subsets
        )
        return UnionStrategy(
            name=self.name, domain_shape=shape, terms=terms, parameters=self.parameters
        )

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``A·x`` through the union of terms (confidential; only the choke point calls it)."""
        return self.to_union().apply(x)

    def least_squares(self, y: np.ndarray, workload: Workload) -> np.ndarray:
        return self.to_union().least_squares(y, workload)

    @cached_property
    def inverse_eigenvalues(self) -> np.ndarray:
        """``1/μ_T`` per subset of the family (0 where ``μ_T = 0``: the pseudo-inverse). O(d 2^d)
        once (O(Σ 2^|S|) on a closed family)."""
        mu = self.weights.strategy_eigenvalues()
        positive = mu > _POSITIVE_RTOL * max(float(mu.max()), np.finfo(np.float64).tiny)
        return np.divide(1.0, mu, out=np.zeros_like(mu), where=positive)

    @cached_property
    def _marginal_sums(self) -> np.ndarray:
        """``Σ_{T⊆R} r_T / μ_T`` for every subset R of the family: a marginal R's total is this
        times ``c_R = Π_{i∉R} n_i`` (``g_T(R) = r_T c_R``). One subset sum, O(d 2^d) or O(pairs)."""
        family = self.weights.family
        return family.subset_sums(family.multiplicities() * self.inverse_eigenvalues)

    def item_unit_total(self, item: WorkloadItem, workload: Workload | None = None) -> float:
        """``tr(W_itemᵀW_item (AᵀA)⁺) = Σ_T g_T(item) / μ_T`` (a subset outside the family has
        ``μ_T = 0``). O(k) for a marginal of k attributes the family holds (after one subset sum
        over the family), else O(2^d) on the lattice and O(2^k · k) on a closed family."""
        family = self.weights.family
        mask = item_subset(item)
        position = None if mask is None else family.position(mask)
        if position is not None:
            kept = math.prod(float(family.sizes[i]) for i in set_bits(mask))
            return float(self._marginal_sums[position]) * family.num_cells / kept
        positions, values = item_support(item, family)
        held = positions >= 0
        return float(values[held] @ self.inverse_eigenvalues[positions[held]])

    def uniform_unit_variance(self, item: WorkloadItem) -> float | None:
        """The variance every cell of a marginal ``item`` shares (each ``Q_T`` has a constant
        diagonal on a marginal's rows), None for other items. As :meth:`item_unit_total`."""
        if item_subset(item) is None:
            return None
        return self.item_unit_total(item) / item.num_queries

    def item_unit_variances(
        self, item: WorkloadItem, workload: Workload | None = None
    ) -> np.ndarray:
        """``diag(W (AᵀA)⁺ Wᵀ) = Σ_T μ_T⁻¹ ⊗_i diag(W_i P^{T_i} W_iᵀ)``, row-major.

        Only subsets of the attributes the item does not sum out contribute (a total factor has no
        centred part), so the cost is O(2^k · m_item) for k such attributes; a marginal's rows
        share one variance (:meth:`uniform_unit_variance`).
        """
        uniform = self.uniform_unit_variance(item)
        if uniform is not None:
            return np.full(item.num_queries, uniform)
        family = self.weights.family
        inverse = self.inverse_eigenvalues
        per_attribute = []
        for factor in item.factors:
            row_sums = np.asarray(factor.matvec(np.ones(factor.n)), dtype=np.float64)
            mean = row_sums**2 / factor.n  # diag(F P¹ Fᵀ)
            centred = np.maximum(factor.row_norms_squared() - mean, 0.0)  # diag(F P⁰ Fᵀ)
            small = 1e-12 * max(float(mean.max()), float(centred.max()))
            per_attribute.append((mean, centred if np.any(centred > small) else None))
        free = [i for i, (_, centred) in enumerate(per_attribute) if centred is not None]
        total = np.zeros(tuple(f.m for f in item.factors))
        for choice in range(1 << len(free)):
            mask = sum(1 << free[k] for k in range(len(free)) if choice >> k & 1)
            inverse_mu = family.value_at(inverse, mask)
            if inverse_mu == 0.0:
                continue
            outer = np.ones(())
            for i, (mean, centred) in enumerate(per_attribute):
                outer = np.multiply.outer(outer, centred if mask >> i & 1 else mean)
            total += inverse_mu * outer
        return total.ravel()

    def support_residual(self, workload: Workload) -> float:
        """0 when ``μ_T > 0`` wherever the workload has mass, else 1 (an unsupported eigenspace
        leaves a residual of the order of the queries).  A marginal R the family holds needs every
        ``T ⊆ R`` of positive rank measured: one subset sum counts the unmeasured ones below each
        R (O(d 2^d) or O(pairs) once, then O(1) per table); other items O(2^k) each."""
        family = self.weights.family
        inverse = self.inverse_eigenvalues
        unmeasured = family.subset_sums(((inverse == 0.0) & (family.multiplicities() > 0)) * 1.0)
        for item in workload.items:
            mask = item_subset(item)
            position = None if mask is None else family.position(mask)
            if position is not None:
                if unmeasured[position] > 0:
                    return 1.0
                continue
            positions, values = item_support(item, family)
            positions = positions[values > _POSITIVE_RTOL * values.sum()]  # not round-off
            if np.any(positions < 0) or np.any(inverse[positions] == 0.0):
                return 1.0
        return 0.0


def subset_strategy(
    weights: MarginalWeights, *, name: str, parameters: dict[str, Any] | None = None
) -> SubsetStrategy:
    """The strategy for ``weights``; its ``parameters`` record the weights (plus ``parameters``)."""
    template = "subset-eigen" if weights.basis == "centred" else "marginals"
    recorded = {"template": template, **weights.to_parameters(), **(parameters or {})}
    return SubsetStrategy(name=name, weights=weights, parameters=recorded)
