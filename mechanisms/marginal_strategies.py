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
  ``C = I − J/n`` (:class:`~mechanisms.operators.Centring`), i.e. the T-marginal centred along every
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

:class:`SubsetStrategy` evaluates either family for planning in O(items · 2^k) (k = attributes an
item does not sum out) and measures small domains through the equivalent
:class:`~mechanisms.union.UnionStrategy` (:meth:`SubsetStrategy.to_union`).

*Privacy*: everything here reads only the public workload and spends nothing; ``rng`` is public
randomness (restart points).  References: Li thesis ch. 4–5 (SVD bound, Eigen-Design, Thm 4.9);
McKenna et al., HDMM, PVLDB 11(10) 2018, §6 (marginals template; ideas only, no code).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from mechanisms.compute_limits import Progress
from mechanisms.lower_bound import svd_bound_from_eigenvalues
from mechanisms.operators import Centring, Factor
from mechanisms.optimized_marginals import (
    MAX_MARGINAL_ATTRIBUTES,
    eigenspace_multiplicities,
    marginals_sensitivity,
    per_subset_product,
    search_marginal_weights,
    summed_out_sizes,
    superset_sums,
)
from mechanisms.strategies import identity_strategy, total_strategy
from mechanisms.union import UnionStrategy, UnionTerm
from mechanisms.workload import Workload, WorkloadItem

SubsetBasis = Literal["centred", "marginal"]
BASES: tuple[str, ...] = ("centred", "marginal")
DEFAULT_L1_RESTARTS = 16
"""Random starts of the L1 template after the workload's own marginals (O(d 2^d) per evaluation)."""
_POSITIVE_RTOL = 1e-12


# ------------------------------------------------------------------------------------------------
# The workload in subset space
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class SubsetWorkload:
    """A workload's projections ``g_T = tr(WᵀW Q_T)`` on the 2^d subset eigenspaces."""

    domain_shape: tuple[int, ...]
    projections: np.ndarray
    """``g_T`` (length 2^d; round-off below 1e-12 of the total set to 0)."""
    diagonal: bool
    """True when ``WᵀW = Σ_T λ_T Q_T`` exactly (every factor's Gram is ``a·I + b·J``)."""
    own_subsets: tuple[int, ...]
    """Per item, the bitmask of the attributes it does not sum out (its own marginal)."""

    @property
    def num_attributes(self) -> int:
        return len(self.domain_shape)

    @property
    def num_cells(self) -> float:
        return float(math.prod(self.domain_shape))

    def multiplicities(self) -> np.ndarray:
        """``r_T = Π_{i∈T}(n_i − 1)``."""
        return eigenspace_multiplicities(self.domain_shape)

    def eigenvalues(self) -> np.ndarray:
        """``λ_T = g_T / r_T`` (0 where ``r_T = 0``): the Gram's spectrum when ``diagonal``."""
        r = self.multiplicities()
        return np.divide(self.projections, r, out=np.zeros_like(self.projections), where=r > 0)


def _factor_parts(factor: Factor) -> tuple[float, float]:
    """(centred, mean) parts of ``tr(FᵀF)``: ``tr(FᵀF P⁰)`` and ``tr(FᵀF P¹) = 1ᵀFᵀF1 / n``."""
    mean = factor.gram_sum() / factor.n
    return max(factor.gram_trace() - mean, 0.0), mean


def item_projections(item: WorkloadItem) -> np.ndarray:
    """``tr(W_itemᵀW_item Q_T)`` for every subset T. O(2^d + Σ_i cost of one product of W_i)."""
    parts = [_factor_parts(f) for f in item.factors]
    return per_subset_product([c for c, _ in parts], [m for _, m in parts])  # bit i ⇔ centred


def subset_workload(workload: Workload) -> SubsetWorkload:
    """The workload's subset-space projections. O(items · 2^d); d ≤ 20 attributes.

    Identity and total factors cost O(1); other factors one product each (never a Gram).
    """
    d = len(workload.domain_shape)
    if d > MAX_MARGINAL_ATTRIBUTES:
        raise ValueError(
            f"the subset space of {d} attributes has 2^{d} subsets; at most "
            f"{MAX_MARGINAL_ATTRIBUTES} attributes"
        )
    total = np.zeros(2**d)
    own = []
    diagonal = True
    for item in workload.items:
        total += item_projections(item)
        parts = [f.gram_ij() for f in item.factors]
        own.append(sum(1 << i for i, part in enumerate(parts) if part is None or part[0] != 0.0))
        diagonal = diagonal and all(part is not None for part in parts)
    floor = _POSITIVE_RTOL * max(float(total.sum()), np.finfo(np.float64).tiny)
    return SubsetWorkload(
        domain_shape=workload.domain_shape,
        projections=np.where(total > floor, total, 0.0),
        diagonal=diagonal,
        own_subsets=tuple(own),
    )


# ------------------------------------------------------------------------------------------------
# Weights over subsets
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class MarginalWeights:
    """One weight per attribute subset (bit i = attribute i) and what the weights achieve.

    ``basis="centred"``: term ``w_T ⊗ (C_i if i ∈ T else 1ᵀ)``; ``"marginal"``: term ``w_S M_S``
    (identity on S, total elsewhere).  Weights are normalised to sensitivity 1 in ``norm``.
    """

    domain_shape: tuple[int, ...]
    basis: SubsetBasis
    weights: np.ndarray
    norm: int
    """1: L1 sensitivity (Laplace, ε-DP); 2: L2 sensitivity (Gaussian, ρ-zCDP or (ε, δ))."""
    unit_total_error: float
    """``Δ² · tr(WᵀW (AᵀA)⁺)``: total squared error at unit noise variance per unit Δ (multiply
    by ``1/(2ρ)``, ``2/ε²`` or ``(σ/Δ)²``); ``rmse = √(variance · unit_total_error / m)``."""
    lower_bound: float | None = None
    """The SVD bound in the same unit when the workload is diagonal in subset space, else None."""
    stopped_early: bool = False
    """True when ``time_limit`` stopped the search (the weights are the best found by then)."""
    iterations: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.basis not in BASES:
            raise ValueError(f"basis ({self.basis!r}) must be one of {BASES}")
        if self.norm not in (1, 2):
            raise ValueError(f"norm ({self.norm}) must be 1 (L1) or 2 (L2)")
        d = len(self.domain_shape)
        weights = np.array(self.weights, dtype=np.float64, copy=True)  # frozen below
        if weights.shape != (2**d,) or not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError(f"weights must be 2^d = {2**d} finite values >= 0")
        if not weights.any():
            raise ValueError("weights must not all be 0")
        object.__setattr__(self, "domain_shape", tuple(int(n) for n in self.domain_shape))
        weights.setflags(write=False)
        object.__setattr__(self, "weights", weights)

    @property
    def subsets(self) -> np.ndarray:
        """Bitmasks with a non-zero weight (the measured terms), ascending."""
        return np.flatnonzero(self.weights > 0)

    def strategy_eigenvalues(self) -> np.ndarray:
        """``μ_T``: the strategy Gram's eigenvalue on each ``Q_T``. O(d 2^d)."""
        sizes_out = summed_out_sizes(self.domain_shape)  # c_T = Π_{i∉T} n_i
        squared = self.weights**2 * sizes_out
        if self.basis == "centred":
            return squared
        return superset_sums(squared, len(self.domain_shape))

    def sensitivity(self, *, norm: int) -> float:
        """Largest column norm of the stacked terms (every column has the same norm). O(d 2^d)."""
        if norm not in (1, 2):
            raise ValueError(f"norm ({norm}) must be 1 or 2")
        if self.basis == "marginal":
            return marginals_sensitivity(self.weights, noise="laplace" if norm == 1 else "gaussian")
        sizes = np.array(self.domain_shape, dtype=np.float64)
        if norm == 2:  # ‖C column‖² = 1 − 1/n, ‖1ᵀ column‖² = 1
            squared = _kept_products((sizes - 1.0) / sizes)
            return float(np.sqrt(np.sum(self.weights**2 * squared)))
        # ‖C column‖₁ = 2 (n − 1) / n, ‖1ᵀ column‖₁ = 1
        return float(np.sum(self.weights * _kept_products(2.0 * (sizes - 1.0) / sizes)))

    @property
    def num_answers(self) -> int:
        """Noisy answers measured: ``Π_{i∈S} n_i`` per weighted subset."""
        shape = self.domain_shape
        return sum(
            math.prod(n for i, n in enumerate(shape) if int(mask) >> i & 1) for mask in self.subsets
        )

    def to_parameters(self) -> dict[str, Any]:
        """JSON-able record (non-zero weights by bitmask) that :meth:`from_parameters` rebuilds."""
        return {
            "basis": self.basis,
            "norm": self.norm,
            "subset_weights": {str(int(s)): float(self.weights[s]) for s in self.subsets},
            "unit_total_error": self.unit_total_error,
            "lower_bound": self.lower_bound,
            "stopped_early": self.stopped_early,
            "iterations": self.iterations,
        }

    @classmethod
    def from_parameters(
        cls, domain_shape: tuple[int, ...], parameters: dict[str, Any]
    ) -> MarginalWeights:
        weights = np.zeros(2 ** len(domain_shape))
        for mask, value in dict(parameters["subset_weights"]).items():
            weights[int(mask)] = float(value)
        return cls(
            domain_shape=domain_shape,
            basis=parameters["basis"],
            weights=weights,
            norm=int(parameters["norm"]),
            unit_total_error=float(parameters["unit_total_error"]),
            lower_bound=parameters.get("lower_bound"),
            stopped_early=bool(parameters.get("stopped_early", False)),
            iterations=int(parameters.get("iterations", 0)),
        )


def _kept_products(values: np.ndarray) -> np.ndarray:
    """``Π_{i∈S} values[i]`` for every bitmask S. O(2^d)."""
    return per_subset_product(list(values), [1.0] * len(values))


def subset_unit_error(weights: MarginalWeights, projections: np.ndarray) -> float:
    """``Δ² · Σ_T g_T / μ_T`` for projections ``g`` (``inf`` if the weights do not support them)."""
    mu = weights.strategy_eigenvalues()
    needed = projections > 0
    if np.any(needed & ~(mu > _POSITIVE_RTOL * max(float(mu.max()), np.finfo(np.float64).tiny))):
        return math.inf
    trace = float(np.sum(projections[needed] / mu[needed]))
    return weights.sensitivity(norm=weights.norm) ** 2 * trace


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

    Closed form, O(items · 2^d): each eigenspace ``Q_T`` gets weight ``μ_T ∝ √λ_T`` (Cauchy–Schwarz
    on ``Δ₂² · Σ g_T/μ_T`` with ``Δ₂² = Σ μ_T r_T / N``), so the total error is
    ``(Σ_T √(g_T r_T))² / N``: the SVD bound exactly when the workload is diagonal (all marginals).
    ``time_limit`` is accepted for a uniform interface (the computation never needs it).
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
    weights = np.sqrt(mu / summed_out_sizes(subset.domain_shape))
    result = MarginalWeights(
        domain_shape=subset.domain_shape,
        basis="centred",
        weights=weights,
        norm=2,
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
    norm: int,
    rng: np.random.Generator,
    restarts: int = DEFAULT_L1_RESTARTS,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> MarginalWeights:
    """HDMM's marginals template: weights ``w_S`` of plain marginals minimising ``Δ² Σ g_T/μ_T``.

    Starts from the workload's own marginals (weight 1 each: the "measure every table" strategy,
    so the result is never worse than it) and then ``restarts`` random points; L-BFGS-B, O(d 2^d)
    per evaluation.  On ``time_limit`` the best weights so far are returned (``stopped_early``).
    """
    _check_time_limit(time_limit)
    if norm not in (1, 2):
        raise ValueError(f"norm ({norm}) must be 1 (L1) or 2 (L2)")
    subset = workload if isinstance(workload, SubsetWorkload) else subset_workload(workload)
    start = np.zeros(2**subset.num_attributes)
    start[list(set(subset.own_subsets))] = 1.0
    search = search_marginal_weights(
        subset.projections,
        subset.domain_shape,
        noise="laplace" if norm == 1 else "gaussian",
        rng=rng,
        restarts=restarts,
        starts=(start,),
        time_limit=time_limit,
        progress=progress,
    )
    return MarginalWeights(
        domain_shape=subset.domain_shape,
        basis="marginal",
        weights=search.weights,
        norm=norm,
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
        workload, norm=1, rng=rng, restarts=restarts, time_limit=time_limit, progress=progress
    )


def _bound(subset: SubsetWorkload) -> float | None:
    if not subset.diagonal:
        return None
    return svd_bound_from_eigenvalues(
        subset.eigenvalues(), subset.num_cells, multiplicities=subset.multiplicities()
    )


# ------------------------------------------------------------------------------------------------
# The strategy
# ------------------------------------------------------------------------------------------------


def _term_factors(basis: SubsetBasis, mask: int, domain_shape: tuple[int, ...]) -> tuple:
    if basis == "centred":
        return tuple(
            Centring(n) if mask >> i & 1 else total_strategy(n) for i, n in enumerate(domain_shape)
        )
    return tuple(
        identity_strategy(n) if mask >> i & 1 else total_strategy(n)
        for i, n in enumerate(domain_shape)
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class SubsetStrategy:
    """A subset-weighted strategy with the pipeline's strategy interface.

    Planning (sensitivity, per-item error, per-query variances, support) works in subset space for
    any number of cells; measuring (``apply``) and ``answers`` go through the equivalent
    :class:`~mechanisms.union.UnionStrategy`, so they need a domain that fits in memory.
    """

    name: str
    weights: MarginalWeights
    parameters: dict[str, object] = field(default_factory=dict)
    _union: list[UnionStrategy] = field(default_factory=list, repr=False, compare=False)
    _inverse: list[np.ndarray] = field(default_factory=list, repr=False, compare=False)

    @property
    def domain_shape(self) -> tuple[int, ...]:
        return self.weights.domain_shape

    @property
    def num_queries(self) -> int:
        return self.weights.num_answers

    def sensitivity(self, *, norm: int) -> float:
        return self.weights.sensitivity(norm=norm)

    def to_union(self) -> UnionStrategy:
        """The same strategy as explicit Kronecker terms (cached)."""
        if not self._union:
            shape = self.domain_shape
            terms = tuple(
                UnionTerm(
                    weight=float(self.weights.weights[mask]),
                    factors=_term_factors(self.weights.basis, int(mask), shape),
                )
                for mask in self.weights.subsets
            )
            self._union.append(
                UnionStrategy(
                    name=self.name, domain_shape=shape, terms=terms, parameters=self.parameters
                )
            )
        return self._union[0]

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``A·x`` through the union of terms (confidential; only the choke point calls it)."""
        return self.to_union().apply(x)

    def least_squares(self, y: np.ndarray, workload: Workload) -> np.ndarray:
        return self.to_union().least_squares(y, workload)

    def answers(self, y: np.ndarray, workload: Workload) -> dict[str, np.ndarray]:
        estimate = self.least_squares(y, workload)
        return {item.name: item.answer(estimate) for item in workload.items}

    def _inverse_eigenvalues(self) -> np.ndarray:
        """``1/μ_T`` (0 where ``μ_T = 0``: the pseudo-inverse), cached. O(d 2^d)."""
        if not self._inverse:
            mu = self.weights.strategy_eigenvalues()
            positive = mu > _POSITIVE_RTOL * max(float(mu.max()), np.finfo(np.float64).tiny)
            self._inverse.append(np.divide(1.0, mu, out=np.zeros_like(mu), where=positive))
        return self._inverse[0]

    def item_unit_total(self, item: WorkloadItem, workload: Workload | None = None) -> float:
        """``tr(W_itemᵀW_item (AᵀA)⁺) = Σ_T g_T(item) / μ_T``. O(2^d)."""
        return float(item_projections(item) @ self._inverse_eigenvalues())

    def item_unit_variances(
        self, item: WorkloadItem, workload: Workload | None = None
    ) -> np.ndarray:
        """``diag(W (AᵀA)⁺ Wᵀ) = Σ_T μ_T⁻¹ ⊗_i diag(W_i P^{T_i} W_iᵀ)``, row-major.

        Only subsets of the attributes the item does not sum out contribute (a total factor has no
        centred part), so the cost is O(2^k · m_item) for k such attributes.
        """
        inverse = self._inverse_eigenvalues()
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
            if inverse[mask] == 0.0:
                continue
            outer = np.ones(())
            for i, (mean, centred) in enumerate(per_attribute):
                outer = np.multiply.outer(outer, centred if mask >> i & 1 else mean)
            total += inverse[mask] * outer
        return total.ravel()

    def support_residual(self, workload: Workload) -> float:
        """0 when ``μ_T > 0`` wherever the workload has mass, else 1 (an unsupported eigenspace
        leaves a residual of the order of the queries)."""
        subset = subset_workload(workload)
        return 0.0 if math.isfinite(subset_unit_error(self.weights, subset.projections)) else 1.0


def subset_strategy(
    weights: MarginalWeights, *, name: str, parameters: dict[str, Any] | None = None
) -> SubsetStrategy:
    """The strategy for ``weights``; its ``parameters`` record the weights (plus ``parameters``)."""
    template = "subset-eigen" if weights.basis == "centred" else "marginals"
    recorded = {"template": template, **weights.to_parameters(), **(parameters or {})}
    return SubsetStrategy(name=name, weights=weights, parameters=recorded)
