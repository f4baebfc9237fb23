"""``optimized``: the best of the workload-optimised templates (HDMM-style), chosen by expected error.

Templates tried, each at unit noise (see :mod:`mechanisms.optimized.search`):

* ``union``: a weighted union of per-item Kronecker strategies of one family (identity,
  hierarchical or wavelet), weights optimised for the workload (:mod:`mechanisms.primitives.union`);
* ``kron``: optimised per-attribute factors (p-Identity for Laplace, the full-rank optimum for
  Gaussian), alternated over the workload's terms;
* ``marginals``: one weight per attribute subset (measuring weighted marginals);
* ``subset``: for workloads of marginals, subset-space Eigen-Design (L2 noise: reaches the SVD
  bound) or HDMM's marginals template (L1), at a cost independent of the domain size
  (:mod:`mechanisms.primitives.marginal_strategies`).

Under per-item weights every template minimises the weighted total ``Σ_t w_t`` × item t's total
variance (Gram terms scaled by ``w_t``) except ``union``, which is then skipped (its weight search
is unweighted).

The winner is kept in the strategy cache under the workload fingerprint with the public seed it
was optimised with, so a later plan (or another process) rebuilds exactly the same strategy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from dprelease.mechanisms.hierarchical import TreeOptions
from dprelease.mechanisms.optimized.search import OptimizedStrategy, optimize_workload
from dprelease.mechanisms.optimized.search import predict_seconds as predict_template_seconds
from dprelease.mechanisms.optimized.templates import PIdentityFactor
from dprelease.mechanisms.primitives.compute_limits import WorkLimit
from dprelease.mechanisms.primitives.marginal_objectives import plan_subset_weights
from dprelease.mechanisms.primitives.marginal_strategies import (
    MarginalWeights,
    SubsetStrategy,
    marginal_workload_reason,
    subset_strategy,
    subset_unit_error,
    subset_workload,
)
from dprelease.mechanisms.primitives.noise import SENSITIVITY_NORM, NoiseKind
from dprelease.mechanisms.primitives.operators import Factor, MatrixFactor
from dprelease.mechanisms.primitives.protocol import (
    CandidateUnavailable,
    MatrixMechanism,
    PlanRequest,
    StoredStrategy,
    StrategyCache,
    cache_key,
)
from dprelease.mechanisms.primitives.strategies import FAMILIES, KronStrategy, identity_strategy
from dprelease.mechanisms.primitives.threads import single_threaded_blas
from dprelease.mechanisms.primitives.union import (
    UnionStrategy,
    optimize_weights,
    per_item_terms,
    unit_error,
    weight_problem_sizes,
    weighted_terms,
)
from dprelease.mechanisms.primitives.union import predict_seconds as predict_union_seconds
from dprelease.mechanisms.primitives.workload import Workload, cell_vector_reason

MAX_UNION_ITEMS = 24  # the per-item union optimises one weight per item

Optimized = KronStrategy | UnionStrategy | SubsetStrategy


@dataclass(frozen=True, kw_only=True)
class OptimizedOptions(TreeOptions):
    """``branching``: fan-out of the hierarchical family inside the union template."""


class OptimizedMechanism(MatrixMechanism):
    name = "optimized"
    summary = (
        "workload-optimised strategy: best of weighted unions, Kronecker and marginal templates"
    )
    options = OptimizedOptions

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        # measures the cell vector; its templates walk every item's factors
        return cell_vector_reason(request.workload)

    def predicted_seconds(self, request: PlanRequest) -> float:
        workload = request.workload
        if cell_vector_reason(workload) is not None:  # refused; 2^d and N overflow float64
            return math.inf
        if marginal_workload_reason(workload) is None:  # subset space: O(items · 2^d)
            return 0.05 + len(workload.items) * 2 ** len(workload.domain_shape) * 2e-6
        seconds = predict_template_seconds(
            workload.domain_shape, num_terms=len(workload.items), noise=request.noise
        )
        if len(workload.items) <= MAX_UNION_ITEMS:
            terms = per_item_terms(workload, ordered=request.ordered, family=FAMILIES[0])
            dense, blocks = weight_problem_sizes(workload, terms)
            seconds += len(FAMILIES) * predict_union_seconds(
                dense_cells=dense,
                split_blocks=blocks,
                num_terms=len(terms),
                num_cells=workload.num_cells,
            )
        return seconds

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> Optimized:
        branching = OptimizedOptions.parse(request.options).branching
        key = cache_key(
            "optimized",
            request.workload_fingerprint,
            {"norm": SENSITIVITY_NORM[request.noise], "b": branching},
        )
        stored = cache.load(key)
        if stored is not None:
            return _restore(request, stored, branching=branching)
        # One BLAS thread: the searches multiply matrices of a few hundred rows thousands of times;
        # OpenBLAS threads made them many times slower on a shared 2-core machine (measured by
        # ``benchmarks/strategy_bench.py`` with and without ``--blas-threads 1``).
        with single_threaded_blas():
            best, notes = self._search(request, branching=branching, cache=cache)
        parameters = {**best.parameters, "unit_errors": notes}
        arrays = _factor_arrays(best) if isinstance(best, KronStrategy) else {}
        cache.save(key, StoredStrategy(parameters=parameters, arrays=arrays))
        return replace(best, parameters=parameters)

    def _search(
        self, request: PlanRequest, *, branching: int, cache: StrategyCache
    ) -> tuple[Optimized, dict[str, float | str]]:
        workload = request.workload
        best: Optimized | None = None
        best_error = float("inf")
        notes: dict[str, float | str] = {}
        limit = WorkLimit(time_limit=request.time_limit)  # one deadline for union and templates
        if len(workload.items) > MAX_UNION_ITEMS:
            notes["union"] = f"skipped: more than {MAX_UNION_ITEMS} workload items"
        elif workload.weighted:  # its weight search minimises the unweighted total
            notes["union"] = "skipped: the union template does not take item weights"
        else:
            try:
                best, best_error = _best_union(request, branching=branching)
                notes["union"] = best_error
            except CandidateUnavailable as exc:
                notes["union"] = f"not available: {exc.reason}"
        request = replace(request, time_limit=limit.nested_limit())  # what the union left
        if marginal_workload_reason(workload) is None:
            # Subset space: cost independent of the domain size; for L2 noise it is the SVD bound,
            # which no other template can beat, so nothing else is tried.
            weights = plan_subset_weights(request, cache=cache, time_limit=request.time_limit)
            notes["subset"] = weights.unit_total_error
            if weights.unit_total_error < best_error:
                best = subset_strategy(weights, name="optimized", parameters={"seed": request.seed})
            return best, notes  # type: ignore[return-value]
        optimized = optimize_workload(
            workload.gram_terms(weighted=True),
            noise=request.noise,
            rng=np.random.default_rng(request.seed),
            time_limit=request.time_limit,
            progress=request.progress,
        )
        notes.update({k: float(v) for k, v in optimized.details.items()})
        if optimized.total_error < best_error:
            best = _from_template(optimized, workload, seed=request.seed)
        if best is None:
            raise CandidateUnavailable(f"no optimized template fits this workload ({notes})")
        return best, notes


def _best_union(request: PlanRequest, *, branching: int) -> tuple[UnionStrategy, float]:
    best: UnionStrategy | None = None
    best_error = float("inf")
    limit = WorkLimit(time_limit=request.time_limit)  # the families share one deadline
    for family in FAMILIES:
        terms = per_item_terms(
            request.workload, ordered=request.ordered, family=family, branching=branching
        )
        candidate = optimize_weights(
            request.workload,
            terms,
            noise=request.noise,
            name="optimized",
            time_limit=limit.nested_limit(),
            progress=request.progress,
        )
        error = unit_error(candidate, request.workload, noise=request.noise)
        if error < best_error:
            best_error = error
            best = replace(
                candidate,
                parameters={
                    "template": "union",
                    "family": family,
                    "weights": [t.weight for t in candidate.terms],
                    "kept_terms": list(candidate.parameters["kept_terms"]),  # type: ignore[call-overload]
                },
            )
    if best is None:  # pragma: no cover - FAMILIES is never empty
        raise CandidateUnavailable("no union strategy")
    return best, best_error


def _from_template(optimized: OptimizedStrategy, workload: Workload, *, seed: int) -> Optimized:
    if optimized.kind == "marginals":
        weights = np.asarray(optimized.weights)
        parameters = {"template": "marginals", "marginal_weights": weights.tolist(), "seed": seed}
        return _marginals_template(
            weights, workload, noise=optimized.objective_noise, parameters=parameters
        )
    return KronStrategy(
        name="optimized",
        factors=optimized.factor_operators(),
        parameters={
            "template": "kron",
            "factor_templates": list(optimized.factor_templates),
            "seed": seed,
        },
    )


def _marginals_template(
    weights: np.ndarray, workload: Workload, *, noise: NoiseKind, parameters: dict[str, Any]
) -> SubsetStrategy:
    """HDMM's marginals template on a general workload (weights of :func:`optimize_workload`),
    as the subset-space strategy; weights at round-off (below 1e-12 of the largest) are dropped."""
    weights = np.asarray(weights, dtype=np.float64)
    weights = np.where(weights > 1e-12 * weights.max(), weights, 0.0)
    marginal = MarginalWeights(
        domain_shape=workload.domain_shape,
        basis="marginal",
        weights=weights,
        noise=noise,
        unit_total_error=0.0,
    )
    error = subset_unit_error(marginal, subset_workload(workload, weighted=True).projections)
    marginal = replace(marginal, unit_total_error=error)
    return SubsetStrategy(name="optimized", weights=marginal, parameters=parameters)


def _restore(request: PlanRequest, stored: StoredStrategy, *, branching: int) -> Optimized:
    """The recorded strategy, rebuilt from its parameters (and stored factors for ``kron``)."""
    parameters = dict(stored.parameters)
    workload = request.workload
    template = parameters["template"]
    if template == "union":
        all_terms = per_item_terms(
            workload, ordered=request.ordered, family=str(parameters["family"]), branching=branching
        )
        terms = [all_terms[int(k)] for k in parameters["kept_terms"]]
        return UnionStrategy(
            name="optimized",
            domain_shape=workload.domain_shape,
            terms=weighted_terms(terms, parameters["weights"]),
            parameters=parameters,
        )
    if "subset_weights" in parameters:
        weights = MarginalWeights.from_parameters(workload.domain_shape, parameters)
        return subset_strategy(weights, name="optimized", parameters=parameters)
    if template == "marginals":
        weights = np.asarray(parameters["marginal_weights"])
        return _marginals_template(weights, workload, noise=request.noise, parameters=parameters)
    return KronStrategy(
        name="optimized",
        factors=_restore_factors(stored, workload.domain_shape, noise=request.noise),
        parameters=parameters,
    )


def _factor_arrays(strategy: KronStrategy) -> dict[str, np.ndarray]:
    """What the store keeps of a Kronecker template: Θ of p-Identity factors (O(p n), not the
    140 MB dense factor at n = 4096), nothing for identity factors, other factors dense."""
    arrays: dict[str, np.ndarray] = {}
    for i, factor in enumerate(strategy.factors):
        if isinstance(factor, PIdentityFactor):
            arrays[f"theta_{i}"] = factor.theta
        elif not _is_identity(factor):
            arrays[f"factor_{i}"] = factor.dense()
    return arrays


def _is_identity(factor: Factor) -> bool:
    """A sparse ``I_n`` (what the identity template is kept as). O(n)."""
    if not (isinstance(factor, MatrixFactor) and sp.issparse(factor.matrix)):
        return False
    matrix = factor.matrix
    n = factor.n
    return (
        factor.m == n
        and matrix.nnz == n
        and np.array_equal(matrix.indptr, np.arange(n + 1))
        and np.array_equal(matrix.indices, np.arange(n))
        and bool(np.all(matrix.data == 1.0))
    )


def _restore_factors(
    stored: StoredStrategy, domain_shape: tuple[int, ...], *, noise: NoiseKind
) -> tuple[Factor, ...]:
    """The inverse of :func:`_factor_arrays` (entries stored before Θ was kept have dense
    ``factor_i`` arrays for every attribute)."""
    templates = list(stored.parameters.get("factor_templates", []))
    factors: list[Factor] = []
    for i, n in enumerate(domain_shape):
        if f"theta_{i}" in stored.arrays:
            factors.append(PIdentityFactor(stored.arrays[f"theta_{i}"], noise=noise))
        elif f"factor_{i}" in stored.arrays:
            factors.append(MatrixFactor(stored.arrays[f"factor_{i}"]))
        elif i < len(templates) and templates[i] == "identity":
            factors.append(identity_strategy(n))
        else:  # _factor_arrays leaves out identity factors only
            raise ValueError(
                f"stored Kronecker strategy has no array for attribute {i} and its template "
                f"({templates[i] if i < len(templates) else 'unrecorded'}) is not identity"
            )
    return tuple(factors)


MECHANISM = OptimizedMechanism()
