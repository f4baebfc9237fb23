"""The release of one period of a series: register, measure, publish (the series' stages; the
Prefect tasks in ``tasks/series.py`` wrap them 1:1).

State (public, tables of their own in the catalog database): ``series_plans`` holds each
series' horizon plan (canonical JSON, sha256), recorded at its first release together with a
zero-cost ``series-plan`` ledger entry whose label carries the digest (so the plan is
hash-chained like every charge); ``series_periods`` holds, per released period, its partition
(``file_name``: the file's name, or ``NAME=<value>`` for periods given by a column's values), the
keyed fingerprint of that file (of the period's counts, for column periods) at release, and the
period's noisy measurement
(post-noise: what later periods' published figures combine); ``series_claims`` lets one run at
a time release a period (two runs started together never both charge for it).

Order and refusals (each before any data is read or anything charged, CLI exit 2): a spec whose
:func:`~catalog.planning.series.spec_key` differs from the recorded plan's; a period already
released; a period past the horizon; a past period's file whose keyed fingerprint changed (also
checked again when the files are read, before the charge; a column period's rows are checked
when they are read, still before the charge).  A column series releases the next declared value
(public: from the catalog, never from the data).  Then each partition's increment is
checked against the cap, the release charges every partition it reads its own increment, and only
then is noise drawn (the choke point).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dprelease.catalog import partitions
from dprelease.catalog.confidential.series_measure import combined_periods
from dprelease.catalog.confidential.source import list_source_files, resolve_source
from dprelease.catalog.errors import CatalogError, DataError, SpecError
from dprelease.catalog.identity import signing
from dprelease.catalog.ledger.schema import now, releases, with_tables
from dprelease.catalog.ledger.store import Catalog, SkippedRelease
from dprelease.catalog.planning.memory import check_memory, predict_plan
from dprelease.catalog.planning.planner import Plan, build_workload, make_plan
from dprelease.catalog.planning.series import SeriesPlan, make_series_plan, spec_key
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.publishing.tables import build_table
from dprelease.catalog.review.policy import record_policy
from dprelease.catalog.spec.load import check_runnable
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.catalog.validation.checks import validate_tables
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import (
    ItemAnswers,
    MeasureContext,
    Measurement,
    NoiseDescription,
    largest_unit_variance,
)
from dprelease.mechanisms.primitives.workload import Workload

PLAN_ENTRY_KIND = "series-plan"

series_metadata = sa.MetaData()

series_plans = sa.Table(
    "series_plans",
    series_metadata,
    sa.Column("dataset_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("plan_json", sa.Text, nullable=False),
    sa.Column("plan_sha256", sa.String(64), nullable=False),
    sa.Column("spec_key", sa.String(64), nullable=False),
    sa.Column("receipt_id", sa.String(64), nullable=False),
    sa.Column("recorded_at", sa.String(40), nullable=False),
)

series_periods = sa.Table(
    "series_periods",
    series_metadata,
    sa.Column("dataset_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("period", sa.Integer, primary_key=True),  # 0-based
    sa.Column("file_name", sa.String(256), nullable=False),  # the partition
    sa.Column("file_path", sa.Text, nullable=False),
    sa.Column("input_fingerprint", sa.String(64), nullable=False),
    sa.Column("release_id", sa.String(128), nullable=False),
    sa.Column("noise_scale", sa.Float, nullable=False),
    sa.Column("measurement", sa.LargeBinary, nullable=False),  # float64, post-noise
    sa.Column("measurement_sha256", sa.String(64), nullable=False),
    sa.Column("recorded_at", sa.String(40), nullable=False),
    sa.UniqueConstraint("dataset_id", "name", "file_name"),
)

series_claims = sa.Table(  # one release at a time per period: concurrent runs never both charge
    "series_claims",
    series_metadata,
    sa.Column("dataset_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("period", sa.Integer, primary_key=True),  # 0-based
    sa.Column("release_id", sa.String(128), nullable=False),
    sa.Column("claimed_at", sa.String(40), nullable=False),
)


def _engine(catalog: Catalog) -> Engine:
    return with_tables(catalog.engine, series_metadata)


@dataclass(frozen=True, kw_only=True)
class RecordedPeriod:
    """A released period (public): its file, fingerprint at release and noisy measurement."""

    period: int
    file_name: str
    file_path: str
    input_fingerprint: str
    release_id: str
    noise_scale: float
    measurement: np.ndarray = field(repr=False)


def recorded_plan(catalog: Catalog, spec: ReleaseSpec) -> SeriesPlan | None:
    """The series' recorded plan, checked against its ledger entry (digest in the label)."""
    with _engine(catalog).connect() as conn:
        row = conn.execute(
            sa.select(series_plans).where(
                series_plans.c.dataset_id == spec.dataset.id, series_plans.c.name == spec.name
            )
        ).first()
    if row is None:
        return None
    plan = SeriesPlan.from_json(json.loads(row.plan_json))
    anchored = [
        entry
        for entry in catalog.ledger_entries(spec.dataset.id)
        if entry.receipt_id == row.receipt_id and entry.kind == PLAN_ENTRY_KIND
    ]
    if not anchored or anchored[0].label != plan_label(plan) or plan.digest() != row.plan_sha256:
        raise CatalogError(
            f"series {spec.name!r}: the recorded plan does not match its ledger entry "
            f"(receipt {row.receipt_id}); the catalog was altered, series releases are refused"
        )
    return plan


def plan_label(plan: SeriesPlan) -> str:
    return f"series-plan {plan.name} sha256:{plan.digest()}"


def recorded_periods(catalog: Catalog, spec: ReleaseSpec) -> list[RecordedPeriod]:
    """The released periods of the series, in order.  O(periods × measurement size)."""
    with _engine(catalog).connect() as conn:
        rows = conn.execute(
            sa.select(series_periods)
            .where(
                series_periods.c.dataset_id == spec.dataset.id,
                series_periods.c.name == spec.name,
            )
            .order_by(series_periods.c.period)
        ).all()
    periods = []
    for row in rows:
        values = np.frombuffer(row.measurement, dtype=np.float64).copy()
        if hashlib.sha256(row.measurement).hexdigest() != row.measurement_sha256:
            raise CatalogError(
                f"series {spec.name!r}: the recorded measurement of period {row.period + 1} "
                "does not match its digest; the catalog was altered"
            )
        periods.append(
            RecordedPeriod(
                period=row.period,
                file_name=row.file_name,
                file_path=row.file_path,
                input_fingerprint=row.input_fingerprint,
                release_id=row.release_id,
                noise_scale=row.noise_scale,
                measurement=values,
            )
        )
    return periods


@dataclass(frozen=True, kw_only=True)
class SeriesStep:
    """What one period's release does (public): the period, the files it reads (with their
    fingerprints at release, None for the new one), their weights and each partition's charge."""

    period: int
    paths: tuple[str, ...]
    fingerprints: tuple[str | None, ...]
    weights: tuple[float, ...]
    charges: dict[str | None, float]
    """ρ per partition (file name; None: the whole dataset) at the plan's ``ρ_unit``."""
    plan_sha256: str
    first: bool
    periods: tuple[int, ...] = ()
    """The periods read (0-based), in the order of ``paths``."""


def cell_plan(spec: ReleaseSpec, plan: Plan, catalog: Catalog) -> Plan:
    """The cell plan a period runs: the run's own for the first period; afterwards the recorded
    plan's cell mechanism, re-planned alone when ``auto`` chose another this time (its choice may
    change as the strategy store fills), with the spec's own workload fingerprint.  Public."""
    recorded = recorded_plan(catalog, spec)
    if recorded is None or plan.chosen == recorded.cell_mechanism:
        return plan
    pinned = make_plan(spec.model_copy(update={"mechanism": recorded.cell_mechanism}))
    return replace(pinned, workload_fingerprint=plan.workload_fingerprint)


def series_plan_for(spec: ReleaseSpec, plan: Plan, catalog: Catalog) -> tuple[SeriesPlan, bool]:
    """The recorded plan (refusing a spec that would change it), or a new one (True)."""
    recorded = recorded_plan(catalog, spec)
    if recorded is None:
        return make_series_plan(spec, plan), True
    if spec_key(spec) != recorded.spec_key:
        raise SpecError(
            f"series {spec.name!r}: the spec changes the series' plan (recorded at its first "
            f"release, sha256 {recorded.digest()[:12]}…): its name, dataset, series section, "
            "privacy level or unit, domain, workload or mechanism differ; a series follows its "
            "plan to the horizon (start a new series under another name)"
        )
    workload = plan.workload or build_workload(spec)
    unit_variances = {
        item.name: largest_unit_variance(plan.strategy, item, workload) for item in workload.items
    }
    if (
        (plan.chosen, plan.workload_fingerprint, plan.strategy.num_queries)
        != (recorded.cell_mechanism, recorded.workload_fingerprint, recorded.cell_queries)
        or not math.isclose(
            plan.strategy.sensitivity(noise="gaussian"), recorded.cell_sensitivity, rel_tol=1e-12
        )
        or unit_variances.keys() != recorded.item_unit_variances.keys()
        or not all(
            math.isclose(value, recorded.item_unit_variances[name], rel_tol=1e-9)
            for name, value in unit_variances.items()
        )
    ):
        raise SpecError(
            f"series {spec.name!r}: the cell strategy planned now ({plan.chosen}) differs from "
            f"the recorded plan's ({recorded.cell_mechanism}); a series follows its plan"
        )
    return recorded, False


def register(
    spec: ReleaseSpec,
    plan: Plan,
    catalog: Catalog,
    *,
    release_id: str,
    directory: Path,
    on_unchanged: Literal["skip", "release"] = "release",
) -> tuple[SeriesStep, PrivacyCost] | SkippedRelease:
    """Everything public before any data is read (module docstring); records the plan at the
    series' first release, then the release's intent.  Returns the step and what the partitions
    it reads had spent.

    ``on_unchanged="skip"`` (scheduled and triggered runs): a source whose keyed fingerprint is
    that of the series' last release (a duplicated arrival of the period just released) records a
    ``skipped`` ledger entry and returns it, as a release without a series does.  O(bytes)."""
    if spec.dataset.source is None:
        raise SpecError(
            "dataset.source is not set in the spec; plan works without it, run does not"
        )
    if plan.mechanism.input_kind == "cells":
        check_runnable(spec)
    check_memory(predict_plan(spec, plan))  # one period read at a time, plus the running sum
    directory.parent.mkdir(parents=True, exist_ok=True)
    series_plan, first = series_plan_for(spec, plan, catalog)
    catalog.ensure_dataset(
        spec.dataset.id, cap=spec.dataset.budget_cap(), partitioned_by=partitions.declaration(spec)
    )
    # a dataset with registered keys: an operator key runs it (checked before anything is charged)
    signing.check_operator(catalog, spec.dataset.id, key=signing.load_chosen_key())
    if on_unchanged == "skip":
        skipped = catalog.skip_if_unchanged(
            release_id=release_id,
            name=spec.name,
            dataset_id=spec.dataset.id,
            series_key=spec.series_key(),
            input_fingerprint=resolve_source(str(spec.dataset.source), key=catalog.key).fingerprint,
        )
        if skipped is not None:
            return skipped
    released = recorded_periods(catalog, spec)
    period = len(released)
    columns = spec.series.columns if spec.series is not None else None
    if columns is not None:  # the next declared value (public: the catalog, never the data)
        series_plan.check_period(period)
        path = str(Path(str(spec.dataset.source)).resolve())
    else:
        path = _next_file(spec, released)
        series_plan.check_period(period)
    needed = series_plan.periods_read(period)
    key = catalog.key
    # a file period's past files are checked here; a column period's past rows when they are
    # read (series_measure), which is still before the charge (made by the choke point)
    for s in (s for s in needed if s < period and columns is None):
        past = released[s]
        if resolve_source(past.file_path, key=key).fingerprint != past.input_fingerprint:
            raise DataError(
                f"series {spec.name!r}: the file of period {s + 1} ({past.file_name!r}) changed "
                "since its release (its keyed fingerprint differs); published figures never "
                "change, so this release is refused: restore the file as released"
            )
    rows = series_plan.release_costs(period)
    charges: dict[str | None, float] = {}
    for s, multiplier in rows.items():
        charges[_partition(spec, released, s, path=path)] = multiplier * series_plan.rho_unit
    for name, rho in charges.items():  # each partition's increment, before any data is read
        catalog.check_budget(
            spec.dataset.id,
            PrivacyCost(measure="zcdp", rho=rho),
            partitions=None if name is None else (name,),
        )
    touched = tuple(sorted(n for n in charges if n is not None)) or None
    before = catalog.spent(spec.dataset.id, partitions=touched)
    record_policy(catalog, release_id=release_id, spec=spec)
    catalog.create_release(
        release_id=release_id,
        spec_fingerprint=spec.fingerprint(),
        mechanism=plan.chosen,
        name=spec.name,
        dataset_id=spec.dataset.id,
        series_key=spec.series_key(),
    )
    try:
        _claim(catalog, spec, period=period, release_id=release_id)
    except SpecError:
        catalog.update_release(release_id, status="failed")  # refused: nothing read or charged
        raise
    if first:
        _record_plan(catalog, spec, series_plan, release_id=release_id)
    return (
        SeriesStep(
            period=period,
            paths=tuple(released[s].file_path if s < period else path for s in needed),
            fingerprints=tuple(
                released[s].input_fingerprint if s < period else None for s in needed
            ),
            weights=tuple(float(series_plan.A[period, s]) for s in needed),
            charges=charges,
            plan_sha256=series_plan.digest(),
            first=first,
            periods=tuple(needed),
        ),
        before,
    )


def _partition(
    spec: ReleaseSpec, released: list[RecordedPeriod], s: int | None, *, path: str
) -> str | None:
    """The ledger partition of period ``s`` (None: the whole dataset, person level): its file's
    name, or ``NAME=<value>`` for column periods.  Public."""
    if s is None:
        return None
    columns = spec.series.columns if spec.series is not None else None
    if columns is not None:
        return columns.partition(s)
    return released[s].file_name if s < len(released) else Path(path).name


def _period_key(spec: ReleaseSpec, period: int) -> dict[str, Any]:
    """The key of one period of the series (``series_claims`` and ``series_periods``)."""
    return {"dataset_id": spec.dataset.id, "name": spec.name, "period": period}


def _claim(catalog: Catalog, spec: ReleaseSpec, *, period: int, release_id: str) -> None:
    """Claim ``period`` for ``release_id`` (recorded before this call).  A claim by a release
    that is still measuring refuses this one (:class:`SpecError`); a claim by a failed or aborted
    release that recorded no measurement lapses.  The primary key makes two concurrent claims
    of one period impossible.  O(1)."""
    key = _period_key(spec, period)
    where = tuple(series_claims.c[column] == value for column, value in key.items())
    refused = SpecError(
        f"series {spec.name!r}: period {period + 1} is being released by another run; a "
        "period is released once, by one run (if that run crashed, `dprelease recover` marks "
        "it failed and the period can be released again)"
    )
    try:
        with _engine(catalog).begin() as conn:
            holder = conn.execute(sa.select(series_claims.c.release_id).where(*where)).first()
            if holder is not None:
                status = conn.execute(
                    sa.select(releases.c.status).where(releases.c.id == holder.release_id)
                ).scalar_one_or_none()
                if status not in ("failed", "aborted"):
                    raise refused
                conn.execute(sa.delete(series_claims).where(*where))  # the claim lapsed
            conn.execute(
                series_claims.insert().values(**key, release_id=release_id, claimed_at=now())
            )
    except sa.exc.IntegrityError:
        raise refused from None


def _next_file(spec: ReleaseSpec, released: list[RecordedPeriod]) -> str:
    """The first file of the source (by name) not yet released; refused when there is none."""
    files, _ = list_source_files(str(spec.dataset.source))
    done = {period.file_name: period.period for period in released}
    for path in sorted(files, key=lambda f: Path(f).name):
        if Path(path).name not in done:
            return str(Path(path).resolve())
    last = Path(sorted(files, key=lambda f: Path(f).name)[-1]).name if files else None
    if last is None:
        raise DataError(f"series {spec.name!r}: dataset.source lists no file")
    raise SpecError(
        f"series {spec.name!r}: file {last!r} was already released as period {done[last] + 1}; "
        "a period is released once (its published figures never change): deliver the next "
        "period's file"
    )


def _record_plan(
    catalog: Catalog, spec: ReleaseSpec, series_plan: SeriesPlan, *, release_id: str
) -> None:
    """The plan's row and its zero-cost ``series-plan`` ledger entry, in one transaction."""

    def insert(conn: Connection, receipt_id: str) -> None:
        conn.execute(
            series_plans.insert().values(
                dataset_id=spec.dataset.id,
                name=spec.name,
                plan_json=series_plan.canonical_json(),
                plan_sha256=series_plan.digest(),
                spec_key=series_plan.spec_key,
                receipt_id=receipt_id,
                recorded_at=now(),
            )
        )

    _engine(catalog)
    catalog.append_record(
        dataset_id=spec.dataset.id,
        release_id=release_id,
        label=plan_label(series_plan),
        kind=PLAN_ENTRY_KIND,
        also=insert,
    )


@dataclass(eq=False)
class SeriesAccountant:
    """The accountant of one period: the choke point hands it the cost of a measurement per unit
    time weight; it charges each partition ``weights[s]²`` times that (event level; person level:
    ``(Σ|weights|)²`` to the whole dataset) in one atomic ledger write (privacy obligation of
    ``ProtectedCells.combination``)."""

    catalog: Catalog
    dataset_id: str
    release_id: str
    multipliers: dict[str | None, float]
    receipts: list[str] = field(default_factory=list, init=False)
    charged: dict[str | None, float] = field(default_factory=dict, init=False)

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        if cost.measure != "zcdp":
            raise CatalogError(f"a series charges zCDP costs (got {cost.measure})")
        costs = {
            name: PrivacyCost(measure="zcdp", rho=cost.rho * multiplier)
            for name, multiplier in self.multipliers.items()
        }
        receipts = self.catalog.charge_each(
            self.dataset_id, costs, release_id=self.release_id, label=label
        )
        self.receipts.extend(receipts)
        self.charged = {name: c.rho for name, c in costs.items()}
        return receipts[0]

    def holds(self, receipt_id: str) -> bool:
        return receipt_id in self.receipts


def measure(
    spec: ReleaseSpec, plan: Plan, step: SeriesStep, catalog: Catalog, *, release_id: str
) -> tuple[Measurement, tuple[str, ...], str]:
    """Read the periods, combine them in the boundary, charge each partition its increment, noise
    (choke point); record the period.  Returns the measurement (its ``charged`` the largest
    partition's charge), the files read and the new period's keyed fingerprint."""
    catalog.heartbeat(release_id)
    series_plan = recorded_plan(catalog, spec)
    if series_plan is None or series_plan.digest() != step.plan_sha256:
        raise CatalogError(f"series {spec.name!r}: the plan registered for this release is gone")
    columns = spec.series.columns if spec.series is not None else None
    # column periods: the release's input fingerprint is the whole source's (skip-unchanged and
    # `verify --input` compare it); each period records the fingerprint of its own counts
    source_fingerprint = (
        None
        if columns is None
        else resolve_source(str(spec.dataset.source), key=catalog.key).fingerprint
    )
    combined, seen = combined_periods(
        spec,
        plan,
        step.paths,
        step.weights,
        key=catalog.key,
        fingerprints=step.fingerprints,
        periods=step.periods or None,
    )
    unit = {name: rho / series_plan.rho_unit for name, rho in step.charges.items()}
    accountant = SeriesAccountant(
        catalog, dataset_id=spec.dataset.id, release_id=release_id, multipliers=unit
    )
    context = MeasureContext(
        target=PrivacyCost(measure="zcdp", rho=series_plan.rho_unit),
        accountant=accountant,
        label=f"{spec.name} period {step.period + 1}",
        contribution_bound=spec.privacy_unit.contribution_bound,
        input_fingerprint=seen[-1],
        dataset_id=spec.dataset.id,
        released=None,
    )
    measured = plan.mechanism.measure(plan.strategy, combined, context=context)
    new_fingerprint = seen[-1]
    _record_period(
        catalog,
        spec,
        period=step.period,
        path=step.paths[-1],
        partition=_partition(spec, [], step.period, path=step.paths[-1]) or "",
        fingerprint=new_fingerprint,
        release_id=release_id,
        measurement=measured,
    )
    input_fingerprint = new_fingerprint if source_fingerprint is None else source_fingerprint
    catalog.update_release(release_id, input_fingerprint=input_fingerprint)
    value = (
        {}
        if columns is None
        else {
            "period_column": columns.column,
            "period_value": columns.values[step.period],
            "period_fingerprint": new_fingerprint,
        }
    )
    worst = max(accountant.charged.values())
    measured = replace(
        measured,
        receipts=tuple(accountant.receipts),
        charged=PrivacyCost(measure="zcdp", rho=worst),
        details=dict(measured.details)
        | {
            "series": {
                "period": step.period + 1,
                "horizon": series_plan.horizon,
                "time_strategy": series_plan.time_strategy,
                "domain_order": list(spec.domain),  # the cell layout (the spec JSON sorts keys)
                "plan_sha256": series_plan.digest(),
                "charges": {str(k): v for k, v in accountant.charged.items()},
            }
            | value
        },
    )
    files = step.paths if columns is None else list_source_files(str(spec.dataset.source))[0]
    return measured, files, input_fingerprint


def _record_period(
    catalog: Catalog,
    spec: ReleaseSpec,
    *,
    period: int,
    path: str,
    partition: str,
    fingerprint: str,
    release_id: str,
    measurement: Measurement,
) -> None:
    """The period's row: its partition (file name or ``NAME=<value>``), path, fingerprint and
    noisy measurement (post-noise)."""
    values = np.ascontiguousarray(measurement.values, dtype=np.float64).tobytes()
    with _engine(catalog).begin() as conn:
        conn.execute(
            series_periods.insert().values(
                **_period_key(spec, period),
                file_name=partition,
                file_path=path,
                input_fingerprint=fingerprint,
                release_id=release_id,
                noise_scale=measurement.noise.scale,
                measurement=values,
                measurement_sha256=hashlib.sha256(values).hexdigest(),
                recorded_at=now(),
            )
        )


def reconstruct(
    spec: ReleaseSpec, plan: Plan, catalog: Catalog, *, period: int
) -> dict[str, pa.Table]:
    """The period's rows of the time workload, per cell item: ``<item>.<part>`` tables from the
    measurements of periods ≤ ``period`` (causal), with their standard errors.  Post-processing of
    recorded noisy measurements only.  O(parts × period × answers)."""
    series_plan = recorded_plan(catalog, spec)
    if series_plan is None:
        raise CatalogError(f"series {spec.name!r} has no recorded plan")
    released = recorded_periods(catalog, spec)[: period + 1]
    if len(released) != period + 1 or len({p.noise_scale for p in released}) != 1:
        raise CatalogError(
            f"series {spec.name!r}: periods 1..{period + 1} must be recorded with one noise scale"
        )
    workload = plan.workload or build_workload(spec)
    answers = period_answers(
        series_plan,
        plan,
        workload,
        np.vstack([p.measurement for p in released]),
        scale=released[0].noise_scale,
        period=period,
    )
    return {
        f"{item.name}.{part}": build_table(
            spec,
            item,
            estimates=answers[f"{item.name}.{part}"].estimates,
            unit_variances=answers[f"{item.name}.{part}"].variances,
            noise_variance=1.0,
            nonnegative=spec.postprocess.nonnegative,
            interval=answers[f"{item.name}.{part}"].interval,
            uncertainty=answers[f"{item.name}.{part}"].uncertainty,
        )
        for part in series_plan.parts
        for item in workload.items
    }


def period_answers(
    series_plan: SeriesPlan,
    plan: Plan,
    workload: Workload,
    measurements: np.ndarray,
    *,
    scale: float,
    period: int,
) -> dict[str, ItemAnswers]:
    """The figures published at ``period`` (0-based): for time part b, row ``r = b·T + period``
    of ``W_time`` is the cell reconstruction of ``Σ_{i≤period} B[r,i]·m_i`` (``measurements``:
    one noisy measurement per period, rows 0..period, each with noise ``scale``), with variance
    ``scale²·‖B_r‖²`` times the cell strategy's unit variances.  Pure post-processing; keyed
    ``<item>.<part>``.  O(parts × period × answers + the cell reconstruction)."""
    stacked = np.asarray(measurements, dtype=np.float64)[: period + 1]
    if stacked.shape[0] != period + 1:
        raise ValueError(
            f"measurements has {stacked.shape[0]} periods; period {period + 1} needs {period + 1}"
        )
    result = {}
    for b, part in enumerate(series_plan.parts):
        row = series_plan.B[b * series_plan.horizon + period, : period + 1]
        norm = float(np.linalg.norm(row))
        measurement = Measurement(
            values=row @ stacked,
            noise=NoiseDescription(
                kind="gaussian",
                scale=scale * norm,
                sensitivity=0.0,
                size=stacked.shape[1],
                variance=(scale * norm) ** 2,
            ),
            strategy=plan.strategy,
            receipts=(),
            charged=PrivacyCost.zero("zcdp"),
        )
        answers = plan.mechanism.reconstruct(measurement, workload=workload)
        for item in workload.items:
            result[f"{item.name}.{part}"] = answers[item.name]
    return result


def validate(
    tables: dict[str, pa.Table], plan: Plan, series_plan_parts: tuple[str, ...], *, directory: Path
) -> dict[str, Any]:
    """Write and validate the period's tables (released values and public metadata only)."""
    for name, table in tables.items():
        artifacts.write_table(directory, name, table)
    expected = {
        f"{item}.{part}": rows
        for item, rows in plan.item_queries.items()
        for part in series_plan_parts
    }
    return validate_tables(tables, expected_rows=expected, directory=directory / "validation")
