"""Weighted unions of Kronecker strategies, with exact Gram algebra that never forms an N × N matrix.

A union stacks terms ``w_t · (A_{t,1} ⊗ … ⊗ A_{t,d})``; its Gram ``Σ_t w_t² ⊗_i A_{t,i}ᵀA_{t,i}``
has no Kronecker inverse.  On an attribute where every term's *and* every workload item's Gram is
in ``span{I, J}`` (J = 11ᵀ), all Grams are diagonal in ``span{1} ⊕ 1^⊥`` (``P0 = J/n``,
``P1 = I − J/n``; ``aI + bJ`` acts as ``a + bn`` on P0 and ``a`` on P1).  With k such "split"
attributes and the rest "dense",

    AᵀA = Σ_{c ∈ {0,1}^k} P_c ⊗ S_c,      (AᵀA)⁺ = Σ_c P_c ⊗ S_c⁺,

each ``S_c`` D × D over the dense attributes, so error, per-query variances and least squares cost
O(2^k D³ + 2^k N D) instead of O(N³): HDMM's marginals algebra (McKenna et al. 2018, §6) extended
to ordered attributes, implemented here independently.  The default terms give each workload item
its own strategy; :func:`optimize_weights` picks weights minimising sensitivity² × total variance.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg

from dprelease.mechanisms.primitives.compute_limits import (
    DGEMM_FLOPS_PER_SECOND,
    Progress,
    TimeLimitReached,
    WorkLimit,
    eigh_seconds,
    interruptible,
    report,
)
from dprelease.mechanisms.primitives.linalg import psd_pinv
from dprelease.mechanisms.primitives.noise import SENSITIVITY_NORM, NoiseKind
from dprelease.mechanisms.primitives.operators import (
    Factor,
    Identity,
    Total,
    gram_ij_parts,
    kron_apply,
    kron_matrices,
    kron_query_variances,
)
from dprelease.mechanisms.primitives.protocol import CandidateUnavailable, LeastSquaresAnswers
from dprelease.mechanisms.primitives.strategies import family_factor
from dprelease.mechanisms.primitives.threads import single_threaded_blas
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

MAX_DENSE_CELLS = 4096
MAX_SPLIT_BLOCKS = 1 << 16
# Relative term weights stay within e^±7 (≈ 1100×): wider ratios only lose terms to rounding.
LOG_WEIGHT_BOUND = 7.0
MAX_EVALUATIONS = 400  # objective evaluations of the weight search (L-BFGS-B maxfun)


@dataclass(frozen=True, kw_only=True)
class UnionTerm:
    """One stacked block ``weight · ⊗_i factors[i]``."""

    weight: float
    factors: tuple[Factor, ...]

    def __post_init__(self) -> None:
        if not (np.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"term weight ({self.weight}) must be finite and > 0")

    @property
    def num_queries(self) -> int:
        return math.prod(f.m for f in self.factors)


def weighted_terms(
    factor_tuples: Sequence[tuple[Factor, ...]], weights: Sequence[float] | None = None
) -> tuple[UnionTerm, ...]:
    """One term per factor tuple, weighted by ``weights`` (1 each when None)."""
    weights = [1.0] * len(factor_tuples) if weights is None else weights
    return tuple(
        UnionTerm(weight=float(w), factors=f) for w, f in zip(weights, factor_tuples, strict=True)
    )


@dataclass(frozen=True, kw_only=True)
class _Structure:
    """The split/dense partition of the attributes and the per-block matrices."""

    shape: tuple[int, ...]
    split_axes: tuple[int, ...]
    dense_axes: tuple[int, ...]
    blocks: tuple[tuple[tuple[int, ...], int, np.ndarray], ...]  # (choice, multiplicity, S_c⁺)

    def gram_blocks(self, terms: Sequence[UnionTerm]) -> list[np.ndarray]:
        """Per block c, ``Σ_t w_t² s_{t,c} K_t`` (see :func:`_gram_blocks`)."""
        choices = [choice for choice, _, _ in self.blocks]
        return _gram_blocks(terms, choices, self.split_axes, self.dense_axes, self.shape)

    def workload_blocks(self, workload: Workload) -> list[np.ndarray]:
        return self.gram_blocks(weighted_terms([item.factors for item in workload.items]))

    def unit_trace(self, blocks: Sequence[np.ndarray]) -> float:
        """``Σ_c mult_c · tr(Q_c S_c⁺)`` for the Gram blocks ``Q_c``. O(2^k D²)."""
        return sum(
            multiplicity * float(np.sum(block * pinv))
            for (_, multiplicity, pinv), block in zip(self.blocks, blocks, strict=True)
        )


@dataclass(frozen=True, kw_only=True)
class UnionStrategy(LeastSquaresAnswers):
    """``A = [w_1 ⊗A_{1,·}; …; w_T ⊗A_{T,·}]`` over one domain (public)."""

    name: str
    domain_shape: tuple[int, ...]
    terms: tuple[UnionTerm, ...]
    parameters: dict[str, object] = field(default_factory=dict)
    _cache: dict[int, tuple[Workload, _Structure]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("a union strategy needs at least one term")
        for term in self.terms:
            shape = tuple(f.n for f in term.factors)
            if shape != self.domain_shape:
                raise ValueError(
                    f"term factor sizes {shape} differ from the domain {self.domain_shape}"
                )

    @property
    def num_queries(self) -> int:
        return sum(term.num_queries for term in self.terms)

    @property
    def num_cells(self) -> int:
        return math.prod(self.domain_shape)

    def column_norms(self, *, norm: int) -> np.ndarray:
        """Per-cell L1 norm (Σ_t w_t Π c_{t,i}) or L2 norm (√Σ_t w_t² Π c²_{t,i}). O(T N)."""
        total = np.zeros(self.domain_shape)
        for term in self.terms:
            outer = np.ones(())
            for factor in term.factors:
                outer = np.multiply.outer(outer, factor.column_norms(norm=norm) ** norm)
            total += term.weight**norm * outer
        return total.ravel() if norm == 1 else np.sqrt(total.ravel())

    def sensitivity(self, *, noise: NoiseKind) -> float:
        return float(self.column_norms(norm=SENSITIVITY_NORM[noise]).max())

    def apply(self, x: np.ndarray) -> np.ndarray:
        """A·x, term by term. O(Σ_t N Σ_i nnz(A_{t,i})/n_i)."""
        return np.concatenate([term.weight * kron_apply(term.factors, x) for term in self.terms])

    def apply_transpose(self, y: np.ndarray) -> np.ndarray:
        out = np.zeros(self.num_cells)
        start = 0
        for term in self.terms:
            stop = start + term.num_queries
            out += term.weight * kron_apply([f.T for f in term.factors], y[start:stop])
            start = stop
        return out

    def structure(self, workload: Workload) -> _Structure:
        """Split/dense partition valid for this strategy *and* ``workload``; blocks' ``S_c⁺``."""
        cached = self._cache.get(id(workload))
        if cached is not None and cached[0] is workload:
            return cached[1]
        shape = self.domain_shape
        split = _split_axes([t.factors for t in self.terms], workload)
        dense = tuple(axis for axis in range(len(shape)) if axis not in split)
        dense_size = math.prod(shape[a] for a in dense)
        if dense_size > MAX_DENSE_CELLS or 2 ** len(split) > MAX_SPLIT_BLOCKS:
            raise CandidateUnavailable(
                f"union strategy algebra needs the non-split attributes to have at most "
                f"{MAX_DENSE_CELLS} cells together (got {dense_size}) and at most "
                f"{MAX_SPLIT_BLOCKS} split blocks (got {2 ** len(split)})"
            )
        choices, multiplicities = [], []
        for choice in itertools.product((0, 1), repeat=len(split)):
            multiplicity = int(
                np.prod([1 if c == 0 else shape[a] - 1 for a, c in zip(split, choice, strict=True)])
            )
            if multiplicity:
                choices.append(choice)
                multiplicities.append(multiplicity)
        grams = _gram_blocks(self.terms, choices, split, dense, shape)
        result = _Structure(
            shape=shape,
            split_axes=tuple(split),
            dense_axes=dense,
            blocks=tuple(zip(choices, multiplicities, map(psd_pinv, grams), strict=True)),
        )
        self._cache[id(workload)] = (workload, result)
        return result

    def least_squares(self, y: np.ndarray, workload: Workload) -> np.ndarray:
        """x̂ = (AᵀA)⁺Aᵀy = Σ_c (P_c ⊗ S_c⁺) Aᵀy. O(2^k N (k + D))."""
        structure = self.structure(workload)
        back = self.apply_transpose(y).reshape(self.domain_shape)
        estimate = np.zeros(self.domain_shape)
        for choice, _multiplicity, block_pinv in structure.blocks:
            part = back
            for axis, c in zip(structure.split_axes, choice, strict=True):
                mean = part.mean(axis=axis, keepdims=True)
                part = np.broadcast_to(mean, part.shape) if c == 0 else part - mean
            estimate += _apply_on_axes(block_pinv, np.asarray(part), structure.dense_axes)
        return estimate.ravel()

    def item_unit_variances(self, item: WorkloadItem, workload: Workload) -> np.ndarray:
        """``diag(W (AᵀA)⁺ Wᵀ)`` for one item, in the item's row-major query order."""
        structure = self.structure(workload)
        shape = self.domain_shape
        sizes = [f.m for f in item.factors]
        total = np.zeros(sizes)
        dense_factors = [item.factors[a] for a in structure.dense_axes]
        dense_sizes = [sizes[a] for a in structure.dense_axes]
        for choice, _multiplicity, block_pinv in structure.blocks:
            tensor = _dense_query_variances(dense_factors, block_pinv).reshape(dense_sizes or [1])
            order = list(structure.dense_axes)
            for axis, c in zip(structure.split_axes, choice, strict=True):
                n = shape[axis]
                projector = np.full((n, n), 1.0 / n) if c == 0 else np.eye(n) - 1.0 / n
                tensor = np.multiply.outer(tensor, item.factors[axis].query_variances(projector))
                order.append(axis)
            if not structure.dense_axes:
                tensor = tensor.reshape(tensor.shape[1:])
            total += np.transpose(tensor, np.argsort(order))
        return total.ravel()

    def item_unit_total(self, item: WorkloadItem, workload: Workload) -> float:
        """``tr(W_itemᵀW_item (AᵀA)⁺) = Σ_c mult_c · tr(Q_c S_c⁺)``. O(2^k D²)."""
        structure = self.structure(workload)
        return structure.unit_trace(structure.gram_blocks(weighted_terms([item.factors])))

    def support_residual(self, workload: Workload) -> float:
        """Largest relative ‖Q_c − Q_c S_c⁺ S_c‖ over blocks; ≈ 0 iff A supports W."""
        structure = self.structure(workload)
        worst = 0.0
        for (_, _, pinv), strategy_block, workload_block in zip(
            structure.blocks,
            structure.gram_blocks(self.terms),
            structure.workload_blocks(workload),
            strict=True,
        ):
            residual = workload_block - workload_block @ pinv @ strategy_block
            worst = max(
                worst, float(np.abs(residual).max()) / max(1.0, float(np.abs(workload_block).max()))
            )
        return worst


def _split_axes(term_factors: Sequence[tuple[Factor, ...]], workload: Workload) -> list[int]:
    """Attributes where every strategy term's Gram is ``aI + bJ`` and every workload item is an
    identity or a total: there the Gram algebra splits into ``span{1} ⊕ 1^⊥``. O(T Σ n_i²)."""
    return [
        axis
        for axis in range(len(workload.domain_shape))
        # the O(n²) Gram test only where the O(1) workload test passed
        if all(isinstance(item.factors[axis], Identity | Total) for item in workload.items)
        and all(gram_ij_parts(factors[axis].gram()) is not None for factors in term_factors)
    ]


def _gram_blocks(
    terms: Sequence[UnionTerm],
    choices: Sequence[tuple[int, ...]],
    split_axes: Sequence[int],
    dense_axes: Sequence[int],
    shape: tuple[int, ...],
) -> list[np.ndarray]:
    """Per split block ``c``, ``S_c = Σ_t w_t² s_{t,c} K_t`` over the dense attributes."""
    # Each term's dense Kronecker Gram and its I/J coefficients do not depend on the block:
    # computed once per term, O(T (Σ nnz·n + D²)), then each block is a weighted sum, O(B T D²).
    dense_grams = [kron_matrices([t.factors[a].gram() for a in dense_axes]) for t in terms]
    split_coefficients = []
    for term in terms:
        pairs = [gram_ij_parts(term.factors[axis].gram()) for axis in split_axes]
        if None in pairs:  # pragma: no cover - split axes are I/J by construction
            raise ValueError("split attribute without I/J structure")
        split_coefficients.append(pairs)
    size = math.prod(shape[a] for a in dense_axes)
    result = []
    for choice in choices:
        block = np.zeros((size, size))
        for term, gram, pairs in zip(terms, dense_grams, split_coefficients, strict=True):
            scalar = term.weight**2
            for axis, c, (a, b) in zip(split_axes, choice, pairs, strict=True):  # type: ignore[misc]
                scalar *= a + b * shape[axis] if c == 0 else a
            if scalar:
                block += scalar * gram
        result.append(block)
    return result


def _apply_on_axes(matrix: np.ndarray, tensor: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Apply a D × D matrix jointly over ``axes`` (row-major over them) of ``tensor``."""
    if not axes:
        return matrix[0, 0] * tensor
    moved = np.moveaxis(tensor, axes, range(len(axes)))
    dense_shape = moved.shape[: len(axes)]
    flat = moved.reshape(int(np.prod(dense_shape)), -1)
    result = (matrix @ flat).reshape(moved.shape)
    return np.moveaxis(result, range(len(axes)), axes)


def _dense_query_variances(factors: Sequence[Factor], covariance: np.ndarray) -> np.ndarray:
    """``diag(W_d M W_dᵀ)`` for ``W_d = ⊗ factors`` and a D × D covariance M."""
    if not factors:
        return np.array([covariance[0, 0]])
    if len(factors) == 1:
        return factors[0].query_variances(covariance)
    return kron_query_variances(factors, covariance)  # never the m_d × D query matrix


def per_item_terms(
    workload: Workload, *, ordered: Sequence[bool], family: str, branching: int = 2
) -> list[tuple[Factor, ...]]:
    """One strategy term per distinct item shape: the family's factor on the item's ordered
    attributes, identity on its categorical ones, a total elsewhere."""
    seen: dict[tuple[str, ...], tuple[Factor, ...]] = {}
    for item in workload.items:
        # one key per distinct term: under "identity" an ordered attribute is measured as categorical
        roles = tuple(
            "total"
            if isinstance(factor, Total)
            else "categorical"
            if isinstance(factor, Identity) or not ordered[axis] or family == "identity"
            else "ordered"
            for axis, factor in enumerate(item.factors)
        )
        if roles not in seen:
            seen[roles] = tuple(
                family_factor(family, role, factor.n, branching=branching)
                for role, factor in zip(roles, item.factors, strict=True)
            )
    return list(seen.values())


def unit_error(strategy: UnionStrategy, workload: Workload, *, noise: NoiseKind) -> float:
    """sensitivity² × tr(WᵀW (AᵀA)⁺): total variance per unit noise variance per unit sensitivity."""
    structure = strategy.structure(workload)
    trace = structure.unit_trace(structure.workload_blocks(workload))
    return strategy.sensitivity(noise=noise) ** 2 * trace


class _WeightProblem:
    """Precomputed pieces of ``f(w) = sens(w)² · Σ_c mult_c tr(Q_c S_c(w)⁺)``.

    ``S_c(w) = Σ_t w_t² s_{t,c} K_t`` with fixed scalars ``s_{t,c}`` and dense Kronecker Grams
    ``K_t``; sensitivity from fixed per-term column norms.  One evaluation is O(2^k D³ + T N).
    """

    def __init__(
        self, workload: Workload, term_factors: Sequence[tuple[Factor, ...]], *, noise: NoiseKind
    ) -> None:
        self.norm = norm = SENSITIVITY_NORM[noise]
        reference = UnionStrategy(
            name="reference", domain_shape=workload.domain_shape, terms=weighted_terms(term_factors)
        )
        structure = reference.structure(workload)
        self.multiplicities = [multiplicity for _, multiplicity, _ in structure.blocks]
        self.workload_blocks = structure.workload_blocks(workload)
        self.term_blocks = [structure.gram_blocks(weighted_terms([f])) for f in term_factors]
        # S_c(w) is a positive combination of PSD blocks: its range is that of Σ_t K_{t,c} for every
        # w > 0.  On a basis U of that range UᵀS_c U is positive definite, so each evaluation
        # inverts an r × r block by Cholesky instead of a singular D × D one by eigh, and
        # tr(Q S⁺) = tr(UᵀQU (UᵀSU)⁻¹).
        for index in range(len(self.multiplicities)):
            basis = _range_basis(sum(blocks[index] for blocks in self.term_blocks))  # O(D³) once
            if basis is None:
                continue
            self.workload_blocks[index] = basis.T @ self.workload_blocks[index] @ basis
            for blocks in self.term_blocks:
                blocks[index] = basis.T @ blocks[index] @ basis
        self.column_powers: list[np.ndarray] = []
        for factors in term_factors:
            per_factor = [factor.column_norms(norm=norm) ** norm for factor in factors]
            if all(np.ptp(values) == 0 for values in per_factor):
                # identity/total-like terms: one column norm everywhere, O(1) instead of O(N)
                self.column_powers.append(np.array([math.prod(float(v[0]) for v in per_factor)]))
                continue
            outer = np.ones(())
            for values in per_factor:
                outer = np.multiply.outer(outer, values)
            self.column_powers.append(outer.ravel())
        if len({c.size for c in self.column_powers}) > 1:  # mixed: broadcast constants
            size = max(c.size for c in self.column_powers)
            self.column_powers = [np.broadcast_to(c, (size,)) for c in self.column_powers]

    def __call__(self, weights: np.ndarray, *, limit: WorkLimit | None = None) -> float:
        """``f(weights)``; ``limit`` is checked before every block (raises TimeLimitReached)."""
        return self.value_and_log_gradient(weights, limit=limit, gradient=False)[0]

    def value_and_log_gradient(
        self, weights: np.ndarray, *, limit: WorkLimit | None = None, gradient: bool = True
    ) -> tuple[float, np.ndarray]:
        """``f(w)`` and its gradient in the log-weights ``x`` (``w = eˣ``), one pinvh per block.

        ``∂T/∂x_t = −2 w_t² Σ_c mult_c ⟨S_c⁺ Q_c S_c⁺, K_{t,c}⟩`` (the range of ``S_c`` does not
        change with positive weights); the sensitivity's max over columns contributes its
        subgradient at the maximising column.  O(2^k D³ + T D²) per block.
        """
        columns = sum(w**self.norm * c for w, c in zip(weights, self.column_powers, strict=True))
        top = int(np.argmax(columns))
        largest = float(columns[top])
        sensitivity_sq = largest ** (2 / self.norm)
        trace = 0.0
        trace_gradient = np.zeros(len(weights))
        for index, (multiplicity, workload_block) in enumerate(
            zip(self.multiplicities, self.workload_blocks, strict=True)
        ):
            block = sum(
                w**2 * blocks[index] for w, blocks in zip(weights, self.term_blocks, strict=True)
            )
            if limit is not None:
                limit.check()
            pinv = interruptible(  # O(D³); Ctrl-C is seen at once even for D in the thousands
                lambda block=block: psd_pinv(block),  # Cholesky unless near-singular
                flops=_BLOCK_EVALUATION_EIGHS
                * eigh_seconds(block.shape[0])
                * DGEMM_FLOPS_PER_SECOND,
            )
            trace += multiplicity * float(np.sum(workload_block * pinv))
            if gradient:
                inner = pinv @ workload_block @ pinv  # O(D³)
                for t, blocks in enumerate(self.term_blocks):  # O(T D²)
                    trace_gradient[t] -= (
                        2.0 * weights[t] ** 2 * multiplicity * float(np.sum(inner * blocks[index]))
                    )
        if not gradient:
            return sensitivity_sq * trace, trace_gradient
        column_gradient = np.array(
            [
                self.norm * w**self.norm * float(c[top])
                for w, c in zip(weights, self.column_powers, strict=True)
            ]
        )
        sensitivity_gradient = (2 / self.norm) * largest ** (2 / self.norm - 1) * column_gradient
        return (
            sensitivity_sq * trace,
            sensitivity_sq * trace_gradient + trace * sensitivity_gradient,
        )


def _range_basis(symmetric: np.ndarray) -> np.ndarray | None:
    """Orthonormal basis of the range of a PSD matrix (eigenvalues above ``n·eps·max``, the cut-off
    of :func:`~mechanisms.primitives.linalg.psd_pinv`), or None when it has full rank. O(n³)."""
    values, vectors = np.linalg.eigh(symmetric)
    if values.size == 0:
        return None
    keep = values > float(np.abs(values).max()) * symmetric.shape[0] * np.finfo(np.float64).eps
    return None if bool(np.all(keep)) else vectors[:, keep]


def optimize_weights(
    workload: Workload,
    term_factors: Sequence[tuple[Factor, ...]],
    *,
    noise: NoiseKind,
    name: str,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> UnionStrategy:
    """Weights minimising sensitivity² × total variance, then pruning of terms it drove to ~0.

    Deterministic: L-BFGS-B with the analytic gradient on all log-weights (bounded to e^±7; the
    objective is scale-free) from equal weights.  A term whose weight ends below e^-5 of the
    largest is dropped when the others still support the workload and the error does not grow.
    ``time_limit`` is checked at every evaluation (O(2^k D³) each); once passed, the best weights
    so far are kept (every term stays, so the workload stays supported), pruning is skipped and
    ``parameters["stopped_early"]`` is True.
    """
    # imported here, before the time limit starts (0.2 s that planning from the strategy store
    # never needs); _optimize_log_weights uses it
    import scipy.optimize  # noqa: F401

    limit = WorkLimit(time_limit=time_limit)

    def optimise(candidate_terms: list[tuple[Factor, ...]]) -> tuple[np.ndarray, int, bool]:
        return _optimize_log_weights(
            workload,
            candidate_terms,
            noise=noise,
            limit=limit,
            progress=progress,
        )

    with single_threaded_blas():
        terms = list(term_factors)
        kept = list(range(len(terms)))
        weights, evaluations, stopped = optimise(terms)
        while len(terms) > 1 and not stopped:
            smallest = int(np.argmin(weights))
            if weights[smallest] > np.exp(-5.0) * weights.max():
                break
            reduced = terms[:smallest] + terms[smallest + 1 :]
            trial = UnionStrategy(
                name=name, domain_shape=workload.domain_shape, terms=weighted_terms(reduced)
            )
            if trial.support_residual(workload) > 1e-8:
                break
            new_weights, more, stopped = optimise(reduced)
            evaluations += more
            if stopped:
                break  # keep the full, unpruned weights: the reduced run was cut short
            problem = _WeightProblem(workload, terms, noise=noise)
            if _WeightProblem(workload, reduced, noise=noise)(new_weights) > problem(weights):
                break
            terms, weights = reduced, new_weights
            del kept[smallest]
    weights = weights / weights.max()
    report(progress, 1.0, f"union weights: {len(terms)} terms after {evaluations} evaluations")
    return UnionStrategy(
        name=name,
        domain_shape=workload.domain_shape,
        terms=weighted_terms(terms, weights),
        parameters={
            "weights": [float(w) for w in weights],
            "kept_terms": kept,
            "evaluations": evaluations,
            "stopped_early": stopped,
        },
    )


def _optimize_log_weights(
    workload: Workload,
    terms: Sequence[tuple[Factor, ...]],
    *,
    noise: NoiseKind,
    limit: WorkLimit,
    progress: Progress | None,
) -> tuple[np.ndarray, int, bool]:
    """(weights, evaluations, stopped early): L-BFGS-B on the log-weights from equal weights."""
    import scipy.optimize  # already loaded by optimize_weights (outside its time limit)

    if len(terms) == 1:  # the objective is scale-free: nothing to optimise
        return np.ones(1), 0, False
    problem = _WeightProblem(workload, terms, noise=noise)
    start = np.zeros(len(terms))
    seen = {"value": math.inf, "point": start, "evaluations": 0}

    def objective(point: np.ndarray) -> tuple[float, np.ndarray]:
        value, gradient = problem.value_and_log_gradient(np.exp(point), limit=limit)
        seen["evaluations"] += 1
        if value < seen["value"]:
            seen["value"], seen["point"] = value, point.copy()
        return value, gradient

    def iterated(_: scipy.optimize.OptimizeResult) -> None:
        if progress is not None:
            share = seen["evaluations"] / MAX_EVALUATIONS
            used = limit.fraction_used()
            report(
                progress,
                share if math.isnan(used) else max(share, used),
                f"union weights ({len(terms)} terms): {seen['evaluations']} evaluations, "
                f"unit error {seen['value']:.6g}",
            )

    try:
        result = scipy.optimize.minimize(
            objective,
            start,
            jac=True,
            method="L-BFGS-B",
            bounds=[(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND)] * start.size,
            callback=iterated,
            options={"maxfun": MAX_EVALUATIONS},
        )
    except TimeLimitReached:
        return np.exp(np.asarray(seen["point"])), int(seen["evaluations"]), True
    best = result.x if result.fun <= problem(np.exp(start)) else start
    return np.exp(best), int(result.nfev), False


# One objective evaluation per split block (a pinvh of the D × D block and the weighted sum of
# the term blocks) costs fixed + 2.5 eighs of size D; an optimize_weights call with the analytic
# gradient takes about 10·(T + 1) evaluations for T terms.  Constants from
# benchmarks/predict_bench.py --calibrate union.
_BLOCK_EVALUATION_FIXED = 2.5e-4
_BLOCK_EVALUATION_EIGHS = 2.5
_EVALUATIONS_PER_TERM = 10


def weight_problem_sizes(
    workload: Workload, term_factors: Sequence[tuple[Factor, ...]]
) -> tuple[int, int]:
    """``(D, blocks)``: the dense cells and the split blocks of :func:`optimize_weights`'s Gram
    algebra for these terms, without building any block.  O(T Σ n_i²)."""
    split = _split_axes(term_factors, workload)
    shape = workload.domain_shape
    dense = math.prod(n for axis, n in enumerate(shape) if axis not in split)
    blocks = math.prod(2 if shape[axis] > 1 else 1 for axis in split)
    return dense, blocks


def predict_seconds(
    *,
    dense_cells: int,
    split_blocks: int,
    num_terms: int,
    num_cells: int,
) -> float:
    """Predicted seconds of :func:`optimize_weights` from sizes (see :func:`weight_problem_sizes`).

    ``min(MAX_EVALUATIONS·T, 10·(T + 1))`` evaluations, each ``split_blocks`` pinvh's and two
    products of the ``dense_cells``-sized block plus the O(T·N) sensitivity.  One BLAS thread.  O(1).
    """
    for name, value in (
        ("dense_cells", dense_cells),
        ("split_blocks", split_blocks),
        ("num_terms", num_terms),
        ("num_cells", num_cells),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} ({value!r}) must be an integer >= 1")
    if num_terms == 1:
        return 0.0  # a single term needs no weights
    evaluations = min(MAX_EVALUATIONS * num_terms, _EVALUATIONS_PER_TERM * (num_terms + 1))
    per_block = (
        _BLOCK_EVALUATION_FIXED
        + _BLOCK_EVALUATION_EIGHS * eigh_seconds(dense_cells)
        + (4 * dense_cells**3 + 2 * num_terms * dense_cells**2) / DGEMM_FLOPS_PER_SECOND
    )
    per_evaluation = split_blocks * per_block + num_terms * num_cells * 1e-9
    return evaluations * per_evaluation
