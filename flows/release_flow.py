"""The ``release`` flow: spec → plan → budget check → ingest → measure → reconstruct → validate → stage.

One flow for every mechanism: the plan carries the mechanism and its strategy.  Parameters are
public (paths, a catalog URL, an engine, a scheduler address); data never is.  A run that stops
after the charge keeps it and is marked ``failed`` (``aborted`` on Ctrl-C).  Under ``dask``
(:mod:`catalog.engine`) :func:`run_release` runs the flow on a ``DaskTaskRunner`` of the run's
cluster, which counting (:mod:`catalog.confidential.dask_count`) uses too.
"""

from __future__ import annotations

from typing import Literal

from prefect import Flow, flow

from dprelease.catalog import release
from dprelease.catalog.engine import Execution, open_cluster, with_execution
from dprelease.catalog.ledger.database import default_url
from dprelease.catalog.ledger.store import SkippedRelease
from dprelease.flows.series_flow import release_period
from dprelease.flows.server import state_home
from dprelease.flows.staging import MeasuredStages, stage_after_charge
from dprelease.flows.watchdog import RunWatchdog, stage_timeout_seconds
from dprelease.tasks.stages import (
    ingest_task,
    load_spec_task,
    measure_task,
    plan_task,
    reconstruct_task,
    register_task,
    validate_task,
)


@flow(name="release", log_prints=False, validate_parameters=True)
def release_flow(
    spec_path: str,
    out_dir: str = "releases",
    catalog_url: str | None = None,
    source_override: str | None = None,
    engine: Literal["local", "dask"] | None = None,
    address: str | None = None,
    on_unchanged: Literal["skip", "release"] = "release",
) -> release.StagedRelease | SkippedRelease:
    """Run one release for the spec at ``spec_path``; returns the staged release (public).

    ``on_unchanged="skip"`` (the deployed flow passes the spec's policy for scheduled and triggered
    runs): an input and spec unchanged since the series' last release charge nothing and return
    the :class:`SkippedRelease` (a ``skipped`` ledger entry); a run by hand always releases.

    ``source_override`` (a path, e.g. a newly arrived file) replaces the spec's ``dataset.source``;
    ``engine``/``address``, when given, replace the spec's ``execution`` (the CLI wins).
    """
    catalog_url = catalog_url or default_url()
    limit = stage_timeout_seconds()
    # each stage under the watchdog's time limit (flows.watchdog)
    with RunWatchdog(home=state_home(), spec=spec_path, limit_seconds=limit) as watchdog:
        with watchdog.stage("load-spec"):
            loaded = load_spec_task(spec_path, source_override)
            spec = with_execution(loaded, engine=engine, address=address)
        with watchdog.stage("plan"):
            plan = plan_task(spec)
            spec = release.planned_spec(spec, plan)  # accuracy targets: the level plan found
        if spec.series is not None:  # one period of a series: its own stages
            return release_period(
                spec,
                plan,
                out_dir=out_dir,
                catalog_url=catalog_url,
                watchdog=watchdog,
                on_unchanged=on_unchanged,
            )
        release_id = release.new_release_id(spec)
        directory = release.release_directory(out_dir, release_id)
        with watchdog.stage("register"):
            spent_before = register_task(
                spec, plan, catalog_url, release_id, str(directory), on_unchanged
            )
        if isinstance(spent_before, SkippedRelease):
            return spent_before  # nothing read, nothing charged

        def measured_input() -> MeasuredStages:
            with watchdog.stage("ingest"):
                ingested = ingest_task(spec, plan, catalog_url)
            with watchdog.stage("measure"):
                measurement = measure_task(ingested, spec, plan, catalog_url, release_id)
            with watchdog.stage("reconstruct"):
                tables = reconstruct_task(spec, plan, measurement)
            with watchdog.stage("validate"):
                validation = validate_task(tables, plan, str(directory))
            return ingested, measurement, tables, validation

        return stage_after_charge(
            watchdog, spec, plan, release_id, directory, spent_before, catalog_url, measured_input
        )


def run_release(
    *,
    spec_path: str,
    execution: Execution,
    out_dir: str = "releases",
    catalog_url: str | None = None,
    source_override: str | None = None,
) -> release.StagedRelease | SkippedRelease:
    """Run :func:`release_flow` on ``execution`` (resolved by the caller: spec, then CLI).

    ``dask`` without an address starts a LocalCluster sized to the machine for this run and closes
    it afterwards; with an address the run joins that cluster and leaves it running.
    """
    with open_cluster(execution) as client:
        address = None if client is None else str(client.scheduler.address)
        flow: Flow = release_flow
        if address is not None:  # fan-out tasks on the run's Dask cluster
            from prefect_dask import DaskTaskRunner

            flow = release_flow.with_options(task_runner=DaskTaskRunner(address=address))
        return flow(
            spec_path=spec_path,
            out_dir=out_dir,
            catalog_url=catalog_url,
            source_override=source_override,
            engine=execution.engine,
            address=address,
        )
