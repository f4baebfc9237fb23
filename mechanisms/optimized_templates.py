"""Per-attribute (one-dimensional) strategy templates optimised for a workload Gram matrix.

Everything here is data-free: a workload enters only through its Gram matrix ``G = WᵀW`` (n × n),
because the expected total squared error of the matrix mechanism with strategy ``A`` is
``Δ(A)² · tr(G (AᵀA)⁻¹)`` times the noise variance per unit sensitivity (Li thesis Prop 3.4).
Every template returns a strategy normalised to sensitivity 1 in the norm of its noise, so its
*unit error* ``tr(G (AᵀA)⁻¹)`` is directly comparable across templates.

Two templates:

* **p-Identity** (idea from McKenna et al., HDMM, VLDB 2018, §5): ``A = [I; Θ] diag(1/s)`` with
  ``p`` extra queries ``Θ`` (p × n).  For Laplace noise ``Θ ≥ 0`` and ``s_j = 1 + Σ_k Θ_kj`` (unit
  L1 column norms); for Gaussian noise ``Θ`` is real and ``s_j = √(1 + Σ_k Θ_kj²)`` (unit L2 column
  norms; signs cost nothing under L2).  The loss and its analytic gradient cost O(n² p) through the
  Woodbury identity; optimised with L-BFGS(-B) from random restarts.
* **Full rank (Gaussian only)**: the exact convex problem ``min tr(G X⁻¹) s.t. diag(X) ≤ 1`` over all
  positive definite ``X = AᵀA`` (Yuan et al. 2016's L2 formulation), solved through its dual
  ``max_{v>0} ‖W diag(v)‖²_* / ‖v‖²`` (a weighted nuclear norm; v = 1 gives the SVD bound).  For any
  ``v`` the matrix ``X_v = V⁻¹ (V G V)^{1/2} V⁻¹`` (V = diag(v)) is a primal strategy whose error
  meets the dual value when ``diag(X_v)`` is constant, so every iteration yields a strategy *and* a
  certified lower bound; the loop stops when their gap is below the tolerance.  Each iteration is
  one symmetric eigendecomposition, O(n³).

References: McKenna, Miklau, Hay, Machanavajjhala, "Optimizing error of high-dimensional statistical
queries under differential privacy", PVLDB 11(10) 2018, §5 (p-Identity, OPT₀); Li, *Optimizing
linear queries under differential privacy*, PhD thesis 2013, Def 4.3 and Thm 4.1 (SVD bound), Lemma 3
(completion: topping up deficient columns never raises the sensitivity nor the error).  Ideas only:
no code was taken from HDMM (AGPL).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
import scipy.optimize

NoiseKind = Literal["laplace", "gaussian"]
NOISE_KINDS: tuple[str, ...] = ("laplace", "gaussian")

# X ← (1 − ε) X + ε I keeps diag(X) = 1 and costs at most a factor 1/(1 − ε) in error, but makes
# every returned strategy Gram positive definite (condition number ≤ 1/ε).
FULL_RANK_RIDGE = 1e-10


@dataclass(frozen=True, kw_only=True, eq=False)
class FactorSolution:
    """An optimised per-attribute strategy of sensitivity 1 (in the norm of ``noise``)."""

    strategy: np.ndarray
    """``rows × n`` strategy matrix; its largest column norm is 1."""
    unit_error: float
    """``tr(G (AᵀA)⁻¹)`` for the Gram the factor was optimised for."""
    template: str
    """``"identity"``, ``"pidentity"`` or ``"fullrank"``."""
    noise: NoiseKind
    restarts: int
    iterations: int
    lower_bound: float | None = None
    """A certified lower bound on the unit error of *any* strategy (full-rank dual), if known."""


def validate_noise(noise: str) -> None:
    """Raise unless ``noise`` is one of :data:`NOISE_KINDS`."""
    if noise not in NOISE_KINDS:
        raise ValueError(f"noise ({noise!r}) must be one of {NOISE_KINDS}")


def validate_gram(gram: np.ndarray, *, name: str = "gram") -> np.ndarray:
    """Return ``gram`` as a float64 array after checking it is square, finite and symmetric."""
    array = np.asarray(gram, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] != array.shape[1] or array.shape[0] < 1:
        raise ValueError(f"{name} (shape {array.shape}) must be a non-empty square matrix")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite")
    scale = max(1.0, float(np.abs(array).max()))
    if float(np.abs(array - array.T).max()) > 1e-9 * scale:
        raise ValueError(f"{name} must be symmetric")
    if np.any(np.diag(array) < -1e-12 * scale):
        raise ValueError(f"{name} must be positive semidefinite (it has a negative diagonal entry)")
    return (array + array.T) / 2


def unit_error(gram: np.ndarray, strategy_gram: np.ndarray) -> float:
    """``tr(G X⁺)`` for a strategy Gram ``X = AᵀA``; ``inf`` if ``X`` does not support ``G``.

    Cholesky and LAPACK ``potri`` when ``X`` is positive definite (O(n³) flops in all); otherwise
    an eigendecomposition and the pseudo-inverse, with a support check (``G`` must vanish on the
    null space of ``X``).
    """
    factor, info = scipy.linalg.lapack.dpotrf(strategy_gram, lower=False, clean=True)
    if info == 0:
        # potri writes the upper triangle only; the strict lower one stays as potrf cleaned it (0)
        upper, info = scipy.linalg.lapack.dpotri(factor, lower=False)
        if info == 0 and np.all(np.isfinite(upper)):
            return float(2.0 * np.sum(gram * upper) - np.sum(np.diag(gram) * np.diag(upper)))
    eigenvalues, vectors = np.linalg.eigh(strategy_gram)  # O(n³)
    keep = eigenvalues > 1e-12 * max(float(eigenvalues.max()), 1e-300)
    rotated = vectors.T @ gram @ vectors  # O(n³)
    scale = max(float(np.trace(gram)), 1e-300)
    if np.abs(np.diag(rotated)[~keep]).sum() > 1e-9 * scale:
        return float("inf")
    return float(np.sum(np.diag(rotated)[keep] / eigenvalues[keep]))


def column_sensitivity(strategy: np.ndarray, *, noise: NoiseKind) -> float:
    """Largest column L1 norm (Laplace) or L2 norm (Gaussian) of a dense strategy matrix."""
    validate_noise(noise)
    if noise == "laplace":
        return float(np.abs(strategy).sum(axis=0).max())
    return float(np.sqrt((strategy * strategy).sum(axis=0).max()))


# --------------------------------------------------------------------------------------------
# p-Identity
# --------------------------------------------------------------------------------------------


def pidentity_column_scales(theta: np.ndarray, *, noise: NoiseKind) -> np.ndarray:
    """Column norms ``s`` of ``[I; Θ]`` (L1 for Laplace with Θ ≥ 0, L2 for Gaussian). O(p n)."""
    if noise == "laplace":
        return 1.0 + np.abs(theta).sum(axis=0)
    return np.sqrt(1.0 + (theta * theta).sum(axis=0))


def pidentity_strategy(theta: np.ndarray, *, noise: NoiseKind) -> np.ndarray:
    """The p-Identity strategy ``[I; Θ] diag(1/s)`` (sensitivity 1). O(p n).

    Rows of Θ that are entirely zero measure nothing and are left out, so the result has
    ``n + (number of non-zero rows of Θ)`` rows.
    """
    validate_noise(noise)
    theta = np.asarray(theta, dtype=np.float64)
    if theta.ndim != 2:
        raise ValueError(f"theta (shape {theta.shape}) must be a p × n matrix")
    if noise == "laplace" and np.any(theta < 0):
        raise ValueError("theta must be >= 0 for the Laplace p-Identity template")
    scales = pidentity_column_scales(theta, noise=noise)
    used = theta[np.any(theta != 0.0, axis=1)]
    return np.vstack([np.eye(theta.shape[1]), used]) / scales


def pidentity_loss_and_gradient(
    params: np.ndarray, gram: np.ndarray, p: int, noise: NoiseKind
) -> tuple[float, np.ndarray]:
    """Unit error ``tr(G (AᵀA)⁻¹)`` of the p-Identity strategy and its gradient in ``Θ``.

    ``params`` is ``Θ`` (p × n) flattened row-major.  With ``S = diag(s)`` the strategy Gram is
    ``S⁻¹(I + ΘᵀΘ)S⁻¹``, so ``(AᵀA)⁻¹ = S (I − Θᵀ M Θ) S`` with ``M = (I_p + ΘΘᵀ)⁻¹`` (Woodbury).
    Cost O(n² p + n p² + p³); one n × n matrix product with a p × n matrix dominates.
    """
    n = gram.shape[0]
    theta = params.reshape(p, n)
    scales = pidentity_column_scales(theta, noise=noise)  # O(p n)
    small = np.eye(p) + theta @ theta.T  # O(p² n)
    b = scipy.linalg.solve(small, theta, assume_a="pos", check_finite=False)  # B = MΘ, O(p³ + p² n)
    e = (b * scales) @ gram  # E = B S G, O(p n²)
    c = e * scales  # C = B S G S = Θ Y S G S, O(p n)
    diag_gram = np.diag(gram)
    loss = float(diag_gram @ (scales * scales) - np.sum(theta * c))
    # d/dΘ with s fixed: −2 Θ Y (SGS) Y = −2 (C − (CΘᵀ) B). O(p² n)
    gradient = -2.0 * (c - (c @ theta.T) @ b)
    # d/ds: 2 ((G ∘ Y) s) = 2 (diag(G) s − colsum(Θ ∘ E)). O(p n)
    d_scales = 2.0 * (diag_gram * scales - np.sum(theta * e, axis=0))
    if noise == "laplace":
        gradient += d_scales  # ∂s_j/∂Θ_kj = 1 (Θ ≥ 0)
    else:
        gradient += theta * (d_scales / scales)  # ∂s_j/∂Θ_kj = Θ_kj / s_j
    return loss, gradient.ravel()


def _top_eigenpairs(
    gram: np.ndarray, count: int, *, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Leading ``count`` eigenpairs of a PSD matrix: dense ``eigh`` when small, else randomised.

    The randomised path is a block power (subspace) iteration with a Gaussian start from ``rng``
    followed by Rayleigh–Ritz: O(n² (count + 8) · 5).  Returns (values descending, vectors n × count).
    """
    n = gram.shape[0]
    if n <= 512 or count + 8 >= n // 2:
        values, vectors = np.linalg.eigh(gram)  # O(n³)
        order = np.argsort(values)[::-1][:count]
        return np.clip(values[order], 0.0, None), vectors[:, order]
    block = rng.standard_normal((n, count + 8))
    for _ in range(5):
        block, _ = np.linalg.qr(gram @ block)  # O(n² (count + 8))
    small = block.T @ gram @ block
    values, rotation = np.linalg.eigh((small + small.T) / 2)
    order = np.argsort(values)[::-1][:count]
    return np.clip(values[order], 0.0, None), block @ rotation[:, order]


def _gaussian_pidentity_start(gram: np.ndarray, p: int, *, rng: np.random.Generator) -> np.ndarray:
    """Θ whose ``I + ΘᵀΘ`` matches ``√G / c`` on its top-p eigenspace (the SVD-bound strategy)."""
    n = gram.shape[0]
    rank = min(p, n)
    values, vectors = _top_eigenpairs(gram, min(p + 1, n), rng=rng)
    roots = np.sqrt(values)
    # √G ≈ c (I + ΘᵀΘ) with c the (p+1)-th root (half the smallest when p ≥ n: exact then)
    floor = roots[p] if p < n else 0.5 * roots[-1]
    floor = max(floor, 1e-12 * max(roots[0], 1e-300))
    theta = np.zeros((p, n))
    theta[:rank] = (
        np.sqrt(np.maximum(roots[:rank] / floor - 1.0, 0.0))[:, None] * vectors[:, :rank].T
    )
    return theta


def _block_start(p: int, n: int) -> np.ndarray:
    """Θ whose row k sums the k-th of p contiguous blocks of cells (a two-level hierarchy)."""
    theta = np.zeros((p, n))
    for row, cells in enumerate(np.array_split(np.arange(n), p)):
        theta[row, cells] = 1.0
    return theta


def optimize_pidentity_factor(
    gram: np.ndarray,
    *,
    p: int,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int,
    max_iterations: int = 2000,
    initial_theta: np.ndarray | None = None,
) -> tuple[np.ndarray, float, int]:
    """Best ``Θ`` over ``restarts`` L-BFGS(-B) runs; returns (Θ, unit error, total iterations).

    Θ = 0 (the identity) is always a local minimum of the Laplace loss (extra mass raises the L1
    sensitivity linearly but lowers the trace only quadratically), so Laplace starts stay away
    from it: restart 0 is :func:`_block_start` plus ``0.1 · Uniform[0, 1)``, later restarts are
    ``Uniform[0, 1)`` (bounds Θ ≥ 0).  Gaussian restart 0 starts at the
    SVD-bound-like Θ of :func:`_gaussian_pidentity_start`, later ones perturb it with ``rng``.
    ``initial_theta`` (for warm starts inside the Kronecker alternation) replaces restart 0.
    """
    n = gram.shape[0]
    scale = max(float(np.trace(gram)) / n, 1e-300)
    normalised = gram / scale  # unit average diagonal: tolerances below are then relative
    best_theta = np.zeros((p, n))
    best_loss = float(np.sum(np.diag(normalised)))  # Θ = 0 is the identity strategy
    iterations = 0
    gaussian_start: np.ndarray | None = None
    for restart in range(restarts):
        if restart == 0 and initial_theta is not None:
            start = np.array(initial_theta, dtype=np.float64)
        elif noise == "laplace" and restart == 0:
            start = _block_start(p, n) + 0.1 * rng.random((p, n))
        elif noise == "laplace":
            start = rng.random((p, n))
        else:
            if gaussian_start is None:
                gaussian_start = _gaussian_pidentity_start(normalised, p, rng=rng)
            spread = 0.0 if restart == 0 else 0.3 * float(np.sqrt(np.mean(gaussian_start**2)))
            start = gaussian_start + spread * rng.standard_normal((p, n))
        result = scipy.optimize.minimize(
            pidentity_loss_and_gradient,
            start.ravel(),
            args=(normalised, p, noise),
            jac=True,
            method="L-BFGS-B",
            bounds=[(0.0, None)] * (p * n) if noise == "laplace" else None,
            options={"maxiter": max_iterations, "ftol": 1e-12, "gtol": 1e-9, "maxcor": 20},
        )
        iterations += int(result.nit)
        if np.isfinite(result.fun) and result.fun < best_loss:
            best_loss = float(result.fun)
            best_theta = result.x.reshape(p, n)
    if noise == "laplace":
        best_theta = np.maximum(best_theta, 0.0)
    return best_theta, best_loss * scale, iterations


# --------------------------------------------------------------------------------------------
# Full-rank Gaussian optimum (convex)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class FullRankSolution:
    """Result of :func:`optimize_gaussian_full_rank`."""

    strategy_gram: np.ndarray
    """``X = AᵀA`` with unit diagonal (L2 sensitivity 1), positive definite."""
    unit_error: float
    """``tr(G X⁻¹)``: the total error at unit noise per unit L2 sensitivity."""
    lower_bound: float
    """Dual value: no strategy (any rows, L2 sensitivity 1) has a smaller ``tr(G X⁺)``."""
    iterations: int
    dual_weights: np.ndarray
    """The dual point ``v`` (a warm start for a neighbouring problem)."""


def optimize_gaussian_full_rank(
    gram: np.ndarray,
    *,
    tolerance: float = 1e-5,
    max_iterations: int = 100,
    initial_weights: np.ndarray | None = None,
) -> FullRankSolution:
    """The L2-optimal strategy Gram for ``gram`` to a relative duality gap of ``tolerance``.

    Deterministic (the problem is convex).  Each iteration, O(n³): eigendecompose
    ``K = V G V`` (V = diag(v)), read off the dual value ``(tr √K)² / ‖v‖²`` and the primal
    ``X_v = V⁻¹ √K V⁻¹`` repaired to a unit diagonal (by completion, thesis Lemma 3, or by
    rescaling its columns; the better one is kept), then update
    ``v_i ← v_i · (diag(X_v)_i)^{ω/2}``, a multiplicative ascent step on the dual whose gradient is
    ``diag(X_v) − 1`` (step ω = 2; ω = 1 from the first time the dual decreases).  Cells with ``G_ii = 0``
    are not needed by the workload and get an identity query.

    *Privacy*: none consumed; public computation on the workload only.

    References: Li thesis §4.2.2 (proof structure, completion Lemma 3); Yuan et al. 2016 (the
    convex L2 formulation).  The dual derivation and the fixed-point update are ours.
    """
    gram = validate_gram(gram)
    if not tolerance > 0:
        raise ValueError(f"tolerance ({tolerance}) must be > 0")
    if max_iterations < 1:
        raise ValueError(f"max_iterations ({max_iterations}) must be >= 1")
    return _gaussian_full_rank(gram, tolerance, max_iterations, initial_weights)


def gaussian_dual(gram: np.ndarray, weights: np.ndarray) -> tuple[float, np.ndarray]:
    """Dual lower bound and matching primal Gram of the L2 problem at dual point ``v > 0``.

    With ``K = V G V`` (V = diag(v)) and ``T = tr √K``: returns ``T² / ‖v‖²``, a lower bound on
    ``tr(G X⁺)`` over every X with ``diag(X) ≤ 1`` (the Lagrange dual with multipliers
    ``μ = c v²``, maximised over the scale c), and ``X_v = V⁻¹ √K V⁻¹``, the minimiser of the
    Lagrangian, whose unit error after dividing by ``max diag(X_v)`` is ``T · max diag(X_v)``.
    The dual's gradient in ``μ`` is ``diag(X_μ) − 1``.  O(n³): one eigendecomposition.
    """
    values, vectors = np.linalg.eigh(gram * np.outer(weights, weights))  # O(n³)
    roots = np.sqrt(np.clip(values, 0.0, None))
    dual = float(roots.sum()) ** 2 / float(weights @ weights)
    root_k = (vectors * roots) @ vectors.T  # √K, O(n³)
    return dual, root_k / np.outer(weights, weights)


def _gaussian_full_rank(
    gram: np.ndarray,
    tolerance: float,
    max_iterations: int,
    initial_weights: np.ndarray | None,
) -> FullRankSolution:
    """:func:`optimize_gaussian_full_rank` on an already validated symmetric ``gram``."""
    n = gram.shape[0]
    diag = np.diag(gram)
    active = diag > 1e-14 * max(float(diag.max()), 1e-300)
    size = int(active.sum())
    if size == 0:
        return FullRankSolution(
            strategy_gram=np.eye(n),
            unit_error=0.0,
            lower_bound=0.0,
            iterations=0,
            dual_weights=np.ones(n),
        )
    sub = gram[np.ix_(active, active)]
    scale = float(np.trace(sub)) / size
    sub = sub / scale
    if initial_weights is None:
        weights = np.ones(size)
    else:
        weights = np.asarray(initial_weights, dtype=np.float64)[active]
        if weights.shape != (size,) or not np.all(weights > 0):
            weights = np.ones(size)
    best_error, best_bound = np.inf, 0.0
    best_gram = np.eye(size)
    best_weights = weights
    omega, previous_dual, previous_weights = 2.0, -np.inf, weights
    iterations = 0
    for _ in range(max_iterations):
        iterations += 1
        dual, primal = gaussian_dual(sub, weights)  # O(n³)
        if dual < previous_dual * (1 - 1e-12) and omega > 1.0:
            omega, weights = 1.0, previous_weights  # overshoot: retreat and take plain steps
            continue
        if dual > best_bound:
            best_bound, best_weights = dual, weights
        if best_error - best_bound <= tolerance * best_bound:
            break  # the new dual certifies the primal already in hand
        primal_diag = np.diag(primal).copy()
        top = float(primal_diag.max())
        # Two unit-diagonal repairs of X_v: top up the diagonal (Lemma 3) or rescale the columns.
        completed = (primal + np.diag(top - primal_diag)) / top
        rescaled = primal / np.sqrt(np.outer(primal_diag, primal_diag))
        for repaired in (rescaled, completed):
            candidate = (1.0 - FULL_RANK_RIDGE) * repaired + FULL_RANK_RIDGE * np.eye(size)
            error = unit_error(sub, candidate)  # O(n³)
            if error < best_error:
                best_error, best_gram = error, candidate
        if best_error - best_bound <= tolerance * best_bound:
            break
        previous_dual, previous_weights = dual, weights
        weights = weights * (primal_diag / top) ** (omega / 2.0)
        weights = weights / np.sqrt(float(np.mean(weights**2)))
    strategy_gram = np.eye(n)
    strategy_gram[np.ix_(active, active)] = best_gram
    dual_weights = np.ones(n)
    dual_weights[active] = best_weights
    return FullRankSolution(
        strategy_gram=strategy_gram,
        unit_error=float(best_error * scale),
        lower_bound=float(min(best_bound, best_error) * scale),
        iterations=iterations,
        dual_weights=dual_weights,
    )


def strategy_from_gram(strategy_gram: np.ndarray) -> np.ndarray:
    """An ``n × n`` strategy ``A`` (upper-triangular Cholesky factor) with ``AᵀA = strategy_gram``."""
    return scipy.linalg.cholesky(strategy_gram, lower=False, check_finite=False)


# --------------------------------------------------------------------------------------------
# One attribute: pick the best template
# --------------------------------------------------------------------------------------------


def default_p(n: int) -> int:
    """HDMM's default number of extra p-Identity queries: ``max(1, n // 16)``."""
    return max(1, n // 16)


FULL_RANK_MAX_CELLS = 4096
"""Largest attribute size for the O(n³)-per-iteration full-rank Gaussian template."""

FACTOR_TEMPLATES: tuple[str, ...] = ("auto", "pidentity", "fullrank", "identity")


def optimize_factor(
    gram: np.ndarray,
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    p: int | None = None,
    restarts: int = 1,
    template: str = "auto",
    warm_start: FactorSolution | None = None,
    warm_theta: np.ndarray | None = None,
    warm_weights: np.ndarray | None = None,
    tolerance: float = 1e-5,
) -> tuple[FactorSolution, np.ndarray | None, np.ndarray | None]:
    """Best sensitivity-1 strategy for one attribute among identity and the chosen template.

    ``template``: ``"auto"`` (Gaussian → full rank when n ≤ :data:`FULL_RANK_MAX_CELLS`, else
    p-Identity; Laplace → p-Identity), ``"pidentity"``, ``"fullrank"`` (Gaussian only) or
    ``"identity"``.  Returns the solution plus the state for a warm start (Θ or dual weights).
    ``gram`` must already be validated (:func:`validate_gram`).
    """
    if template not in FACTOR_TEMPLATES:
        raise ValueError(f"template ({template!r}) must be one of {FACTOR_TEMPLATES}")
    if template == "fullrank" and noise != "gaussian":
        raise ValueError(
            "the full-rank template optimises L2 sensitivity: noise must be 'gaussian'"
        )
    n = gram.shape[0]
    identity_error = float(np.trace(gram))
    best = FactorSolution(
        strategy=np.eye(n),
        unit_error=identity_error,
        template="identity",
        noise=noise,
        restarts=0,
        iterations=0,
    )
    if warm_start is not None and warm_start.strategy.shape[1] == n:
        # the previous factor stays admissible: never return something worse than it
        x = warm_start.strategy.T @ warm_start.strategy
        previous = unit_error(gram, x)
        if previous < best.unit_error:
            best = FactorSolution(
                strategy=warm_start.strategy,
                unit_error=previous,
                template=warm_start.template,
                noise=noise,
                restarts=0,
                iterations=0,
            )
    if n == 1:  # [1] is optimal: the bound is attained
        return dataclasses.replace(best, lower_bound=best.unit_error), warm_theta, warm_weights
    if template == "identity":
        return best, warm_theta, warm_weights
    if template == "auto":
        template = "fullrank" if noise == "gaussian" and n <= FULL_RANK_MAX_CELLS else "pidentity"
    if template == "fullrank":
        solution = _gaussian_full_rank(gram, tolerance, 100, warm_weights)
        if solution.unit_error <= best.unit_error:
            best = FactorSolution(
                strategy=strategy_from_gram(solution.strategy_gram),
                unit_error=solution.unit_error,
                template="fullrank",
                noise=noise,
                restarts=1,
                iterations=solution.iterations,
                lower_bound=solution.lower_bound,
            )
        else:  # the dual bound holds whichever strategy is kept
            best = dataclasses.replace(best, lower_bound=solution.lower_bound)
        return best, warm_theta, solution.dual_weights
    p = default_p(n) if p is None else p
    theta, error, iterations = optimize_pidentity_factor(
        gram,
        p=p,
        noise=noise,
        rng=rng,
        restarts=restarts,
        initial_theta=warm_theta if warm_theta is not None and warm_theta.shape == (p, n) else None,
    )
    if error < best.unit_error:  # ties go to the identity (fewer rows)
        best = FactorSolution(
            strategy=pidentity_strategy(theta, noise=noise),
            unit_error=error,
            template="pidentity",
            noise=noise,
            restarts=restarts,
            iterations=iterations,
        )
    return best, theta, warm_weights
