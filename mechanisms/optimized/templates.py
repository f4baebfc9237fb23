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
  Woodbury identity; optimised with projected L-BFGS (:mod:`mechanisms.optimized.projected_lbfgs`)
  from random restarts.
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
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.linalg.lapack

from dprelease.mechanisms.optimized import projected_lbfgs
from dprelease.mechanisms.primitives.compute_limits import (
    DGEMM_FLOPS_PER_SECOND,
    Progress,
    TimeLimitReached,
    WorkLimit,
    blocked_matmul,
    eigh_seconds,
    interruptible,
    report,
)
from dprelease.mechanisms.primitives.noise import NoiseKind, validate_noise
from dprelease.mechanisms.primitives.operators import Factor, check_norm

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
    stopped_early: bool = False
    """True when a time limit stopped the optimisation (the strategy is the best found so far)."""
    theta: np.ndarray | None = None
    """Θ of a p-Identity strategy (:class:`PIdentityFactor`), None for the other templates."""


def unit_error(gram: np.ndarray, strategy_gram: np.ndarray) -> float:
    """``tr(G X⁺)`` for a strategy Gram ``X = AᵀA``; ``inf`` if ``X`` does not support ``G``.
    Cholesky and ``potri`` when ``X`` is positive definite, else an eigendecomposition and a support
    check (``G`` must vanish on the null space of ``X``).  O(n³)."""
    flops = float(strategy_gram.shape[0]) ** 3  # potrf n³/3 + potri 2n³/3
    factor, info = interruptible(
        lambda: scipy.linalg.lapack.dpotrf(strategy_gram, lower=False, clean=True), flops=flops
    )
    if info == 0:
        # potri writes the upper triangle only; the strict lower one stays as potrf cleaned it (0)
        upper, info = interruptible(
            lambda: scipy.linalg.lapack.dpotri(factor, lower=False), flops=flops
        )
        if info == 0 and np.all(np.isfinite(upper)):
            return float(2.0 * np.sum(gram * upper) - np.sum(np.diag(gram) * np.diag(upper)))
    eigenvalues, vectors = _eigh(strategy_gram)  # O(n³)
    keep = eigenvalues > 1e-12 * max(float(eigenvalues.max()), 1e-300)
    rotated = vectors.T @ gram @ vectors  # O(n³)
    scale = max(float(np.trace(gram)), 1e-300)
    if np.abs(np.diag(rotated)[~keep]).sum() > 1e-9 * scale:
        return float("inf")
    return float(np.sum(np.diag(rotated)[keep] / eigenvalues[keep]))


def _eigh(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.linalg.eigh`` that Ctrl-C can interrupt (a worker thread above ~1 s). O(n³)."""
    flops = eigh_seconds(matrix.shape[0]) * DGEMM_FLOPS_PER_SECOND
    return interruptible(lambda: np.linalg.eigh(matrix), flops=flops)


def column_sensitivity(strategy: np.ndarray, *, noise: NoiseKind) -> float:
    """Largest column L1 norm (Laplace) or L2 norm (Gaussian) of a dense strategy matrix."""
    validate_noise(noise)
    if noise == "laplace":
        return float(np.abs(strategy).sum(axis=0).max())
    return float(np.sqrt((strategy * strategy).sum(axis=0).max()))


RightMultiply = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``(X, out) ↦ out = X @ G`` for a fixed symmetric Gram ``G`` (rows of ``X`` are strategy rows);
``X`` may be overwritten (it serves as scratch)."""


def gram_right_multiply(gram: np.ndarray) -> RightMultiply:
    """``X ↦ X @ gram`` in O(p n) when ``gram`` is a multiple of the all-range or the prefix Gram
    (recognised in O(n²)), else a dense product, O(p n²).  With 0-based cells, all ranges give
    ``G_ij = c (min(i, j) + 1)(n − max(i, j))`` and prefixes ``G_ij = c (n − max(i, j))``; then
    ``(X G)_j`` needs only prefix sums of ``X`` weighted by ``(i + 1)`` or 1 and suffix sums
    weighted by ``(n − i)``.  These 1-D range and CDF Grams are the ones p-Identity serves, where
    the dense product dominates a loss evaluation."""
    recognised = structured_gram(gram)
    if recognised is None:

        def dense(x: np.ndarray, out: np.ndarray) -> np.ndarray:  # O(p n²)
            return np.matmul(x, gram, out=out)

        return dense
    kind, c = recognised
    n = gram.shape[0]
    cells = np.arange(n, dtype=np.float64)
    weight = cells + 1.0 if kind == "ranges" else np.ones(n)  # (min + 1) factor, or 1
    distance = n - cells

    def multiply(x: np.ndarray, out: np.ndarray) -> np.ndarray:  # O(p n), in place
        np.multiply(x, weight, out=out)
        np.cumsum(out, axis=-1, out=out)  # Σ_{i ≤ j} x_i w_i
        out *= distance
        x *= distance
        np.cumsum(x, axis=-1, out=x)
        np.subtract(x[..., -1:], x, out=x)  # Σ_{i > j} x_i (n − i): the total less the prefix
        x *= weight
        out += x
        out *= c
        return out

    return multiply


def structured_gram(gram: np.ndarray) -> tuple[str, float] | None:
    """``("ranges", c)`` or ``("prefix", c)`` when ``gram`` is ``c`` times that Gram (relative
    tolerance 1e-12), else None. O(n²)."""
    n = gram.shape[0]
    cells = np.arange(n, dtype=np.float64)
    c = float(gram[0, 0]) / float(n)  # both weights are n at (0, 0)
    if not c > 0:
        return None
    for kind in ("ranges", "prefix"):
        for row in range(n):  # row by row: no n × n temporaries, stops at the first mismatch
            low, high = np.minimum(cells, row), np.maximum(cells, row)
            weight = (low + 1.0) * (n - high) if kind == "ranges" else n - high
            if not np.allclose(gram[row], c * weight, rtol=1e-12, atol=0.0):
                break
        else:
            return kind, c
    return None


def pidentity_column_scales(theta: np.ndarray, *, noise: NoiseKind) -> np.ndarray:
    """Column norms ``s`` of ``[I; Θ]`` (L1 for Laplace with Θ ≥ 0, L2 for Gaussian). O(p n)."""
    if noise == "laplace":
        return 1.0 + np.abs(theta).sum(axis=0)
    return np.sqrt(1.0 + (theta * theta).sum(axis=0))


class PIdentityFactor(Factor):
    """The p-Identity strategy ``A = [I; Θ] S⁻¹`` (``S = diag(s)``, unit column norms), kept as Θ.

    O(p n) memory and products instead of the (n + p) × n matrix (140 MB at n = 4096), and the
    Gram inverse by Woodbury, ``(AᵀA)⁻¹ = S (I − Θᵀ M Θ) S`` with ``M = (I_p + ΘΘᵀ)⁻¹``: O(p n²)
    instead of the dense Gram's O(n³) Cholesky inverse.  ``AᵀA = S⁻¹(I + ΘᵀΘ)S⁻¹ ⪰ S⁻²`` is always
    positive definite.  Public: Θ comes from the workload alone.
    """

    def __init__(self, theta: np.ndarray, *, noise: NoiseKind) -> None:
        validate_noise(noise)
        theta = np.asarray(theta, dtype=np.float64)
        if theta.ndim != 2:
            raise ValueError(f"theta (shape {theta.shape}) must be a p × n matrix")
        if noise == "laplace" and np.any(theta < 0):
            raise ValueError("theta must be >= 0 for the Laplace p-Identity template")
        self.noise: NoiseKind = noise
        self.scales = pidentity_column_scales(theta, noise=noise)  # O(p n)
        self.theta = np.ascontiguousarray(theta[np.any(theta != 0.0, axis=1)])  # used rows
        super().__init__(shape=(theta.shape[1] + self.theta.shape[0], theta.shape[1]))

    def dense(self) -> np.ndarray:
        """``[I; Θ] diag(1/s)`` without the zero rows of Θ (they measure nothing). O(n² + p n)."""
        return np.vstack([np.eye(self.n), self.theta]) / self.scales

    def gram(self) -> np.ndarray:
        """``S⁻¹(I + ΘᵀΘ)S⁻¹``. O(p n²)."""
        gram = self.theta.T @ self.theta
        gram[np.diag_indices(self.n)] += 1.0
        gram /= self.scales
        gram /= self.scales[:, None]
        return gram

    def gram_inverse(self) -> tuple[np.ndarray, bool]:
        """``(S (I − Zᵀ Z) S, True)`` with ``Z = L⁻¹Θ``, ``LLᵀ = I_p + ΘΘᵀ`` (Woodbury). O(p n²)."""
        if self.theta.shape[0] == 0:  # Θ = 0: the identity
            return np.diag(self.scales**2), True
        small = self.theta @ self.theta.T  # O(p² n)
        small[np.diag_indices(small.shape[0])] += 1.0  # eigenvalues >= 1: Cholesky is stable
        lower = scipy.linalg.cholesky(small, lower=True, check_finite=False)
        z = scipy.linalg.solve_triangular(lower, self.theta, lower=True, check_finite=False)
        inverse = -(z.T @ z)  # O(p n²)
        inverse[np.diag_indices(self.n)] += 1.0
        inverse *= self.scales
        inverse *= self.scales[:, None]
        return inverse, True

    def column_norms(self, *, norm: int) -> np.ndarray:
        check_norm(norm)
        noise: NoiseKind = "laplace" if norm == 1 else "gaussian"
        return pidentity_column_scales(self.theta, noise=noise) / self.scales

    def max_abs(self) -> float:
        return float(max((1.0 / self.scales).max(), (np.abs(self.theta) / self.scales).max()))

    def row_norms_squared(self) -> np.ndarray:
        scaled = self.theta / self.scales
        return np.concatenate([self.scales**-2.0, np.einsum("ij,ij->i", scaled, scaled)])

    def _matmat(self, x: np.ndarray) -> np.ndarray:  # O(p n k)
        scaled = np.asarray(x, dtype=np.float64) / self.scales[:, None]
        return np.vstack([scaled, self.theta @ scaled])

    def _rmatmat(self, y: np.ndarray) -> np.ndarray:  # O(p n k)
        y = np.asarray(y, dtype=np.float64)
        return (y[: self.n] + self.theta.T @ y[self.n :]) / self.scales[:, None]


_LEAST_SIGNIFICANT_SHARE = 1e-8
"""The smallest loss, as a share of its leading term ``diag(G)·s²``, that
:class:`PIdentityObjective` trusts: the rounding error of the difference is about 1e-16 of the
leading term, so the loss keeps about 8 significant digits at this share."""


class PIdentityObjective:
    """Unit error ``tr(G (AᵀA)⁻¹)`` of the p-Identity strategy and its gradient in ``Θ``.

    Called with ``Θ`` (p × n) flattened row-major, ``Θ ≥ 0`` for Laplace; returns (loss, new
    gradient array).  Woodbury as in :class:`PIdentityFactor`.  O(p² n + p³) in four GEMMs, plus
    one product with ``G`` (:func:`gram_right_multiply`).  Three p × n work arrays are reused
    between calls (fresh ones cost as much in page faults as the arithmetic).
    """

    def __init__(self, gram: np.ndarray, *, p: int, noise: NoiseKind) -> None:
        self._n = gram.shape[0]
        self._p = p
        self._noise = noise
        self._diag_gram = np.array(np.diag(gram), dtype=np.float64)
        self._right_multiply = gram_right_multiply(gram)  # O(n²) once
        self._b = np.empty((p, self._n))
        self._e = np.empty((p, self._n))
        self._c = np.empty((p, self._n))

    def __call__(self, params: np.ndarray) -> tuple[float, np.ndarray]:
        p, n = self._p, self._n
        theta = params.reshape(p, n)
        if self._noise == "laplace":  # Θ ≥ 0 (the optimiser projects): no |Θ| temporary, O(p n)
            scales = theta.sum(axis=0)
            scales += 1.0
        else:
            scales = pidentity_column_scales(theta, noise=self._noise)  # O(p n)
        small = theta @ theta.T  # O(p² n)
        small[np.diag_indices(p)] += 1.0
        # M itself (potrf + potri, O(p³)): I + ΘΘᵀ has eigenvalues ≥ 1, so forming M is stable, and
        # one GEMM with Θ is much faster than a triangular solve with n right-hand sides.
        factor, info = scipy.linalg.lapack.dpotrf(small, lower=False, clean=True)
        upper, info_inverse = scipy.linalg.lapack.dpotri(factor, lower=False)
        if info != 0 or info_inverse != 0:
            return math.inf, np.zeros(p * n)
        m = np.triu(upper) + np.triu(upper, 1).T
        b, e, c = self._b, self._e, self._c
        np.matmul(m, theta, out=b)  # B = MΘ, O(p² n)
        np.multiply(b, scales, out=e)  # B S
        self._right_multiply(e, c)  # E = B S G into c (e is scratch)
        # d/ds: 2 ((G ∘ Y) s) = 2 (diag(G) s − colsum(Θ ∘ E)). O(p n)
        d_scales = self._diag_gram * scales - np.einsum("ij,ij->j", theta, c)
        d_scales *= 2.0
        c *= scales  # C = B S G S = Θ Y S G S, O(p n)
        leading = float(self._diag_gram @ (scales * scales))
        loss = leading - float(np.vdot(theta, c))
        if not loss > leading * _LEAST_SIGNIFICANT_SHARE:
            # fewer than ~8 significant digits left: Θ is so large that the rounding error of the
            # two terms exceeds the loss itself.  Outside the domain: the line search backs off.
            return math.inf, np.zeros(p * n)
        # d/dΘ with s fixed: −2 Θ Y (SGS) Y = −2 (C − (CΘᵀ) B). O(p² n)
        gradient = (c @ theta.T) @ b
        gradient -= c
        gradient *= 2.0
        if self._noise == "laplace":
            gradient += d_scales  # ∂s_j/∂Θ_kj = 1 (Θ ≥ 0)
        else:
            np.multiply(theta, d_scales / scales, out=e)  # ∂s_j/∂Θ_kj = Θ_kj / s_j
            gradient += e
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


# L-BFGS memory: 5 pairs reach the same loss per iteration as 20 at n = 1024 in less time per
# iteration (its updates cost O(maxcor · p n) per iteration).
_MAXCOR = 5


def _uniform_start_scale(p: int) -> float:
    """Scale of the uniform Laplace start: HDMM's ``Uniform[0, 1)`` up to p = 16 extra queries,
    then ``16 / p``, so a column of Θ sums to about 8 whatever p."""
    return min(1.0, 16.0 / p)


def _block_start(p: int, n: int) -> np.ndarray:
    """Θ whose row k sums the k-th of p contiguous blocks of cells (a two-level hierarchy)."""
    theta = np.zeros((p, n))
    for row, cells in enumerate(np.array_split(np.arange(n), p)):
        theta[row, cells] = 1.0
    return theta


STALL_ITERATIONS = 50
STALL_TOLERANCE = 3e-4
"""p-Identity stops once ``STALL_ITERATIONS`` L-BFGS iterations lowered the loss by less than
``STALL_TOLERANCE`` of itself (HDMM stops at a per-iteration ``ftol`` of 1e-4; a window is steadier)."""


def optimize_pidentity_factor(
    gram: np.ndarray,
    *,
    p: int,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int,
    max_iterations: int = 2000,
    initial_theta: np.ndarray | None = None,
    limit: WorkLimit | None = None,
    progress: Progress | None = None,
) -> tuple[np.ndarray, float, int, bool]:
    """Best ``Θ`` over ``restarts`` projected L-BFGS runs: (Θ, unit error, iterations, stopped).

    Θ = 0 (the identity) is always a local minimum of the Laplace loss (extra mass raises the L1
    sensitivity linearly but lowers the trace only quadratically), so Laplace starts stay away
    from it: every restart starts at HDMM's ``Uniform[0, 1)`` scaled by :func:`_uniform_start_scale`
    (bounds Θ ≥ 0), and when all of them still end at Θ = 0 (small p: n = 64, p = 4) one more run
    starts at :func:`_block_start` (a two-level hierarchy).  Gaussian restart 0 starts at the
    SVD-bound-like Θ of :func:`_gaussian_pidentity_start`, later ones perturb it with ``rng``.
    ``initial_theta`` (a warm start) replaces restart 0.  ``limit`` is checked at every loss
    evaluation (O(n² p) each); once passed, the best Θ evaluated so far (feasible: the optimiser
    evaluates only points inside the bounds) is returned with ``stopped = True``."""
    n = gram.shape[0]
    scale = max(float(np.trace(gram)) / n, 1e-300)
    normalised = gram / scale  # unit average diagonal: tolerances below are then relative
    best_theta = np.zeros((p, n))
    best_loss = float(np.sum(np.diag(normalised)))  # Θ = 0 is the identity strategy
    iterations = 0
    gaussian_start: np.ndarray | None = None
    seen = {"loss": best_loss, "theta": best_theta, "iterations": 0}
    run_losses: list[float] = []  # best loss of the current run after each iteration

    objective = PIdentityObjective(normalised, p=p, noise=noise)  # O(n²) once

    def evaluate(params: np.ndarray) -> tuple[float, np.ndarray]:
        if limit is not None:
            limit.check()
        loss, gradient = objective(params)
        if np.isfinite(loss) and loss < seen["loss"]:
            # no copy: the optimiser never writes to a point after evaluating it
            seen["loss"], seen["theta"] = loss, params.reshape(p, n)
        return loss, gradient

    def iterated(iteration: int, loss: float) -> bool:
        seen["iterations"] = iteration
        run_losses.append(min(loss, run_losses[-1] if run_losses else math.inf))
        if len(run_losses) > STALL_ITERATIONS:
            before, now = run_losses[-1 - STALL_ITERATIONS], run_losses[-1]
            if before - now <= STALL_TOLERANCE * abs(now):
                return True
        if progress is not None:
            used = math.nan if limit is None else limit.fraction_used()
            share = min(1.0, (restart + min(1.0, iteration / max_iterations)) / restarts)
            report(
                progress,
                share if math.isnan(used) else max(share, used),
                f"p-Identity (n = {n}, p = {p}): start {restart + 1} of {restarts}, "
                f"unit error {float(seen['loss']) * scale:.6g}",
            )
        return False

    identity_loss = best_loss
    for restart in range(restarts + 1):
        if limit is not None and limit.expired():
            return (*_pidentity_best(seen["theta"], seen["loss"], noise, scale, iterations), True)
        if restart == restarts:  # one extra run only when every Laplace start fell back to Θ = 0
            if noise != "laplace" or best_loss < identity_loss:
                break
            start = _block_start(p, n) + 0.1 * rng.random((p, n))
        elif restart == 0 and initial_theta is not None:
            start = np.array(initial_theta, dtype=np.float64)
        elif noise == "laplace":
            start = _uniform_start_scale(p) * rng.random((p, n))
        else:
            if gaussian_start is None:
                gaussian_start = _gaussian_pidentity_start(normalised, p, rng=rng)
            spread = 0.0 if restart == 0 else 0.3 * float(np.sqrt(np.mean(gaussian_start**2)))
            start = gaussian_start + spread * rng.standard_normal((p, n))
        seen["iterations"] = 0
        run_losses.clear()
        try:
            result = projected_lbfgs.minimize(
                evaluate,
                start.ravel(),
                nonnegative=noise == "laplace",
                memory=_MAXCOR,
                max_iterations=max_iterations,
                callback=iterated,
            )
        except TimeLimitReached:
            iterations += int(seen["iterations"])
            return (*_pidentity_best(seen["theta"], seen["loss"], noise, scale, iterations), True)
        iterations += result.iterations
        if np.isfinite(result.fun) and result.fun < best_loss:
            best_loss = float(result.fun)
            best_theta = result.x.reshape(p, n)
    return (*_pidentity_best(best_theta, best_loss, noise, scale, iterations), False)


def _pidentity_best(
    theta: object, loss: object, noise: NoiseKind, scale: float, iterations: int
) -> tuple[np.ndarray, float, int]:
    """(Θ, unit error, iterations) of a best point (Θ ≥ 0 restored for Laplace)."""
    theta = np.asarray(theta)
    if noise == "laplace":
        theta = np.maximum(theta, 0.0)
    return theta, float(loss) * scale, iterations  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True, eq=False)
class FullRankSolution:
    """Result of :func:`gaussian_full_rank`."""

    strategy_gram: np.ndarray
    """``X = AᵀA`` with unit diagonal (L2 sensitivity 1), positive definite."""
    unit_error: float
    """``tr(G X⁻¹)``: the total error at unit noise per unit L2 sensitivity."""
    lower_bound: float
    """Dual value: no strategy (any rows, L2 sensitivity 1) has a smaller ``tr(G X⁺)``."""
    iterations: int
    dual_weights: np.ndarray
    """The dual point ``v`` (a warm start for a neighbouring problem)."""
    stopped_early: bool = False
    """True when a time limit stopped the iterations (the best strategy so far is returned)."""


def gaussian_dual(gram: np.ndarray, weights: np.ndarray) -> tuple[float, np.ndarray]:
    """Dual lower bound and matching primal Gram of the L2 problem at dual point ``v > 0``.

    With ``K = V G V`` (V = diag(v)) and ``T = tr √K``: returns ``T² / ‖v‖²``, a lower bound on
    ``tr(G X⁺)`` over every X with ``diag(X) ≤ 1`` (the Lagrange dual with multipliers
    ``μ = c v²``, maximised over the scale c), and ``X_v = V⁻¹ √K V⁻¹``, the minimiser of the
    Lagrangian, whose unit error after dividing by ``max diag(X_v)`` is ``T · max diag(X_v)``.
    The dual's gradient in ``μ`` is ``diag(X_μ) − 1``.  O(n³): one eigendecomposition.
    """
    values, vectors = _eigh(gram * np.outer(weights, weights))  # O(n³)
    roots = np.sqrt(np.clip(values, 0.0, None))
    dual = float(roots.sum()) ** 2 / float(weights @ weights)
    root_k = blocked_matmul(vectors * roots, vectors.T)  # √K, O(n³), Ctrl-C between blocks
    return dual, root_k / np.outer(weights, weights)


def gaussian_full_rank(
    gram: np.ndarray,
    tolerance: float,
    max_iterations: int,
    initial_weights: np.ndarray | None,
    *,
    limit: WorkLimit | None = None,
    progress: Progress | None = None,
) -> FullRankSolution:
    """The L2-optimal strategy Gram for ``gram`` (validated, symmetric) to a relative duality gap of
    ``tolerance``.

    Deterministic (the problem is convex).  Each iteration, O(n³): eigendecompose
    ``K = V G V`` (V = diag(v)), read off the dual value ``(tr √K)² / ‖v‖²`` and the primal
    ``X_v = V⁻¹ √K V⁻¹`` repaired to a unit diagonal (by completion, thesis Lemma 3, or by
    rescaling its columns; the better one is kept), then update
    ``v_i ← v_i · (diag(X_v)_i)^{ω/2}``, a multiplicative ascent step on the dual whose gradient is
    ``diag(X_v) − 1`` (step ω = 2; ω = 1 from the first time the dual decreases).  Cells with
    ``G_ii = 0`` get an identity query.  ``limit`` is checked before every O(n³) step; once passed,
    the best strategy so far (the identity before the first iteration) and the best dual bound are
    returned with ``stopped_early``.  *Privacy*: none consumed (public workload only).

    References: Li thesis §4.2.2 (proof structure, completion Lemma 3); Yuan et al. 2016 (the
    convex L2 formulation).  The dual derivation and the fixed-point update are ours.
    """
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
    stopped = False
    first_gap = math.nan
    for _ in range(max_iterations):
        if limit is not None and limit.expired():
            stopped = True
            break
        if progress is not None and iterations > 0:
            gap = (best_error - best_bound) / max(best_bound, 1e-300)
            if math.isnan(first_gap) and math.isfinite(gap):
                first_gap = gap
            report(
                progress,
                _gap_fraction(first_gap, gap, tolerance, limit),
                f"full-rank strategy (n = {n}): iteration {iterations}, duality gap {gap:.3g}",
            )
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
            if limit is not None and limit.expired():
                break
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
    if not np.isfinite(best_error):  # stopped before the first primal: the identity
        best_error = unit_error(sub, best_gram)
    return FullRankSolution(
        strategy_gram=strategy_gram,
        unit_error=float(best_error * scale),
        lower_bound=float(min(best_bound, best_error) * scale),
        iterations=iterations,
        dual_weights=dual_weights,
        stopped_early=stopped,
    )


def _gap_fraction(first: float, gap: float, tolerance: float, limit: WorkLimit | None) -> float:
    """Share of the log duality gap closed (first gap → tolerance), or of the time used."""
    share = math.nan
    if first > tolerance and gap > 0:
        share = math.log(first / gap) / math.log(first / tolerance)
    used = math.nan if limit is None else limit.fraction_used()
    if math.isnan(share):
        return used
    return share if math.isnan(used) else max(share, used)


def strategy_from_gram(strategy_gram: np.ndarray) -> np.ndarray:
    """An ``n × n`` strategy ``A`` (upper-triangular Cholesky factor) with ``AᵀA = strategy_gram``."""
    return scipy.linalg.cholesky(strategy_gram, lower=False, check_finite=False)


def default_p(n: int) -> int:
    """HDMM's default number of extra p-Identity queries: ``max(1, n // 16)``."""
    return max(1, n // 16)


FULL_RANK_MAX_CELLS = 4096
"""Largest attribute size for the O(n³)-per-iteration full-rank Gaussian template."""


def _factor_template(noise: NoiseKind, n: int) -> str:
    """Gaussian → full rank when n ≤ :data:`FULL_RANK_MAX_CELLS`, else p-Identity; Laplace →
    p-Identity."""
    return "fullrank" if noise == "gaussian" and n <= FULL_RANK_MAX_CELLS else "pidentity"


def identity_factor(n: int, *, unit_error: float, noise: NoiseKind) -> FactorSolution:
    """The identity strategy on n cells as a factor solution (``unit_error``: its tr G)."""
    return FactorSolution(
        strategy=np.eye(n),
        unit_error=unit_error,
        template="identity",
        noise=noise,
        restarts=0,
        iterations=0,
    )


def optimize_factor(
    gram: np.ndarray,
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    p: int | None = None,
    warm_start: FactorSolution | None = None,
    warm_theta: np.ndarray | None = None,
    warm_weights: np.ndarray | None = None,
    tolerance: float = 1e-5,
    limit: WorkLimit | None = None,
    progress: Progress | None = None,
) -> tuple[FactorSolution, np.ndarray | None, np.ndarray | None]:
    """Best sensitivity-1 strategy for one attribute among identity and the template
    :func:`_factor_template` chooses (one p-Identity start).  Returns the solution plus the state
    for a warm start (Θ or dual weights).  ``gram`` must already be validated (:func:`validate_gram`).  ``limit``: an
    expired limit returns the best strategy found so far (never worse than the identity or
    ``warm_start``) with ``stopped_early``."""
    n = gram.shape[0]
    best = identity_factor(n, unit_error=float(np.trace(gram)), noise=noise)
    if warm_start is not None and warm_start.strategy.shape[1] == n:
        # the previous factor stays admissible: never return something worse than it
        x = warm_start.strategy.T @ warm_start.strategy
        previous = unit_error(gram, x)
        if previous < best.unit_error:
            best = FactorSolution(
                strategy=warm_start.strategy,
                unit_error=previous,
                template=warm_start.template,
                theta=warm_start.theta,
                noise=noise,
                restarts=0,
                iterations=0,
            )
    if n == 1:  # [1] is optimal: the bound is attained
        return dataclasses.replace(best, lower_bound=best.unit_error), warm_theta, warm_weights
    if _factor_template(noise, n) == "fullrank":
        solution = gaussian_full_rank(
            gram, tolerance, 100, warm_weights, limit=limit, progress=progress
        )
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
        best = dataclasses.replace(best, stopped_early=solution.stopped_early)
        return best, warm_theta, solution.dual_weights
    p = default_p(n) if p is None else p
    theta, error, iterations, stopped = optimize_pidentity_factor(
        gram,
        p=p,
        noise=noise,
        rng=rng,
        restarts=1,
        initial_theta=warm_theta if warm_theta is not None and warm_theta.shape == (p, n) else None,
        limit=limit,
        progress=progress,
    )
    if error < best.unit_error:  # ties go to the identity (fewer rows)
        best = FactorSolution(
            strategy=PIdentityFactor(theta, noise=noise).dense(),
            unit_error=error,
            template="pidentity",
            theta=theta,
            noise=noise,
            restarts=1,
            iterations=iterations,
        )
    return dataclasses.replace(best, stopped_early=stopped), theta, warm_weights


# p-Identity, per projected L-BFGS iteration (one BLAS thread): fixed 3e-4 s, 6e-8 s per variable
# (elementwise passes of the loss and the optimiser's O(memory·pn) products) and ~1.05 loss
# evaluations of four p × p × n GEMMs (8p²n flops; the Gram product is O(pn) for the range and
# prefix Grams p-Identity serves, O(n²p) otherwise).  Iterations until the stall rule stops a run
# modelled as 150 + 0.6·n.  Calibrated by benchmarks/predict_bench.py --calibrate templates.
_PIDENTITY_ITERATION_FIXED = 3.0e-4
_PIDENTITY_PER_VARIABLE = 6.0e-8
_PIDENTITY_EVALUATIONS_PER_ITERATION = 1.05
# Full-rank Gaussian: 2-11 iterations on the same Grams, each about 1.8 eighs (eigh of VGV, √K,
# two Cholesky inverses).
_FULL_RANK_ITERATIONS = 6
_FULL_RANK_EIGHS_PER_ITERATION = 1.8


def predict_pidentity_seconds(n: int) -> float:
    """Predicted seconds of :func:`optimize_pidentity_factor` for an n-cell attribute (the
    default p, one start, at most 2000 iterations). O(1)."""
    if n <= 1:
        return 0.0
    extra = default_p(n)
    iterations = min(2000, 150 + 0.6 * n)
    per_iteration = (
        _PIDENTITY_ITERATION_FIXED
        + _PIDENTITY_PER_VARIABLE * extra * n
        + _PIDENTITY_EVALUATIONS_PER_ITERATION * 8.0 * extra * extra * n / DGEMM_FLOPS_PER_SECOND
    )
    return iterations * per_iteration


def predict_factor_seconds(n: int, *, noise: NoiseKind) -> float:
    """Predicted seconds of :func:`optimize_factor`. O(1)."""
    validate_noise(noise)
    if n <= 1:
        return 0.0
    if _factor_template(noise, n) == "fullrank":  # gaussian_full_rank
        return _FULL_RANK_ITERATIONS * (_FULL_RANK_EIGHS_PER_ITERATION * eigh_seconds(n) + 2e-4)
    return predict_pidentity_seconds(n)
