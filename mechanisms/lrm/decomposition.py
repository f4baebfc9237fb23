"""Low-Rank Mechanism (LRM): answer a batch of linear queries through a workload factorisation.

A workload ``W`` (m×n) is factored as ``W ≈ B·L`` with ``B`` m×r and ``L`` r×n, each column of
``L`` in the unit L1 ball.  The release is ``B·(L·x + Lap(Δ(L)/ε)^r)``: the Laplace mechanism on the
r intermediate queries ``L·x``, then public post-processing by ``B``.  The factorisation minimises
the noise term ``2·Δ(L)²·‖B‖²_F/ε²`` (Lemma 1) and is found by the paper's inexact augmented
Lagrangian method (Algorithm 1) with the closed-form B-step (Eq. 9) and an accelerated projected
gradient L-step (Algorithm 2 on Eq. 10, exact per-column L1-ball projection, Eq. 11).

The factorisation depends only on the public workload (never on data or ε), so it can be cached
per workload.  The release does not use ``B`` (the relaxed program leaves ``B·L ≠ W``, a bias):
:func:`supported_measurement` extends ``L`` for unbiased least squares (see :mod:`mechanisms.lrm`).
The paper's own release, error formulas and workload families are in ``tests/reference/lrm.py``.

References:
G. Yuan, Z. Zhang, M. Winslett, X. Xiao, Y. Yang, Z. Hao, "Low-Rank Mechanism: Optimizing Batch
Queries under Differential Privacy", PVLDB 5(11), 2012 (VLDB 2012).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral

import numpy as np
import scipy.linalg

from dprelease.mechanisms.primitives.compute_limits import (
    DGEMM_FLOPS_PER_SECOND,
    Progress,
    TimeLimitReached,
    WorkLimit,
    blocked_matmul,
    interruptible,
    report,
    svd_seconds,
)
from dprelease.mechanisms.primitives.linalg import l1_sensitivity

# A row of L whose largest entry is below this fraction of L's largest entry is a dead rank-one
# component: its B column is zero after the B-step and the alternation can never revive it.
_DEAD_ROW_RELATIVE = 1e-10
# L1 mass given to a re-seeded row (spread over its n entries); small enough not to disturb the
# current iterate, large enough for the next B-step to give the component a non-zero column.
_RESEED_L1_MASS = 1e-3
# Step control of the L-step (ω is the inverse step): the first L-step starts at this many times
# the safe step 1/(β·λ_max(BᵀB)) (as in the authors' code); later ones start at _HINT_SHRINK times
# the previous accepted ω (rescaled when β grows), never at a longer step than the first one.
# Backtracking then raises ω until the exact quadratic sufficient-decrease test holds.
_FIRST_STEP_FACTOR = 100.0
_HINT_SHRINK = 0.5
# The L-step updates BᵀB·L incrementally; it is recomputed every this many steps.
_REFRESH_PERIOD = 16
# Seconds between deadline checks in the worst case (one product block or projection block).
_CHECK_INTERVAL = 0.5
# Largest array the L1-ball projection sorts in one call (about 0.1 s of work).
_PROJECTION_BLOCK = 1 << 21


@dataclass(frozen=True, kw_only=True, eq=False)
class LowRankDecomposition:
    """A workload factorisation ``W ≈ B·L`` for the Low-Rank Mechanism (public, data-free).

    ``B`` (m×r) post-processes and ``L`` (r×n) receives the noise (read-only copies; arrays, so
    ``eq=False``).  ``converged`` iff ``‖W − B·L‖_F ≤ γ`` was met (not merely an iteration cap);
    ``bias_sq = ‖W − B·L‖²_F`` (the paper's τ²: squared bias per
    unit squared L2 norm of the data, Theorem 3 with its γ corrected to γ²); ``stopped_early`` iff
    :func:`decompose` stopped at its time limit with its best exact decomposition so far.
    """

    B: np.ndarray
    L: np.ndarray
    iterations: int
    converged: bool
    bias_sq: float
    stopped_early: bool = False

    def __post_init__(self) -> None:
        factor_b = _finite_matrix(self.B, "B")
        factor_l = _finite_matrix(self.L, "L")
        if factor_b.shape[1] != factor_l.shape[0]:
            raise ValueError(
                f"B has {factor_b.shape[1]} columns but L has {factor_l.shape[0]} rows; "
                "they must be equal"
            )
        if not isinstance(self.iterations, Integral) or self.iterations < 0:
            raise ValueError(f"iterations ({self.iterations}) must be an integer >= 0")
        if not (math.isfinite(self.bias_sq) and self.bias_sq >= 0):
            raise ValueError(f"bias_sq ({self.bias_sq}) must be finite and >= 0")
        factor_b.setflags(write=False)
        factor_l.setflags(write=False)
        object.__setattr__(self, "B", factor_b)
        object.__setattr__(self, "L", factor_l)
        object.__setattr__(self, "iterations", int(self.iterations))
        object.__setattr__(self, "converged", bool(self.converged))
        object.__setattr__(self, "stopped_early", bool(self.stopped_early))
        object.__setattr__(self, "bias_sq", float(self.bias_sq))

    @property
    def rank(self) -> int:
        """r, the number of rows of ``L`` (not the rank of ``W``)."""
        return int(self.L.shape[0])


def _project_rows(rows: np.ndarray, radius: float, *, limit: WorkLimit | None = None) -> np.ndarray:
    """Project every row of a C-contiguous (n, r) array onto the L1 ball. O(n r log r).

    Rows are independent: large arrays go in blocks of :data:`_PROJECTION_BLOCK` entries, with
    ``limit`` checked (and Ctrl-C seen) between blocks; the result is the same.
    """
    if rows.size <= _PROJECTION_BLOCK:
        return _project_block(rows, radius)
    step = max(1, _PROJECTION_BLOCK // rows.shape[1])
    out = np.empty_like(rows)
    for start in range(0, rows.shape[0], step):
        if limit is not None:
            limit.check()
        out[start : start + step] = _project_block(rows[start : start + step], radius)
    return out


def _project_block(rows: np.ndarray, radius: float) -> np.ndarray:
    magnitudes = np.abs(rows)
    if magnitudes.sum(axis=1).max() <= radius:
        return rows.copy()
    ascending = np.sort(magnitudes, axis=1)
    descending = ascending[:, ::-1]  # u_1 ≥ u_2 ≥ … (a view)
    excess = np.cumsum(descending, axis=1)  # Σ_{i≤k} u_i
    excess -= radius
    ascending *= np.arange(rows.shape[1], 0, -1, dtype=rows.dtype)  # descending now holds k·u_k
    # The support size ρ is the length of the prefix where k·u_k > Σ_{i≤k} u_i − radius.
    support = np.count_nonzero(descending > excess, axis=1)
    threshold = np.take_along_axis(excess, (support - 1)[:, None], axis=1)
    threshold /= support[:, None]
    np.maximum(threshold, 0.0, out=threshold)  # rows inside the ball: threshold 0, unchanged
    magnitudes -= threshold
    np.maximum(magnitudes, 0.0, out=magnitudes)
    return np.copysign(magnitudes, rows, out=magnitudes)


def decompose(
    W: np.ndarray,
    *,
    rank: int | None = None,
    rng: np.random.Generator,
    gamma: float = 0.01,
    max_outer: int = 300,
    max_inner: int = 5,
    max_gradient_steps: int = 5,
    beta_growth: float = 2.0,
    beta_period: int = 10,
    beta_max: float = 1e10,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> LowRankDecomposition:
    """Factor ``W ≈ B·L`` minimising ``‖B‖²_F`` with every column of ``L`` in the unit L1 ball.

    Solves the relaxed program (8), ``min tr(BᵀB)`` s.t. ``‖W − B·L‖_F ≤ γ`` and
    ``Σ_i |L_ij| ≤ 1``, by the inexact augmented Lagrangian method (Algorithm 1): per outer
    iteration, ``max_inner`` alternations of an L-step (Algorithm 2: accelerated projected
    gradient on Eq. 10, exact L1-ball projection) and the closed-form B-step (Eq. 9), then
    ``π ← π + β·(W − B·L)``; β is multiplied by ``beta_growth`` every ``beta_period`` outer
    iterations (paper: doubled every 10).  Uses neither data nor ε.

    ``rank`` is the inner dimension r, default ``⌈1.2·rank(W)⌉`` (Table 1); ``rng`` is public
    randomness (re-seeding dead rank-one components); ``gamma`` is the stopping tolerance on
    ``τ = ‖W − B·L‖_F`` (Table 1: 0.01; 0 runs to the caps).  ``max_inner`` is N_in of §5 and
    ``max_gradient_steps`` the steps per L-step (authors' code: 5 and 5); the paper gives no
    ``max_outer``.  β stops growing at ``beta_max`` ("β sufficiently large", Alg. 1 line 8).
    ``time_limit``: stop at the next safe point (checked at least every ~0.5 s of work, time kept
    in reserve) and return the best *exact* decomposition so far (``stopped_early=True``,
    :func:`_stopped_result`); noise on data at once if even the SVD would overrun; ``None`` is
    bit-identical to no limit.  ``progress(fraction, message)`` after every outer iteration.

    Privacy: none spent; the release calibrates the noise to the sensitivity of the matrix it
    measures, so the result is safe to use even if the optimiser is stopped early.

    Cost: one SVD ``O(mn·min(m, n))``, then per alternation ``O(mnr + nr² + r³ + n·r log r)``
    (the paper's ``O(r²(m+n))`` omits the ``mnr`` products with W and π and the r×r
    factorisations).  Memory ``O(mn + (m+n)r)``.  Ctrl-C is seen within about half a second.

    Decisions (paper's §5 and Algorithms 1-2 silent or inconsistent):

    - initial point from the SVD (Lemma 3's ``B = √r·UΣ``, ``L = Vᵀ/√r``; rows beyond rank(W)
      start at zero and are revived by the guard below); β₀ = 1, π₀ = 0 (paper);
    - each outer iteration runs ``max_inner`` alternations, L-step then B-step (authors' code
      order), then updates π with the new β (Alg. 1 line 12); defaults follow the paper's
      schedule (β doubles every 10 iterations), which gave clearly better decompositions than
      the authors' code's ×5 every 8 in our runs, at about twice the iterations;
    - Algorithm 2 is standard FISTA; the backtracking test is at the projected point with
      ∇G(S); ω is carried between L-steps (see ``_HINT_SHRINK``) and never exceeds the safe
      ``β·λ_max(BᵀB)``; stop after ``max_gradient_steps`` or when ``‖S − L_new‖_F < r·n·10⁻¹²``;
    - the L-step is an inexact inner solver and runs in float32 (its cost is memory-bound sorting
      and elementwise work); its result is returned in float64 and rescaled into the balls, and
      everything that defines the output (B-step, residual, multipliers) is float64;
    - dead rank-one components (rows of L that the exact projection set to zero) are re-seeded
      with a random row of L1 mass 10⁻³ and the columns rescaled into the ball (the §2.5 guard;
      without it the alternation stalls at τ ≈ 2.1 on Example 2).

    Run it under :func:`mechanisms.primitives.threads.single_threaded_blas` (spinning OpenBLAS
    threads make small decompositions many times slower under load).

    Examples
    --------
    The paper's Example 2 (noise on data: 40/ε²; the paper's hand-made strategy: 39/ε²):

    >>> W = np.array([[0, 2, 1, 1], [0, 1, 0, 2], [1, 0, 2, 2]], dtype=float)
    >>> decomposition = decompose(W, rng=np.random.default_rng(0))
    >>> decomposition.rank, decomposition.converged
    (4, True)
    >>> noise = 2 * l1_sensitivity(decomposition.L) ** 2 * float(np.sum(decomposition.B**2))  # ε=1
    >>> round(noise + decomposition.bias_sq, 1)
    38.0
    """
    limit = WorkLimit(time_limit=time_limit)
    workload = _finite_matrix(W, "W")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if rank is None and not np.any(workload):
        raise ValueError("W has rank 0 (all zero); there is nothing to decompose")
    requested_rank = None if rank is None else _positive_int(rank, "rank")
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma ({gamma}) must be finite and >= 0")
    max_outer = _positive_int(max_outer, "max_outer")
    max_inner = _positive_int(max_inner, "max_inner")
    max_gradient_steps = _positive_int(max_gradient_steps, "max_gradient_steps")
    beta_period = _positive_int(beta_period, "beta_period")
    if not (math.isfinite(beta_growth) and beta_growth >= 1):
        raise ValueError(f"beta_growth ({beta_growth}) must be finite and >= 1")
    if not (beta_max > 1):
        raise ValueError(f"beta_max ({beta_max}) must be > 1 (β starts at 1)")
    if not np.any(workload):
        raise ValueError("W is all zero; there is nothing to decompose")

    m, n = workload.shape
    report(progress, 0.0, f"LRM: SVD of the {m}×{n} workload")
    if time_limit is not None:  # keep time to assemble the result after the last safe point
        guess = requested_rank or (6 * min(m, n) + 4) // 5
        reserve = _finish_seconds(m, n, guess, max_inner)
        limit = WorkLimit(time_limit=max(0.0, time_limit - reserve), started=limit.started)
    if svd_seconds(m, n) > limit.remaining():
        return _stopped_result(workload, [], gamma=gamma, iterations=0)
    left, singular, right_t = interruptible(  # O(mn·min(m, n)), one LAPACK call
        lambda: np.linalg.svd(workload, full_matrices=False),
        flops=svd_seconds(m, n) * DGEMM_FLOPS_PER_SECOND,
    )
    workload_rank_value = _numerical_rank(singular, m, n)  # numpy's matrix_rank tolerance
    inner_dim = (6 * workload_rank_value + 4) // 5 if requested_rank is None else requested_rank
    factor_b, factor_lt = _svd_initial_point(
        left, singular, right_t, workload_rank_value, inner_dim
    )
    del left, right_t
    multiplier = np.zeros_like(workload)
    beta = 1.0
    stop_step = inner_dim * n * 1e-12
    tau = first_tau = math.inf
    omega_hint = 0.0
    iteration = 0
    # With a time limit: the outer-iteration end whose exact completion has the lowest noise.
    best_bound, checkpoint = math.inf, (factor_b, factor_lt)
    try:
        while iteration < max_outer:
            limit.check()
            iteration += 1
            target_t = np.ascontiguousarray((beta * workload + multiplier).T)  # (βW + π)ᵀ, n×m
            for inner in range(max_inner):
                limit.check()
                new_lt, omega_hint = _l_step(
                    factor_b,
                    factor_lt,
                    target_t,
                    beta,
                    max_gradient_steps,
                    stop_step,
                    omega_hint,
                    limit=limit,
                )
                _reseed_dead_rows(new_lt, rng)
                factor_b = _b_step(new_lt, target_t, beta, limit=limit)
                factor_lt = new_lt  # (B, Lᵀ) is a completed alternation: a safe point
                if progress is not None and inner + 1 < max_inner:
                    report(
                        progress,
                        _lrm_fraction(iteration - 1, max_outer, tau, first_tau, gamma, limit),
                        f"LRM: outer iteration {iteration} of at most {max_outer}, "
                        f"alternation {inner + 1} of {max_inner}",
                    )
            residual = workload - blocked_matmul(factor_b, factor_lt.T, limit=limit)  # O(mnr)
            tau = float(np.linalg.norm(residual))
            first_tau = tau if math.isinf(first_tau) else first_tau
            if time_limit is not None:
                _, bound = _completion(factor_b, factor_lt, residual)  # O(mn + nr)
                if bound < best_bound:
                    best_bound, checkpoint = bound, (factor_b, factor_lt)
            report(
                progress,
                _lrm_fraction(iteration, max_outer, tau, first_tau, gamma, limit),
                f"LRM: outer iteration {iteration} of at most {max_outer}, "
                f"residual {tau:.3g} (target {gamma:g})",
            )
            if tau <= gamma or beta >= beta_max:
                break
            if iteration % beta_period == 0:
                omega_hint *= min(beta * beta_growth, beta_max) / beta
                beta = min(beta * beta_growth, beta_max)
            multiplier += beta * residual
    except TimeLimitReached:
        iterates = [(factor_b, factor_lt)]
        if checkpoint[0] is not factor_b:
            iterates.append(checkpoint)
        return _stopped_result(workload, iterates, gamma=gamma, iterations=iteration)

    report(progress, 1.0, f"LRM: done after {iteration} outer iterations, residual {tau:.3g}")
    factor_l = np.ascontiguousarray(factor_lt.T)
    return _decomposition(factor_b, factor_l, tau, iterations=iteration, gamma=gamma)


# Cost model of one outer iteration at the default max_inner = max_gradient_steps = 5 (seconds,
# one BLAS thread): c0 + c1·mnr + c2·mr² + c3·r³ + c4·nr·log2(r) + c5·mn, fitted on WRange
# workloads (benchmarks/predict_bench.py --calibrate lrm).  Runs to γ = 0.01 took 86-135 outer
# iterations on the paper's workload families, so a run is predicted at _TYPICAL_OUTER.
_OUTER_COEFFICIENTS = (7.5e-3, 1.35e-10, 1.0e-9, 8.9e-10, 1.27e-7, 2.2e-7)
_TYPICAL_OUTER = 150


def predict_seconds(num_queries: int, num_cells: int) -> float:
    """Predicted seconds of :func:`decompose` (its defaults) on an ``m×n`` workload, from sizes
    only: the SVD plus :data:`_TYPICAL_OUTER` outer iterations of the fitted cost model at
    ``r = ⌈1.2·min(m, n)⌉`` (``min(m, n)`` bounds the workload's rank; one BLAS thread, an idle
    core).  O(1).
    """
    m, n = _positive_int(num_queries, "num_queries"), _positive_int(num_cells, "num_cells")
    rank = (6 * min(m, n) + 4) // 5
    return svd_seconds(m, n) + _TYPICAL_OUTER * _outer_seconds(m, n, rank, 5)


def _outer_seconds(m: int, n: int, r: int, max_inner: int) -> float:
    """Predicted seconds of one outer iteration (``_OUTER_COEFFICIENTS``). O(1)."""
    c0, c1, c2, c3, c4, c5 = _OUTER_COEFFICIENTS
    alternations = c1 * m * n * r + c2 * m * r * r + c3 * r**3 + c4 * n * r * math.log2(max(r, 2))
    return c0 + max_inner / 5.0 * alternations + c5 * m * n


def _lrm_fraction(
    iteration: int, max_outer: int, tau: float, first_tau: float, gamma: float, limit: WorkLimit
) -> float:
    """Share of the work done: the largest of three public progress measures, in [0, 1]."""
    shares = [iteration / max_outer]
    if gamma > 0 and math.isfinite(first_tau) and first_tau > gamma and 0 < tau < first_tau:
        shares.append(math.log(first_tau / tau) / math.log(first_tau / gamma))
    used = limit.fraction_used()
    if not math.isnan(used):
        shares.append(used)
    return min(1.0, max(shares))


def _numerical_rank(singular: np.ndarray, m: int, n: int) -> int:
    """Singular values above σ_max·max(m, n)·eps (numpy's ``matrix_rank`` default)."""
    tolerance = singular[0] * max(m, n) * np.finfo(np.float64).eps
    return int(np.count_nonzero(singular > tolerance))


def _stopped_result(
    workload: np.ndarray,
    iterates: list[tuple[np.ndarray, np.ndarray]],
    *,
    gamma: float,
    iterations: int,
) -> LowRankDecomposition:
    """Best exact decomposition available when ``decompose`` stops at its time limit.

    Candidates: noise on data (``B = W``, ``L = I``: exact, noise ``‖W‖²_F``) and, for every
    ``(B, Lᵀ)`` in ``iterates``, with ``R = W − B·L``: the iterate itself if ``‖R‖_F ≤ γ``,
    else the completion of :func:`_completion` (exact, columns in the unit L1 ball).  The one
    with the lowest noise ``Δ(L)²‖B‖²_F`` is returned.  O(mnr) per iterate.
    """
    n = workload.shape[1]
    best_noise = float(np.sum(workload * workload))
    best = (workload, np.eye(n), 0.0)  # W·I = W exactly
    for factor_b, factor_lt in iterates:
        factor_l = np.ascontiguousarray(factor_lt.T)
        residual = workload - factor_b @ factor_l  # O(mnr)
        tau = float(np.linalg.norm(residual))
        if tau <= gamma:
            noise = l1_sensitivity(factor_l) ** 2 * float(np.sum(factor_b * factor_b))
            if noise < best_noise:
                best_noise, best = noise, (factor_b, factor_l, tau)
            continue
        alpha, bound = _completion(factor_b, factor_lt, residual)
        if bound >= best_noise:
            continue
        slack = 1.0 - alpha * np.abs(factor_l).sum(axis=0)  # > 0: every column L1 norm ≤ 1
        scaled_b, scaled_r = factor_b / alpha, residual / slack
        completed_l = np.zeros((factor_l.shape[0] + n, n))
        completed_l[: factor_l.shape[0]] = factor_l * alpha
        completed_l[factor_l.shape[0] :][np.diag_indices(n)] = slack
        completed_b = np.hstack([scaled_b, scaled_r])
        noise = l1_sensitivity(completed_l) ** 2 * float(np.sum(completed_b * completed_b))
        if noise < best_noise:
            # B'·L' = (B/α)(αL) + (R/s)·diag(s): the diagonal block needs no product.
            formed = scaled_b @ completed_l[: factor_l.shape[0]]  # O(mnr)
            formed += scaled_r * slack
            completed_tau = float(np.linalg.norm(workload - formed))
            best_noise, best = noise, (completed_b, completed_l, completed_tau)
    return _decomposition(*best, iterations=iterations, gamma=gamma, stopped_early=True)


def _completion(
    factor_b: np.ndarray, factor_lt: np.ndarray, residual: np.ndarray
) -> tuple[float, float]:
    """``(α, noise)`` of the exact completion ``[B/α, R·diag(1/s)]·[αL; diag(s)] = W`` with
    ``s_j = 1 − α‖L_j‖₁``: every column of the new L has L1 norm exactly 1 (given ``‖L_j‖₁ ≤ 1``)
    and its noise is ``f(α) = a/α² + Σ_j ‖R_j‖²/s_j²`` (``a = ‖B‖²_F``), convex on (0, 1) and
    minimised by a bounded scalar search.  With uniform ``s = 1 − α`` it is at most
    ``(a^⅓ + b^⅓)³`` (``b = ‖R‖²_F``), the value at the uniform optimum ``α = a^⅓/(a^⅓ + b^⅓)``.
    O(mn + nr)."""
    scale = float(np.sum(factor_b * factor_b))
    if not scale > 0:
        return 0.5, math.inf
    column_l1 = np.minimum(np.abs(factor_lt).sum(axis=1), 1.0)  # ‖L_j‖₁, ≤ 1 by feasibility
    column_r2 = np.einsum("ij,ij->j", residual, residual)  # ‖R_j‖²

    def noise(alpha: float) -> float:
        return scale / alpha**2 + float(np.sum(column_r2 / (1.0 - alpha * column_l1) ** 2))

    root_b, root_r = scale ** (1 / 3), float(column_r2.sum()) ** (1 / 3)
    uniform = root_b / (root_b + root_r)
    import scipy.optimize  # imported here: 0.2 s that planning from the strategy store never needs

    result = scipy.optimize.minimize_scalar(
        noise, bounds=(uniform * 1e-3, 1.0 - (1.0 - uniform) * 1e-3), method="bounded"
    )
    best = min((float(result.x), uniform), key=noise)
    return best, noise(best)


def _decomposition(
    factor_b: np.ndarray,
    factor_l: np.ndarray,
    tau: float,
    *,
    iterations: int,
    gamma: float,
    stopped_early: bool = False,
) -> LowRankDecomposition:
    return LowRankDecomposition(
        B=factor_b,
        L=factor_l,
        iterations=iterations,
        converged=tau <= gamma,
        bias_sq=tau * tau,
        stopped_early=stopped_early,
    )


def _finish_seconds(m: int, n: int, inner_dim: int, max_inner: int) -> float:
    """Seconds kept in reserve for ``_stopped_result`` on two iterates after the last check:
    twice the predicted gap between checks (at most ``_CHECK_INTERVAL``) plus three times the
    predicted work (a loaded machine runs slower than the calibration)."""
    gap = min(_CHECK_INTERVAL, _outer_seconds(m, n, inner_dim, max_inner) / max_inner)
    flops = 2 * (2.0 * m * n * inner_dim * 2 + 30.0 * m * (n + inner_dim))
    return 2 * gap + 1.5 * flops / DGEMM_FLOPS_PER_SECOND


def _svd_initial_point(
    left: np.ndarray,
    singular: np.ndarray,
    right_t: np.ndarray,
    workload_rank_value: int,
    inner_dim: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Lemma 3's feasible point ``(B, Lᵀ) = (√r·U_kΣ_k, V_k/√r)``, k = min(r, rank): columns of
    ``V_k`` have L2 norm ≤ 1, so L1 ≤ √k ≤ √r and ``Δ(L) ≤ 1``."""
    m, n = left.shape[0], right_t.shape[1]
    kept = min(inner_dim, workload_rank_value)
    factor_b = np.zeros((m, inner_dim))
    factor_lt = np.zeros((n, inner_dim))
    factor_b[:, :kept] = left[:, :kept] * (singular[:kept] * math.sqrt(inner_dim))
    factor_lt[:, :kept] = right_t[:kept].T / math.sqrt(inner_dim)
    return factor_b, factor_lt


def _b_step(
    factor_lt: np.ndarray, target_t: np.ndarray, beta: float, *, limit: WorkLimit | None = None
) -> np.ndarray:
    """Eq. (9): ``B = (βW + π)Lᵀ(βLLᵀ + I)⁻¹`` by a Cholesky solve (eigenvalues ≥ 1).
    O(mnr + nr² + r³)."""
    inner_dim = factor_lt.shape[1]
    system = beta * blocked_matmul(factor_lt.T, factor_lt, limit=limit)  # O(n r²)
    system[np.diag_indices(inner_dim)] += 1.0
    right_side = blocked_matmul(factor_lt.T, target_t, limit=limit)  # ((βW + π)Lᵀ)ᵀ, O(mnr)
    factor = scipy.linalg.cho_factor(system, lower=False, overwrite_a=True, check_finite=False)
    return scipy.linalg.cho_solve(factor, right_side, overwrite_b=True, check_finite=False).T


def _l_step(
    factor_b: np.ndarray,
    factor_lt: np.ndarray,
    target_t: np.ndarray,
    beta: float,
    max_steps: int,
    stop_step: float,
    omega_hint: float,
    dtype: type[np.floating] = np.float32,
    *,
    limit: WorkLimit | None = None,
) -> tuple[np.ndarray, float]:
    """Algorithm 2 on Eq. (10): FISTA with backtracking for ``min G(L)`` over the L1 balls.

    ``G(L) = β/2·⟨BᵀB·L, L⟩ − ⟨Bᵀ(βW + π), L⟩``, on ``Lᵀ`` (n×r: each column of L contiguous).
    G is quadratic, so the sufficient-decrease test is exactly ``β⟨D, BᵀB·D⟩ ≤ ω‖D‖²``
    (``D = L⁺ − S``) and ``BᵀB·L⁺ = BᵀB·S + BᵀB·D`` is reused: one O(n r²) product and one
    O(n r log r) projection per trial step.  ``omega_hint`` is the previous accepted ω (0 for
    none).  Returns the new Lᵀ (float64, feasible) and the last ω."""
    gram64 = blocked_matmul(factor_b.T, factor_b, limit=limit)  # O(m r²)
    top = gram64.shape[0] - 1
    safe_omega = beta * float(
        interruptible(
            lambda: scipy.linalg.eigvalsh(gram64, subset_by_index=[top, top])[0],
            flops=4.0 * float(top + 1) ** 3,  # tridiagonal reduction dominates
        )
    )
    gram = gram64.astype(dtype)
    linear_t = blocked_matmul(target_t, factor_b, limit=limit).astype(dtype)  # −∇G(0)ᵀ, O(mnr)
    factor_lt = factor_lt.astype(dtype)
    if not safe_omega > 0:  # B = 0: G is linear; any step is exact after projection
        safe_omega = 1.0
    omega = min(max(omega_hint * _HINT_SHRINK, safe_omega / _FIRST_STEP_FACTOR), safe_omega)
    previous = current = factor_lt
    gram_previous = gram_current = blocked_matmul(factor_lt, gram, limit=limit)  # O(n r²)
    momentum_prev, momentum = 1.0, 1.0
    for step in range(max_steps):
        if step == 0:
            search, gram_search = current, gram_current
        else:
            weight = (momentum_prev - 1.0) / momentum
            search = current - previous
            search *= weight
            search += current
            gram_search = gram_current - gram_previous
            gram_search *= weight
            gram_search += gram_current
        descent = gram_search * (-beta)
        descent += linear_t  # −∇G(S)
        while True:
            point = descent * (1.0 / omega)
            point += search
            candidate = _project_rows(point, 1.0, limit=limit)  # O(n r log r)
            move = candidate - search
            gram_move = blocked_matmul(move, gram, limit=limit)  # O(n r²)
            move_sq = float(np.vdot(move, move))
            curvature = beta * float(np.vdot(move, gram_move))
            if curvature <= omega * move_sq * (1.0 + 1e-12) or omega >= safe_omega:
                break
            omega = min(max(2.0 * omega, curvature / move_sq), safe_omega)
        previous, gram_previous = current, gram_current
        gram_move += gram_search
        current, gram_current = candidate, gram_move
        if step % _REFRESH_PERIOD == _REFRESH_PERIOD - 1:
            # Bound the rounding drift of the running products; both are refreshed, or the
            # extrapolation (weight → 1) would turn their mismatch into a linearly growing error.
            gram_previous = blocked_matmul(previous, gram, limit=limit)
            gram_current = blocked_matmul(current, gram, limit=limit)
        momentum_prev, momentum = momentum, (1.0 + math.sqrt(1.0 + 4.0 * momentum * momentum)) / 2
        if math.sqrt(move_sq) < stop_step:
            break
    # In float32 a projected row can exceed the ball by a rounding error; a float64 rescale of such
    # rows (a feasible map, change ~1e-7) makes the returned iterate feasible.
    result = current.astype(np.float64)
    result /= np.maximum(np.abs(result).sum(axis=1), 1.0)[:, None]
    return result, omega


def _reseed_dead_rows(factor_lt: np.ndarray, rng: np.random.Generator) -> None:
    """Give every all-zero row of L (column of Lᵀ) a small random direction, in place, then
    rescale every column of L into the unit L1 ball (a feasible map). O(n r)."""
    row_peaks = np.abs(factor_lt).max(axis=0)
    dead = row_peaks <= _DEAD_ROW_RELATIVE * max(float(row_peaks.max()), 1.0)
    dead_count = int(np.count_nonzero(dead))
    if dead_count == 0:
        return
    n = factor_lt.shape[0]
    factor_lt[:, dead] = rng.standard_normal((n, dead_count)) * (_RESEED_L1_MASS / n)
    column_l1 = np.abs(factor_lt).sum(axis=1)
    factor_lt /= np.maximum(column_l1, 1.0)[:, None]


# Singular values of L below this fraction of its largest are treated as absent: W's weight on such
# a near-dead direction is carried by a well-scaled appended row instead of being amplified ≥ 1e5×.
SUPPORT_RCOND = 1e-5
# ``W`` counts as supported when the part of it outside the row space of the measured matrix has
# Frobenius norm at most this fraction of ‖W‖_F (floating-point round-off, not a bias).
SUPPORT_RTOL = 1e-10
# Candidate scales of the appended rows: this many, log-spaced over 6 decades around the scale
# that gives them the same column-L1 mass as L (the total noise is flat near its minimum).
_SCALE_GRID = 241


@dataclass(frozen=True, kw_only=True, eq=False)
class SupportedMeasurement:
    """The measured matrix ``[L; c·D]`` whose least-squares estimator answers ``W`` without bias.

    ``matrix`` is ``L`` with ``appended = k`` rows ``c·D`` (``D`` orthonormal rows spanning the
    part of the row space of ``W`` that ``L`` misses; ``matrix is L`` and ``scale = 0`` when
    ``k = 0``).  ``missed_norm = ‖W − W·P_L‖_F``, the part of ``W`` outside the row space of ``L``
    (``P_L`` the projector onto it): the paper's estimator ``B·L`` is biased at least by this much
    per unit ``‖x‖₂`` in Frobenius norm; the least-squares answer from ``matrix`` is not.
    """

    matrix: np.ndarray
    appended: int
    scale: float
    missed_norm: float


def supported_measurement(W: np.ndarray, L: np.ndarray) -> SupportedMeasurement:
    """Extend the strategy ``L`` so that ``W`` lies in its row space (the answer is unbiased).

    The release answers ``W·x̂`` with ``x̂ = (AᵀA)⁺Aᵀy`` the least-squares estimate from the noisy
    ``y = A·x + η`` (``A`` the returned matrix).  That answer is unbiased iff ``W·A⁺·A = W``, and
    then its noise covariance is exactly ``σ²·W(AᵀA)⁺Wᵀ`` (σ² the per-answer noise variance).  A
    relaxed LRM decomposition (stopped by γ, the time limit or the iteration cap) can leave part of
    ``W`` outside the row space of ``L``; those directions ``D`` (orthonormal, from the SVD of the
    missed part ``R = W − W·P_L``) are appended as ``c·D``.  Because ``D ⊥ rowspace(L)``, the
    unit-noise total is ``Δ(c)²·(‖W·L⁺‖²_F + ‖R‖²_F/c²)`` with ``Δ(c) = max_j(‖L_:j‖₁ + c‖D_:j‖₁)``;
    ``c`` minimises it over a log grid.  Privacy: the release calibrates to the sensitivity of the
    returned matrix (appending rows raises it); nothing here reads data.
    O(r n min(r, n) + m n min(m, n)) for the two SVDs."""
    workload = _finite_matrix(W, "W")
    strategy = _finite_matrix(L, "L")
    if workload.shape[1] != strategy.shape[1]:
        raise ValueError(
            f"W has {workload.shape[1]} columns but L has {strategy.shape[1]}; both must span "
            "the same cells"
        )
    _, singular, right = np.linalg.svd(strategy, full_matrices=False)  # O(r n min(r, n))
    keep = singular > SUPPORT_RCOND * singular[0] if singular[0] > 0 else singular < 0
    basis, kept = right[keep], singular[keep]
    inside = workload @ basis.T  # O(m n k)
    missed = workload - inside @ basis
    missed_norm = float(np.linalg.norm(missed))
    threshold = SUPPORT_RTOL * float(np.linalg.norm(workload))
    if missed_norm <= threshold:
        return SupportedMeasurement(matrix=L, appended=0, scale=0.0, missed_norm=missed_norm)
    _, missed_singular, missed_right = np.linalg.svd(missed, full_matrices=False)
    directions = missed_right[missed_singular > threshold]  # O(m n min(m, n)) above
    kept_total = float(np.sum((inside / kept) ** 2))  # ‖W·L⁺‖²_F over the kept directions
    columns_l = np.abs(strategy).sum(axis=0)
    columns_d = np.abs(directions).sum(axis=0)
    scale = best_append_scale(columns_l, columns_d, kept_total, missed_norm**2)
    return SupportedMeasurement(
        matrix=np.vstack([strategy, scale * directions]),
        appended=int(directions.shape[0]),
        scale=scale,
        missed_norm=missed_norm,
    )


def best_append_scale(
    columns_l: np.ndarray, columns_d: np.ndarray, kept_total: float, missed_sq: float
) -> float:
    """The grid ``c`` minimising ``max_j(l_j + c·d_j)²·(kept_total + missed_sq/c²)``. O(grid·n)."""
    unit = max(float(columns_l.max()), 1.0) / float(columns_d.max())
    candidates = unit * np.logspace(-4.0, 2.0, _SCALE_GRID)
    sensitivity = (columns_l[None, :] + candidates[:, None] * columns_d[None, :]).max(axis=1)
    totals = sensitivity**2 * (kept_total + missed_sq / candidates**2)
    return float(candidates[int(np.argmin(totals))])


def _finite_matrix(matrix: np.ndarray, name: str) -> np.ndarray:
    values = np.array(matrix, dtype=np.float64, copy=True)
    if values.ndim != 2 or values.size == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} must be finite")
    return values


def _positive_int(value: int, name: str) -> int:
    if not isinstance(value, Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} ({value!r}) must be an integer >= 1")
    return int(value)
