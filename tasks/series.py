"""One Prefect task per stage of a series period's release; the logic lives in
:mod:`catalog.series`.  Privacy as in :mod:`tasks.stages`: the task that reads the periods and
draws the noise has ``retries=0``, no cache, no persisted result and no printed logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from dprelease.catalog import series
from dprelease.catalog.ledger.store import Catalog, SkippedRelease
from dprelease.catalog.planning.planner import Plan
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import Measurement


@task(name="series-cell-plan", cache_policy=NO_CACHE, retries=0)
def series_cell_plan_task(spec: ReleaseSpec, plan: Plan, catalog_url: str) -> Plan:
    """The cell plan this period runs: the series' recorded cell mechanism once it has one."""
    return series.cell_plan(spec, plan, Catalog(catalog_url))


@task(name="series-register", cache_policy=NO_CACHE, retries=0)
def series_register_task(
    spec: ReleaseSpec,
    plan: Plan,
    catalog_url: str,
    release_id: str,
    directory: str,
    on_unchanged: Literal["skip", "release"] = "release",
) -> tuple[series.SeriesStep, PrivacyCost] | SkippedRelease:
    """The series' checks and each partition's increment against its cap, before any data is
    read; the plan recorded at the first release; the release's intent (or a skip)."""
    return series.register(
        spec,
        plan,
        Catalog(catalog_url),
        release_id=release_id,
        directory=Path(directory),
        on_unchanged=on_unchanged,
    )


@task(
    name="series-measure", retries=0, cache_policy=NO_CACHE, persist_result=False, log_prints=False
)
def series_measure_task(
    spec: ReleaseSpec, plan: Plan, step: series.SeriesStep, catalog_url: str, release_id: str
) -> tuple[Measurement, tuple[str, ...], str]:
    """Read the periods, charge each its increment, then noise (choke point)."""
    return series.measure(spec, plan, step, Catalog(catalog_url), release_id=release_id)


@task(name="series-reconstruct", cache_policy=NO_CACHE, persist_result=False)
def series_reconstruct_task(
    spec: ReleaseSpec, plan: Plan, catalog_url: str, period: int
) -> dict[str, pa.Table]:
    return series.reconstruct(spec, plan, Catalog(catalog_url), period=period)


@task(name="series-validate", cache_policy=NO_CACHE, persist_result=False)
def series_validate_task(
    tables: dict[str, pa.Table], plan: Plan, parts: tuple[str, ...], directory: str
) -> dict[str, Any]:
    return series.validate(tables, plan, parts, directory=Path(directory))
