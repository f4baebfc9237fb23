"""From a spec to a workload, the registry's candidate strategies, their expected errors, the bound.

Planning is data-free: it reads only the spec (public) and spends nothing.  ``plan --json`` prints
:meth:`Plan.to_json`.  ``rmse`` is √(mean per-query expected squared error) over all queries of all
items, unweighted, at the spec's privacy level (noise calibrated exactly as a release would be,
including OpenDP's discretisation slack); ``total_variance`` is the sum.  A spec whose items carry
weights adds ``weighted_total_variance`` (``Σ_items weight × item total``) to each candidate, and
``auto`` then minimises that.

Only what is needed is planned: a spec that names a mechanism plans that one; ``auto`` plans the
registry's mechanisms cheapest first (predicted from sizes), stops once one is within
:data:`EARLY_STOP` of the SVD lower bound, and skips those predicted to exceed the time budget
(once one candidate is planned, so a plan always exists). Every skipped or unavailable candidate is
listed with its reason. The chosen strategy travels in the plan: measure and reconstruct use that
object, they never rebuild it."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.spec.limits import MAX_RELEASE_CELLS, MAX_RELEASE_QUERIES
from dprelease.catalog.spec.model import (
    ReleaseSpec,
    derived_rows,
    derived_support,
    expansion_tables,
)
from dprelease.catalog.spec.sections import WorkloadItemSpec
from dprelease.mechanisms import registry
from dprelease.mechanisms.primitives.compute_limits import MIN_TIME_LIMIT
from dprelease.mechanisms.primitives.lower_bound import svd_bound
from dprelease.mechanisms.primitives.noise import calibrate, noise_kind_for
from dprelease.mechanisms.primitives.operators import (
    AllRanges,
    Factor,
    Identity,
    MatrixFactor,
    Prefix,
    Ranges,
    Total,
)
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import (
    CALIBRATION_SIZE_LIMIT,
    CandidateUnavailable,
    Evaluation,
    Mechanism,
    PlanRequest,
    Progress,
    StrategyCache,
)
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem, magnitude

MAX_MEASURED_ANSWERS = 1_000_000_000
SUPPORT_TOLERANCE = 1e-4  # relative; an unsupported query leaves a residual of order 1
EARLY_STOP = 0.005  # auto stops once a candidate's rmse is within 0.5% of the lower bound
WEIGHTED_TIE = 1e-6  # relative: weighted totals closer than this are equal (round-off)
DEFAULT_TIME_BUDGET = 120.0  # seconds of predicted planning work auto may spend on candidates


def build_workload(spec: ReleaseSpec) -> Workload:
    """The spec's workload as Kronecker items over the spec's domain (attribute order = spec order).
    Marginal items share their factors (:meth:`WorkloadItem.marginal`): O(k) Python each."""
    shape = spec.domain_shape
    axis = {name: k for k, name in enumerate(spec.domain)}
    items: list[WorkloadItem] = []
    with _no_cyclic_gc():
        _append_items(spec, shape, axis, items)
    return Workload(domain_shape=shape, items=tuple(items))


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic collector while building items: they hold no cycles, and its full passes
    over 166,750 factor tuples cost more than building them (~15 µs a table instead of ~6)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _append_items(
    spec: ReleaseSpec, shape: tuple[int, ...], axis: dict[str, int], items: list[WorkloadItem]
) -> None:
    for item in spec.workload:
        if item.marginals is None:
            items.append(_build_item(spec, item, shape, axis))
            continue
        # the expansion's names and attributes, never one spec model per table: O(tables · k)
        weight = 1.0 if item.weight is None else item.weight  # every table inherits it
        for name, attributes in expansion_tables(spec, item):
            kept = [axis[a] for a in attributes]
            items.append(
                WorkloadItem.marginal(name=name, domain_shape=shape, kept=kept, weight=weight)
            )


def _build_item(
    spec: ReleaseSpec, item: WorkloadItemSpec, shape: tuple[int, ...], axis: dict[str, int]
) -> WorkloadItem:
    weight = 1.0 if item.weight is None else item.weight
    if item.derived_column is not None:  # mean/sum/quantiles: their support queries
        support = derived_support(spec, item)
        return support if weight == 1.0 else support.with_weight(weight)
    if item.marginal is not None or item.total is not None:
        kept = [axis[name] for name in item.marginal or ()]
        return WorkloadItem.marginal(name=item.name, domain_shape=shape, kept=kept, weight=weight)
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
    return WorkloadItem(name=item.name, factors=tuple(factors), weight=weight)


def plan_request(
    spec: ReleaseSpec,
    *,
    workload: Workload,
    requested: bool,
    time_limit: float | None = None,
    progress: Progress | None = None,
) -> PlanRequest:
    return PlanRequest(
        workload=workload,
        ordered=tuple(getattr(a, "ordered", True) for a in spec.domain.values()),
        target=spec.privacy_target(),
        contribution_bound=spec.privacy_unit.contribution_bound,
        options=dict(spec.mechanism_options),
        workload_fingerprint=spec.workload_fingerprint(),
        requested=requested,
        time_limit=time_limit,
        progress=progress,
        objective=spec.effective_objective,
        item_scales=_item_scales(spec),
    )


def _item_scales(spec: ReleaseSpec) -> dict[str, float] | None:
    """``1/target²`` per table under accuracy targets: a table meets its target exactly when its
    scaled largest variance is 1 (at the planned privacy level)."""
    targets = spec.item_targets()
    return None if targets is None else {name: t**-2 for name, t in targets.items()}


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One candidate mechanism: its expected error at the spec's privacy level, or why not."""

    mechanism: str
    rmse: float | None
    total_variance: float | None
    seconds: float
    sensitivity: float | None = None
    noise_scale: float | None = None
    largest_variance: float | None = None
    """The largest variance of any released cell (computed for the chosen candidate, and for
    every candidate when the objective is ``max_variance``)."""
    status: str = "planned"
    """``planned`` (evaluated), ``unavailable`` (cannot serve the workload) or ``skipped``."""
    note: str | None = None
    weighted_total_variance: float | None = None
    """``Σ_items weight × item total variance`` (items with a ``weight``; what ``auto`` then
    minimises); ``total_variance`` and ``rmse`` stay unweighted."""

    def to_json(self, *, weighted: bool = False) -> dict[str, Any]:
        """``weighted_total_variance`` only for a spec with item weights (the contract's keys
        are unchanged otherwise)."""
        data = {**asdict(self), "seconds": round(self.seconds, 6)}
        if not weighted:
            del data["weighted_total_variance"]
        return data


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The data-free plan of a release: candidates, the choice and why, the lower bound, and the
    chosen mechanism's planned strategy (public; used as is by measure and reconstruct)."""

    model: str
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
    objective: str = "total_variance"
    item_std_errors: dict[str, float] | None = None
    """Per item of the chosen strategy, the largest standard error of its cells (None when the
    error is not predicted: data-dependent mechanisms)."""
    targets: dict[str, float] | None = None
    """Per item, the spec's ``max_std_error`` (accuracy targets; the plan's privacy level is the
    smallest that meets them all)."""
    weighted: bool = False
    """The spec gives item weights: candidates carry ``weighted_total_variance``."""
    strategy: Any = field(default=None, repr=False, compare=False)
    workload: Workload | None = field(default=None, repr=False, compare=False)

    @property
    def mechanism(self) -> Mechanism:
        return registry.get(self.chosen, model=self.model)

    def candidate(self, mechanism: str) -> Candidate:
        for candidate in self.candidates:
            if candidate.mechanism == mechanism:
                return candidate
        raise KeyError(mechanism)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
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
            "candidates": [c.to_json(weighted=self.weighted) for c in self.candidates],
            "objective": self.objective,
            "item_std_errors": self.item_std_errors,
            "targets": self.targets,
            "binding_table": self.binding_table,
        }

    @property
    def binding_table(self) -> str | None:
        """The table whose target decides the privacy level (accuracy targets only)."""
        if self.targets is None or self.item_std_errors is None:
            return None
        errors, targets = self.item_std_errors, self.targets
        return max(targets, key=lambda name: errors[name] / targets[name])

    @property
    def largest_std_error(self) -> tuple[str, float] | None:
        """(item, standard error) of the noisiest released cell of the chosen strategy."""
        if not self.item_std_errors:
            return None
        return max(self.item_std_errors.items(), key=lambda pair: pair[1])


@dataclass(kw_only=True)
class _Planned:
    candidate: Candidate
    evaluation: Evaluation | None = None
    strategy: Any = None
    largest_variances: dict[str, float] | None = None


def make_plan(
    spec: ReleaseSpec,
    *,
    time_budget: float = DEFAULT_TIME_BUDGET,
    cache: StrategyCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Plan the candidates the spec calls for and choose (auto: least expected total error, or
    by the spec's objective); a spec with accuracy targets is planned at the smallest privacy
    level that meets them (:func:`_plan_for_targets`)."""
    if not time_budget > 0:
        raise SpecError(f"the time budget ({time_budget!r} s) must be > 0")
    if spec.privacy is None:
        return _plan_for_targets(spec, time_budget=time_budget, cache=cache, progress=progress)
    cache = cache if cache is not None else StrategyStore()
    progress_callback = _optimiser_progress(progress)
    workload = build_workload(spec)
    lower_rmse, lower_note = _lower_bound(spec, workload)
    mechanisms = _by_predicted_cost(spec, workload)
    deadline = time.monotonic() + time_budget
    planned: list[_Planned] = []
    stop_reason: str | None = None
    for mechanism, predicted in mechanisms:
        # auto's only candidate (e.g. the local model's) is as good as requested: nothing to skip
        requested = spec.mechanism == mechanism.name or len(mechanisms) == 1
        request = plan_request(
            spec,
            workload=workload,
            requested=requested,
            # optimisers stop at the deadline with their best strategy so far (never unbounded)
            time_limit=max(MIN_TIME_LIMIT, deadline - time.monotonic()),
            progress=progress_callback,
        )
        unavailable = mechanism.unavailable_reason(request) or _weights_reason(mechanism, workload)
        if unavailable is not None:
            planned.append(_unavailable(mechanism, unavailable, requested=requested))
            continue
        has_fallback = any(p.candidate.total_variance is not None for p in planned)
        skip = stop_reason or (
            _over_time_budget(mechanism, request, predicted, deadline) if has_fallback else None
        )
        if skip is not None:
            planned.append(_Planned(candidate=_not_planned(mechanism, skip, status="skipped")))
            continue
        if progress is not None:
            progress(f"planning {mechanism.name} (predicted {predicted:.2g} s)")
        result = _plan_one(mechanism, request, cache, requested=requested, weighted=spec.weighted)
        planned.append(result)
        rmse = result.candidate.rmse
        if (
            spec.mechanism == registry.AUTO
            and spec.objective == "total_variance"  # the bound is on the total, not the largest
            and not workload.weighted  # and on the unweighted total
            and rmse is not None
            and lower_rmse is not None
            and rmse <= (1 + EARLY_STOP) * lower_rmse
        ):
            stop_reason = (
                f"not needed: {mechanism.name} is within {EARLY_STOP:.1%} of the SVD lower bound"
            )
    chosen, reason = _choose(spec, planned)
    if chosen.largest_variances is None:
        mechanism = registry.get(chosen.candidate.mechanism, model=spec.model)
        _add_largest_variances(
            chosen, mechanism, plan_request(spec, workload=workload, requested=True)
        )
    variances = chosen.largest_variances
    return Plan(
        model=spec.model,
        chosen=chosen.candidate.mechanism,
        reason=reason,
        candidates=tuple(p.candidate for p in planned),
        lower_bound_rmse=lower_rmse,
        lower_bound_note=lower_note,
        privacy=dict(spec.privacy),
        expected_cost=chosen.evaluation.cost,  # type: ignore[union-attr]
        noise_kind=noise_kind_for(spec.privacy_target().measure),
        workload_fingerprint=spec.workload_fingerprint(),
        num_queries=workload.num_queries,
        num_cells=workload.num_cells,
        item_queries={
            **{item.name: item.num_queries for item in workload.items},
            **{i.name: derived_rows(spec, i) for i in spec.workload if i.derived_column},
        },
        strategy_parameters=dict(chosen.strategy.parameters),
        objective=spec.effective_objective,
        item_std_errors=None if variances is None else {k: v**0.5 for k, v in variances.items()},
        weighted=spec.weighted,
        strategy=chosen.strategy,
        workload=workload,
    )


def _weights_reason(mechanism: Mechanism, workload: Workload) -> str | None:
    """Why a data-dependent mechanism is no candidate under item weights (None otherwise): its
    strategy is chosen from the data (DAWA's partition and its greedy tree over the unweighted
    workload), so the weights would silently change nothing. O(items)."""
    if mechanism.data_independent or not workload.weighted:
        return None
    return "its strategy is chosen from the data and does not take item weights"


def _optimiser_progress(progress: Callable[[str], None] | None) -> Progress | None:
    if progress is None:
        return None

    def report(fraction: float, message: str) -> None:
        done = "" if fraction != fraction else f" ({fraction:.0%})"  # NaN: unknown fraction
        progress(f"{message}{done}")

    return report


def _by_predicted_cost(spec: ReleaseSpec, workload: Workload) -> list[tuple[Mechanism, float]]:
    """The candidates with their predicted planning seconds, cheapest first (stable)."""
    try:
        mechanisms = registry.candidates(requested=spec.mechanism, model=spec.model)
    except registry.UnknownMechanism as exc:
        raise SpecError(str(exc)) from None
    request = plan_request(spec, workload=workload, requested=False)
    predicted = [(m, float(m.predicted_seconds(request))) for m in mechanisms]
    return sorted(predicted, key=lambda pair: pair[1])


def _over_time_budget(
    mechanism: Mechanism, request: PlanRequest, predicted: float, deadline: float
) -> str | None:
    remaining = deadline - time.monotonic()
    if not request.requested and predicted > remaining:
        return (
            f"predicted {predicted:.3g} s exceeds the remaining time budget {remaining:.3g} s "
            f"(raise it with plan --time-budget, or ask for it with mechanism: {mechanism.name})"
        )
    return None


def _plan_one(
    mechanism: Mechanism,
    request: PlanRequest,
    cache: StrategyCache,
    *,
    requested: bool,
    weighted: bool = False,
) -> _Planned:
    """Plan and evaluate one mechanism.  Only :class:`CandidateUnavailable` means "not a
    candidate"; any other exception is a bug and propagates."""
    started = time.perf_counter()
    try:
        strategy = mechanism.plan(request, cache=cache)
    except CandidateUnavailable as exc:
        return _unavailable(mechanism, exc.reason, requested=requested, started=started)
    if mechanism.data_independent:
        residual = strategy.support_residual(request.workload)
        if residual > SUPPORT_TOLERANCE:
            note = f"does not support the workload (residual {residual:.2e})"
            return _unavailable(mechanism, note, requested=requested, started=started)
    evaluation = mechanism.evaluate(strategy, request)
    note = evaluation.note
    status = "planned"
    num_answers = getattr(strategy, "num_queries", 0)
    if num_answers > MAX_MEASURED_ANSWERS:
        note = f"plan only: {num_answers:,} noisy answers is too many to measure"
        status = "plan-only"
    elif (
        not requested
        and mechanism.input_kind == "cells"
        and request.workload.num_cells > MAX_RELEASE_CELLS
    ):
        note = (
            f"plan only: it measures the full cell vector ({request.workload.num_cells:,} cells; "
            f"a release counts at most {MAX_RELEASE_CELLS:,})"
        )
        status = "plan-only"
    result = _Planned(
        candidate=Candidate(
            mechanism=mechanism.name,
            rmse=evaluation.rmse,
            total_variance=evaluation.total_variance,
            seconds=time.perf_counter() - started,
            sensitivity=evaluation.sensitivity,
            noise_scale=evaluation.noise_scale,
            note=note,
            status=status,
            weighted_total_variance=(
                _weighted_total(strategy, request.workload, evaluation.total_variance)
                if weighted
                else None
            ),
        ),
        evaluation=evaluation,
        strategy=strategy,
    )
    if request.objective == "max_variance":
        _add_largest_variances(result, mechanism, request)
    return result


def _weighted_total(strategy: Any, workload: Workload, total: float | None) -> float | None:
    """``Σ_t w_t · total_t``: the evaluated total redistributed over the items by their unit
    totals (every item shares the calibrated noise variance), so unit weights give ``total``
    exactly. One ``item_unit_total`` per item (the evaluation's cost again)."""
    if total is None:
        return None
    units = [strategy.item_unit_total(item, workload) for item in workload.items]
    unit_total = sum(units)
    if unit_total == 0.0:
        return 0.0
    weighted = sum(item.weight * u for item, u in zip(workload.items, units, strict=True))
    return float(total * (weighted / unit_total))


def _add_largest_variances(planned: _Planned, mechanism: Mechanism, request: PlanRequest) -> None:
    """Set each item's largest cell variance on ``planned``, when its mechanism predicts error and
    the per-cell variances are affordable (all cells of a marginal of a subset-space strategy
    share one; otherwise one variance per released cell, as reconstruct computes them)."""
    hook = getattr(mechanism, "largest_variances", None)
    strategy = planned.strategy
    if hook is None or planned.candidate.total_variance is None:
        return
    uniform = hasattr(strategy, "uniform_unit_variance")
    if not uniform and request.workload.num_queries > MAX_RELEASE_QUERIES:
        return
    planned.largest_variances = hook(strategy, request)
    largest = max(planned.largest_variances.values())
    planned.candidate = dataclasses.replace(planned.candidate, largest_variance=largest)


def _unavailable(
    mechanism: Mechanism, reason: str, *, requested: bool, started: float | None = None
) -> _Planned:
    """A candidate that cannot serve the workload (refused when the spec asked for it)."""
    if requested:
        raise SpecError(f"mechanism {mechanism.name!r} cannot run on this spec: {reason}") from None
    seconds = 0.0 if started is None else time.perf_counter() - started
    return _Planned(
        candidate=_not_planned(mechanism, reason, status="unavailable", seconds=seconds)
    )


def _not_planned(
    mechanism: Mechanism, reason: str, *, status: str, seconds: float = 0.0
) -> Candidate:
    prefix = "not available: " if status == "unavailable" else ""
    return Candidate(
        mechanism=mechanism.name,
        rmse=None,
        total_variance=None,
        seconds=seconds,
        note=f"{prefix}{reason}",
        status=status,
    )


def _choose(spec: ReleaseSpec, planned: list[_Planned]) -> tuple[_Planned, str]:
    runnable = [p for p in planned if p.candidate.status == "planned"]
    scored = [p for p in runnable if p.candidate.total_variance is not None]
    if spec.mechanism != registry.AUTO:
        if not runnable:
            raise SpecError(f"mechanism {spec.mechanism!r} does not support this workload")
        summary = registry.get(spec.mechanism, model=spec.model).summary
        return runnable[0], f"requested by the spec: {summary}"
    if not scored:  # nothing runnable (e.g. a domain too large to count): plan the best anyway
        scored = [p for p in planned if p.candidate.total_variance is not None]
    if not scored:
        raise SpecError("no candidate mechanism supports this workload")
    names = ", ".join(p.candidate.mechanism for p in scored)
    if spec.accuracy is not None:
        scales = _item_scales(spec) or {}
        chosen = min(scored, key=lambda p: _largest_scaled(p, scales))
        return chosen, f"auto: least privacy loss to meet the accuracy targets among {names}"
    if spec.objective == "max_variance":
        chosen = min(scored, key=lambda p: _largest_scaled(p, {}))
        return chosen, f"auto: least largest cell variance among {names}"
    if spec.weighted:
        # no early stop under weights (the SVD bound is of the unweighted total), so strategies
        # equal up to round-off are all planned: the cheapest of those within WEIGHTED_TIE wins
        least = min(_or_inf(p.candidate.weighted_total_variance) for p in scored)
        chosen = next(
            p
            for p in scored
            if _or_inf(p.candidate.weighted_total_variance) <= least * (1.0 + WEIGHTED_TIE)
        )
        return chosen, f"auto: least expected weighted total error among {names}"
    chosen = min(scored, key=lambda p: p.candidate.total_variance or float("inf"))
    return chosen, f"auto: least expected total error among {names}"


def _or_inf(value: float | None) -> float:
    return float("inf") if value is None else value


def _largest_scaled(planned: _Planned, scales: dict[str, float]) -> float:
    """``max_t s_t · variance_t`` of a candidate (inf when it does not predict its error)."""
    if planned.largest_variances is None:
        return float("inf")
    return max(scales.get(name, 1.0) * v for name, v in planned.largest_variances.items())


TARGET_ROUNDS = 5
TARGET_TOLERANCE = 1e-6  # the binding table's standard error is within this of its target
_LEVEL_KEY = {"gaussian": "rho", "laplace": "epsilon"}


def _plan_for_targets(spec: ReleaseSpec, **options: Any) -> Plan:
    """The plan at the smallest privacy level whose chosen strategy gives every cell of every
    table at most the table's target standard error.

    The strategy does not depend on the level (its weights minimise ``max_t V_t / target_t²``),
    and every variance scales as ``1/ρ`` (Gaussian noise, zCDP) or ``1/ε²`` (Laplace), so one
    plan at level 1 gives the level: ``ρ = max_t V_t / target_t²`` or ``ε = √(…)``.  OpenDP's
    calibration slack (~1e-9 relative) is absorbed by re-planning at the corrected level (the
    strategies come from the store) until the binding table is within :data:`TARGET_TOLERANCE`
    below its target and no table above its own.
    """
    targets = spec.item_targets() or {}
    key = _LEVEL_KEY[spec.noise]
    power = 1.0 if key == "rho" else 0.5
    level, binding = 1.0, ""
    for _ in range(TARGET_ROUNDS):
        try:
            at_level = spec.with_privacy({key: level})
        except ValueError as exc:
            raise SpecError(
                f"the accuracy targets need {key}={level:.6g}, outside the supported range "
                f"({exc}); table {binding!r} binds (max_std_error {targets[binding]:g}): "
                "loosen its target"
            ) from None
        plan = make_plan(at_level, **options)
        errors = plan.item_std_errors
        if errors is None:
            raise SpecError(
                f"accuracy targets need a mechanism that predicts each cell's error; "
                f"{plan.chosen!r} does not (it is data-dependent, or its tables have more than "
                f"{MAX_RELEASE_QUERIES:,} rows): choose another mechanism, or give privacy"
            )
        binding = max(targets, key=lambda name: errors[name] / targets[name])
        excess = (errors[binding] / targets[binding]) ** 2  # (achieved / target) squared
        if 1.0 - TARGET_TOLERANCE <= excess <= 1.0:
            return dataclasses.replace(plan, targets=targets)
        level *= excess**power * (1.0 + 1e-12)
    raise SpecError(f"no privacy level met the accuracy targets within {TARGET_ROUNDS} rounds")


def _lower_bound(spec: ReleaseSpec, workload: Workload) -> tuple[float | None, str]:
    """√(P·SVDB/m): P is the noise variance a sensitivity-1 strategy gets (× the contribution bound²)."""
    if spec.model != "central":
        return None, "not computed: the SVD bound is for the central model"
    bound = svd_bound(workload)
    if bound is None:
        return None, (
            f"not computed: the exact SVD bound of a union of items needs at most "
            f"4096 cells (this domain has {magnitude(workload.num_cells)})"
        )
    unit = calibrate(
        target=spec.privacy_target(),
        sensitivity=float(spec.privacy_unit.contribution_bound),
        size=min(workload.num_cells, CALIBRATION_SIZE_LIMIT),
    )
    return float((unit.variance * bound / workload.num_queries) ** 0.5), (
        "SVD bound (Li thesis Thm 4.1): no matrix-mechanism strategy has lower total error"
    )
