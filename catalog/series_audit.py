"""What ``dprelease show``, ``budget`` and ``verify`` say about a series (public facts only: the
recorded plan, the periods' files, release ids and fingerprints, ledger charges, published rows).

- :func:`series_summary` (show): the series, period t of T (named by its file, or by
  ``NAME=<value>`` for column periods), the plan digest and each partition's charge next to what
  the plan sets for it.
- :func:`series_budget` (budget): per period's partition, the ρ the plan sets over the horizon and
  what the series has spent on it so far.
- :func:`series_problems` (verify): the release is its series' recorded period (plan digest,
  period row, fingerprint: the file's, or for column periods the period's value and the keyed
  fingerprint of its counts), its charges are the plan's increments, and its published rows are
  exactly the estimates the recorded plan derives from the recorded (noisy) measurements.

Reads the catalog only; never creates a table (an auditor's login may not).  Cost: O(ledger
entries + periods) for show and budget; verify re-plans the cell strategy and re-derives the
period's rows (:func:`catalog.series.reconstruct`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from dprelease.catalog import series
from dprelease.catalog.errors import CatalogError, VerificationError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.planning.series import SeriesPlan
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.publishing.series_report import series_details
from dprelease.catalog.review.signatures import verify_release
from dprelease.catalog.series import PLAN_ENTRY_KIND, plan_label, series_periods, series_plans
from dprelease.catalog.spec.model import ReleaseSpec

RELATIVE_TOLERANCE = 1e-9
"""How far a re-derived figure or a charge may differ from the recorded one (floating point)."""


@dataclass(frozen=True, kw_only=True)
class PeriodRow:
    """A released period as the catalog records it (public)."""

    period: int  # 0-based
    file_name: str
    """The period's partition: its file's name, or ``NAME=<value>`` for column periods."""
    file_path: str
    release_id: str
    input_fingerprint: str

    @property
    def label(self) -> str:
        """How ``show`` names the period: ``file 2026-03.parquet``, or ``month=2026-03`` for a
        column period (whose path is the whole source, not a file of that name)."""
        if Path(self.file_path).name == self.file_name:
            return f"file {self.file_name}"
        return self.file_name


def _has_series_tables(catalog: Catalog) -> bool:
    return sa.inspect(catalog.engine).has_table(series_plans.name)


def recorded_plans(catalog: Catalog, dataset_id: str) -> list[SeriesPlan]:
    """Every series plan recorded on ``dataset_id``, each checked against its ledger entry (the
    digest in its label); a mismatch raises.  O(plans + ledger entries)."""
    if not _has_series_tables(catalog):
        return []
    with catalog.engine.connect() as conn:
        rows = conn.execute(
            sa.select(series_plans)
            .where(series_plans.c.dataset_id == dataset_id)
            .order_by(series_plans.c.name)
        ).all()
    entries = {
        e.receipt_id: e for e in catalog.ledger_entries(dataset_id) if e.kind == PLAN_ENTRY_KIND
    }
    plans = []
    for row in rows:
        plan = SeriesPlan.from_json(json.loads(row.plan_json))
        entry = entries.get(row.receipt_id)
        if entry is None or entry.label != plan_label(plan) or plan.digest() != row.plan_sha256:
            raise CatalogError(
                f"series {row.name!r}: the recorded plan does not match its ledger entry "
                f"(receipt {row.receipt_id}); the catalog was altered"
            )
        plans.append(plan)
    return plans


def period_rows(catalog: Catalog, dataset_id: str, name: str) -> list[PeriodRow]:
    """The series' released periods, in order (no measurement read).  O(periods)."""
    if not _has_series_tables(catalog):
        return []
    with catalog.engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                series_periods.c.period,
                series_periods.c.file_name,
                series_periods.c.file_path,
                series_periods.c.release_id,
                series_periods.c.input_fingerprint,
            )
            .where(series_periods.c.dataset_id == dataset_id, series_periods.c.name == name)
            .order_by(series_periods.c.period)
        ).all()
    return [PeriodRow(**row._asdict()) for row in rows]


def _charges(catalog: Catalog, dataset_id: str, release_id: str) -> dict[str | None, float]:
    charged: dict[str | None, float] = {}
    for entry in catalog.ledger_entries(dataset_id):
        if entry.release_id == release_id and entry.kind == "charge":
            charged[entry.partition] = charged.get(entry.partition, 0.0) + entry.cost.rho
    return charged


def _planned_charges(
    plan: SeriesPlan, period: int, released: list[PeriodRow]
) -> dict[str | None, float]:
    """ρ the plan sets for each partition at the release of ``period`` (0-based)."""
    names = {row.period: row.file_name for row in released}
    return {
        None if s is None else names.get(s, f"period {s + 1}"): multiplier * plan.rho_unit
        for s, multiplier in plan.release_costs(period).items()
    }


def series_summary(catalog: Catalog, release_id: str) -> dict[str, Any] | None:
    """The series of a release that is one of its periods (None otherwise): its name, period t of
    T, time strategy, plan digest, and per partition the ρ charged next to the plan's."""
    record = catalog.release(release_id)
    for plan in recorded_plans(catalog, record.dataset_id):
        if plan.name != record.name:
            continue
        released = period_rows(catalog, record.dataset_id, plan.name)
        mine = [row for row in released if row.release_id == release_id]
        if not mine:
            return None
        period = mine[0].period
        planned = _planned_charges(plan, period, released)
        charged = _charges(catalog, record.dataset_id, release_id)
        return {
            "name": plan.name,
            "period": period + 1,
            "horizon": plan.horizon,
            "file": mine[0].file_name,
            "period_name": mine[0].label,
            "unit": plan.unit,
            "time_strategy": plan.time_strategy,
            "plan_sha256": plan.digest(),
            "charges": [
                {
                    "partition": partition,
                    "rho": charged.get(partition, 0.0),
                    "planned_rho": planned.get(partition),
                }
                for partition in sorted(set(planned) | set(charged), key=str)
            ],
        }
    return None


def _declared_name(plan: SeriesPlan, period: int) -> str | None:
    """A column period's ``NAME=<value>`` (declared in the spec, recorded in the plan); None for
    a file period not yet released (its file is not known before)."""
    return plan.period_names[period] if plan.period_names else None


def series_budget(catalog: Catalog, dataset_id: str) -> list[dict[str, Any]]:
    """Per series on the dataset, per period: its name (the period's file once released, or a
    column period's declared ``NAME=<value>``), its partition (that name at event level; at
    person level the whole dataset: None), the ρ the plan sets for it over the horizon, and what
    the series' releases have charged it so far.  O(ledger entries + horizon)."""
    result = []
    entries = [e for e in catalog.ledger_entries(dataset_id) if e.kind == "charge"]
    for plan in recorded_plans(catalog, dataset_id):
        released = {row.period: row for row in period_rows(catalog, dataset_id, plan.name)}
        ours = {row.release_id for row in released.values()}
        totals = plan.partition_totals()
        periods = []
        for s in range(plan.horizon):
            row = released.get(s)
            # public: the released row's partition, or a column period's declared NAME=<value>
            name = row.file_name if row is not None else _declared_name(plan, s)
            if plan.unit == "person":  # release s charges the whole dataset
                partition = None
                spent = sum(
                    e.cost.rho
                    for e in entries
                    if row is not None and e.release_id == row.release_id
                )
            else:  # the period's file, or NAME=<value> for column periods (declared: also
                # before their release)
                partition = name
                spent = sum(
                    e.cost.rho
                    for e in entries
                    if row is not None and e.partition == partition and e.release_id in ours
                )
            periods.append(
                {
                    "period": s + 1,
                    "partition": partition,
                    "period_name": name,
                    "released": row is not None,
                    "release_id": None if row is None else row.release_id,
                    "planned_rho": totals[s],
                    "spent_rho": spent,
                }
            )
        result.append(
            {
                "name": plan.name,
                "horizon": plan.horizon,
                "unit": plan.unit,
                "rho": plan.rho,
                "time_strategy": plan.time_strategy,
                "plan_sha256": plan.digest(),
                "periods_released": len(released),
                "periods": periods,
            }
        )
    return result


def series_problems(directory: Path, catalog: Catalog) -> list[str]:
    """What does not match in a series period's release (module docstring); [] for a release that
    is not a period of a series."""
    manifest = artifacts.read_manifest(Path(directory))
    details = series_details(manifest)
    if details is None:
        return []
    name, dataset_id = manifest.get("name"), manifest.get("dataset_id")
    plans = [p for p in recorded_plans(catalog, str(dataset_id)) if p.name == name]
    if not plans:
        return [f"series {name!r}: no recorded plan in the catalog at {catalog.url}"]
    plan = plans[0]
    problems = []
    if details.get("plan_sha256") != plan.digest():
        problems.append(
            f"series {name!r}: the manifest's plan sha256 {str(details.get('plan_sha256'))[:12]}… "
            f"is not the recorded plan's {plan.digest()[:12]}…"
        )
    period = int(details.get("period", 0)) - 1
    released = period_rows(catalog, str(dataset_id), str(name))
    row = next((r for r in released if r.period == period), None)
    if row is None or row.release_id != manifest.get("release_id"):
        return [
            *problems,
            f"series {name!r}: period {period + 1} is not recorded as this release "
            f"({manifest.get('release_id')}) in the catalog",
        ]
    column = details.get("period_column")
    if column is not None:  # column periods: the fingerprint of the period's own counts
        if row.file_name != f"{column}={details.get('period_value')}":
            problems.append(
                f"series {name!r}: period {period + 1} is recorded as {row.file_name!r}, the "
                f"manifest names {column}={details.get('period_value')}"
            )
        if row.input_fingerprint != details.get("period_fingerprint"):
            problems.append(
                f"series {name!r}: period {period + 1}'s recorded fingerprint differs from the "
                "manifest's period fingerprint"
            )
    elif row.input_fingerprint != manifest.get("input_fingerprint"):
        problems.append(
            f"series {name!r}: period {period + 1}'s recorded file fingerprint differs from the "
            "manifest's input fingerprint"
        )
    problems += _charge_problems(plan, period, released, catalog, manifest)
    if not problems:
        problems += _row_problems(plan, period, catalog, manifest, Path(directory))
    return problems


def _charge_problems(
    plan: SeriesPlan,
    period: int,
    released: list[PeriodRow],
    catalog: Catalog,
    manifest: dict[str, Any],
) -> list[str]:
    """Each partition is charged the plan's increment at one common unit ρ ≤ ``ρ_unit``."""
    planned = _planned_charges(plan, period, released)
    charged = _charges(catalog, str(manifest["dataset_id"]), str(manifest["release_id"]))
    if set(planned) != set(charged):
        return [
            f"series {plan.name!r}: period {period + 1} charged partitions "
            f"{sorted(map(str, charged))}, the plan sets {sorted(map(str, planned))}"
        ]
    ratios = [charged[p] / planned[p] for p in planned if planned[p] > 0]
    if any(r > 1 + RELATIVE_TOLERANCE for r in ratios) or (
        ratios and not math.isclose(min(ratios), max(ratios), rel_tol=RELATIVE_TOLERANCE)
    ):
        return [
            f"series {plan.name!r}: period {period + 1}'s charges are not the plan's increments "
            "(A[t,s]² at one unit ρ no larger than the plan's)"
        ]
    return []


def _row_problems(
    plan: SeriesPlan, period: int, catalog: Catalog, manifest: dict[str, Any], directory: Path
) -> list[str]:
    """The published tables equal the rows the recorded plan derives from the recorded noisy
    measurements of periods ≤ this one (post-processing only)."""
    data = dict(manifest["spec"])
    order = (series_details(manifest) or {}).get("domain_order")
    if isinstance(order, list) and sorted(order) == sorted(data.get("domain") or {}):
        data["domain"] = {name: data["domain"][name] for name in order}  # the cell layout
    spec = ReleaseSpec.model_validate(data)
    derived = series.reconstruct(spec, make_plan(spec), catalog, period=period)
    problems = []
    for table_name in manifest.get("tables") or []:
        path = directory / "tables" / f"{table_name}.parquet"
        expected = derived.get(table_name)
        if expected is None or not path.is_file():
            problems.append(f"series table {table_name!r} is not a table of the recorded plan")
            continue
        if not _same_rows(pq.read_table(path), expected):
            problems.append(
                f"series table {table_name!r}: its rows are not the estimates the recorded plan "
                f"(sha256 {plan.digest()[:12]}…) derives from the recorded measurements"
            )
    return problems


def _same_rows(published: pa.Table, derived: pa.Table) -> bool:
    if published.column_names != derived.column_names or published.num_rows != derived.num_rows:
        return False
    for column in published.column_names:
        if pa.types.is_floating(published[column].type):
            a = published[column].to_numpy(zero_copy_only=False).astype(np.float64)
            b = derived[column].to_numpy(zero_copy_only=False).astype(np.float64)
            if not np.allclose(a, b, rtol=RELATIVE_TOLERANCE, atol=1e-12, equal_nan=True):
                return False
        elif published[column].to_pylist() != derived[column].to_pylist():
            return False
    return True


def verify_release_and_series(
    directory: Path, catalog: Catalog, *, input_path: str | Path | None = None
) -> list[str]:
    """``dprelease verify``: the release checks (:func:`catalog.review.signatures.verify_release`)
    and, for a series period, :func:`series_problems`; raises with every problem."""
    try:
        notes = verify_release(directory, catalog, input_path=input_path)
    except VerificationError as exc:
        extra = _series_problems_or_error(directory, catalog)
        if not extra:
            raise
        artifacts.raise_problems(directory, exc.problems + tuple(extra))
    extra = _series_problems_or_error(directory, catalog)
    if extra:
        artifacts.raise_problems(directory, extra)
    return notes


def _series_problems_or_error(directory: Path, catalog: Catalog) -> list[str]:
    try:
        return series_problems(directory, catalog)
    except VerificationError:  # an unreadable manifest: the release checks report it
        return []
    except CatalogError as exc:  # e.g. a recorded plan that no longer matches its ledger entry
        return [str(exc)]
