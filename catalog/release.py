"""The release pipeline's stages as plain functions (the Prefect tasks in ``tasks/`` wrap them 1:1).

One pipeline for every mechanism of the registry (central, data-dependent and local model); the
chosen mechanism, carried by the plan, does the mechanism-specific work.  Order and obligations:

1. :func:`register` — data-free: dataset cap registered, budget checked (refused *before any data
   is read*), the release's intent recorded (status ``measuring``).
2. :func:`ingest` — the only stage that reads the input (rows, or local-model responses).
3. :func:`measure` — the mechanism charges the ledger, then draws noise through the choke point.
4. :func:`reconstruct` — post-processing of the noisy answers only.
5. :func:`validate` — released values and public metadata only.
6. :func:`stage` — manifest, report, catalog status ``staged``; publication waits for review.
"""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from dprelease.catalog import partitions
from dprelease.catalog.confidential.distributed_noise import noise_cluster, sharded
from dprelease.catalog.confidential.inputs import READERS, Ingested
from dprelease.catalog.confidential.source import resolve_source
from dprelease.catalog.errors import BudgetExceededError, SpecError, ValidationFailedError
from dprelease.catalog.identity import signing
from dprelease.catalog.ledger.store import Catalog, SkippedRelease
from dprelease.catalog.planning import estimators
from dprelease.catalog.planning.memory import check_memory, predict_plan
from dprelease.catalog.planning.planner import Plan, build_workload
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.publishing.manifest import Manifest, NoiseRecord
from dprelease.catalog.publishing.report import write_report
from dprelease.catalog.publishing.tables import build_table, derived_descriptions, derived_tables
from dprelease.catalog.review.policy import record_policy
from dprelease.catalog.spec.load import check_runnable
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.catalog.validation.checks import validate_tables
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import MeasureContext, Measurement


def new_release_id(spec: ReleaseSpec) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{spec.name}-{stamp}-{uuid.uuid4().hex[:6]}"


def planned_spec(spec: ReleaseSpec, plan: Plan) -> ReleaseSpec:
    """``spec`` at the plan's privacy level: a spec with accuracy targets has none until planned
    (the plan found the smallest level that meets them); any other spec is returned as is."""
    return spec if spec.privacy is not None else spec.with_privacy(plan.privacy)


def register(
    spec: ReleaseSpec,
    plan: Plan,
    catalog: Catalog,
    *,
    release_id: str,
    directory: Path | None = None,
    on_unchanged: Literal["skip", "release"] = "release",
) -> PrivacyCost | SkippedRelease:
    """Everything public, before any data is read: the input is one this machine can release,
    the output folder (``directory``'s parent, when given) is writable, the budget admits the
    cost (in every partition the release reads, for a partitioned dataset); then the intent is
    recorded.  Returns the budget spent before this release (by the partitions it reads).

    ``on_unchanged="skip"`` (scheduled and triggered runs, with the spec's policy): when the keyed
    input fingerprint and the spec's ``series_key`` equal those of the last release of the series,
    nothing is charged or recorded but a ``skipped`` ledger entry, returned as
    :class:`SkippedRelease` (checked before the budget, so an unchanged run on a spent budget is
    a skip, not an error; and again atomically with recording the release).  Costs one keyed
    hash of the input files (O(bytes), no rows parsed)."""
    estimators.estimator(spec, plan)  # reconstruct: pgm is refused here, before any charge
    if plan.mechanism.input_kind == "cells":
        check_runnable(spec)  # a full cell vector is counted: its size is bounded
    elif spec.dataset.source is None:
        raise SpecError(
            "dataset.source is not set in the spec; plan works without it, run does not"
        )
    if directory is not None:
        _check_writable(directory.parent)
    catalog.ensure_dataset(
        spec.dataset.id, cap=spec.dataset.budget_cap(), partitioned_by=partitions.declaration(spec)
    )
    operator_key = signing.load_chosen_key()  # DPRELEASE_KEY: loaded here, only its id recorded
    signing.check_operator(catalog, spec.dataset.id, key=operator_key)  # before any charge
    touched = partitions.release_partitions(spec)  # public: file names or domain cells
    series = {"name": spec.name, "dataset_id": spec.dataset.id, "series_key": spec.series_key()}
    input_fingerprint = None
    if on_unchanged == "skip":
        input_fingerprint = resolve_source(str(spec.dataset.source), key=catalog.key).fingerprint
        skipped = catalog.skip_if_unchanged(
            release_id=release_id, input_fingerprint=input_fingerprint, **series
        )
        if skipped is not None:
            return skipped
    check_memory(predict_plan(spec, plan))  # refused before any data is read or charge made
    due = cost_due(spec, plan, catalog, input_fingerprint=input_fingerprint)
    try:
        catalog.check_budget(spec.dataset.id, due, partitions=touched)  # before any data is read
    except BudgetExceededError as exc:
        binding = plan.binding_table
        if binding is None or plan.targets is None:
            raise
        raise BudgetExceededError(
            f"{exc}; the accuracy targets need this much: table {binding!r} binds "
            f"(max_std_error {plan.targets[binding]:g}): loosen it, or raise the cap"
        ) from None
    before = catalog.spent(spec.dataset.id, partitions=touched)
    # who runs it and who must approve it, recorded first: no release exists without its policy
    record_policy(catalog, release_id=release_id, spec=spec)
    skipped = catalog.create_release(
        release_id=release_id,
        spec_fingerprint=spec.fingerprint(),
        mechanism=plan.chosen,
        input_fingerprint=input_fingerprint,
        skip_unchanged=on_unchanged == "skip",
        **series,
    )
    if skipped is None and operator_key is not None:
        signing.sign_run(
            catalog,
            key=operator_key,
            release_id=release_id,
            dataset_id=spec.dataset.id,
            spec_fingerprint=spec.fingerprint(),
        )
    return before if skipped is None else skipped


def cost_due(
    spec: ReleaseSpec, plan: Plan, catalog: Catalog, *, input_fingerprint: str | None = None
) -> PrivacyCost:
    """What this release will charge: the plan's cost, unless the mechanism knows (from public
    facts: the keyed fingerprint of the input files and its released intermediates) that part of
    it was paid by an earlier release (e.g. a local-model collection already charged).
    ``input_fingerprint``: the keyed fingerprint when the caller already hashed the input (the
    skip check did); otherwise the files are hashed here, once (O(bytes))."""
    hook = getattr(plan.mechanism, "cost_due", None)
    if hook is None or spec.dataset.source is None:
        return plan.expected_cost
    if input_fingerprint is None:
        input_fingerprint = resolve_source(spec.dataset.source, key=catalog.key).fingerprint
    return hook(
        plan.strategy,
        dataset_id=spec.dataset.id,
        input_fingerprint=input_fingerprint,
        released=StrategyStore.released(catalog.url),
    )


def _check_writable(folder: Path) -> None:
    """The output folder exists (or can be made) and accepts files; refused before any charge."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dprelease-write-check-"):
            pass
    except OSError as exc:
        raise SpecError(
            f"--out: cannot write release artifacts under {str(folder)!r} ({exc.strerror}); "
            "choose a writable folder"
        ) from None


def ingest(spec: ReleaseSpec, plan: Plan, catalog: Catalog) -> Ingested:
    """Read the input the chosen mechanism measures (the only stage that touches data)."""
    return READERS[plan.mechanism.input_kind](spec, plan, catalog.key)


def measure(
    ingested: Ingested, spec: ReleaseSpec, plan: Plan, catalog: Catalog, *, release_id: str
) -> Measurement:
    """The chosen mechanism measures its planned strategy (charge before noise, choke point)."""
    catalog.heartbeat(release_id)  # the lease: a crashed run is found and marked by `recover`
    catalog.update_release(release_id, input_fingerprint=ingested.input_fingerprint)
    context = MeasureContext(
        target=spec.privacy_target(),
        accountant=signing.SignedAccountant(
            catalog,
            dataset_id=spec.dataset.id,
            release_id=release_id,
            # every partition of the files actually read (public: names, or domain cells)
            partitions=partitions.release_partitions(spec, files=ingested.files),
            key_name=signing.chosen_key_name(),  # each charge signed by the operator's key
        ),
        label=spec.name,
        contribution_bound=spec.privacy_unit.contribution_bound,
        input_fingerprint=ingested.input_fingerprint,
        dataset_id=spec.dataset.id,
        released=StrategyStore.released(catalog.url),
    )
    with noise_cluster(spec.execution) as mapper:  # dask: noised shard by shard on the cluster
        return plan.mechanism.measure(
            plan.strategy, sharded(ingested.data, mapper), context=context
        )


def reconstruct(spec: ReleaseSpec, plan: Plan, measurement: Measurement) -> dict[str, pa.Table]:
    """Every item's answers with their standard errors (post-processing of the measurement)."""
    workload = plan.workload or build_workload(spec)
    answers = plan.mechanism.reconstruct(measurement, workload=workload)
    answers = estimators.apply(spec, plan, measurement, answers, workload=workload)
    tables = {
        item.name: build_table(
            spec,
            item,
            estimates=answers[item.name].estimates,
            unit_variances=answers[item.name].variances,
            noise_variance=1.0,
            nonnegative=spec.postprocess.nonnegative,
            interval=answers[item.name].interval,
            uncertainty=answers[item.name].uncertainty,
        )
        for item in workload.items
    }
    return tables | derived_tables(spec, answers)  # post-processing of the same answers


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


def stage(
    *,
    spec: ReleaseSpec,
    plan: Plan,
    release_id: str,
    directory: Path,
    ingested: Ingested,
    measurement: Measurement,
    tables: dict[str, pa.Table],
    validation: dict[str, Any],
    spent_before: PrivacyCost,
    catalog: Catalog,
) -> StagedRelease:
    """Write the report and manifest, record the manifest hash; status becomes ``staged``."""
    if not validation["success"]:
        catalog.update_release(release_id, status="failed", directory=str(directory))
        raise ValidationFailedError(
            f"release {release_id} failed output validation; see {directory / 'validation'} "
            "(the privacy budget stays spent)"
        )
    # any charge made outside the signed accountant (a series period) is signed before staging
    signing.sign_unsigned(
        catalog,
        release_id=release_id,
        dataset_id=spec.dataset.id,
        spec_fingerprint=spec.fingerprint(),
    )
    cap = catalog.cap(spec.dataset.id)
    touched = partitions.charged_partitions(spec, files=ingested.files, details=measurement.details)
    after = catalog.spent(spec.dataset.id, partitions=touched)
    receipts = [  # a partitioned charge is one entry per partition, all paid by this release
        entry.receipt()
        for entry in catalog.ledger_entries(spec.dataset.id)
        if entry.receipt_id in measurement.receipts
        or (entry.release_id == release_id and entry.kind == "charge")
    ]
    manifest = Manifest.model_validate(
        {
            "release_id": release_id,
            "name": spec.name,
            "dataset_id": spec.dataset.id,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "spec": spec.model_dump(mode="json"),
            "spec_fingerprint": spec.fingerprint(),
            "workload_fingerprint": plan.workload_fingerprint,
            "input_fingerprint": ingested.input_fingerprint,
            artifacts.MANIFEST_KEY_ID: catalog.fingerprint_key_id(),
            "input_files": [Path(f).name for f in ingested.files],
            "code_version": artifacts.code_version(),
            "privacy_unit": ingested.privacy_unit,
            "mechanism": {
                "name": plan.chosen,
                "model": plan.model,
                "reason": plan.reason,
                "parameters": dict(spec.mechanism_options),
                "noise": {
                    name: getattr(measurement.noise, name) for name in NoiseRecord.model_fields
                },
                "details": dict(measurement.details) | estimators.details(spec, plan),
            },
            "privacy": {
                "requested": dict(spec.privacy),
                "charged": measurement.charged.as_dict(),
                "receipts_in_budget_measure": [r["cost"] for r in receipts],
                "model": f"{plan.model}: {plan.mechanism.summary}",
                "allow_large_delta": spec.allow_large_delta,
            },
            "budget": {
                "cap": cap.as_dict(),
                "before": spent_before.as_dict(),
                "after": after.as_dict(),
                "remaining": after.remaining(cap).as_dict(),
            },
            "ledger_receipts": receipts,
            "partitions": partitions.manifest_record(spec, touched),
            artifacts.MANIFEST_CHAIN_HEAD: catalog.chain_head(spec.dataset.id).as_dict(),
            "plan": plan.to_json(),
            "tables": list(tables),
            "derived_tables": derived_descriptions(spec),
            "validation": {"success": validation["success"], "results": "validation/results.json"},
            "review": {"status": "staged", "trail": []},
        }
    ).to_json()
    write_report(directory, manifest, catalog)
    digest = artifacts.write_manifest(directory, manifest)
    catalog.update_release(
        release_id, status="staged", directory=str(directory), manifest_sha256=digest
    )
    return StagedRelease(
        release_id=release_id,
        directory=str(directory),
        mechanism=plan.chosen,
        charged=measurement.charged.as_dict(),
    )


def mark_stopped(catalog: Catalog, release_id: str, directory: Path, *, status: str) -> None:
    """A release that stopped before staging is ``failed`` or ``aborted``; its charges stay."""
    if status == "aborted":
        catalog.mark_interrupted(release_id)
    if catalog.release(release_id).status == "measuring":
        catalog.update_release(
            release_id, status=status, directory=str(directory) if directory.exists() else None
        )
