"""The strategy optimiser of Problem 3.12 of [McKenna20] (see :mod:`mechanisms.local`): an ε-LDP
``Q`` for a workload, and its cost model.  Uses no data: its output is public."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from dprelease.mechanisms.local.estimation import workload_matrix
from dprelease.mechanisms.local.randomizer import LDPStrategy, check_size, enforce_row_ratio
from dprelease.mechanisms.primitives.compute_limits import Progress, WorkLimit, report
from dprelease.mechanisms.primitives.privacy import check_epsilon
from dprelease.mechanisms.primitives.threads import single_threaded_blas

# Outputs whose lower bound z_o falls to this probability are removed by the optimiser.
_PRUNE_PROBABILITY = 1e-10
# SPG phase: non-monotone Armijo over the last few objective values (Birgin, Martinez, Raydan).
_SPG_MEMORY = 10
_ARMIJO_FRACTION = 1e-4
# Largest step, in units of (widest row window) / max |gradient|; beyond it every coordinate clips.
_MAX_STEP_WIDTHS = 1e3
# Paper-step phase: z moves by this fraction of Algorithm 2's beta / (n e^eps) (the paper's 1
# ends clearly worse; chosen with benchmarks/ldp_bench.py).
_BOUND_STEP_FRACTION = 0.01
_STEP_GROWTH = 1.25
# A phase ends when the objective fell by less than `tolerance` (relative) over this many steps.
_PROGRESS_WINDOW = 50
# Projection root finding: stop when every column sums to 1 within m * this (the rounding of a sum
# of m terms), or after this many steps (bisection alone resolves a double in ~1100 halvings).
_PROJECTION_SUM_ULPS = 2.0**-52
_PROJECTION_MAX_STEPS = 200


def _project_columns(points: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Euclidean projection of every column of ``points`` onto ``{q : 1^T q = 1, lower <= q <= upper}``.

    The projection is ``clip(r + λ, lower, upper)`` where ``λ`` solves ``f(λ) = 1`` for the
    piecewise-linear, non-decreasing ``f(λ) = Σ_o clip(r_o + λ, lower_o, upper_o)`` (§4.1 of
    [McKenna20]; its Algorithm 1 finds the same ``λ`` by sorting the ``2m`` breakpoints).  Here
    ``λ`` is found by Newton steps on ``f`` (slope = number of free coordinates) inside a bracket
    ``f(a) <= 1 <= f(b)``, bisecting whenever a Newton step leaves it: a Newton step from a point
    on the root's linear piece lands on the root, so few steps are needed and the result is exact
    up to rounding.  Needs ``Σ lower <= 1 <= Σ upper``.  Cost ``O(n m)`` per step, on the columns
    not yet resolved.
    """
    shifted = np.ascontiguousarray(points.T)  # n x m: one projected column per row
    num_rows = shifted.shape[1]
    bracket_low = (lower - shifted).min(axis=1)  # f = Σ lower <= 1
    bracket_high = (upper - shifted).max(axis=1)  # f = Σ upper >= 1
    shift = np.clip((1.0 - shifted.sum(axis=1)) / num_rows, bracket_low, bracket_high)
    active = np.arange(shifted.shape[0])
    for _ in range(_PROJECTION_MAX_STEPS):
        moved = shifted[active] + shift[active, None]  # O(|active| m)
        excess = np.clip(moved, lower, upper).sum(axis=1) - 1.0
        unresolved = np.abs(excess) > num_rows * _PROJECTION_SUM_ULPS
        active, moved, excess = active[unresolved], moved[unresolved], excess[unresolved]
        if active.size == 0:
            break
        num_free = ((moved > lower) & (moved < upper)).sum(axis=1)
        current = shift[active]
        low = np.where(excess < 0, current, bracket_low[active])
        high = np.where(excess > 0, current, bracket_high[active])
        bracket_low[active], bracket_high[active] = low, high
        newton = current - excess / np.maximum(num_free, 1)
        inside = (num_free > 0) & (newton > low) & (newton < high)
        shift[active] = np.where(inside, newton, (low + high) / 2.0)
    projected = np.clip(shifted + shift[:, None], lower, upper)
    # One Newton step on the free coordinates removes the remaining rounding of the sums.
    free = (projected > lower) & (projected < upper)
    correction = (1.0 - projected.sum(axis=1)) / np.maximum(free.sum(axis=1), 1)
    projected = np.clip(projected + free * correction[:, None], lower, upper)
    return projected.T


@dataclass(frozen=True)
class _Evaluation:
    """Objective ``L(Q) = tr(X^-1 G)`` at one iterate, with what its gradient reuses."""

    value: float
    scaled: np.ndarray  # A = D^-1 Q
    cholesky: tuple[np.ndarray, bool]
    solved: np.ndarray  # X^-1 G


def _evaluate(matrix: np.ndarray, workload_gram: np.ndarray) -> _Evaluation | None:
    """``L(Q)``, or ``None`` when ``X = Q^T D^-1 Q`` is not numerically positive definite."""
    row_sums = matrix.sum(axis=1)
    if np.any(row_sums <= 0.0):
        return None
    scaled = matrix / row_sums[:, None]
    gram = matrix.T @ scaled  # O(m n^2)
    try:
        cholesky = scipy.linalg.cho_factor(gram, lower=True, check_finite=False)  # O(n^3)
    except np.linalg.LinAlgError:
        return None
    solved = scipy.linalg.cho_solve(cholesky, workload_gram, check_finite=False)  # O(n^3)
    value = float(np.trace(solved))
    if not math.isfinite(value) or value <= 0.0:
        return None
    return _Evaluation(value=value, scaled=scaled, cholesky=cholesky, solved=solved)


def _gradient(evaluation: _Evaluation) -> np.ndarray:
    """``∇_Q L = -2 A M + rowsum((A M) ∘ A) 1^T`` with ``M = X^-1 G X^-1``.  Cost ``O(m n^2 + n^3)``."""
    middle = scipy.linalg.cho_solve(evaluation.cholesky, evaluation.solved.T, check_finite=False)
    middle = (middle + middle.T) / 2.0
    scaled_middle = evaluation.scaled @ middle  # O(m n^2)
    row_terms = np.einsum("ij,ij->i", scaled_middle, evaluation.scaled)
    return -2.0 * scaled_middle + row_terms[:, None]


def _centered_gradient(evaluation: _Evaluation) -> np.ndarray:
    """The gradient minus its column means: the same projected steps (columns keep summing to 1),
    smaller shifts for the projection to resolve."""
    gradient = _gradient(evaluation)
    return gradient - gradient.mean(axis=0, keepdims=True)


def _lower_bound_gradient(
    gradient: np.ndarray,
    matrix: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    exp_epsilon: float,
) -> np.ndarray:
    """Chain rule of ``z -> L(Π_z(R))`` at ``Π_z(R) = matrix``, for the row lower bounds ``z``.

    For column ``u`` with free set ``F``, lower-bound set ``Lo`` and upper-bound set ``Up``,
    ``dλ_u/dz_o = -(1[o ∈ Lo] + e^ε 1[o ∈ Up]) / |F|``, so
    ``∂L/∂z_o = Σ_u (1[o ∈ Lo] + e^ε 1[o ∈ Up]) (g_ou - mean_F g_·u)``.  Cost ``O(m n)``.
    """
    at_lower = matrix == lower[:, None]
    at_upper = matrix == upper[:, None]
    free = ~(at_lower | at_upper)
    num_free = free.sum(axis=0)
    free_mean = np.where(num_free > 0, (gradient * free).sum(axis=0) / np.maximum(num_free, 1), 0)
    sensitivity = at_lower + exp_epsilon * at_upper
    return (sensitivity * (gradient - free_mean[None, :])).sum(axis=1)


def _made_progress(history: list[float], tolerance: float) -> bool:
    if len(history) <= _PROGRESS_WINDOW:
        return True
    return history[-1 - _PROGRESS_WINDOW] - history[-1] >= tolerance * history[-1]


@dataclass
class _Iterate:
    """Mutable optimiser state: ``Q``, its row bounds ``z <= Q[o, :] <= e^ε z`` and ``L(Q)``."""

    matrix: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    evaluation: _Evaluation
    gradient: np.ndarray  # centred ∇_Q L


def _spectral_projected_gradient(
    state: _Iterate,
    workload_gram: np.ndarray,
    *,
    max_steps: int,
    tolerance: float,
    limit: WorkLimit | None = None,
    progress: Progress | None = None,
) -> tuple[_Iterate, int]:
    """Phase 1: projected gradient with ``z`` fixed, Barzilai-Borwein step, non-monotone Armijo
    search along ``d = Π_z(Q - β ∇L) - Q`` (Birgin, Martinez, Raydan 2000); ``Q + t d`` stays
    feasible for ``t ∈ [0, 1]`` (a product of bounded simplices).  Returns the best iterate and
    the steps taken."""
    width = float(np.max(state.upper - state.lower))
    step = 0.5 / (state.matrix.shape[0] * max(float(np.abs(state.gradient).max()), 1e-300))
    history = [state.evaluation.value]
    best = state
    steps = 0
    while steps < max_steps and _made_progress(history, tolerance) and not _expired(limit):
        gradient_scale = max(float(np.abs(state.gradient).max()), 1e-300)
        step = min(step, _MAX_STEP_WIDTHS * width / gradient_scale)
        target = _project_columns(state.matrix - step * state.gradient, state.lower, state.upper)
        direction = target - state.matrix
        slope = float(np.sum(state.gradient * direction))
        if not slope < -1e-14 * state.evaluation.value:  # stationary for these bounds
            break
        reference = max(history[-_SPG_MEMORY:])
        fraction = 1.0
        trial = None
        while fraction > 1e-10 and not _expired(limit):
            candidate = state.matrix + fraction * direction
            trial = _evaluate(candidate, workload_gram)
            if trial is not None and trial.value <= reference + _ARMIJO_FRACTION * fraction * slope:
                break
            trial = None
            fraction *= 0.5
        if trial is None:
            break
        steps += 1
        new_gradient = _centered_gradient(trial)
        displacement = candidate - state.matrix
        curvature = float(np.sum(displacement * (new_gradient - state.gradient)))
        step = (
            float(np.sum(displacement**2)) / curvature
            if curvature > 0
            else _MAX_STEP_WIDTHS * width / max(float(np.abs(new_gradient).max()), 1e-300)
        )
        state = _Iterate(candidate, state.lower, state.upper, trial, new_gradient)
        history.append(trial.value)
        if trial.value < best.evaluation.value:
            best = state
        _step_report(progress, steps, max_steps, limit, "projected gradient", best)
    return best, steps


def _expired(limit: WorkLimit | None) -> bool:
    return limit is not None and limit.expired()


def _step_report(
    progress: Progress | None,
    steps: int,
    max_steps: int,
    limit: WorkLimit | None,
    phase: str,
    state: _Iterate,
) -> None:
    if progress is not None:
        share = steps / max(max_steps, 1)
        used = math.nan if limit is None else limit.fraction_used()
        message = f"step {steps} of at most {max_steps}, objective {state.evaluation.value:.6g}"
        fraction = share if math.isnan(used) else max(share, used)
        report(progress, fraction, f"LDP strategy, {phase}: {message}")


def _bound_descent(
    state: _Iterate,
    workload_gram: np.ndarray,
    *,
    epsilon: float,
    max_steps: int,
    tolerance: float,
    limit: WorkLimit | None = None,
    progress: Progress | None = None,
) -> tuple[_Iterate, int]:
    """Phase 2: Algorithm 2 of [McKenna20], ``z <- z - α ∇_z L``, ``Q <- Π_z(Q - β ∇_Q L)``, with
    ``α = 0.01 β / (n e^ε)`` and the exact chain rule for ``∇_z``.  Step search: halve ``β`` until
    the objective decreases with ``Σ z < 1 < e^ε Σ z``, then grow it by 25 %.  Rows whose ``z``
    reaches 1e-10 are removed before projecting, so columns still sum to 1.  Monotone.  Stops
    early once ``limit`` has passed (checked before every objective evaluation)."""
    n = state.matrix.shape[1]
    exp_epsilon = math.exp(epsilon)
    step = 0.5 / (state.matrix.shape[0] * max(float(np.abs(state.gradient).max()), 1e-300))
    history = [state.evaluation.value]
    steps = 0
    while steps < max_steps and _made_progress(history, tolerance) and not _expired(limit):
        bound_gradient = _lower_bound_gradient(
            state.gradient, state.matrix, state.lower, state.upper, exp_epsilon
        )
        accepted = None
        gradient_scale = float(np.abs(state.gradient).max())
        while step * gradient_scale > 1e-12 * float(state.matrix.max()) and not _expired(limit):
            bound_step = _BOUND_STEP_FRACTION * step / (n * exp_epsilon)
            lower = np.maximum(state.lower - bound_step * bound_gradient, 0.0)
            keep = lower > _PRUNE_PROBABILITY
            lower = lower[keep]
            lower_total = math.fsum(lower.tolist())
            if lower.size >= n and lower_total < 1.0 and exp_epsilon * lower_total > 1.0:
                upper = exp_epsilon * lower
                candidate = _project_columns(
                    state.matrix[keep] - step * state.gradient[keep], lower, upper
                )
                trial = _evaluate(candidate, workload_gram)
                if trial is not None and trial.value < state.evaluation.value:
                    accepted = _Iterate(candidate, lower, upper, trial, _centered_gradient(trial))
                    step *= _STEP_GROWTH
                    break
            step *= 0.5
        if accepted is None:
            break
        state = accepted
        steps += 1
        history.append(state.evaluation.value)
        _step_report(progress, steps, max_steps, limit, "bound descent", state)
    return state, steps


def _random_start(
    num_rows: int, n: int, epsilon: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random start of §4: ``R ~ U[0,1]^{m x n}`` projected with ``z = (1 + e^-ε) / (2 m)``.

    This ``z`` makes a column with every entry at a bound put a fraction ``1 / (e^ε + 1)`` of its
    rows at the upper bound, the optimal subset size of subset selection.
    """
    lower = np.full(num_rows, (1.0 + math.exp(-epsilon)) / (2.0 * num_rows))
    start = rng.random((num_rows, n))
    return _project_columns(start, lower, math.exp(epsilon) * lower), lower


@single_threaded_blas()
def optimize_strategy(
    W: np.ndarray,
    *,
    epsilon: float,
    rng: np.random.Generator,
    rows: int | None = None,
    iterations: int = 500,
    tolerance: float = 1e-5,
    initial: LDPStrategy | None = None,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> LDPStrategy:
    """Optimise an ε-LDP strategy for workload ``W`` (Problem 3.12 of [McKenna20]).

    Minimises the average-case objective ``L(Q) = tr[(Q^T D^-1 Q)^-1 W^T W]`` (Thm 3.11; Thm 5.1
    bounds the gap to the worst case) over ``(Q, z)`` with every column of ``Q`` in the bounded
    simplex ``{z <= q_u <= e^ε z, 1^T q_u = 1}`` (§4.1), by projected gradient in two phases:

    1. ``z`` fixed at the start's bounds: spectral step, non-monotone backtracking, until
       stationary (most of the gain at ε = 1);
    2. Algorithm 2: ``z`` and ``Q`` move together, ``z`` by the exact chain rule with step
       ``0.01 β / (n e^ε)``; monotone; rows whose ``z`` reaches 1e-10 are removed.

    Each step costs ``O(m n^2 + n^3)`` plus a few ``O(m n)`` projection passes; ``W`` enters only
    through ``W^T W``.  ``rng`` is public randomness for the random start (``rows x n``, default
    ``4 n``; ``initial`` replaces it).  A phase stops when the objective fell by less than
    ``tolerance`` (relative) over 50 steps.  Once ``time_limit`` has passed, the best iterate (each
    is a valid strategy) is returned with ``details["stopped_early"]``; ``details`` also hold
    ``objective`` (of the last iterate, before the one-ulp row-ratio fix) and ``steps``.

    Privacy: Uses no data; ε-LDP by the exact checks of :class:`LDPStrategy`.

    References:
    [McKenna20] §3.2, §4 (Algorithms 1 and 2, random start, m = 4n); Birgin, Martinez, Raydan,
    "Nonmonotone spectral projected gradient methods on convex sets", SIAM J. Optim. 10(4), 2000."""
    limit = WorkLimit(time_limit=time_limit)
    workload = workload_matrix(W)
    epsilon = check_epsilon(epsilon)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng ({type(rng).__name__}) must be a numpy.random.Generator")
    n = workload.shape[1]
    if n < 2:
        raise ValueError(f"W has n = {n} columns; the domain must have at least 2 items")
    num_rows = 4 * n if rows is None else check_size(rows, name="rows")
    if num_rows < n:
        raise ValueError(f"rows ({num_rows}) must be >= n ({n}) for Q to have full column rank")
    iterations = check_size(iterations, name="iterations", minimum=0)
    if not (isinstance(tolerance, (int, float)) and 0.0 <= tolerance < 1.0):
        raise ValueError(f"tolerance ({tolerance!r}) must be in [0, 1)")
    workload_gram = workload.T @ workload  # O(p n^2)

    if initial is None:
        matrix, lower = _random_start(num_rows, n, epsilon, rng)
    else:
        if not isinstance(initial, LDPStrategy) or initial.domain_size != n:
            raise ValueError(f"initial must be an LDPStrategy on n = {n} items")
        if initial.epsilon != epsilon:
            raise ValueError(f"initial.epsilon ({initial.epsilon}) must equal epsilon ({epsilon})")
        matrix = np.array(initial.Q)
        lower = matrix.min(axis=1)
    upper = np.maximum(math.exp(epsilon) * lower, matrix.max(axis=1))
    evaluation = _evaluate(matrix, workload_gram)
    if evaluation is None:
        raise ValueError("the start strategy does not have full column rank (Q^T D^-1 Q singular)")
    state = _Iterate(matrix, lower, upper, evaluation, _centered_gradient(evaluation))
    state, spent = _spectral_projected_gradient(
        state,
        workload_gram,
        max_steps=iterations,
        tolerance=tolerance,
        limit=limit,
        progress=progress,
    )
    state, more = _bound_descent(
        state,
        workload_gram,
        epsilon=epsilon,
        max_steps=iterations - spent,
        tolerance=tolerance,
        limit=limit,
        progress=progress,
    )
    stopped = limit.expired()
    matrix = enforce_row_ratio(state.matrix, epsilon)
    details = {
        "objective": state.evaluation.value,  # the matrix differs by at most one ulp per entry
        "steps": spent + more,
        "stopped_early": stopped,
    }
    report(
        progress, 1.0, f"LDP strategy: {spent + more} steps, objective {details['objective']:.6g}"
    )
    return LDPStrategy(name="optimized", Q=matrix, epsilon=epsilon, details=details)
