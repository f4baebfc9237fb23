"""The horizon plan of a series: one causal time strategy for all its periods, composed with the
cell strategy the planner chose, with its predicted errors and what each period pays.

Kronecker composition (Denisov et al., NeurIPS 2022, §2; the matrix mechanism's product
strategies): the release workload is ``W_time ⊗ W_cell``; with ``W_time = B·A`` (causal, from
:mod:`mechanisms.continual`) and the cell strategy ``S``, period t measures ``S·(Σ_s A[t,s]·x_s)``
with Gaussian noise N(0, σ²) on every answer, and publishes row r of ``W_time`` (at period t) as
the cell reconstruction of ``Σ_{i≤t} B[r,i]·m_i``; its variance is ``σ²·‖B_r‖²`` times the cell
strategy's unit variance.

Accounting under ρ-zCDP (the time strategy's columns are the periods):

* event level (``rows_per_person: c``; each person in one period, each period a partition): a
  person of period s changes measurement t by at most ``|A[t,s]|·Δ_S·c`` in L2, so release t
  pays partition s ``A[t,s]²·ρ_unit`` with ``ρ_unit = (Δ_S·c)²/(2σ²)``; over the horizon the
  partition pays ``‖A[:,s]‖²·ρ_unit ≤ ρ`` (σ is set by the largest column norm).
* person level (``max_rows: c`` per period, a person in every period): release t changes by at
  most ``Σ_s |A[t,s]|·Δ_S·c``; it pays the whole dataset ``(Σ_s |A[t,s]|)²·ρ_unit``, and the
  horizon pays ``‖|A|·1‖²·ρ_unit = ρ`` (sequential composition of the releases).

The plan's canonical JSON (matrices included) and its sha256 are what the catalog records at the
series' first release; ``spec_key`` names what a later spec must keep to follow it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning.planner import Plan, build_workload
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms.continual import (
    CausalFactorisation,
    optimised,
    square_root,
    time_workload,
)
from dprelease.mechanisms.primitives.protocol import MatrixMechanism, largest_unit_variance

PLAN_FORMAT = "dprelease-series-plan/1"
SERIES_INPUT_KINDS = ("cells", "marginals")


def spec_key(spec: ReleaseSpec) -> str:
    """sha256 of what fixes a series' plan: name, dataset and its partitioning, the series
    section, privacy level and unit, and the workload fingerprint (domain, items, mechanism,
    options).  A later release whose spec has another key is refused."""
    payload = {
        "name": spec.name,
        "dataset_id": spec.dataset.id,
        "partitions": None
        if spec.dataset.partitions is None
        else spec.dataset.partitions.declaration(),
        "series": None if spec.series is None else spec.series.model_dump(mode="json"),
        "privacy": spec.privacy,
        "privacy_unit": spec.privacy_unit.model_dump(mode="json"),
        "workload_fingerprint": spec.workload_fingerprint(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def time_strategy(parts: list[Any], horizon: int) -> CausalFactorisation:
    """Square root for cumulative counts alone; otherwise the optimised causal factorisation of
    the stacked time workload (worst row variance, never worse than the square root).
    O(iterations·kT³)."""
    workload = time_workload(parts, horizon)
    if parts == ["cumulative"]:
        return square_root(workload)
    return optimised(workload, objective="worst")


@dataclass(frozen=True, kw_only=True)
class SeriesPlan:
    """The horizon plan (module docstring).  Public; frozen; JSON round-trips to the byte."""

    name: str
    dataset_id: str
    spec_key: str
    horizon: int
    parts: tuple[str, ...]
    time_strategy: str
    A: np.ndarray
    B: np.ndarray
    unit: str
    contribution_bound: int
    rho: float
    cell_mechanism: str
    cell_strategy: str
    cell_sensitivity: float
    cell_queries: int
    workload_fingerprint: str
    item_unit_variances: dict[str, float]
    """Per cell workload item, the largest unit variance of its cells (σ² = 1, ‖B_r‖ = 1)."""
    period_names: tuple[str, ...] = ()
    """A column series' periods, ``NAME=<value>`` in declared order (public, from the spec); ()
    for file periods (a period's file is named when it is released).  In the JSON only when
    given, so a file series' plan and its digest are as before."""

    @property
    def factorisation(self) -> CausalFactorisation:
        return CausalFactorisation(self.A, self.B, self.time_strategy)

    @property
    def time_sensitivity(self) -> float:
        """Δ of ``A`` in L2 at this unit (per unit contribution)."""
        return self.factorisation.sensitivity(noise="gaussian", unit=self.unit)

    @property
    def rho_unit(self) -> float:
        """The zCDP cost of one measurement with unit time coefficient: ``ρ / Δ_A²``."""
        return self.rho / self.time_sensitivity**2

    @property
    def sigma(self) -> float:
        """The textbook noise scale ``Δ_A·Δ_S·c / √(2ρ)`` (the choke point's calibration may
        add OpenDP's floating-point slack)."""
        return (
            self.time_sensitivity
            * self.cell_sensitivity
            * self.contribution_bound
            / math.sqrt(2 * self.rho)
        )

    def release_costs(self, period: int) -> dict[int | None, float]:
        """ρ each partition pays at the release of ``period`` (0-based), per unit ``ρ_unit``
        multiplier: ``{s: A[t,s]²}`` for every period s the release reads (event level), or
        ``{None: (Σ_s |A[t,s]|)²}`` for the whole dataset (person level).  O(T)."""
        self.check_period(period)
        row = self.A[period, : period + 1]
        if self.unit == "person":
            return {None: float(np.abs(row).sum()) ** 2}
        return {s: float(row[s]) ** 2 for s in np.flatnonzero(row)}

    def periods_read(self, period: int) -> list[int]:
        """The periods whose counts the measurement of ``period`` combines (``A[t,s] ≠ 0``)."""
        self.check_period(period)
        return [int(s) for s in np.flatnonzero(self.A[period, : period + 1])]

    def check_period(self, period: int) -> None:
        if not 0 <= period < self.horizon:
            raise SpecError(
                f"series {self.name!r} has a horizon of {self.horizon} periods (its plan covers "
                f"periods 1 to {self.horizon}); period {period + 1} is past it: start a new "
                "series (another spec name) for later periods"
            )

    def predicted_std_errors(self) -> dict[str, list[float]]:
        """``{"<item>.<part>": [worst cell standard error at period 1..T]}``.  O(kT·T + items)."""
        row_norms = np.sqrt(np.einsum("ij,ij->i", self.B, self.B))
        result = {}
        for b, part in enumerate(self.parts):
            norms = row_norms[b * self.horizon : (b + 1) * self.horizon]
            for item, unit_variance in self.item_unit_variances.items():
                scale = self.sigma * math.sqrt(unit_variance)
                result[f"{item}.{part}"] = [float(scale * n) for n in norms]
        return result

    def partition_totals(self) -> list[float]:
        """ρ each period's partition pays over the whole horizon (event level), or the ρ of each
        release (person level).  O(T²)."""
        if self.unit == "person":
            return [
                float(np.abs(self.A[t]).sum()) ** 2 * self.rho_unit for t in range(self.horizon)
            ]
        return [float(v) * self.rho_unit for v in np.einsum("ij,ij->j", self.A, self.A)]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "name": self.name,
            "dataset_id": self.dataset_id,
            "spec_key": self.spec_key,
            "horizon": self.horizon,
            "parts": list(self.parts),
            "time_strategy": self.time_strategy,
            "A": self.A.tolist(),
            "B": self.B.tolist(),
            "unit": self.unit,
            "contribution_bound": self.contribution_bound,
            "rho": self.rho,
            "cell_mechanism": self.cell_mechanism,
            "cell_strategy": self.cell_strategy,
            "cell_sensitivity": self.cell_sensitivity,
            "cell_queries": self.cell_queries,
            "workload_fingerprint": self.workload_fingerprint,
            "item_unit_variances": dict(self.item_unit_variances),
        } | ({"period_names": list(self.period_names)} if self.period_names else {})

    def canonical_json(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """sha256 of :meth:`canonical_json`: what the ledger's series-plan entry anchors."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SeriesPlan:
        if data.get("format") != PLAN_FORMAT:
            raise SpecError(f"series plan format {data.get('format')!r} is not {PLAN_FORMAT!r}")
        fields = {k: v for k, v in data.items() if k != "format"}
        fields["parts"] = tuple(fields["parts"])
        fields["A"] = np.array(fields["A"], dtype=np.float64)
        fields["B"] = np.array(fields["B"], dtype=np.float64)
        fields["period_names"] = tuple(fields.get("period_names", ()))
        return cls(**fields)

    def summary(self) -> dict[str, Any]:
        """What ``dprelease plan`` shows: the strategy, σ, per-period and worst predicted standard
        errors, and the privacy each person can lose over the horizon."""
        errors = self.predicted_std_errors()
        totals = self.partition_totals()
        return {
            "series": self.name,
            "horizon": self.horizon,
            "time_workload": list(self.parts),
            "time_strategy": self.time_strategy,
            "cell_mechanism": self.cell_mechanism,
            "unit": self.unit,
            "sigma": self.sigma,
            "std_errors_by_period": errors,
            "worst_std_error": {name: max(values) for name, values in errors.items()},
            "rho_per_person_total": max(totals) if self.unit == "event" else sum(totals),
            "rho_by_partition" if self.unit == "event" else "rho_by_release": totals,
            "plan_sha256": self.digest(),
        }


def make_series_plan(spec: ReleaseSpec, plan: Plan) -> SeriesPlan:
    """The horizon plan of ``spec`` on the cell plan ``plan`` (data-free, deterministic).

    Refuses (``SpecError``, before anything is charged) a cell mechanism whose strategy is not a
    fixed linear one measured from cells or marginals (a data-dependent or local-model plan)."""
    series = spec.series
    if series is None:
        raise SpecError(f"spec {spec.name!r} has no series section")
    mechanism = plan.mechanism
    if not isinstance(mechanism, MatrixMechanism) or mechanism.input_kind not in SERIES_INPUT_KINDS:
        raise SpecError(
            f"series: the cell mechanism {plan.chosen!r} is not a data-independent linear "
            "strategy; a series composes a fixed cell strategy with its time strategy: give "
            "mechanism: identity, hierarchical, optimized, marginal_space (or auto)"
        )
    workload = plan.workload or build_workload(spec)
    factorisation = time_strategy(series.parts(), series.horizon)
    return SeriesPlan(
        name=spec.name,
        dataset_id=spec.dataset.id,
        spec_key=spec_key(spec),
        horizon=series.horizon,
        parts=tuple(series.part_names()),
        time_strategy=factorisation.name,
        A=factorisation.A,
        B=factorisation.B,
        unit="event" if spec.privacy_unit.person_column is None else "person",
        contribution_bound=spec.privacy_unit.contribution_bound,
        rho=float(spec.privacy_target().rho),
        cell_mechanism=plan.chosen,
        cell_strategy=str(plan.strategy.name),
        cell_sensitivity=float(plan.strategy.sensitivity(noise="gaussian")),
        cell_queries=int(plan.strategy.num_queries),
        workload_fingerprint=plan.workload_fingerprint,
        item_unit_variances={
            item.name: float(largest_unit_variance(plan.strategy, item, workload))
            for item in workload.items
        },
        period_names=()
        if series.columns is None
        else tuple(series.columns.partition(t) for t in range(series.horizon)),
    )
