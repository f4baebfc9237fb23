"""The optimised templates one at a time, with their own validation, and the dense error check.

``dprelease`` runs :func:`mechanisms.optimized.search.optimize_workload` (Kronecker and marginals
templates together); the tests call each template through these entry points (one attribute's
p-Identity or full-rank optimum, a Kronecker product, the marginals template on Gram terms or
attribute subsets) and check every strategy's error with :func:`expected_total_error`.
References: McKenna et al., HDMM, PVLDB 11(10) 2018, §5–7; Li thesis ch. 4.  Ideas only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import numpy as np

from dprelease.mechanisms.optimized.search import (
    OptimizedStrategy,
    kron_template,
    marginals_template,
    validate_restarts,
    validate_terms,
)
from dprelease.mechanisms.optimized.templates import (
    FullRankSolution,
    NoiseKind,
    PIdentityFactor,
    PIdentityObjective,
    column_sensitivity,
    gaussian_full_rank,
    optimize_pidentity_factor,
    strategy_from_gram,
    unit_error,
    validate_noise,
)
from dprelease.mechanisms.primitives.compute_limits import Progress, WorkLimit
from dprelease.mechanisms.primitives.lower_bound import validate_gram
from dprelease.mechanisms.primitives.marginal_strategies import (
    marginals_sensitivity,
    marginals_unit_error,
    validate_domain_sizes,
    workload_projections,
)
from tests.reference.marginal_algebra import subsets_projections


def optimize_pidentity(
    gram: np.ndarray,
    *,
    p: int,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int = 2,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> OptimizedStrategy:
    """p-Identity strategy ``[I; Θ] diag(1/s)`` for one attribute with Gram ``gram``.

    Laplace: ``Θ ≥ 0``, unit L1 columns.  Gaussian: real ``Θ``, unit L2 columns, restart 0 from
    the SVD-bound strategy's top-p eigenspace.  Projected L-BFGS with the analytic gradient, O(n² p)
    per evaluation; the best of ``restarts`` runs (and of the identity) is returned.
    ``time_limit`` (seconds) stops at the next evaluation with the best Θ so far
    (``stopped_early``); ``progress(fraction, message)`` after every L-BFGS iteration.

    *Privacy*: none consumed; ``rng`` is public randomness (restart points).

    References: HDMM §5 (p-Identity / OPT₀).
    """
    start = time.perf_counter()
    limit = WorkLimit(time_limit=time_limit)
    gram = validate_gram(gram)
    validate_noise(noise)
    validate_restarts(restarts)
    n = gram.shape[0]
    if not 1 <= p <= max(1, 4 * n):
        raise ValueError(f"p ({p}) must be in [1, 4n] = [1, {max(1, 4 * n)}]")
    theta, error, iterations, stopped = optimize_pidentity_factor(
        gram, p=p, noise=noise, rng=rng, restarts=restarts, limit=limit, progress=progress
    )
    strategy = PIdentityFactor(theta, noise=noise).dense()
    return OptimizedStrategy(
        kind="pidentity",
        domain_sizes=(n,),
        objective_noise=noise,
        total_error=error,
        sensitivity=column_sensitivity(strategy, noise=noise),
        restarts=restarts,
        seconds=time.perf_counter() - start,
        factors=(strategy,),
        factor_templates=("pidentity",),
        thetas=(theta,),
        iterations=iterations,
        stopped_early=stopped,
    )


def optimize_gaussian_full_rank(
    gram: np.ndarray,
    *,
    tolerance: float = 1e-5,
    max_iterations: int = 100,
    initial_weights: np.ndarray | None = None,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> FullRankSolution:
    """:func:`mechanisms.optimized.templates.gaussian_full_rank` with its arguments validated;
    ``time_limit`` in seconds."""
    limit = WorkLimit(time_limit=time_limit)
    gram = validate_gram(gram)
    if not tolerance > 0:
        raise ValueError(f"tolerance ({tolerance}) must be > 0")
    if max_iterations < 1:
        raise ValueError(f"max_iterations ({max_iterations}) must be >= 1")
    return gaussian_full_rank(
        gram, tolerance, max_iterations, initial_weights, limit=limit, progress=progress
    )


def optimize_full_rank(
    gram: np.ndarray,
    *,
    tolerance: float = 1e-5,
    max_iterations: int = 100,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> OptimizedStrategy:
    """The L2-optimal (Gaussian) strategy for one attribute, to a relative duality gap.

    Deterministic convex optimisation (see
    :func:`optimize_gaussian_full_rank`), O(n³) per iteration;
    ``lower_bound`` is the dual certificate, so ``total_error ≤ (1 + tolerance) · lower_bound``
    unless ``max_iterations`` or ``time_limit`` (seconds; then ``stopped_early``) ran out.

    *Privacy*: none consumed.

    References: Yuan et al. 2016 (convex L2 formulation); Li thesis §4.2.2 (completion).
    """
    start = time.perf_counter()
    solution = optimize_gaussian_full_rank(
        gram,
        tolerance=tolerance,
        max_iterations=max_iterations,
        time_limit=time_limit,
        progress=progress,
    )
    strategy = strategy_from_gram(solution.strategy_gram)
    return OptimizedStrategy(
        kind="fullrank",
        domain_sizes=(strategy.shape[1],),
        objective_noise="gaussian",
        total_error=solution.unit_error,
        sensitivity=column_sensitivity(strategy, noise="gaussian"),
        restarts=1,
        seconds=time.perf_counter() - start,
        factors=(strategy,),
        factor_templates=("fullrank",),
        lower_bound=solution.lower_bound,
        iterations=solution.iterations,
        stopped_early=solution.stopped_early,
    )


def optimize_kron(
    terms: Sequence[Sequence[np.ndarray]],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    ps: Sequence[int | None] | None = None,
    restarts: int = 1,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> OptimizedStrategy:
    """Kronecker strategy ``A_1 ⊗ … ⊗ A_d`` for a union of Kronecker terms, by alternation.

    Each sweep re-optimises every factor ``i`` against the effective Gram
    ``Σ_t c_t G_{t,i}``, ``c_t = Π_{j≠i} tr(G_{t,j} (A_jᵀA_j)⁻¹)`` (exact for the current other
    factors), warm-started from its previous value; a factor is only replaced by something no
    worse, so the error never increases.  A single term is separable and needs one sweep (for
    Gaussian noise it is then optimal among *all* strategies up to ``KRON_TOLERANCE``, certified
    by the product of the factors' dual bounds).  ``ps[i]`` is the p-Identity size of attribute
    ``i`` (default ``max(1, n_i // 16)``).

    ``time_limit`` (seconds): the factor being optimised stops at its next evaluation with its
    best point so far, no further factors, sweeps or restarts start, and the best strategy is
    returned with ``stopped_early`` (every factor is at least as good as the identity).
    ``progress(fraction, message)``: after every inner iteration.

    *Privacy*: none consumed; ``rng`` is public randomness (restart points).

    References: HDMM §6 (OPT_⊗ and unions of Kronecker products).
    """
    start = time.perf_counter()
    limit = WorkLimit(time_limit=time_limit)
    grams, sizes = validate_terms(terms)
    validate_noise(noise)
    validate_restarts(restarts)
    d = len(sizes)
    if ps is None:
        ps = [None] * d
    if len(ps) != d:
        raise ValueError(f"ps has {len(ps)} entries; the domain has {d} attributes")
    for p, n in zip(ps, sizes, strict=True):
        if p is not None and not 1 <= p <= max(1, 4 * n):
            raise ValueError(f"ps entry ({p}) must be in [1, 4n] = [1, {max(1, 4 * n)}]")
    return kron_template(
        grams,
        sizes,
        noise=noise,
        rng=rng,
        ps=ps,
        restarts=restarts,
        start=start,
        limit=limit,
        progress=progress,
    )


def _is_term(item: object) -> bool:
    return (
        isinstance(item, tuple | list)
        and len(item) > 0
        and all(isinstance(g, np.ndarray) and g.ndim == 2 for g in item)
    )


def optimize_marginals(
    workload: Sequence[Sequence[np.ndarray]] | Sequence[Iterable[int]],
    domain_sizes: Sequence[int],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int = 2,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> OptimizedStrategy:
    """Weighted-marginals strategy (one weight per attribute subset) for a workload.

    ``workload`` is either Kronecker Gram terms (any Grams: the error formula projects them on
    the marginals algebra) or subsets of attribute indices, meaning the workload of those
    marginals.  The objective is O(d 2^d) per evaluation and never touches N-sized arrays.
    ``time_limit`` (seconds) and ``progress`` as in
    :func:`mechanisms.primitives.marginal_strategies.search_marginal_weights`.

    *Privacy*: none consumed; ``rng`` is public randomness (restart points).

    References: HDMM §6 (OPT_M).
    """
    start = time.perf_counter()
    limit = WorkLimit(time_limit=time_limit)
    sizes = validate_domain_sizes(domain_sizes)
    validate_noise(noise)
    validate_restarts(restarts)
    items = list(workload)
    if not items:
        raise ValueError("workload must not be empty")
    if all(_is_term(item) for item in items):
        grams, term_sizes = validate_terms(items)  # type: ignore[arg-type]
        if term_sizes != sizes:
            raise ValueError(f"terms have attribute sizes {term_sizes}, domain_sizes is {sizes}")
        projections = workload_projections(grams)
    elif not any(_is_term(item) for item in items):
        projections = subsets_projections(items, sizes)  # type: ignore[arg-type]
    else:
        raise ValueError("workload must be all Gram terms or all attribute subsets, not a mix")
    return marginals_template(
        projections,
        sizes,
        noise=noise,
        rng=rng,
        restarts=restarts,
        start=start,
        limit=limit,
        progress=progress,
    )


def factor_grams(strategy: OptimizedStrategy) -> tuple[np.ndarray, ...]:
    """``A_iᵀA_i`` for each factor (dense kinds only). O(Σ rows_i n_i²)."""
    if strategy.kind == "marginals":
        raise ValueError("a marginals strategy has no per-attribute factors")
    return tuple(f.T @ f for f in strategy.factors)


def expected_total_error(
    terms: Sequence[Sequence[np.ndarray]], strategy: OptimizedStrategy, *, noise: NoiseKind
) -> float:
    """``Δ(A)² · tr(WᵀW (AᵀA)⁺)`` at unit noise variance per unit Δ (``inf`` if unsupported).

    Δ is computed from the strategy itself in the norm of ``noise`` (which may differ from the
    noise it was optimised for).  Dense kinds: ``Π_i Δ(A_i)² · Σ_t Π_i tr(G_{t,i} (A_iᵀA_i)⁺)``,
    O(Σ n_i³).  Marginals: ``Σ_U tr(WᵀW P_U) / λ_U``, O(T d 2^d).
    """
    grams, sizes = validate_terms(terms)
    validate_noise(noise)
    if sizes != strategy.domain_sizes:
        raise ValueError(f"terms have sizes {sizes}, the strategy has {strategy.domain_sizes}")
    if strategy.weights is not None:  # kind "marginals" (checked in __post_init__)
        weights = strategy.weights
        sensitivity = marginals_sensitivity(weights, noise=noise)
        return sensitivity**2 * marginals_unit_error(weights, workload_projections(grams), sizes)
    sensitivity = float(np.prod([column_sensitivity(f, noise=noise) for f in strategy.factors]))
    strategy_grams = factor_grams(strategy)
    total = 0.0
    for term in grams:
        product = 1.0
        for gram, strategy_gram in zip(term, strategy_grams, strict=True):
            product *= unit_error(gram, strategy_gram)
        total += product
    return sensitivity**2 * total


def pidentity_loss_and_gradient(
    params: np.ndarray, gram: np.ndarray, p: int, noise: NoiseKind
) -> tuple[float, np.ndarray]:
    """One evaluation of :class:`PIdentityObjective` (which keeps its set-up between calls)."""
    return PIdentityObjective(gram, p=p, noise=noise)(params)
