"""Limited-memory BFGS on ``x ≥ 0`` (or unconstrained) for objectives with 10⁵–10⁶ variables.

p-Identity at n = 4096 has p·n = 10⁶ variables, where scipy's L-BFGS-B spends as much on its own
bookkeeping (Cauchy point, subspace minimisation) as on the loss evaluation.  The bound here is the simple one ``x ≥ 0``, so a projected quasi-Newton step is
enough (Kim, Sra, Dhillon, "Tackling box-constrained optimization via a new projected quasi-Newton
approach", SIAM J. Sci. Comput. 2010): variables at the bound whose gradient pushes outward are
held fixed, the L-BFGS inverse Hessian gives the direction on the others, and a backtracking line
search along the projected path ``max(x + t d, 0)`` ensures the Armijo decrease.  The inverse
Hessian is applied in its compact form (Byrd, Nocedal, Schnabel, "Representations of quasi-Newton
matrices and their use in limited memory methods", Math. Prog. 1994, §3): three matrix-vector
products with the stored pairs per iteration instead of the two-loop recursion's 4·memory vector
operations.  No temporaries of the variables' size beyond the trial point.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg
from scipy.linalg.blas import ddot, dgemv

Objective = Callable[[np.ndarray], tuple[float, np.ndarray]]
"""``x ↦ (f(x), ∇f(x))``; the gradient must be a new array (the optimiser keeps it)."""

IterationCallback = Callable[[int, float], bool]
"""``(iteration, f) ↦ stop?`` after every accepted step."""

_ARMIJO = 1e-4
_MAX_BACKTRACKS = 40
_CURVATURE_FLOOR = 1e-10


@dataclass(frozen=True, kw_only=True)
class LbfgsResult:
    x: np.ndarray
    fun: float
    iterations: int
    converged: bool
    """True when the projected gradient vanished or no step could lower ``f`` further."""


def minimize(
    objective: Objective,
    start: np.ndarray,
    *,
    nonnegative: bool,
    memory: int = 5,
    max_iterations: int = 2000,
    gradient_tolerance: float = 1e-9,
    callback: IterationCallback | None = None,
) -> LbfgsResult:
    """Minimise ``objective`` from ``start`` (projected onto ``x ≥ 0`` when ``nonnegative``).

    Stops after ``max_iterations``, when the largest projected-gradient entry is at most
    ``gradient_tolerance``, when the line search cannot lower ``f`` (precision reached), or when
    ``callback`` returns True.  Exceptions raised by ``objective`` (a time limit) propagate.
    Cost per iteration: the evaluations of the line search (usually one) plus O(memory · size).
    """
    if memory < 1:
        raise ValueError(f"memory ({memory}) must be >= 1")
    if max_iterations < 0:
        raise ValueError(f"max_iterations ({max_iterations}) must be >= 0")
    x = np.array(start, dtype=np.float64).ravel()
    if nonnegative:
        np.maximum(x, 0.0, out=x)
    f, g = objective(x)
    size = x.size
    history = _History(memory=memory, size=size)
    direction = np.empty(size)
    held = np.zeros(size, dtype=bool)
    for iteration in range(1, max_iterations + 1):
        if nonnegative:  # at the bound with the gradient pushing outward: held fixed
            np.less_equal(x, 0.0, out=held)
            held &= g > 0.0
        np.copyto(direction, g)
        np.copyto(direction, 0.0, where=held)
        if _largest_magnitude(direction) <= gradient_tolerance:
            return LbfgsResult(x=x, fun=f, iterations=iteration - 1, converged=True)
        history.apply_inverse_hessian(direction)
        np.copyto(direction, 0.0, where=held)
        slope = ddot(g, direction)
        if not slope > 0.0:  # not a descent direction: forget the history, steepest descent
            history.clear()
            np.copyto(direction, g)
            np.copyto(direction, 0.0, where=held)
            direction /= max(float(np.linalg.norm(direction)), 1e-300)
            slope = ddot(g, direction)
        # direction holds H g; the step is x − t·direction, projected
        accepted = None
        step = 1.0
        g_dot_x = ddot(g, x)
        for _ in range(_MAX_BACKTRACKS):
            trial = np.multiply(direction, -step)
            trial += x
            if nonnegative:
                np.maximum(trial, 0.0, out=trial)
            f_trial, g_trial = objective(trial)
            # Armijo on the projected path: f(x⁺) ≤ f(x) + c ∇f(x)ᵀ(x⁺ − x)
            if f_trial <= f + _ARMIJO * (ddot(g, trial) - g_dot_x):
                accepted = (trial, f_trial, g_trial)
                break
            step *= 0.5
        if accepted is None:
            return LbfgsResult(x=x, fun=f, iterations=iteration - 1, converged=True)
        trial, f_trial, g_trial = accepted
        history.add(trial, x, g_trial, g)
        x, f, g = trial, f_trial, g_trial
        if callback is not None and callback(iteration, f):
            return LbfgsResult(x=x, fun=f, iterations=iteration, converged=False)
    return LbfgsResult(x=x, fun=f, iterations=max_iterations, converged=False)


def _largest_magnitude(vector: np.ndarray) -> float:
    """max |v_i| without a temporary of the vector's size. O(size)."""
    if vector.size == 0:
        return 0.0
    return max(float(vector.max()), -float(vector.min()))


class _History:
    """The newest ``memory`` pairs (s, y) and their inner products, for the compact L-BFGS form.

    ``pairs`` holds the steps in rows ``0..memory-1`` and the gradient changes in rows
    ``memory..2·memory-1`` (zero until used: unused rows always meet zero coefficients);
    ``sy[i, j] = s_iᵀ y_j`` is kept for i older than or equal to j, ``yy`` in full.
    """

    def __init__(self, *, memory: int, size: int) -> None:
        self.memory = memory
        self.pairs = np.zeros((2 * memory, size))
        self.sy = np.zeros((memory, memory))
        self.yy = np.zeros((memory, memory))
        self.order: list[int] = []  # slots in use, oldest first

    def clear(self) -> None:
        self.order.clear()

    def add(self, x_new: np.ndarray, x: np.ndarray, g_new: np.ndarray, g: np.ndarray) -> None:
        """Store ``(x_new − x, g_new − g)`` if its curvature is positive. O(memory · size)."""
        m = self.memory
        free = [slot for slot in range(m) if slot not in self.order]
        slot = free[0] if free else self.order[0]  # full: the oldest pair's slot
        if slot in self.order:
            self.order.remove(slot)  # overwritten below, whether or not the new pair is kept
        np.subtract(x_new, x, out=self.pairs[slot])
        np.subtract(g_new, g, out=self.pairs[m + slot])
        products = dgemv(1.0, self.pairs.T, self.pairs[m + slot], trans=1)  # pairs · y_new
        curvature, change = float(products[slot]), float(products[m + slot])
        if curvature > _CURVATURE_FLOOR * change:
            self.sy[:, slot] = products[:m]
            self.yy[:, slot] = self.yy[slot, :] = products[m:]
            self.order.append(slot)

    def apply_inverse_hessian(self, vector: np.ndarray) -> None:
        """``vector ← H vector`` in place; with no pairs ``H = I / ‖vector‖`` (a unit first step).

        ``H = γI + [S γY] [[R⁻ᵀ(D + γYᵀY)R⁻¹, −R⁻ᵀ], [−R⁻¹, 0]] [Sᵀ; γYᵀ]`` with R the upper
        triangle of SᵀY (chronological), D its diagonal, γ = s_kᵀy_k / y_kᵀy_k of the newest pair.
        O(memory · size) in two matrix-vector products, O(memory²) besides.
        """
        if not self.order:
            vector /= max(float(np.linalg.norm(vector)), 1e-300)
            return
        m, order = self.memory, self.order
        products = dgemv(1.0, self.pairs.T, vector, trans=1)  # [Sᵀv; Yᵀv] over every slot
        a, b = products[order], products[[m + slot for slot in order]]
        sy = self.sy[np.ix_(order, order)]
        yy = self.yy[np.ix_(order, order)]
        upper = np.triu(sy)
        gamma = sy[-1, -1] / yy[-1, -1]
        u = scipy.linalg.solve_triangular(upper, a, lower=False)
        w = scipy.linalg.solve_triangular(
            upper, np.diag(sy) * u + gamma * (yy @ u) - gamma * b, lower=False, trans="T"
        )
        coefficients = np.zeros(2 * m)
        coefficients[order] = w
        coefficients[[m + slot for slot in order]] = -gamma * u
        # vector ← γ vector + pairsᵀ coefficients, in place
        updated = dgemv(1.0, self.pairs.T, coefficients, beta=gamma, y=vector, overwrite_y=1)
        if updated is not vector:  # pragma: no cover - only if BLAS could not work in place
            np.copyto(vector, updated)
