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
  :mod:`mechanisms.optimized_templates`).
* ``kind="kron"``: ``A = A_1 ⊗ … ⊗ A_d`` with each factor one of the above (or identity); the error
  is ``Σ_t Π_i tr(G_{t,i} (A_iᵀA_i)⁻¹)`` and sensitivities multiply, so the factors are optimised
  in turn against ``Σ_t c_t G_{t,i}`` with ``c_t = Π_{j≠i} tr(G_{t,j} (A_jᵀA_j)⁻¹)``.
* ``kind="marginals"``: one nonnegative weight per attribute subset (see
  :mod:`mechanisms.optimized_marginals`); works for any terms, not only marginal workloads.

:func:`optimize_workload` tries the Kronecker and marginals templates and keeps the lower error;
:func:`svd_bound` is the matching lower bound.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import numpy as np

from mechanisms.optimized_marginals import (
    MAX_MARGINAL_ATTRIBUTES,
    eigenspace_multiplicities,
    marginals_sensitivity,
    marginals_unit_error,
    optimize_marginal_weights,
    subsets_projections,
    validate_domain_sizes,
    workload_projections,
)
from mechanisms.optimized_templates import (
    FACTOR_TEMPLATES,
    FactorSolution,
    NoiseKind,
    column_sensitivity,
    optimize_factor,
    optimize_gaussian_full_rank,
    optimize_pidentity_factor,
    pidentity_strategy,
    strategy_from_gram,
    unit_error,
    validate_gram,
    validate_noise,
)

Term = tuple[np.ndarray, ...]
StrategyKind = Literal["pidentity", "fullrank", "kron", "marginals"]
STRATEGY_KINDS: tuple[str, ...] = ("pidentity", "fullrank", "kron", "marginals")

SVD_BOUND_DENSE_LIMIT = 2048
"""Largest product of the sizes of attributes that are not ``a I + b J`` for the exact bound."""


def _read_only(array: np.ndarray) -> np.ndarray:
    copy = np.array(array, dtype=np.float64, copy=True)
    copy.setflags(write=False)
    return copy


@dataclass(frozen=True, kw_only=True, eq=False)
class OptimizedStrategy:
    """A public, data-independent measurement strategy and its expected error.

    For every kind except ``"marginals"`` the strategy is the Kronecker product of ``factors``
    (apply it with Kronecker matvecs; ``factor_grams()`` gives ``A_iᵀA_i`` for least squares).  For
    ``"marginals"`` it stacks ``weights[S] · M_S`` over subsets S (bitmask, bit i = attribute i
    kept); see :func:`mechanisms.optimized_marginals.marginals_gram_pinv_apply`.
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
    weights: np.ndarray | None = None
    """``"marginals"`` only: 2^d nonnegative weights indexed by kept-attribute bitmask."""
    lower_bound: float | None = None
    """A certified lower bound on the total error of any strategy for this workload and noise
    (from the full-rank dual; None when not computed)."""
    iterations: int = 0
    details: Mapping[str, float] = field(default_factory=dict)
    """Total error of every candidate template considered (by kind), for reports."""

    def __post_init__(self) -> None:
        if self.kind not in STRATEGY_KINDS:
            raise ValueError(f"kind ({self.kind!r}) must be one of {STRATEGY_KINDS}")
        validate_noise(self.objective_noise)
        object.__setattr__(self, "domain_sizes", tuple(int(n) for n in self.domain_sizes))
        d = len(self.domain_sizes)
        if self.kind == "marginals":
            if self.weights is None or np.shape(self.weights) != (2**d,):
                raise ValueError(f"a marginals strategy needs 2^d = {2**d} weights")
            object.__setattr__(self, "weights", _read_only(self.weights))
        else:
            if len(self.factors) != d:
                raise ValueError(f"factors ({len(self.factors)}) must number d = {d}")
            for factor, n in zip(self.factors, self.domain_sizes, strict=True):
                if np.ndim(factor) != 2 or np.shape(factor)[1] != n:
                    raise ValueError(f"factor shape {np.shape(factor)} must be (rows, {n})")
            object.__setattr__(self, "factors", tuple(_read_only(f) for f in self.factors))
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    def factor_grams(self) -> tuple[np.ndarray, ...]:
        """``A_iᵀA_i`` for each factor (dense kinds only). O(Σ rows_i n_i²)."""
        if self.kind == "marginals":
            raise ValueError("a marginals strategy has no per-attribute factors")
        return tuple(f.T @ f for f in self.factors)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


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


def _validate_restarts(restarts: int) -> None:
    if restarts < 1:
        raise ValueError(f"restarts ({restarts}) must be >= 1")


# --------------------------------------------------------------------------------------------
# One attribute
# --------------------------------------------------------------------------------------------


def optimize_pidentity(
    gram: np.ndarray,
    *,
    p: int,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int = 2,
) -> OptimizedStrategy:
    """p-Identity strategy ``[I; Θ] diag(1/s)`` for one attribute with Gram ``gram``.

    Laplace: ``Θ ≥ 0``, unit L1 columns.  Gaussian: real ``Θ``, unit L2 columns, restart 0 from
    the SVD-bound strategy's top-p eigenspace.  L-BFGS(-B) with the analytic gradient, O(n² p)
    per evaluation; the best of ``restarts`` runs (and of the identity) is returned.

    *Privacy*: none consumed; ``rng`` is public randomness (restart points).

    References: HDMM §5 (p-Identity / OPT₀).
    """
    start = time.perf_counter()
    gram = validate_gram(gram)
    validate_noise(noise)
    _validate_restarts(restarts)
    n = gram.shape[0]
    if not 1 <= p <= max(1, 4 * n):
        raise ValueError(f"p ({p}) must be in [1, 4n] = [1, {max(1, 4 * n)}]")
    theta, error, iterations = optimize_pidentity_factor(
        gram, p=p, noise=noise, rng=rng, restarts=restarts
    )
    strategy = pidentity_strategy(theta, noise=noise)
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
        iterations=iterations,
    )


def optimize_full_rank(
    gram: np.ndarray, *, tolerance: float = 1e-5, max_iterations: int = 100
) -> OptimizedStrategy:
    """The L2-optimal (Gaussian) strategy for one attribute, to a relative duality gap.

    Deterministic convex optimisation (see
    :func:`mechanisms.optimized_templates.optimize_gaussian_full_rank`), O(n³) per iteration;
    ``lower_bound`` is the dual certificate, so ``total_error ≤ (1 + tolerance) · lower_bound``
    unless ``max_iterations`` ran out.

    *Privacy*: none consumed.

    References: Yuan et al. 2016 (convex L2 formulation); Li thesis §4.2.2 (completion).
    """
    start = time.perf_counter()
    solution = optimize_gaussian_full_rank(gram, tolerance=tolerance, max_iterations=max_iterations)
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
    )


# --------------------------------------------------------------------------------------------
# Kronecker products
# --------------------------------------------------------------------------------------------


def optimize_kron(
    terms: Sequence[Sequence[np.ndarray]],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    ps: Sequence[int | None] | None = None,
    restarts: int = 1,
    template: str = "auto",
    max_sweeps: int = 10,
    tolerance: float = 1e-5,
) -> OptimizedStrategy:
    """Kronecker strategy ``A_1 ⊗ … ⊗ A_d`` for a union of Kronecker terms, by alternation.

    Each sweep re-optimises every factor ``i`` against the effective Gram
    ``Σ_t c_t G_{t,i}``, ``c_t = Π_{j≠i} tr(G_{t,j} (A_jᵀA_j)⁻¹)`` (exact for the current other
    factors), warm-started from its previous value; a factor is only replaced by something no
    worse, so the error never increases.  A single term is separable and needs one sweep (for
    Gaussian noise it is then optimal among *all* strategies up to ``tolerance``, certified by the
    product of the factors' dual bounds).  ``ps[i]`` is the p-Identity size of attribute ``i``
    (default ``max(1, n_i // 16)``); ``template`` is as in
    :func:`mechanisms.optimized_templates.optimize_factor`.

    *Privacy*: none consumed; ``rng`` is public randomness (restart points).

    References: HDMM §6 (OPT_⊗ and unions of Kronecker products).
    """
    start = time.perf_counter()
    grams, sizes = validate_terms(terms)
    validate_noise(noise)
    _validate_restarts(restarts)
    if template not in FACTOR_TEMPLATES:
        raise ValueError(f"template ({template!r}) must be one of {FACTOR_TEMPLATES}")
    if template == "fullrank" and noise != "gaussian":
        raise ValueError(
            "the full-rank template optimises L2 sensitivity: noise must be 'gaussian'"
        )
    if max_sweeps < 1:
        raise ValueError(f"max_sweeps ({max_sweeps}) must be >= 1")
    d = len(sizes)
    if ps is None:
        ps = [None] * d
    if len(ps) != d:
        raise ValueError(f"ps has {len(ps)} entries; the domain has {d} attributes")
    for p, n in zip(ps, sizes, strict=True):
        if p is not None and not 1 <= p <= max(1, 4 * n):
            raise ValueError(f"ps entry ({p}) must be in [1, 4n] = [1, {max(1, 4 * n)}]")
    return _optimize_kron_checked(
        grams,
        sizes,
        noise=noise,
        rng=rng,
        ps=ps,
        restarts=restarts,
        template=template,
        max_sweeps=max_sweeps,
        tolerance=tolerance,
        start=start,
    )


def _optimize_kron_checked(
    grams: list[Term],
    sizes: tuple[int, ...],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    ps: Sequence[int | None],
    restarts: int,
    template: str,
    max_sweeps: int,
    tolerance: float,
    start: float,
) -> OptimizedStrategy:
    """:func:`optimize_kron` after validation (``start``: its perf_counter at entry)."""
    d = len(sizes)
    deterministic = noise == "gaussian" and template in ("auto", "fullrank", "identity")
    runs = 1 if deterministic else restarts
    results = [
        _alternate(
            grams,
            sizes,
            ps,
            noise=noise,
            rng=rng,
            template=template,
            max_sweeps=max_sweeps,
            tolerance=tolerance,
        )
        for _ in range(runs)
    ]
    solutions, total, _ = min(results, key=lambda result: result[1])
    iterations = sum(result[2] for result in results)
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
        lower_bound=lower_bound,
        iterations=iterations,
    )


def _alternate(
    grams: list[Term],
    sizes: tuple[int, ...],
    ps: Sequence[int | None],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    template: str,
    max_sweeps: int,
    tolerance: float,
) -> tuple[list[FactorSolution], float, int]:
    """One run of the Kronecker alternation from identity factors; (factors, error, iterations)."""
    d = len(sizes)
    # errors[t, i] = tr(G_{t,i} (A_iᵀA_i)⁻¹); identity factors to start
    errors = np.array([[float(np.trace(g)) for g in term] for term in grams])
    solutions: list[FactorSolution | None] = [None] * d
    thetas: list[np.ndarray | None] = [None] * d
    dual_weights: list[np.ndarray | None] = [None] * d
    previous = float(np.sum(np.prod(errors, axis=1)))
    iterations = 0
    for _ in range(max_sweeps):
        for i in range(d):
            others = np.prod(np.delete(errors, i, axis=1), axis=1)
            weights = others / max(float(others.max()), 1e-300)
            effective = sum(w * term[i] for w, term in zip(weights, grams, strict=True))
            solution, thetas[i], dual_weights[i] = optimize_factor(
                np.asarray(effective),
                noise=noise,
                rng=rng,
                p=ps[i],
                restarts=1,
                template=template,
                warm_start=solutions[i],
                warm_theta=thetas[i],
                warm_weights=dual_weights[i],
                tolerance=tolerance,
            )
            iterations += solution.iterations
            if len(grams) == 1:  # weights == [1.0]: the effective Gram is the term's own
                errors[0, i] = solution.unit_error
            else:
                strategy_gram = solution.strategy.T @ solution.strategy  # O(rows n²)
                errors[:, i] = [unit_error(term[i], strategy_gram) for term in grams]
            solutions[i] = solution  # one term: weights == [1.0], so its bound is for G_{1,i}
        total = float(np.sum(np.prod(errors, axis=1)))
        converged = total >= previous * (1 - tolerance)
        previous = min(previous, total)
        if len(grams) == 1 or converged:
            break
    final = [s for s in solutions if s is not None]
    return final, float(np.sum(np.prod(errors, axis=1))), iterations


# --------------------------------------------------------------------------------------------
# Marginals
# --------------------------------------------------------------------------------------------


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
) -> OptimizedStrategy:
    """Weighted-marginals strategy (one weight per attribute subset) for a workload.

    ``workload`` is either Kronecker Gram terms (any Grams: the error formula projects them on
    the marginals algebra) or subsets of attribute indices, meaning the workload of those
    marginals.  The objective is O(d 2^d) per evaluation and never touches N-sized arrays.

    *Privacy*: none consumed; ``rng`` is public randomness (restart points).

    References: HDMM §6 (OPT_M).
    """
    start = time.perf_counter()
    sizes = validate_domain_sizes(domain_sizes)
    validate_noise(noise)
    _validate_restarts(restarts)
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
    return _optimize_marginals_checked(
        projections, sizes, noise=noise, rng=rng, restarts=restarts, start=start
    )


def _optimize_marginals_checked(
    projections: np.ndarray,
    sizes: tuple[int, ...],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int,
    start: float,
) -> OptimizedStrategy:
    """:func:`optimize_marginals` from validated workload projections ``tr(WᵀW P_U)``."""
    weights, error, iterations = optimize_marginal_weights(
        projections, sizes, noise=noise, rng=rng, restarts=restarts
    )
    return OptimizedStrategy(
        kind="marginals",
        domain_sizes=sizes,
        objective_noise=noise,
        total_error=error,
        sensitivity=marginals_sensitivity(weights, noise=noise),
        restarts=restarts,
        seconds=time.perf_counter() - start,
        weights=weights,
        iterations=iterations,
    )


# --------------------------------------------------------------------------------------------
# Union: best template
# --------------------------------------------------------------------------------------------


def optimize_workload(
    terms: Sequence[Sequence[np.ndarray]],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int = 1,
) -> OptimizedStrategy:
    """The lowest-error strategy among the Kronecker template and the marginals template.

    Kronecker: per-attribute p-Identity (Laplace) or full-rank optimum (Gaussian, n_i ≤ 4096),
    alternated over a union of terms.  Marginals: tried when ``d ≤ 20``.  The returned
    ``details`` maps each candidate to its total error.

    *Privacy*: none consumed; ``rng`` is public randomness (restart points).

    References: HDMM §7 (choosing among templates).
    """
    start = time.perf_counter()
    grams, sizes = validate_terms(terms)
    validate_noise(noise)
    _validate_restarts(restarts)
    candidates = [
        _optimize_kron_checked(
            grams,
            sizes,
            noise=noise,
            rng=rng,
            ps=[None] * len(sizes),
            restarts=restarts,
            template="auto",
            max_sweeps=10,
            tolerance=1e-5,
            start=time.perf_counter(),
        )
    ]
    if len(sizes) <= MAX_MARGINAL_ATTRIBUTES:
        candidates.append(
            _optimize_marginals_checked(
                workload_projections(grams),
                sizes,
                noise=noise,
                rng=rng,
                restarts=max(restarts, 2),
                start=time.perf_counter(),
            )
        )
    best = min(candidates, key=lambda c: c.total_error)
    details = {c.kind: c.total_error for c in candidates}
    return dataclasses.replace(best, seconds=time.perf_counter() - start, details=details)


# --------------------------------------------------------------------------------------------
# Error and bound
# --------------------------------------------------------------------------------------------


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
    strategy_grams = strategy.factor_grams()
    total = 0.0
    for term in grams:
        product = 1.0
        for gram, strategy_gram in zip(term, strategy_grams, strict=True):
            product *= unit_error(gram, strategy_gram)
        total += product
    return sensitivity**2 * total


def _identity_total_parts(gram: np.ndarray) -> tuple[float, float] | None:
    """``(a, b)`` with ``gram = a I + b J`` exactly (to round-off), else None."""
    n = gram.shape[0]
    if n == 1:
        return float(gram[0, 0]), 0.0
    b = float(gram[0, 1])
    a = float(gram[0, 0]) - b
    scale = max(float(np.abs(gram).max()), 1e-300)
    if np.allclose(gram, a * np.eye(n) + b, rtol=0.0, atol=1e-12 * scale):
        return a, b
    return None


def _root_eigen_sum(gram: np.ndarray) -> float:
    """``Σ √λ_i(G)``, eigenvalues clipped at 0 (a PSD matrix's round-off). O(n³)."""
    values = np.linalg.eigvalsh(gram)
    return float(np.sqrt(np.clip(values, 0.0, None)).sum())


def svd_bound(terms: Sequence[Sequence[np.ndarray]]) -> float:
    """``SVDB(W) = (Σ_i √λ_i(WᵀW))² / N``: no strategy has lower total error at unit noise.

    The unit is total squared error at noise variance 1 per unit L2 sensitivity; it bounds the
    Laplace total error (unit variance per unit L1 sensitivity) too, since L1 ≥ L2.  Exact in all
    cases it accepts:

    * one term: per factor, ``Π_i (Σ √λ(G_i))² / Π n_i`` (eigenvalues of a Kronecker product are
      products), O(Σ n_i³);
    * attributes on which every term is ``a I + b J`` (marginal-like) split into the mean
      eigenspace (``a + b n``, multiplicity 1) and its complement (``a``, multiplicity n − 1);
      the remaining attributes (product of sizes ≤ 2048) are eigendecomposed densely per block.
      Pure marginal workloads are the closed form ``(Σ_U mult_U √λ_U)² / N``.

    Raises ``ValueError`` when the dense part is too large.

    References: Li thesis Def 4.3, Prop 4.3, Thm 4.13 (products), Thm 4.9 (marginals).
    """
    grams, sizes = validate_terms(terms)
    cells = float(np.prod(sizes, dtype=np.float64))
    if len(grams) == 1:
        root = float(np.prod([_root_eigen_sum(g) for g in grams[0]]))
        return root**2 / cells
    d = len(sizes)
    parts = [[_identity_total_parts(term[i]) for term in grams] for i in range(d)]
    split = [i for i in range(d) if all(part is not None for part in parts[i])]
    dense = [i for i in range(d) if i not in split]
    dense_size = int(np.prod([sizes[i] for i in dense], dtype=np.int64))
    if dense_size > SVD_BOUND_DENSE_LIMIT:
        raise ValueError(
            f"the attributes that are not a·I + b·J have {dense_size} cells together; the exact "
            f"SVD bound is limited to {SVD_BOUND_DENSE_LIMIT}"
        )
    if len(split) > MAX_MARGINAL_ATTRIBUTES:
        raise ValueError(f"{len(split)} marginal-like attributes exceed {MAX_MARGINAL_ATTRIBUTES}")
    split_sizes = [sizes[i] for i in split]
    # scalars[t, U]: term t's eigenvalue on split eigenspace U (bit k ⇔ complement of split[k])
    scalars = []
    for t in range(len(grams)):
        mean_values, rest_values = [], []
        for k, i in enumerate(split):
            a, b = parts[i][t] or (0.0, 0.0)  # never None on a split attribute
            mean_values.append(a + b * split_sizes[k])
            rest_values.append(a)
        product = np.ones(1)
        for mean_value, rest_value in zip(mean_values, rest_values, strict=True):
            product = np.concatenate([product * mean_value, product * rest_value])
        scalars.append(product)
    scalar_table = np.array(scalars)  # (terms, 2^k)
    multiplicity = (
        eigenspace_multiplicities(split_sizes) if split else np.ones(1)
    )  # Π_{k∈U} (n_k − 1)
    if not dense:
        eigenvalues = np.clip(scalar_table.sum(axis=0), 0.0, None)
        root = float(np.sum(multiplicity * np.sqrt(eigenvalues)))
        return root**2 / cells
    blocks = []
    for term in grams:
        block = np.ones((1, 1))
        for i in dense:
            block = np.kron(block, term[i])  # O(D²)
        blocks.append(block)
    root = 0.0
    cache: dict[bytes, float] = {}
    for index in range(scalar_table.shape[1]):
        if multiplicity[index] == 0:
            continue
        column = scalar_table[:, index]
        key = column.tobytes()
        if key not in cache:
            matrix = sum(s * block for s, block in zip(column, blocks, strict=True) if s != 0)
            cache[key] = 0.0 if isinstance(matrix, int) else _root_eigen_sum(np.asarray(matrix))
        root += float(multiplicity[index]) * cache[key]
    return root**2 / cells
