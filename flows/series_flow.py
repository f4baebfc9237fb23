"""One period of a series inside the ``release`` flow: register → measure → reconstruct →
validate → stage, each stage under the run's watchdog (the tasks of ``tasks/series.py``; staging
and notification are the release's own, :func:`flows.staging.stage_after_charge`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from dprelease.catalog import release
from dprelease.catalog.confidential.inputs import Ingested, describe_unit
from dprelease.catalog.ledger.store import SkippedRelease
from dprelease.catalog.planning.planner import Plan
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.flows.staging import MeasuredStages, stage_after_charge
from dprelease.tasks.series import (
    series_cell_plan_task,
    series_measure_task,
    series_reconstruct_task,
    series_register_task,
    series_validate_task,
)


def release_period(
    spec: ReleaseSpec,
    plan: Plan,
    *,
    out_dir: str,
    catalog_url: str,
    watchdog: Any,
    on_unchanged: Literal["skip", "release"] = "release",
) -> release.StagedRelease | SkippedRelease:
    """Release the series' next period (its file: the first of ``dataset.source`` not released);
    ``on_unchanged="skip"``: a source unchanged since the series' last release is a skip."""
    if spec.series is None:
        raise ValueError(f"spec {spec.name!r} has no series section")
    parts = tuple(spec.series.part_names())
    release_id = release.new_release_id(spec)
    directory = release.release_directory(out_dir, release_id)
    with watchdog.stage("register"):
        plan = series_cell_plan_task(spec, plan, catalog_url)
        registered = series_register_task(
            spec, plan, catalog_url, release_id, str(directory), on_unchanged
        )
    if isinstance(registered, SkippedRelease):
        return registered  # nothing read, nothing charged
    step, spent_before = registered

    def measured_period() -> MeasuredStages:
        with watchdog.stage("measure"):
            measurement, files, fingerprint = series_measure_task(
                spec, plan, step, catalog_url, release_id
            )
        with watchdog.stage("reconstruct"):
            tables = series_reconstruct_task(spec, plan, catalog_url, step.period)
        with watchdog.stage("validate"):
            validation = series_validate_task(tables, plan, parts, str(directory))
        ingested = Ingested(
            data=None,
            input_fingerprint=fingerprint,
            files=tuple(str(Path(f)) for f in files),
            privacy_unit=describe_unit(spec),
        )
        return ingested, measurement, tables, validation

    return stage_after_charge(
        watchdog, spec, plan, release_id, directory, spent_before, catalog_url, measured_period
    )
