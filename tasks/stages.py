"""One Prefect task per stage of the ``release`` flow; the logic lives in :mod:`catalog.release`.

Only ``ingest`` touches raw data.  Privacy: the tasks that hold counts or noise (``ingest``,
``measure``) have ``retries=0`` (nothing is re-read or re-measured behind the ledger's back), no
cache (the inputs must not be hashed into keys), no persisted result (the counts must never reach
result storage; the returned ``ProtectedCells`` refuses pickling anyway) and no printed logs.  No
task but ``plan`` (public: the workload and privacy level) is cached or retried.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from dprelease.catalog import release
from dprelease.catalog.home import default_home
from dprelease.catalog.ledger.store import Catalog, SkippedRelease
from dprelease.catalog.planning.planner import Plan, make_plan
from dprelease.catalog.spec.load import check_runnable_before_planning, load_spec
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.catalog.spec.series import arrival_source
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import Measurement

# Bump when a pickled Plan's classes change fields, so cached plans are recomputed, never
# unpickled into the new classes (3: MarginalWeights.norm became noise).
PLAN_CACHE_VERSION = "3"


@task(name="load-spec", cache_policy=NO_CACHE, retries=0)
def load_spec_task(spec_path: str, source_override: str | None = None) -> ReleaseSpec:
    """The spec, with a newly arrived file as its source if given (a column series keeps its
    whole source: :func:`arrival_source`); refused from sizes alone (as `dprelease run` refuses
    it) before the plan is made."""
    spec = load_spec(spec_path)
    if source_override is not None:
        source = arrival_source(spec, source_override)
        spec = spec.model_copy(
            update={"dataset": spec.dataset.model_copy(update={"source": source})}
        )
    check_runnable_before_planning(spec)
    return spec


def plan_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    """Key = workload fingerprint + privacy level + contribution bound (all public), hashed."""
    spec: ReleaseSpec = parameters["spec"]
    raw = json.dumps(
        [
            "plan-release",
            PLAN_CACHE_VERSION,
            spec.model,
            spec.workload_fingerprint(),
            spec.privacy,
            spec.privacy_unit.contribution_bound,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(raw.encode()).hexdigest()


def result_storage() -> Path:
    """``$DPRELEASE_HOME/prefect-results``: a ``Path`` means local storage with no server-side block."""
    path = default_home() / "prefect-results"
    path.mkdir(parents=True, exist_ok=True)
    return path


@task(
    name="plan-strategy",
    cache_key_fn=plan_cache_key,
    persist_result=True,
    result_storage=result_storage(),
    cache_expiration=timedelta(days=30),
)
def plan_task(spec: ReleaseSpec) -> Plan:
    """Choose the strategy and compute expected errors (data-free, cached by workload fingerprint)."""
    return make_plan(spec)


@task(name="check-budget", cache_policy=NO_CACHE, retries=0)
def register_task(
    spec: ReleaseSpec,
    plan: Plan,
    catalog_url: str,
    release_id: str,
    directory: str,
    on_unchanged: Literal["skip", "release"] = "release",
) -> PrivacyCost | SkippedRelease:
    """Every public check (input size, output folder, budget) before any data is read; record intent."""
    return release.register(
        spec,
        plan,
        Catalog(catalog_url),
        release_id=release_id,
        directory=Path(directory),
        on_unchanged=on_unchanged,
    )


@task(name="ingest", retries=0, cache_policy=NO_CACHE, persist_result=False, log_prints=False)
def ingest_task(spec: ReleaseSpec, plan: Plan, catalog_url: str) -> release.Ingested:
    return release.ingest(spec, plan, Catalog(catalog_url))


@task(name="measure", retries=0, cache_policy=NO_CACHE, persist_result=False, log_prints=False)
def measure_task(
    ingested: release.Ingested, spec: ReleaseSpec, plan: Plan, catalog_url: str, release_id: str
) -> Measurement:
    """The chosen mechanism charges the ledger, then adds vetted noise."""
    return release.measure(ingested, spec, plan, Catalog(catalog_url), release_id=release_id)


@task(name="reconstruct", cache_policy=NO_CACHE, persist_result=False)
def reconstruct_task(
    spec: ReleaseSpec, plan: Plan, measurement: Measurement
) -> dict[str, pa.Table]:
    return release.reconstruct(spec, plan, measurement)


@task(name="validate-outputs", cache_policy=NO_CACHE, persist_result=False)
def validate_task(tables: dict[str, pa.Table], plan: Plan, directory: str) -> dict[str, Any]:
    """Great Expectations checks of the released tables (released values and public metadata only)."""
    return release.validate(tables, plan, directory=Path(directory))


@task(name="stage-release", cache_policy=NO_CACHE, persist_result=False)
def stage_task(
    spec: ReleaseSpec,
    plan: Plan,
    release_id: str,
    directory: str,
    ingested: release.Ingested,
    measurement: Measurement,
    tables: dict[str, pa.Table],
    validation: dict[str, Any],
    spent_before: PrivacyCost,
    catalog_url: str,
) -> release.StagedRelease:
    """Write the manifest and report, mark the release staged, mirror a summary as an artifact."""
    staged = release.stage(
        spec=spec,
        plan=plan,
        release_id=release_id,
        directory=Path(directory),
        ingested=ingested,
        measurement=measurement,
        tables=tables,
        validation=validation,
        spent_before=spent_before,
        catalog=Catalog(catalog_url),
    )
    create_markdown_artifact(
        key="release-summary",
        markdown=summary_markdown(spec, plan, staged),
        description=f"dprelease {staged.release_id}",
    )
    return staged


def summary_markdown(spec: ReleaseSpec, plan: Plan, staged: release.StagedRelease) -> str:
    """Public summary mirrored into the Prefect UI (the same facts as the manifest)."""
    lines = [
        f"# Release `{staged.release_id}` (staged, awaiting review)",
        f"* dataset: **{spec.dataset.id}**; spec `{spec.name}`",
        f"* mechanism: **{plan.chosen}** ({plan.reason})",
        f"* privacy charged: **{', '.join(f'{k}={v:.6g}' for k, v in staged.charged.items())}**",
        f"* expected RMSE: {_fmt(plan.candidate(plan.chosen).rmse)}; SVD lower bound: "
        + _fmt(plan.lower_bound_rmse),
        f"* objective: {plan.objective}; largest cell standard error: "
        + _fmt(None if plan.largest_std_error is None else plan.largest_std_error[1]),
        f"* artifacts: `{staged.directory}`",
        "",
        "| candidate | rmse |",
        "|---|---|",
    ]
    lines += [
        f"| {c.mechanism} | {c.rmse:.4g} |" if c.rmse is not None else f"| {c.mechanism} | n/a |"
        for c in plan.candidates
    ]
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "n/a (data-dependent)" if value is None else f"{value:.4g}"
