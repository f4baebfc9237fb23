"""From a spec to a workload, candidate strategies, their expected errors and the SVD lower bound.

Planning is data-free: it reads only the spec (public) and spends nothing.  ``plan --json`` prints
:meth:`Plan.to_json`.  ``rmse`` is √(mean per-query expected squared error) over all queries of all
items, unweighted, at the spec's privacy level (noise calibrated exactly as a release would be,
including OpenDP's discretisation slack); ``total_variance`` is the sum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import threadpoolctl

from catalog.errors import SpecError
from catalog.spec import RUNNABLE_MECHANISMS, ReleaseSpec, WorkloadItemSpec
from catalog.strategy_store import StrategyStore, strategy_key
from mechanisms.dense import DenseStrategy, FactorizationStrategy
from mechanisms.eigen_design import eigen_design
from mechanisms.error import ErrorReport, expected_error, support_residual, svd_bound
from mechanisms.lrm import decompose
from mechanisms.noise import calibrate, noise_kind_for
from mechanisms.operators import (
    AllRanges,
    Factor,
    Identity,
    MatrixFactor,
    Prefix,
    Ranges,
    Total,
    kron_dense,
)
from mechanisms.optimized import OptimizedStrategy, optimize_workload
from mechanisms.privacy import PrivacyCost
from mechanisms.strategies import (
    FAMILIES,
    KronStrategy,
    build_kron_strategy,
    identity_strategy,
    total_strategy,
)
from mechanisms.union import UnionStrategy, UnionTerm, optimize_weights, per_item_terms, unit_error
from mechanisms.workload import Workload, WorkloadItem


def build_workload(spec: ReleaseSpec) -> Workload:
    """The spec's workload as Kronecker items over the spec's domain (attribute order = spec order)."""
    return Workload(
        domain_shape=spec.domain_shape,
        items=tuple(_build_item(spec, item) for item in spec.workload),
    )


def _build_item(spec: ReleaseSpec, item: WorkloadItemSpec) -> WorkloadItem:
    factors: list[Factor] = []
    for name, attribute in spec.domain.items():
        n = attribute.size
        factor: Factor = Total(n)
        if item.marginal is not None and name in item.marginal:
            factor = Identity(n)
        elif item.prefix == name:
            factor = Prefix(n)
        elif item.all_ranges is not None and name in item.all_ranges:
            factor = AllRanges(n)
        elif item.attributes is not None and name in item.attributes:
            try:
                factor = MatrixFactor(item.load_matrix(columns=n))
            except ValueError as exc:
                raise SpecError(str(exc)) from None
        elif item.ranges is not None and name in item.ranges:
            pairs = item.ranges[name]
            lo = [attribute.value_to_cell(pair[0], edge="low") for pair in pairs]
            hi = [attribute.value_to_cell(pair[1], edge="high") for pair in pairs]
            factor = Ranges(n, lo, hi)
        factors.append(factor)
    return WorkloadItem(name=item.name, factors=tuple(factors))


CANDIDATES = (*FAMILIES, "optimized", "eigen", "lrm")
MAX_MEASURED_ANSWERS = 1_000_000_000
SUPPORT_TOLERANCE = 1e-4  # relative; an unsupported query leaves a residual of order 1
MAX_UNION_ITEMS = 24  # the per-item union optimises one weight per item (finite differences)


def ordered_flags(spec: ReleaseSpec) -> tuple[bool, ...]:
    return tuple(getattr(attribute, "ordered", True) for attribute in spec.domain.values())


Strategy = KronStrategy | UnionStrategy | FactorizationStrategy | DenseStrategy


def strategy_for(
    spec: ReleaseSpec,
    mechanism: str,
    workload: Workload | None = None,
    parameters: dict[str, Any] | None = None,
) -> Strategy:
    """The (deterministic, public) strategy of a data-independent mechanism for this spec.

    ``optimized`` is a weighted union of per-item Kronecker strategies; with the ``parameters`` a
    plan recorded (family and weights) it is rebuilt without optimising again.
    """
    workload = workload or build_workload(spec)
    if mechanism == "optimized":
        return _optimized(spec, workload, parameters)
    if mechanism == "lrm":
        return _low_rank(spec, workload)
    if mechanism == "eigen":
        return _eigen(spec, workload)
    if mechanism not in FAMILIES:
        raise SpecError(
            f"mechanism {mechanism!r} cannot run in this version; available: {', '.join(RUNNABLE_MECHANISMS)}"
        )
    return build_kron_strategy(
        mechanism,
        attribute_roles=workload.attribute_roles(ordered_flags(spec)),
        branching=int(spec.mechanism_options.get("branching", 2)),
    )


def _optimized(
    spec: ReleaseSpec, workload: Workload, parameters: dict[str, Any] | None
) -> Strategy:
    """The best of two templates, chosen by expected error at unit noise:

    * ``union``: a weighted union of per-item Kronecker strategies (:mod:`mechanisms.union`);
    * ``kron`` / ``marginals``: the optimised per-attribute templates (p-Identity / full-rank
      factors) or marginal weights of :mod:`mechanisms.optimized`.

    The result is kept in the on-disk :class:`StrategyStore` under the workload fingerprint, and
    the plan records the store key, so a release rebuilds exactly the planned strategy.
    """
    noise = noise_kind_for(spec.privacy_target().measure)
    norm = 1 if noise == "laplace" else 2
    branching = int(spec.mechanism_options.get("branching", 2))
    store = StrategyStore()
    key = strategy_key(
        workload_fingerprint=spec.workload_fingerprint(),
        template="optimized",
        settings={"norm": norm, "branching": branching},
    )
    stored = store.get(key) if parameters is None else {"parameters": parameters}
    if stored is not None:
        rebuilt = _rebuild_optimized(spec, workload, dict(stored["parameters"]), store, key)
        if rebuilt is not None:
            return rebuilt
    best: Strategy | None = None
    best_error = float("inf")
    notes: dict[str, float | str] = {}
    if len(workload.items) > MAX_UNION_ITEMS:
        notes["union"] = f"skipped: more than {MAX_UNION_ITEMS} workload items"
    else:
        try:
            union, union_error = _best_union(spec, workload, norm=norm, branching=branching)
            best, best_error = union, union_error
            notes["union"] = union_error
        except ValueError as exc:  # the union algebra does not fit this workload's structure
            notes["union"] = f"not available: {exc}"
    seed = int(spec.workload_fingerprint()[:15], 16)  # public randomness, recorded
    try:
        optimized = optimize_workload(
            workload.gram_terms(), noise=noise, rng=np.random.default_rng(seed)
        )
        notes.update({k: float(v) for k, v in optimized.details.items()})
        if optimized.total_error < best_error:
            best = _from_template(optimized, workload, seed=seed)
            best_error = optimized.total_error
            if optimized.kind != "marginals":
                store.put_arrays(key, {f"factor_{i}": f for i, f in enumerate(optimized.factors)})
    except ValueError as exc:
        notes["templates"] = f"not available: {exc}"
    if best is None:
        raise ValueError(f"no optimized template fits this workload ({notes})")
    recorded = {**best.parameters, "unit_errors": notes, "store_key": key}
    store.put(key, recorded)
    return _with_parameters(best, recorded)


def _best_union(
    spec: ReleaseSpec, workload: Workload, *, norm: int, branching: int
) -> tuple[UnionStrategy, float]:
    best: UnionStrategy | None = None
    best_error = float("inf")
    for family in FAMILIES:
        terms = per_item_terms(
            workload, ordered=ordered_flags(spec), family=family, branching=branching
        )
        candidate = optimize_weights(workload, terms, norm=norm, name="optimized")
        error = unit_error(candidate, workload, norm=norm)
        if error < best_error:
            best_error = error
            best = UnionStrategy(
                name="optimized",
                domain_shape=candidate.domain_shape,
                terms=candidate.terms,
                parameters={
                    "template": "union",
                    "family": family,
                    "weights": [t.weight for t in candidate.terms],
                    "kept_terms": list(candidate.parameters["kept_terms"]),  # type: ignore[call-overload]
                },
            )
    if best is None:  # pragma: no cover - FAMILIES is never empty
        raise ValueError("no union strategy")
    return best, best_error


def _from_template(optimized: OptimizedStrategy, workload: Workload, *, seed: int) -> Strategy:
    if optimized.kind == "marginals":
        weights = np.asarray(optimized.weights)
        sizes = workload.domain_shape
        terms = []
        for mask in np.flatnonzero(weights > 1e-12 * weights.max()):
            factors = tuple(
                identity_strategy(n) if (int(mask) >> axis) & 1 else total_strategy(n)
                for axis, n in enumerate(sizes)
            )
            terms.append(UnionTerm(weight=float(weights[mask]), factors=factors))
        return UnionStrategy(
            name="optimized",
            domain_shape=sizes,
            terms=tuple(terms),
            parameters={
                "template": "marginals",
                "marginal_weights": weights.tolist(),
                "seed": seed,
            },
        )
    return KronStrategy(
        name="optimized",
        factors=tuple(MatrixFactor(f) for f in optimized.factors),
        parameters={
            "template": "kron",
            "factor_templates": list(optimized.factor_templates),
            "seed": seed,
        },
    )


def _rebuild_optimized(
    spec: ReleaseSpec,
    workload: Workload,
    parameters: dict[str, Any],
    store: StrategyStore,
    key: str,
) -> Strategy | None:
    """The recorded strategy, or None when its stored matrices are missing (then re-optimise)."""
    template = parameters.get("template")
    branching = int(spec.mechanism_options.get("branching", 2))
    if template == "union":
        all_terms = per_item_terms(
            workload,
            ordered=ordered_flags(spec),
            family=str(parameters["family"]),
            branching=branching,
        )
        terms = [all_terms[int(k)] for k in parameters["kept_terms"]]
        weights = [float(w) for w in parameters["weights"]]
        return UnionStrategy(
            name="optimized",
            domain_shape=workload.domain_shape,
            terms=tuple(
                UnionTerm(weight=w, factors=f) for w, f in zip(weights, terms, strict=True)
            ),
            parameters=parameters,
        )
    if template == "marginals":
        rebuilt = OptimizedStrategy(
            kind="marginals",
            domain_sizes=workload.domain_shape,
            objective_noise="laplace",
            total_error=0.0,
            sensitivity=1.0,
            restarts=0,
            seconds=0.0,
            weights=np.asarray(parameters["marginal_weights"]),
        )
        return _with_parameters(
            _from_template(rebuilt, workload, seed=int(parameters["seed"])), parameters
        )
    if template == "kron":
        arrays = store.get_arrays(str(parameters.get("store_key", key)))
        if arrays is None:
            return None
        factors = tuple(MatrixFactor(arrays[f"factor_{i}"]) for i in range(len(arrays)))
        return KronStrategy(name="optimized", factors=factors, parameters=parameters)
    return None


def _with_parameters(strategy: Strategy, parameters: dict[str, Any]) -> Strategy:
    if isinstance(strategy, UnionStrategy):
        return UnionStrategy(
            name=strategy.name,
            domain_shape=strategy.domain_shape,
            terms=strategy.terms,
            parameters=parameters,
        )
    return KronStrategy(name=strategy.name, factors=strategy.factors, parameters=parameters)


LRM_MAX_CELLS = 4096
LRM_MAX_QUERIES = 4096
LRM_AUTO_MAX = 1024  # auto considers LRM only on small workloads (a decomposition costs seconds)


def lrm_applicability(spec: ReleaseSpec, workload: Workload) -> str | None:
    if spec.privacy_target().measure != "pure":
        return (
            "the Low-Rank Mechanism is an epsilon-DP (Laplace) mechanism: give privacy as {epsilon}"
        )
    if workload.num_cells > LRM_MAX_CELLS or workload.num_queries > LRM_MAX_QUERIES:
        return (
            f"LRM factors the explicit workload matrix: at most {LRM_MAX_QUERIES} queries over "
            f"{LRM_MAX_CELLS} cells (this one is {workload.num_queries} × {workload.num_cells})"
        )
    return None


def _low_rank(spec: ReleaseSpec, workload: Workload) -> FactorizationStrategy:
    """LRM's decomposition of the stacked workload matrix, cached in the strategy store."""
    reason = lrm_applicability(spec, workload)
    if reason is not None:
        raise ValueError(reason)
    matrix = np.vstack([kron_dense(item.factors) for item in workload.items])  # O(m N)
    rows: dict[str, tuple[int, int]] = {}
    start = 0
    for item in workload.items:
        rows[item.name] = (start, start + item.num_queries)
        start += item.num_queries
    store = StrategyStore()
    key = strategy_key(
        workload_fingerprint=spec.workload_fingerprint(), template="lrm", settings={}
    )
    arrays = store.get_arrays(key)
    stored = store.get(key)
    if arrays is None or stored is None:
        seed = int(spec.workload_fingerprint()[:15], 16)  # public randomness, recorded
        with threadpoolctl.threadpool_limits(limits=1):
            decomposition = decompose(matrix, rng=np.random.default_rng(seed))
        arrays = {"B": decomposition.B, "L": decomposition.L}
        stored = {
            "parameters": {
                "template": "lrm",
                "rank": decomposition.rank,
                "iterations": decomposition.iterations,
                "converged": decomposition.converged,
                "bias_sq": decomposition.bias_sq,
                "seed": seed,
                "store_key": key,
            }
        }
        store.put_arrays(key, arrays)
        store.put(key, stored["parameters"])
    parameters = dict(stored["parameters"])
    return FactorizationStrategy(
        name="lrm",
        B=arrays["B"],
        L=arrays["L"],
        item_rows=rows,
        bias_sq=float(parameters["bias_sq"]),
        parameters=parameters,
    )


def _skip_reason(spec: ReleaseSpec, mechanism: str, workload: Workload) -> str | None:
    """Why a dense candidate (eigen, lrm) is not evaluated; raises when the spec asked for it.

    ``auto`` evaluates them only on small workloads, since each costs an O(N³) optimisation.
    """
    if mechanism == "eigen":
        reason = eigen_applicability(workload)
        too_big_for_auto = workload.num_cells > EIGEN_AUTO_MAX_CELLS
        limit = f"{EIGEN_AUTO_MAX_CELLS} cells"
    elif mechanism == "lrm":
        reason = lrm_applicability(spec, workload)
        too_big_for_auto = max(workload.num_cells, workload.num_queries) > LRM_AUTO_MAX
        limit = f"{LRM_AUTO_MAX} cells or queries"
    else:
        return None
    if reason is None and spec.mechanism != mechanism and too_big_for_auto:
        reason = f"skipped by auto above {limit} (ask for it with mechanism: {mechanism})"
    if reason is not None and spec.mechanism == mechanism:
        raise SpecError(f"mechanism {mechanism!r} cannot run on this spec: {reason}")
    return reason


def _strategy_note(strategy: Strategy) -> str | None:
    if isinstance(strategy, FactorizationStrategy):
        return (
            f"plus bias up to {strategy.bias_sq:.3g} × Σx² (relaxed W ≈ BL; data-dependent, "
            f"not in rmse); rank {strategy.parameters.get('rank')}"
        )
    template = strategy.parameters.get("template")
    return f"template: {template}" if template else None


EIGEN_MAX_CELLS = 4096
EIGEN_AUTO_MAX_CELLS = 2048


def eigen_applicability(workload: Workload) -> str | None:
    if workload.num_cells > EIGEN_MAX_CELLS:
        return (
            f"Eigen-Design works on the dense {workload.num_cells}-cell Gram matrix; at most "
            f"{EIGEN_MAX_CELLS} cells"
        )
    return None


def _eigen(spec: ReleaseSpec, workload: Workload) -> DenseStrategy:
    """Eigen-Design (Li thesis ch. 5) on the workload Gram; the ε-DP variant for Laplace."""
    reason = eigen_applicability(workload)
    if reason is not None:
        raise ValueError(reason)
    norm = "l1" if noise_kind_for(spec.privacy_target().measure) == "laplace" else "l2"
    store = StrategyStore()
    key = strategy_key(
        workload_fingerprint=spec.workload_fingerprint(), template="eigen", settings={"norm": norm}
    )
    arrays = store.get_arrays(key)
    stored = store.get(key)
    if arrays is None or stored is None:
        gram = workload.dense_gram()
        with threadpoolctl.threadpool_limits(limits=1):
            design = eigen_design(np.asarray(gram), sensitivity=norm)
        arrays = {"A": design.A}
        stored = {
            "parameters": {
                "template": "eigen-design",
                "sensitivity_norm": norm,
                "source": design.source,
                "eigenvalues_kept": int(design.eigenvalues_kept.size),
                "solver_relative_gap": float(design.solver_relative_gap),
                "store_key": key,
            }
        }
        store.put_arrays(key, arrays)
        store.put(key, stored["parameters"])
    return DenseStrategy(name="eigen", matrix=arrays["A"], parameters=dict(stored["parameters"]))


def dawa_applicability(spec: ReleaseSpec) -> str | None:
    """None when DAWA can run on this spec, else the reason it cannot."""
    attributes = list(spec.domain.values())
    if len(attributes) not in (1, 2):
        return (
            f"DAWA needs a domain of one or two ordered attributes (this one has {len(attributes)})"
        )
    if not all(getattr(a, "ordered", True) for a in attributes):
        return "DAWA needs ordered attributes (integer ranges, bins, or ordered categories)"
    if spec.privacy_target().measure != "pure":
        return "DAWA uses Laplace noise: give privacy as {epsilon}"
    return None


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One candidate mechanism's expected error at the spec's privacy level."""

    mechanism: str
    rmse: float | None
    total_variance: float | None
    seconds: float
    sensitivity: float | None = None
    noise_scale: float | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "rmse": self.rmse,
            "total_variance": self.total_variance,
            "seconds": round(self.seconds, 6),
            "sensitivity": self.sensitivity,
            "noise_scale": self.noise_scale,
            "note": self.note,
        }


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The data-free plan of a release: candidates, the choice and why, and the lower bound."""

    chosen: str
    reason: str
    candidates: tuple[Candidate, ...]
    lower_bound_rmse: float | None
    lower_bound_note: str
    privacy: dict[str, float]
    expected_cost: PrivacyCost
    noise_kind: str
    workload_fingerprint: str
    num_queries: int
    num_cells: int
    item_queries: dict[str, int]
    strategy_parameters: dict[str, Any]

    def candidate(self, mechanism: str) -> Candidate:
        for candidate in self.candidates:
            if candidate.mechanism == mechanism:
                return candidate
        raise KeyError(mechanism)

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "lower_bound_rmse": self.lower_bound_rmse,
            "lower_bound_note": self.lower_bound_note,
            "privacy": dict(self.privacy),
            "cost": self.expected_cost.as_dict(),
            "noise": self.noise_kind,
            "num_queries": self.num_queries,
            "num_cells": self.num_cells,
            "workload_fingerprint": self.workload_fingerprint,
            "strategy_parameters": self.strategy_parameters,
            "candidates": [candidate.to_json() for candidate in self.candidates],
        }


def evaluate(
    spec: ReleaseSpec, strategy: Strategy, workload: Workload
) -> tuple[ErrorReport, float, float, PrivacyCost]:
    """Expected error, sensitivity, noise scale and exact cost of measuring ``strategy``."""
    target = spec.privacy_target()
    norm = 1 if noise_kind_for(target.measure) == "laplace" else 2
    sensitivity = strategy.sensitivity(norm=norm) * spec.privacy_unit.contribution_bound
    # OpenDP's slack depends on the vector size; beyond 1e8 answers (plan-only domains) the
    # calibration at 1e8 values is used (the slack is then ~1e-7 relative).
    mechanism = calibrate(
        target=target, sensitivity=sensitivity, size=min(strategy.num_queries, 100_000_000)
    )
    report = expected_error(workload, strategy, noise_variance=mechanism.variance)
    return report, sensitivity, mechanism.scale, mechanism.cost


def make_plan(spec: ReleaseSpec) -> Plan:
    """Evaluate every runnable candidate and choose (auto: least expected total error)."""
    if spec.mechanism == "dawa":
        reason = dawa_applicability(spec)
        if reason is not None:
            raise SpecError(f"mechanism 'dawa' cannot run on this spec: {reason}")
    if spec.mechanism not in RUNNABLE_MECHANISMS:
        raise SpecError(
            f"mechanism {spec.mechanism!r} cannot run in this version; available: "
            f"{', '.join(RUNNABLE_MECHANISMS)}"
        )
    workload = build_workload(spec)
    target = spec.privacy_target()
    candidates: list[Candidate] = []
    costs: dict[str, PrivacyCost] = {}
    parameters: dict[str, dict[str, Any]] = {}
    for mechanism in CANDIDATES:
        started = time.perf_counter()
        skip = _skip_reason(spec, mechanism, workload)
        if skip is not None:
            candidates.append(
                Candidate(
                    mechanism=mechanism, rmse=None, total_variance=None, seconds=0.0, note=skip
                )
            )
            continue
        try:
            strategy = strategy_for(spec, mechanism, workload)
            residual = support_residual(workload, strategy)
        except ValueError as exc:  # a template that does not fit this workload's structure
            candidates.append(
                Candidate(
                    mechanism=mechanism,
                    rmse=None,
                    total_variance=None,
                    seconds=time.perf_counter() - started,
                    note=f"not available: {exc}",
                )
            )
            continue
        if residual > SUPPORT_TOLERANCE:
            candidates.append(
                Candidate(
                    mechanism=mechanism,
                    rmse=None,
                    total_variance=None,
                    seconds=time.perf_counter() - started,
                    note=f"does not support the workload (residual {residual:.2e})",
                )
            )
            continue
        report, sensitivity, scale, cost = evaluate(spec, strategy, workload)
        costs[mechanism] = cost
        parameters[mechanism] = dict(strategy.parameters)
        if strategy.num_queries > MAX_MEASURED_ANSWERS:
            candidates.append(
                Candidate(
                    mechanism=mechanism,
                    rmse=report.rmse,
                    total_variance=report.total_variance,
                    seconds=time.perf_counter() - started,
                    sensitivity=sensitivity,
                    noise_scale=scale,
                    note=f"plan only: {strategy.num_queries:,} noisy answers is too many to measure",
                )
            )
            continue
        costs[mechanism] = cost
        parameters[mechanism] = dict(strategy.parameters)
        candidates.append(
            Candidate(
                mechanism=mechanism,
                rmse=report.rmse,
                total_variance=report.total_variance,
                seconds=time.perf_counter() - started,
                sensitivity=sensitivity,
                noise_scale=scale,
                note=_strategy_note(strategy),
            )
        )
    started = time.perf_counter()
    dawa_reason = dawa_applicability(spec)
    candidates.append(
        Candidate(
            mechanism="dawa",
            rmse=None,
            total_variance=None,
            seconds=time.perf_counter() - started,
            note=(
                "data-dependent: its error depends on the data, so it is not predicted (auto never "
                "picks it; ask for it with mechanism: dawa)"
                if dawa_reason is None
                else f"not available: {dawa_reason}"
            ),
        )
    )
    scored = [c for c in candidates if c.total_variance is not None]
    if not scored:
        raise SpecError("no candidate mechanism supports this workload")
    best = min(scored, key=lambda c: c.total_variance or float("inf"))
    if spec.mechanism == "dawa":
        chosen = "dawa"
        reason = "requested by the spec (data-dependent partition, then GreedyH; Li thesis ch. 6)"
        costs["dawa"] = PrivacyCost(measure="pure", epsilon=target.epsilon)
        parameters["dawa"] = dict(spec.mechanism_options)
    elif spec.mechanism == "auto":
        chosen = best.mechanism
        reason = f"auto: least expected total error among {', '.join(c.mechanism for c in scored)}"
    else:
        chosen = spec.mechanism
        if chosen not in costs:
            raise SpecError(f"mechanism {chosen!r} does not support this workload")
        ratio = (spec_total := _total(candidates, chosen)) / (best.total_variance or spec_total)
        reason = f"requested by the spec ({ratio:.3f}x the best candidate's expected error)"
    lower_rmse, lower_note = _lower_bound(spec, workload)
    return Plan(
        chosen=chosen,
        reason=reason,
        candidates=tuple(candidates),
        lower_bound_rmse=lower_rmse,
        lower_bound_note=lower_note,
        privacy=dict(spec.privacy),
        expected_cost=costs[chosen],
        noise_kind=noise_kind_for(target.measure),
        workload_fingerprint=spec.workload_fingerprint(),
        num_queries=workload.num_queries,
        num_cells=workload.num_cells,
        item_queries={item.name: item.num_queries for item in workload.items},
        strategy_parameters=parameters[chosen],
    )


def _total(candidates: list[Candidate], mechanism: str) -> float:
    for candidate in candidates:
        if candidate.mechanism == mechanism and candidate.total_variance is not None:
            return candidate.total_variance
    raise KeyError(mechanism)


def _lower_bound(spec: ReleaseSpec, workload: Workload) -> tuple[float | None, str]:
    """√(P·SVDB/m): P is the noise variance a sensitivity-1 strategy gets (× the contribution bound²)."""
    bound = svd_bound(workload)
    if bound is None:
        return None, (
            f"not computed: the exact SVD bound of a union of items needs at most "
            f"4096 cells (this domain has {workload.num_cells})"
        )
    unit = calibrate(
        target=spec.privacy_target(),
        sensitivity=float(spec.privacy_unit.contribution_bound),
        size=min(workload.num_cells, 100_000_000),
    )
    return float((unit.variance * bound / workload.num_queries) ** 0.5), (
        "SVD bound (Li thesis Thm 4.1): no matrix-mechanism strategy has lower total error"
    )
