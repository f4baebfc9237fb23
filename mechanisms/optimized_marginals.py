"""Weighted-marginals strategies and the algebra of their Gram matrices, never forming N × N.

Cells are the row-major product of ``d`` attributes with sizes ``n_0 … n_{d−1}`` (N = Π n_i).  A
subset ``S`` of attributes is a bitmask (bit ``i`` set ⇔ attribute ``i`` is *kept*); the marginal
over ``S`` sums out the other attributes.  Its query matrix ``M_S`` has Gram
``B_S = ⊗_i (I if i ∈ S else J)`` (J = all-ones), so a strategy that stacks ``w_S · M_S`` has Gram
``X = Σ_S w_S² B_S``: an element of the commutative algebra spanned by the ``B_S``.

The algebra is diagonalised by the orthogonal projectors
``P_U = ⊗_i (I − J/n_i if i ∈ U else J/n_i)`` (eigenspace multiplicity ``Π_{i∈U}(n_i − 1)``): the
eigenvalue of ``Σ_S c_S B_S`` on ``P_U`` is ``λ_U = Σ_{S ⊇ U} c_S Π_{i∉S} n_i``.  Coefficients and
eigenvalues are related by a superset-sum (zeta) transform and its Möbius inverse, O(d 2^d), so
products, inverses and pseudo-inverses cost O(d 2^d) and ``X⁺ v`` costs O(N Π(1 + 1/n_i)).

For *any* workload Gram ``G`` (not only marginals) ``tr(G X⁺) = Σ_U tr(G P_U) / λ_U``, and for a
Kronecker term ``tr(G P_U)`` factorises over attributes, so the template applies to every
workload given as a union of Kronecker terms.

References: McKenna et al., HDMM, PVLDB 11(10) 2018, §6 (the marginals template OPT_M and its
Gram algebra); Li thesis Thm 4.9 (marginal workloads).  Ideas only; the transforms are ours.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.optimize

from mechanisms.compute_limits import Progress
from mechanisms.noise import NoiseKind, validate_noise
from mechanisms.threads import single_threaded_blas

MAX_MARGINAL_ATTRIBUTES = 20
"""Largest ``d`` for the marginals template (2^d weights)."""


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


def subset_mask(subset: Iterable[int], num_attributes: int) -> int:
    """Bitmask of a subset of attribute indices (bit i ⇔ attribute i kept)."""
    mask = 0
    for attribute in subset:
        index = int(attribute)
        if not 0 <= index < num_attributes:
            raise ValueError(f"attribute index ({index}) must be in [0, {num_attributes})")
        mask |= 1 << index
    return mask


def _bit_pairs(values: np.ndarray, bit: int) -> np.ndarray:
    """View a length-2^d vector as ``(2^(d−1−bit), 2, 2^bit)``: the middle axis is ``bit``."""
    return values.reshape(-1, 2, 1 << bit)


def _lattice_transform(
    values: np.ndarray, num_attributes: int, *, upward: bool, sign: float
) -> np.ndarray:
    """One pass per bit: ``low += sign · high`` (``upward=False``) or ``high += sign · low``.

    Each pass is a contiguous 3-D view.  O(d 2^d).
    """
    out = np.array(values, dtype=np.float64, copy=True)
    if out.shape != (1 << num_attributes,):
        raise ValueError(f"values (shape {out.shape}) must have length 2^d = {1 << num_attributes}")
    for bit in range(num_attributes):
        pairs = _bit_pairs(out, bit)
        target, source = (pairs[:, 1, :], pairs[:, 0, :]) if upward else (pairs[:, 0], pairs[:, 1])
        if sign > 0:
            target += source
        else:
            target -= source
    return out


def superset_sums(values: np.ndarray, num_attributes: int) -> np.ndarray:
    """``out[U] = Σ_{S ⊇ U} values[S]`` (zeta transform over supersets). O(d 2^d)."""
    return _lattice_transform(values, num_attributes, upward=False, sign=1.0)


def superset_differences(values: np.ndarray, num_attributes: int) -> np.ndarray:
    """Inverse of :func:`superset_sums` (Möbius transform over supersets). O(d 2^d)."""
    return _lattice_transform(values, num_attributes, upward=False, sign=-1.0)


def subset_sums(values: np.ndarray, num_attributes: int) -> np.ndarray:
    """``out[S] = Σ_{U ⊆ S} values[U]`` (zeta transform over subsets; adjoint of supersets)."""
    return _lattice_transform(values, num_attributes, upward=True, sign=1.0)


def per_subset_product(kept: Sequence[float], summed: Sequence[float]) -> np.ndarray:
    """``out[S] = Π_i (kept[i] if i ∈ S else summed[i])`` for every bitmask S. O(2^d)."""
    out = np.ones(1)
    for kept_value, summed_value in zip(kept, summed, strict=True):
        out = np.concatenate([out * summed_value, out * kept_value])
    return out


def summed_out_sizes(domain_sizes: Sequence[int]) -> np.ndarray:
    """``m_S = Π_{i ∉ S} n_i``: the eigenvalue of ``B_S`` on the all-means eigenspace."""
    return per_subset_product([1.0] * len(domain_sizes), [float(n) for n in domain_sizes])


def eigenspace_multiplicities(domain_sizes: Sequence[int]) -> np.ndarray:
    """``Π_{i∈U} (n_i − 1)``: the dimension of eigenspace ``P_U``."""
    return per_subset_product([float(n - 1) for n in domain_sizes], [1.0] * len(domain_sizes))


def ij_subset_eigenvalues(
    parts: Sequence[tuple[float, float]], domain_sizes: Sequence[int]
) -> np.ndarray:
    """Eigenvalue of ``⊗_i (a_i I + b_i J)`` on every eigenspace ``P_U``. O(2^d).

    ``a_i`` on the centred part (i ∈ U), ``a_i + b_i n_i`` on the mean direction (i ∉ U).
    """
    return per_subset_product(
        [a for a, _ in parts], [a + b * n for (a, b), n in zip(parts, domain_sizes, strict=True)]
    )


def gram_eigenvalues(coefficients: np.ndarray, domain_sizes: Sequence[int]) -> np.ndarray:
    """Eigenvalues ``λ_U`` of ``Σ_S c_S B_S`` (one per eigenspace U). O(d 2^d)."""
    return superset_sums(coefficients * summed_out_sizes(domain_sizes), len(domain_sizes))


def gram_coefficients(eigenvalues: np.ndarray, domain_sizes: Sequence[int]) -> np.ndarray:
    """Coefficients ``c_S`` of the algebra element with eigenvalues ``λ_U``. O(d 2^d)."""
    return superset_differences(eigenvalues, len(domain_sizes)) / summed_out_sizes(domain_sizes)


def pseudo_inverse_coefficients(
    coefficients: np.ndarray, domain_sizes: Sequence[int]
) -> np.ndarray:
    """Coefficients of the Moore–Penrose pseudo-inverse of ``Σ_S c_S B_S``. O(d 2^d)."""
    eigenvalues = gram_eigenvalues(coefficients, domain_sizes)
    inverted = np.zeros_like(eigenvalues)
    keep = np.abs(eigenvalues) > 1e-12 * max(float(np.abs(eigenvalues).max()), 1e-300)
    inverted[keep] = 1.0 / eigenvalues[keep]
    return gram_coefficients(inverted, domain_sizes)


def term_projections(term: Sequence[np.ndarray]) -> np.ndarray:
    """``tr(G P_U)`` for a Kronecker term ``G = ⊗ G_i``, for every eigenspace U. O(Σ n_i² + 2^d).

    Per attribute ``tr(G_i J/n_i) = sum(G_i)/n_i`` (mean part) and ``tr(G_i) − sum(G_i)/n_i``
    (the rest); the term's mass on ``P_U`` is their product.
    """
    means = [float(g.sum()) / g.shape[0] for g in term]
    rests = [float(np.trace(g)) - mean for g, mean in zip(term, means, strict=True)]
    return per_subset_product(rests, means)


def workload_projections(terms: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """``tr(WᵀW P_U)`` summed over terms, with round-off below 1e-12 of the total set to 0."""
    total = np.sum([term_projections(term) for term in terms], axis=0)
    floor = 1e-12 * max(float(np.abs(total).sum()), 1e-300)
    return np.where(total > floor, total, 0.0)


def subsets_projections(
    subsets: Sequence[Iterable[int]], domain_sizes: Sequence[int]
) -> np.ndarray:
    """``tr(WᵀW P_U)`` for the workload of all marginals over ``subsets`` (unit weight each)."""
    sizes = validate_domain_sizes(domain_sizes)
    d = len(sizes)
    coefficients = np.zeros(2**d)
    for subset in subsets:
        coefficients[subset_mask(subset, d)] += 1.0
    return eigenspace_multiplicities(sizes) * gram_eigenvalues(coefficients, sizes)


def marginals_sensitivity(weights: np.ndarray, *, noise: NoiseKind) -> float:
    """L1 (``Σ|w_S|``) or L2 (``√Σ w_S²``) sensitivity: each marginal's columns have one 1."""
    validate_noise(noise)
    weights = np.asarray(weights, dtype=np.float64)
    if noise == "laplace":
        return float(np.abs(weights).sum())
    return float(np.sqrt(np.sum(weights**2)))


def marginals_unit_error(
    weights: np.ndarray, projections: np.ndarray, domain_sizes: Sequence[int]
) -> float:
    """``tr(G X⁺)`` for ``X = Σ w_S² B_S``; ``inf`` if the strategy does not support ``G``."""
    eigenvalues = gram_eigenvalues(np.asarray(weights, dtype=np.float64) ** 2, domain_sizes)
    needed = projections > 0
    positive = eigenvalues > 1e-12 * max(float(eigenvalues.max()), 1e-300)
    if np.any(needed & ~positive):
        return float("inf")
    return float(np.sum(projections[needed] / eigenvalues[needed]))


def marginals_loss_and_gradient(
    params: np.ndarray,
    projections: np.ndarray,
    domain_sizes: tuple[int, ...],
    noise: NoiseKind,
) -> tuple[float, np.ndarray]:
    """``Δ(w)² · tr(G X(w)⁺)`` and its gradient in the weights ``w`` (scale invariant). O(d 2^d).

    With ``θ = w²``, ``λ = zeta(θ ∘ m)`` and ``f = Σ_U g_U / λ_U``:
    ``∂f/∂θ_S = −m_S Σ_{U ⊆ S} g_U / λ_U²`` (a subset-sum transform).
    """
    d = len(domain_sizes)
    sizes_out = summed_out_sizes(domain_sizes)
    theta = params * params
    eigenvalues = superset_sums(theta * sizes_out, d)
    needed = projections > 0
    safe = np.where(needed, eigenvalues, 1.0)
    f = float(np.sum(np.where(needed, projections / safe, 0.0)))
    d_theta = -sizes_out * subset_sums(np.where(needed, projections / safe**2, 0.0), d)
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
    domain_sizes: Sequence[int],
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
    weight is a stationary direction, so restarts explore other supports).  The full-identity
    weight is kept ≥ 1e-6 (relative) so every eigenvalue stays positive; weights below 1e-4 of the
    largest are dropped when that costs < 1e-6 relative error.  BLAS runs single-threaded (scipy's
    L-BFGS-B is many times slower per iteration with contended OpenBLAS threads).

    ``time_limit`` (seconds, None = none) stops the current run at its next iteration and skips
    the rest; the best point so far is returned with ``stopped_early`` (the first run always
    takes at least one iteration, so an expired limit still yields weights).  ``progress(fraction,
    message)`` is called after every run.  One evaluation is O(d 2^d).
    """
    started = time.perf_counter()
    sizes = validate_domain_sizes(domain_sizes)
    d = len(sizes)
    if restarts < 0:
        raise ValueError(f"restarts ({restarts}) must be >= 0")
    if time_limit is not None and not time_limit >= 0:
        raise ValueError(f"time_limit ({time_limit}) must be >= 0 seconds or None")
    initial = [np.asarray(x, dtype=np.float64) for x in starts]
    for x in initial:
        if x.shape != (2**d,) or not np.all(np.isfinite(x)) or np.any(x < 0) or not x.any():
            raise ValueError(f"every start must be 2^d = {2**d} finite weights >= 0, not all 0")
    if not initial and restarts == 0:
        raise ValueError("need at least one start or restart")
    deadline = math.inf if time_limit is None else started + time_limit
    full = 2**d - 1
    scale = max(float(projections.max()), 1e-300)
    normalised = projections / scale
    best_weights, best_loss, iterations, runs, stopped = np.zeros(2**d), np.inf, 0, 0, False
    total_runs = len(initial) + restarts

    def objective(params: np.ndarray, level: float = 1.0) -> tuple[float, np.ndarray]:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            loss, gradient = marginals_loss_and_gradient(params, normalised, sizes, noise)
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
            start = initial[run] if run < len(initial) else rng.random(2**d)
            start = np.array(start, dtype=np.float64)
            start /= marginals_sensitivity(start, noise=noise)  # the objective is scale-free
            bounds = [(0.0, None)] * (2**d)
            bounds[full] = (1e-6 * float(start.mean()), None)
            start[full] = max(start[full], bounds[full][0])
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
    error = marginals_unit_error(best_weights, normalised, sizes)
    pruned = np.where(best_weights >= 1e-4 * best_weights.max(), best_weights, 0.0)
    pruned = pruned / marginals_sensitivity(pruned, noise=noise)
    pruned_error = marginals_unit_error(pruned, normalised, sizes)
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


def optimize_marginal_weights(
    projections: np.ndarray,
    domain_sizes: Sequence[int],
    *,
    noise: NoiseKind,
    rng: np.random.Generator,
    restarts: int,
    max_iterations: int = 1000,
    time_limit: float | None = None,
) -> tuple[np.ndarray, float, int]:
    """(weights, unit error, iterations) of :func:`search_marginal_weights` from ``restarts``
    random starts only."""
    search = search_marginal_weights(
        projections,
        domain_sizes,
        noise=noise,
        rng=rng,
        restarts=restarts,
        max_iterations=max_iterations,
        time_limit=time_limit,
    )
    return search.weights, search.unit_error, search.iterations


# --------------------------------------------------------------------------------------------
# Applying the algebra and the strategy to data-sized vectors
# --------------------------------------------------------------------------------------------


def _check_vector(vector: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float64)
    size = int(np.prod(sizes, dtype=np.int64))
    if array.shape != (size,):
        raise ValueError(f"vector (shape {array.shape}) must have shape ({size},) = Π domain_sizes")
    return array.reshape(sizes)


def _apply_into(coefficients: np.ndarray, tensor: np.ndarray, axis: int, out: np.ndarray) -> None:
    """``out += (Σ_S c_S ⊗_{i ≥ axis} (I | J)) tensor`` over attributes ``axis …``, broadcasting.

    ``coefficients`` is indexed by the bits of attributes ``axis …`` (bit 0 = ``axis``).  The J
    branch sums ``tensor`` over ``axis`` first, so the work is O(N Π (1 + 1/n_i)) overall.
    """
    if coefficients.size == 1:
        if coefficients[0] != 0.0:
            out += coefficients[0] * tensor
        return
    kept, summed = coefficients[1::2], coefficients[0::2]  # bit 0 (this axis) set / not set
    if np.any(kept):
        _apply_into(kept, tensor, axis + 1, out)
    if np.any(summed):
        partial = np.zeros((*out.shape[:axis], 1, *out.shape[axis + 1 :]))
        _apply_into(summed, tensor.sum(axis=axis, keepdims=True), axis + 1, partial)
        out += partial  # broadcast along `axis`: J x = 1 (1ᵀ x)


def marginals_gram_apply(
    coefficients: np.ndarray, domain_sizes: Sequence[int], vector: np.ndarray
) -> np.ndarray:
    """``(Σ_S c_S B_S) v`` for a length-N vector, without forming the N × N matrix.

    O(N Π (1 + 1/n_i)) time, about 2N extra memory.
    """
    sizes = validate_domain_sizes(domain_sizes)
    coefficients = np.asarray(coefficients, dtype=np.float64)
    if coefficients.shape != (2 ** len(sizes),):
        raise ValueError(
            f"coefficients (shape {coefficients.shape}) must have length 2^d = {2 ** len(sizes)}"
        )
    tensor = _check_vector(vector, sizes)
    out = np.zeros(sizes)
    _apply_into(coefficients, tensor, 0, out)
    return out.ravel()


def marginals_gram_pinv_apply(
    weights: np.ndarray, domain_sizes: Sequence[int], vector: np.ndarray
) -> np.ndarray:
    """``(AᵀA)⁺ v`` for the weighted-marginals strategy ``A`` (``AᵀA = Σ_S w_S² B_S``).

    The pseudo-inverse lives in the same algebra (O(d 2^d) to find), then is applied like
    :func:`marginals_gram_apply`.  Least squares from answers ``y`` is
    ``x̂ = (AᵀA)⁺ Aᵀ y`` with :func:`marginal_measurements_transpose`.
    """
    sizes = validate_domain_sizes(domain_sizes)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (2 ** len(sizes),):
        raise ValueError(
            f"weights (shape {weights.shape}) must have length 2^d = {2 ** len(sizes)}"
        )
    return marginals_gram_apply(pseudo_inverse_coefficients(weights**2, sizes), sizes, vector)


def _summed_axes(mask: int, num_attributes: int) -> tuple[int, ...]:
    return tuple(i for i in range(num_attributes) if not mask >> i & 1)


def marginal_measurements(
    weights: np.ndarray, domain_sizes: Sequence[int], vector: np.ndarray
) -> np.ndarray:
    """``A x``: the concatenated weighted marginals ``w_S · M_S x`` for ``w_S ≠ 0``, S ascending.

    Each marginal is flattened row-major over its kept attributes (in attribute order).
    """
    sizes = validate_domain_sizes(domain_sizes)
    tensor = _check_vector(vector, sizes)
    parts = [
        weight * tensor.sum(axis=_summed_axes(mask, len(sizes))).ravel()
        for mask, weight in enumerate(np.asarray(weights, dtype=np.float64))
        if weight != 0.0
    ]
    return np.concatenate(parts) if parts else np.zeros(0)


def marginal_measurements_transpose(
    weights: np.ndarray, domain_sizes: Sequence[int], answers: np.ndarray
) -> np.ndarray:
    """``Aᵀ y`` for answers laid out as :func:`marginal_measurements` returns them."""
    sizes = validate_domain_sizes(domain_sizes)
    answers = np.asarray(answers, dtype=np.float64)
    out = np.zeros(sizes)
    offset = 0
    for mask, weight in enumerate(np.asarray(weights, dtype=np.float64)):
        if weight == 0.0:
            continue
        shape = tuple(n if mask >> i & 1 else 1 for i, n in enumerate(sizes))
        count = int(np.prod(shape, dtype=np.int64))
        if offset + count > answers.size:
            raise ValueError(f"answers (length {answers.size}) are too short for these weights")
        out += weight * answers[offset : offset + count].reshape(shape)
        offset += count
    if offset != answers.size:
        raise ValueError(f"answers (length {answers.size}) must have length {offset}")
    return out.ravel()
