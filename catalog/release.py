"""The release stages as plain functions (the Prefect tasks in ``tasks/`` wrap these one to one).

Order and privacy obligations:

1. :func:`register` — data-free: dataset cap registered, budget checked (refused *before any data
   is read*), the release's intent recorded (status ``measuring``).
2. ``catalog.source.count_cells`` — the only stage that reads raw rows.
3. :func:`measure` — the ledger is charged, then noise is drawn (``ProtectedCells.measure``).
4. :func:`reconstruct` — post-processing of the noisy answers only.
5. :func:`validate` — released values and public metadata only.
6. :func:`stage` — manifest, report, catalog status ``staged``; publication waits for review.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from catalog import artifacts
from catalog.errors import CatalogError, ValidationFailedError
from catalog.ledger import Catalog, DatasetAccountant
from catalog.planning import Plan, build_workload, strategy_for
from catalog.report import render_report
from catalog.source import CountResult
from catalog.spec import ReleaseSpec
from catalog.tables import build_table
from catalog.validation import validate_tables
from mechanisms.dense import FactorizationStrategy
from mechanisms.privacy import PrivacyCost
from mechanisms.session import NoisyMeasurement


def new_release_id(spec: ReleaseSpec) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{spec.name}-{stamp}-{uuid.uuid4().hex[:6]}"


def register(spec: ReleaseSpec, plan: Plan, catalog: Catalog, *, release_id: str) -> PrivacyCost:
    """Register the dataset, refuse an over-budget request, record the intent; return spent-before."""
    catalog.ensure_dataset(spec.dataset.id, cap=spec.dataset.budget_cap())
    catalog.check_budget(spec.dataset.id, plan.expected_cost)  # privacy: before any data is read
    before = catalog.spent(spec.dataset.id)
    catalog.create_release(
        release_id=release_id,
        name=spec.name,
        dataset_id=spec.dataset.id,
        spec_fingerprint=spec.fingerprint(),
        mechanism=plan.chosen,
    )
    return before


def measure(
    counted: CountResult, spec: ReleaseSpec, plan: Plan, catalog: Catalog, *, release_id: str
) -> NoisyMeasurement:
    """Charge the ledger and measure the chosen strategy (the session enforces the order)."""
    strategy = strategy_for(spec, plan.chosen, parameters=plan.strategy_parameters)
    accountant = DatasetAccountant(catalog, dataset_id=spec.dataset.id, release_id=release_id)
    catalog.update_release(release_id, input_fingerprint=counted.input_fingerprint)
    return counted.cells.measure(
        strategy,
        target=spec.privacy_target(),
        accountant=accountant,
        label=f"{spec.name}: {plan.chosen} measurement of {plan.num_queries} queries",
    )


def reconstruct(
    spec: ReleaseSpec, plan: Plan, measurement: NoisyMeasurement
) -> dict[str, pa.Table]:
    """Least-squares cell estimate, then every item's answers with their standard errors."""
    workload = build_workload(spec)
    strategy = strategy_for(spec, plan.chosen, workload, parameters=plan.strategy_parameters)
    if isinstance(strategy, FactorizationStrategy):  # LRM answers with its own B, not least squares
        answers = {
            item.name: strategy.item_answers(measurement.values, item) for item in workload.items
        }
    else:
        cell_estimate = strategy.least_squares(measurement.values, workload)
        answers = {item.name: item.answer(cell_estimate) for item in workload.items}
    tables = {}
    for item in workload.items:
        tables[item.name] = build_table(
            spec,
            item,
            estimates=answers[item.name],
            unit_variances=strategy.item_unit_variances(item, workload),
            noise_variance=measurement.noise.variance,
            nonnegative=spec.postprocess.nonnegative,
        )
    return tables


def release_directory(out_dir: str | Path, release_id: str) -> Path:
    return Path(out_dir).resolve() / release_id


def validate(tables: dict[str, pa.Table], plan: Plan, *, directory: Path) -> dict[str, Any]:
    for name, table in tables.items():
        artifacts.write_table(directory, name, table)
    return validate_tables(
        tables, expected_rows=plan.item_queries, directory=directory / "validation"
    )


@dataclass(frozen=True, kw_only=True)
class StagedRelease:
    release_id: str
    directory: str
    mechanism: str
    charged: dict[str, float]
    validation_success: bool


def stage(
    *,
    spec: ReleaseSpec,
    plan: Plan,
    release_id: str,
    directory: Path,
    counted: CountResult,
    measurement: NoisyMeasurement,
    tables: dict[str, pa.Table],
    validation: dict[str, Any],
    spent_before: PrivacyCost,
    catalog: Catalog,
    partition: Any = None,
) -> StagedRelease:
    """Write the report and manifest, record the manifest hash; status becomes ``staged``.

    ``partition`` is DAWA's :class:`~catalog.dawa_release.PartitionRecord` when the mechanism
    released one (its receipt may belong to an earlier release whose partition was reused).
    """
    if not validation["success"]:
        catalog.update_release(release_id, status="failed", directory=str(directory))
        raise ValidationFailedError(
            f"release {release_id} failed output validation; see {directory / 'validation'} "
            "(the privacy budget stays spent)"
        )
    cap = catalog.cap(spec.dataset.id)
    after = catalog.spent(spec.dataset.id)
    wanted = [measurement.receipt_id] + ([partition.receipt_id] if partition is not None else [])
    receipts = [
        {
            "receipt_id": entry.receipt_id,
            "label": entry.label,
            "cost": entry.cost.as_dict(),
            "paid_by_release": entry.release_id,
        }
        for entry in catalog.ledger_entries(spec.dataset.id)
        if entry.receipt_id in wanted
    ]
    charged = measurement.noise.cost
    if partition is not None and _paid_here(receipts, partition.receipt_id, release_id):
        charged = charged + PrivacyCost(measure="pure", epsilon=partition.cost["epsilon"])
    manifest: dict[str, Any] = {
        "release_id": release_id,
        "name": spec.name,
        "dataset_id": spec.dataset.id,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "spec": spec.model_dump(mode="json"),
        "spec_fingerprint": spec.fingerprint(),
        "workload_fingerprint": plan.workload_fingerprint,
        "input_fingerprint": counted.input_fingerprint,
        "input_files": [Path(f).name for f in counted.files],
        "code_version": artifacts.code_version(),
        "privacy_unit": _describe_unit(spec),
        "mechanism": {
            "name": plan.chosen,
            "reason": plan.reason,
            "parameters": dict(spec.mechanism_options),
            "noise": {
                "kind": measurement.noise.kind,
                "scale": measurement.noise.scale,
                "sensitivity": measurement.noise.sensitivity,
                "size": measurement.noise.size,
                "sampler": "opendp (vetted, floating-point safe)",
            },
        },
        "privacy": {
            "requested": dict(spec.privacy),
            "charged": charged.as_dict(),
            "receipts_in_budget_measure": [r["cost"] for r in receipts],
        },
        "budget": {
            "cap": cap.as_dict(),
            "before": spent_before.as_dict(),
            "after": after.as_dict(),
            "remaining": after.remaining(cap).as_dict(),
        },
        "ledger_receipts": receipts,
        "plan": plan.to_json(),
        "tables": list(tables),
        "validation": {"success": validation["success"], "results": "validation/results.json"},
        "review": {"status": "staged", "trail": []},
    }
    if partition is not None:
        boundaries = list(partition.boundaries)
        manifest["dawa"] = {
            "buckets": len(boundaries) - 1,
            "boundaries": boundaries,
            "partition_receipt": partition.receipt_id,
            "partition_reused": not _paid_here(receipts, partition.receipt_id, release_id),
            "partition_cost": partition.cost,
        }
    write_report(directory, manifest, catalog)
    digest = artifacts.write_manifest(directory, manifest)
    catalog.update_release(
        release_id, status="staged", directory=str(directory), manifest_sha256=digest
    )
    return StagedRelease(
        release_id=release_id,
        directory=str(directory),
        mechanism=plan.chosen,
        charged=charged.as_dict(),
        validation_success=True,
    )


def _paid_here(receipts: list[dict[str, Any]], receipt_id: str, release_id: str) -> bool:
    return any(
        r["receipt_id"] == receipt_id and r["paid_by_release"] == release_id for r in receipts
    )


def write_report(directory: Path, manifest: dict[str, Any], catalog: Catalog) -> None:
    """(Re)render ``report.html`` from the manifest, the tables and the validation results."""
    import pyarrow.parquet as pq

    tables = {
        name: pq.read_table(directory / "tables" / f"{name}.parquet") for name in manifest["tables"]
    }
    validation = json.loads((directory / "validation" / "results.json").read_text())
    ledger_rows = [
        {
            "seq": entry.seq,
            "created_at": entry.created_at,
            "release_id": entry.release_id,
            "label": entry.label,
            "cost": entry.cost.describe(),
        }
        for entry in catalog.ledger_entries(manifest["dataset_id"])
    ]
    reviews = [
        {"at": r["at"], "decision": r["decision"], "reviewer": r["reviewer"], "note": r["note"]}
        for r in manifest["review"]["trail"]
    ]
    html_text = render_report(
        manifest=manifest,
        plan=manifest["plan"],
        tables=tables,
        validation=validation,
        budget=manifest["budget"],
        ledger_rows=ledger_rows,
        reviews=reviews,
    )
    (directory / "report.html").write_text(html_text)


def review(
    catalog: Catalog,
    release_id: str,
    *,
    approve: bool,
    reviewer: str,
    note: str,
    publish_dir: Path | None = None,
) -> dict[str, Any]:
    """Record a decision; approval publishes a copy, rejection keeps the spent budget spent."""
    record = catalog.release(release_id)
    if record.directory is None:
        raise CatalogError(f"release {release_id!r} has no staged directory")
    directory = Path(record.directory)
    decision = catalog.record_review(
        release_id, decision="approved" if approve else "rejected", reviewer=reviewer, note=note
    )
    entry = {"decision": decision.decision, "reviewer": reviewer, "note": note, "at": decision.at}
    manifest = artifacts.read_manifest(directory)
    manifest["review"]["trail"].append(entry)
    manifest["review"]["status"] = decision.decision
    write_report(directory, manifest, catalog)
    digest = artifacts.write_manifest(directory, manifest)
    catalog.update_release(release_id, manifest_sha256=digest)
    result: dict[str, Any] = {"release_id": release_id, "status": decision.decision}
    if approve:
        destination = publish_dir or directory.parent.parent / "published"
        manifest["review"]["status"] = "published"
        write_report(directory, manifest, catalog)
        digest = artifacts.write_manifest(directory, manifest)
        target = artifacts.publish(directory, destination)
        catalog.update_release(
            release_id, status="published", published_directory=str(target), manifest_sha256=digest
        )
        result.update(status="published", published_directory=str(target))
    return result


def _describe_unit(spec: ReleaseSpec) -> str:
    unit = spec.privacy_unit
    if unit.person_column is not None:
        return f"person column {unit.person_column!r}, at most {unit.max_rows} rows per person"
    return f"{unit.rows_per_person} row(s) per person"


def exact_answers(spec: ReleaseSpec, cells: np.ndarray) -> dict[str, np.ndarray]:
    """True answers of every item for given cells (tests and benchmarks on public/synthetic data)."""
    workload = build_workload(spec)
    return {item.name: item.answer(cells) for item in workload.items}
