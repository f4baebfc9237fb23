"""Optimised data-independent strategies for product workloads, from Gram matrices only.

A workload over a product domain (attribute sizes ``n_1 … n_d``) enters as a union of Kronecker
terms, ``terms = [(G_{t,1}, …, G_{t,d}), …]`` with ``G_{t,i} = W_{t,i}ᵀW_{t,i}``, so that
``WᵀW = Σ_t ⊗_i G_{t,i}`` (``Workload.gram_terms()`` builds exactly this).  A marginal over a subset
``S`` has ``G_i = I`` for i ∈ S and ``ones((n_i, n_i))`` otherwise.

The expected total squared error of strategy ``A`` is ``Δ(A)² · tr(WᵀW (AᵀA)⁻¹)`` times the noise
variance per unit sensitivity: Δ is the L1 sensitivity for ``noise="laplace"`` and the L2
sensitivity for ``noise="gaussian"``.  Every number called *total error* here uses unit noise
variance per unit sensitivity (Laplace with ε = √2, Gaussian with ρ = 1/2); multiply by the real
variance per unit sensitivity (``2/ε²`` or ``1/(2ρ)``) to get squared error.

Templates (each returns a strategy of sensitivity 1):

* ``kind="pidentity"`` / ``"fullrank"``: one attribute, a dense strategy matrix (see
  :mod:`mechanisms.optimized.templates`; ``tests/reference/optimized_search.py`` runs each
  template on its own).
* ``kind="kron"``: ``A = A_1 ⊗ … ⊗ A_d`` with each factor one of the above (or identity); the error
  is ``Σ_t Π_i tr(G_{t,i} (A_iᵀA_i)⁻¹)`` and sensitivities multiply, so the factors are optimised
  in turn against ``Σ_t c_t G_{t,i}`` with ``c_t = Π_{j≠i} tr(G_{t,j} (A_jᵀA_j)⁻¹)``.
* ``kind="marginals"``: one nonnegative weight per attribute subset (see
  :mod:`mechanisms.primitives.marginal_strategies`); works for any terms, not only marginal workloads.

:func:`optimize_workload` tries the Kronecker and marginals templates and keeps the lower error;
:func:`mechanisms.primitives.lower_bound.svd_bound` is the matching lower bound.

*Privacy*: nothing here touches data or consumes budget; strategies are public and may be cached.
The strategy's ``sensitivity`` is what a mechanism must calibrate noise to (times the dataset's
contribution bound).

References: McKenna et al., "Optimizing error of high-dimensional statistical queries under
differential privacy" (HDMM), PVLDB 11(10) 2018, §5–7; Li, *Optimizing linear queries under
differential privacy*, PhD thesis 2013, ch. 4 (SVD bound).  HDMM is AGPL: ideas only, no code.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import numpy as np
import scipy.sparse as sp

from dprelease.mechanisms.optimized.templates import (
    FactorSolution,
    NoiseKind,
    PIdentityFactor,
    column_sensitivity,
    identity_factor,
    optimize_factor,
    predict_factor_seconds,
    unit_error,
    validate_noise,
)
from dprelease.mechanisms.primitives.compute_limits import (
    DGEMM_FLOPS_PER_SECOND,
    Progress,
    WorkLimit,
    report,
    scaled,
)
from dprelease.mechanisms.primitives.linalg import read_only
from dprelease.mechanisms.primitives.lower_bound import validate_gram
from dprelease.mechanisms.primitives.marginal_strategies import (
    marginals_sensitivity,
    search_marginal_weights,
    validate_domain_sizes,
    workload_projections,
)
from dprelease.mechanisms.primitives.operators import Factor, MatrixFactor
from dprelease.mechanisms.primitives.subset_family import MAX_MARGINAL_ATTRIBUTES

Term = tuple[np.ndarray, ...]
StrategyKind = Literal["pidentity", "fullrank", "kron", "marginals"]


@dataclass(frozen=True, kw_only=True, eq=False)
class OptimizedStrategy:
    """A public, data-independent measurement strategy and its expected error.

    For every kind except ``"marginals"`` the strategy is the Kronecker product of ``factors``.
    For ``"marginals"`` it stacks ``weights[S] · M_S`` over subsets S (bitmask, bit i = attribute
    i kept); ``optimized`` measures it as a :class:`mechanisms.primitives.marginal_strategies.SubsetStrategy`.
    """

    kind: StrategyKind
    domain_sizes: tuple[int, ...]
    objective_noise: NoiseKind
    """The noise the strategy was optimised for: its sensitivity is L1 (laplace) or L2 (gaussian)."""
    total_error: float
    """``Δ(A)² · tr(WᵀW (AᵀA)⁻¹)``: total squared error at unit noise variance per unit Δ."""
    sensitivity: float
    """Δ(A) in the objective noise's norm (1 up to round-off: strategies are normalised)."""
    restarts: int
    seconds: float
    factors: tuple[np.ndarray, ...] = ()
    """Per-attribute dense strategy matrices (``rows_i × n_i``); empty for ``"marginals"``."""
    factor_templates: tuple[str, ...] = ()
    """Per attribute: ``"identity"``, ``"pidentity"`` or ``"fullrank"``."""
    thetas: tuple[np.ndarray | None, ...] = ()
    """Per attribute: Θ of a p-Identity factor, else None (empty: none recorded)."""
    weights: np.ndarray | None = None
    """``"marginals"`` only: 2^d nonnegative weights indexed by kept-attribute bitmask."""
    lower_bound: float | None = None
    """A certified lower bound on the total error of any strategy for this workload and noise
    (from the full-rank dual; None when not computed)."""
    iterations: int = 0
    details: Mapping[str, float] = field(default_factory=dict)
    """Total error of every candidate template considered (by kind), for reports."""
    stopped_early: bool = False
    """True when a time limit stopped the search: the strategy is the best found so far (it
    supports the workload and ``total_error`` is its exact error)."""

    def __post_init__(self) -> None:  # built by the two templates below: frozen, not re-checked
        object.__setattr__(self, "domain_sizes", tuple(int(n) for n in self.domain_sizes))
        if self.weights is not None:
            object.__setattr__(self, "weights", read_only(self.weights, np.float64))
        object.__setattr__(self, "factors", tuple(read_only(f, np.float64) for f in self.factors))
        thetas = tuple(None if t is None else read_only(t, np.float64) for t in self.thetas)
        object.__setattr__(self, "thetas", thetas)
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    def factor_operators(self) -> tuple[Factor, ...]:
        """Per attribute the factor as an operator: p-Identity factors kept as Θ
        (:class:`PIdentityFactor`, O(p n)), identity factors sparse, others dense."""
        if self.kind == "marginals":
            raise ValueError("a marginals strategy has no per-attribute factors")
        thetas = self.thetas or (None,) * len(self.factors)
        templates = self.factor_templates or ("",) * len(self.factors)
        operators: list[Factor] = []
        for factor, theta, template in zip(self.factors, thetas, templates, strict=True):
            if theta is not None:
                operators.append(PIdentityFactor(theta, noise=self.objective_noise))
            elif template == "identity":  # I_n: n non-zeros
                operators.append(MatrixFactor(sp.csr_array(factor)))
            else:
                operators.append(MatrixFactor(factor))
        return tuple(operators)


def validate_terms(terms: Sequence[Sequence[np.ndarray]]) -> tuple[list[Term], tuple[int, ...]]:
    """Check a union of Kronecker Gram terms; return float64 terms and the domain sizes."""
    if isinstance(terms, np.ndarray) or len(terms) == 0:
        raise ValueError("terms must be a non-empty sequence of tuples of Gram matrices")
    checked: list[Term] = []
    for t, term in enumerate(terms):
        if isinstance(term, np.ndarray) or len(term) == 0:
            raise ValueError(f"terms[{t}] must be a non-empty tuple of per-attribute Gram matrices")
        grams = tuple(validate_gram(g, name=f"terms[{t}][{i}]") for i, g in enumerate(term))
        checked.append(grams)
    sizes = tuple(g.shape[0] for g in checked[0])
    for t, grams in enumerate(checked):
        shape = tuple(g.shape[0] for g in grams)
        if shape != sizes:
            raise ValueError(f"terms[{t}] has attribute sizes {shape}, terms[0] has {sizes}")
    return checked, sizes


def validate_restarts(restarts: int) -> None:
    if restarts < 1:
        raise ValueError(f"restarts ({restarts}) must be >= 1")


KRON_MAX_SWEEPS = 10
"""Most sweeps of a union's alternation."""
KRON_TOLERANCE = 1e-5
"""A union's alternation stops when a sweep lowers the error by less than this fraction; a
factor's full-rank optimum is certified to this relative duality gap."""


def kron_template(
    grams: list[Term],
    sizes: tuple[int, ...],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    ps: Sequence[int | None] | None = None,
    restarts: int,
    start: float,
    limit: WorkLimit,
    progress: Progress | None,
) -> OptimizedStrategy:
    """Kronecker strategy ``A_1 ⊗ … ⊗ A_d`` for validated Gram terms, by alternation.

    Each sweep re-optimises factor ``i`` against ``Σ_t c_t G_{t,i}``,
    ``c_t = Π_{j≠i} tr(G_{t,j} (A_jᵀA_j)⁻¹)`` (exact for the other factors), warm-started; a factor
    is only replaced by something no worse, so the error never increases.  One term is separable
    (one sweep; for Gaussian noise optimal among all strategies up to :data:`KRON_TOLERANCE`,
    certified by the product of the factors' dual bounds).  ``ps[i]``: p-Identity size (None: ``n_i // 16``).
    Once ``limit`` passes, the factor in progress returns its best point and the result is
    ``stopped_early``.

    *Privacy*: none consumed; ``rng`` is public randomness (restart points).
    References: HDMM §6 (OPT_⊗ and unions of Kronecker products).
    """
    d = len(sizes)
    ps = [None] * d if ps is None else ps
    runs = 1 if noise == "gaussian" else restarts  # the Gaussian factors are deterministic
    results: list[tuple[list[FactorSolution], float, int, bool]] = []
    for run in range(runs):
        if results and limit.expired():
            break
        results.append(
            _alternate(
                grams,
                sizes,
                ps,
                noise=noise,
                rng=rng,
                limit=limit,
                progress=scaled(progress, run / runs, (run + 1) / runs),
            )
        )
    solutions, total, _, _ = min(results, key=lambda result: result[1])
    iterations = sum(result[2] for result in results)
    stopped = len(results) < runs or any(result[3] for result in results)
    bounds = [s.lower_bound for s in solutions]
    lower_bound = None
    if len(grams) == 1 and noise == "gaussian" and all(b is not None for b in bounds):
        lower_bound = float(np.prod([b for b in bounds if b is not None]))
    factors = tuple(s.strategy for s in solutions)
    sensitivity = float(np.prod([column_sensitivity(f, noise=noise) for f in factors]))
    templates = tuple(s.template for s in solutions)
    kind: StrategyKind = "kron"
    if d == 1 and templates[0] in ("pidentity", "fullrank"):
        kind = "pidentity" if templates[0] == "pidentity" else "fullrank"
    return OptimizedStrategy(
        kind=kind,
        domain_sizes=sizes,
        objective_noise=noise,
        total_error=total,
        sensitivity=sensitivity,
        restarts=runs,
        seconds=time.perf_counter() - start,
        factors=factors,
        factor_templates=templates,
        thetas=tuple(s.theta for s in solutions),
        lower_bound=lower_bound,
        iterations=iterations,
        stopped_early=stopped,
    )


def _alternate(
    grams: list[Term],
    sizes: tuple[int, ...],
    ps: Sequence[int | None],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    limit: WorkLimit,
    progress: Progress | None,
) -> tuple[list[FactorSolution], float, int, bool]:
    """One run of the Kronecker alternation from identity factors: (factors, error, iterations,
    stopped early).  Once ``limit`` has passed, the factor in progress returns its best point and
    no further factor is optimised; factors never optimised stay the identity."""
    d = len(sizes)
    # errors[t, i] = tr(G_{t,i} (A_iᵀA_i)⁻¹); identity factors to start
    errors = np.array([[float(np.trace(g)) for g in term] for term in grams])
    solutions: list[FactorSolution | None] = [None] * d
    thetas: list[np.ndarray | None] = [None] * d
    dual_weights: list[np.ndarray | None] = [None] * d
    previous = float(np.sum(np.prod(errors, axis=1)))
    iterations = 0
    stopped = False
    sweeps = 1 if len(grams) == 1 else KRON_MAX_SWEEPS
    for sweep in range(KRON_MAX_SWEEPS):
        for i in range(d):
            if limit.expired():
                stopped = True
                break
            done = (sweep * d + i) / (sweeps * d)
            others = np.prod(np.delete(errors, i, axis=1), axis=1)
            weights = others / max(float(others.max()), 1e-300)
            effective = sum(w * term[i] for w, term in zip(weights, grams, strict=True))
            solution, thetas[i], dual_weights[i] = optimize_factor(
                np.asarray(effective),
                noise=noise,
                rng=rng,
                p=ps[i],
                warm_start=solutions[i],
                warm_theta=thetas[i],
                warm_weights=dual_weights[i],
                tolerance=KRON_TOLERANCE,
                limit=limit,
                progress=scaled(progress, done, done + 1 / (sweeps * d)),
            )
            stopped = stopped or solution.stopped_early
            iterations += solution.iterations
            if len(grams) == 1:  # weights == [1.0]: the effective Gram is the term's own
                errors[0, i] = solution.unit_error
            else:
                strategy_gram = solution.strategy.T @ solution.strategy  # O(rows n²)
                errors[:, i] = [unit_error(term[i], strategy_gram) for term in grams]
            solutions[i] = solution  # one term: weights == [1.0], so its bound is for G_{1,i}
        total = float(np.sum(np.prod(errors, axis=1)))
        converged = total >= previous * (1 - KRON_TOLERANCE)
        previous = min(previous, total)
        report(
            progress,
            (sweep + 1) / sweeps,
            f"Kronecker template: sweep {sweep + 1}, unit error {total:.6g}",
        )
        if len(grams) == 1 or converged or stopped:
            break
    final = [
        # an attribute the alternation never reached before its time limit keeps the identity
        solution
        if solution is not None
        else identity_factor(n, unit_error=float(errors[0, i]), noise=noise)
        for i, (solution, n) in enumerate(zip(solutions, sizes, strict=True))
    ]
    return final, float(np.sum(np.prod(errors, axis=1))), iterations, stopped


def marginals_template(
    projections: np.ndarray,
    sizes: tuple[int, ...],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int,
    start: float,
    limit: WorkLimit,
    progress: Progress | None,
) -> OptimizedStrategy:
    """HDMM's marginals template (OPT_M, §6) for workload projections ``tr(WᵀW Q_T)``: the one
    search, :func:`mechanisms.primitives.marginal_strategies.search_marginal_weights`, from random starts.

    If ``limit`` has already passed, one L-BFGS-B iteration from one start still runs (every
    point it evaluates keeps the full-identity weight > 0, so the strategy supports the
    workload) and the result is ``stopped_early``.
    """
    expired, remaining = limit.expired(), limit.remaining()
    search = search_marginal_weights(
        projections,
        sizes,
        noise=noise,
        rng=rng,
        restarts=1 if expired else restarts,
        max_iterations=1 if expired else 1000,
        time_limit=None if expired or remaining == float("inf") else max(remaining, 1e-3),
        progress=None if expired else progress,
    )
    if expired:
        search = dataclasses.replace(search, stopped_early=True)
    return OptimizedStrategy(
        kind="marginals",
        domain_sizes=sizes,
        objective_noise=noise,
        total_error=search.unit_error,
        sensitivity=marginals_sensitivity(search.weights, noise=noise),
        restarts=restarts,
        seconds=time.perf_counter() - start,
        weights=search.weights,
        iterations=search.iterations,
        stopped_early=search.stopped_early,
    )


def optimize_workload(
    terms: Sequence[Sequence[np.ndarray]],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> OptimizedStrategy:
    """The lowest-error strategy among the Kronecker template and the marginals template.
    Kronecker: per-attribute p-Identity (Laplace) or full-rank optimum (Gaussian, n_i ≤ 4096),
    alternated over a union of terms.  Marginals: tried when ``d ≤ 20``.  The returned ``details``
    maps each candidate to its total error.  ``time_limit`` bounds both together (the marginals
    template is skipped once it has passed; the result is then ``stopped_early``).

    *Privacy*: none consumed; ``rng`` is public randomness (restart points).
    References: HDMM §7 (choosing among templates)."""
    start = time.perf_counter()
    limit = WorkLimit(time_limit=time_limit)
    grams, sizes = validate_terms(terms)
    validate_noise(noise)
    candidates = [
        kron_template(
            grams,
            sizes,
            noise=noise,
            rng=rng,
            restarts=1,
            start=time.perf_counter(),
            limit=limit,
            progress=scaled(progress, 0.0, 0.8),
        )
    ]
    stopped = candidates[0].stopped_early
    if len(sizes) <= MAX_MARGINAL_ATTRIBUTES:
        if limit.expired():
            stopped = True
        else:
            candidates.append(
                marginals_template(
                    workload_projections(grams),
                    sizes,
                    noise=noise,
                    rng=rng,
                    restarts=2,
                    start=time.perf_counter(),
                    limit=limit,
                    progress=scaled(progress, 0.8, 1.0),
                )
            )
            stopped = stopped or candidates[-1].stopped_early
    best = min(candidates, key=lambda c: c.total_error)
    details = {c.kind: c.total_error for c in candidates}
    report(progress, 1.0, f"optimised templates: best unit error {best.total_error:.6g}")
    return dataclasses.replace(
        best, seconds=time.perf_counter() - start, details=details, stopped_early=stopped
    )


# A union of terms alternates (warm-started factors converge faster on later sweeps): about 1.5
# single-term runs (benchmarks/predict_bench.py --calibrate templates).
_KRON_UNION_FACTOR = 1.5
# Marginals template (2 starts): per L-BFGS-B iteration 2e-4 s + 2e-8 s·d·2^d; iterations over
# both starts ≈ 200 (Laplace) and 50 (Gaussian) for 2-way marginals.
_MARGINAL_ITERATIONS = {"laplace": 200, "gaussian": 50}


def predict_seconds(
    domain_sizes: Sequence[int],
    *,
    num_terms: int = 1,
    noise: NoiseKind,
) -> float:
    """Predicted seconds of :func:`optimize_workload` from the sizes only (one BLAS thread).

    ``num_terms``: Kronecker terms in the workload's Gram (``len(workload.gram_terms())``).
    Kronecker template: every attribute's factor (p-Identity, or the full-rank optimum for
    Gaussian noise), times 1.5 for a union of terms; marginals template (d ≤ 20, two starts): its
    iterations at O(d 2^d).  Calibrated in
    ``benchmarks/predict_bench.py``; O(d).
    """
    sizes = validate_domain_sizes(domain_sizes)
    validate_noise(noise)
    if num_terms < 1:
        raise ValueError(f"num_terms ({num_terms}) must be >= 1")
    kron = sum(predict_factor_seconds(n, noise=noise) for n in sizes)
    if num_terms > 1:
        kron *= _KRON_UNION_FACTOR
        kron += num_terms * sum(float(n) ** 3 for n in sizes) / DGEMM_FLOPS_PER_SECOND
    d = len(sizes)
    marginals = 0.0
    if d <= MAX_MARGINAL_ATTRIBUTES:
        per_iteration = 2e-4 + 2e-8 * d * 2.0**d
        marginals = _MARGINAL_ITERATIONS[noise] * per_iteration
    return kron + marginals
