"""The ``release`` flow: spec → plan → budget check → ingest → measure → reconstruct → validate → stage.

One flow for every mechanism (central, data-dependent, local model): the plan carries the chosen
mechanism and its strategy, and each task asks the mechanism to do its part.  Flow parameters are
public (a spec path, an output folder, a catalog URL, an engine and a scheduler address); data
never is.  A run that stops after the ledger was charged keeps its charge and is marked ``failed``
(``aborted`` on Ctrl-C).

Where it runs (:mod:`catalog.engine`): :func:`run_release` opens the run's Dask cluster (started,
or joined at ``execution.address``) and runs the flow on ``prefect_dask.DaskTaskRunner``
connected to it, so tasks that fan out (``.submit``/``.map``) run on the cluster, and counting
(:mod:`catalog.confidential.dask_count`) uses the same cluster; ``local`` keeps Prefect's default runner.
"""

from __future__ import annotations

from typing import Literal

from prefect import Flow, flow

from catalog import release
from catalog.engine import Execution, open_cluster, with_execution
from catalog.ledger.database import default_url
from catalog.ledger.store import Catalog, SkippedRelease
from flows.notify import notify_reviewers_task
from flows.server import state_home
from flows.watchdog import RunWatchdog, stage_timeout_seconds
from tasks.ingest import ingest_task
from tasks.load_spec import load_spec_task
from tasks.measure import measure_task
from tasks.plan import plan_task
from tasks.reconstruct import reconstruct_task
from tasks.register import register_task
from tasks.stage import stage_task
from tasks.validate import validate_task


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
    watchdog = RunWatchdog(home=state_home(), spec=spec_path, limit_seconds=stage_timeout_seconds())
    with watchdog:
        return _run_stages(
            watchdog,
            spec_path,
            out_dir,
            catalog_url,
            source_override,
            engine,
            address,
            on_unchanged,
        )


def _run_stages(
    watchdog: RunWatchdog,
    spec_path: str,
    out_dir: str,
    catalog_url: str,
    source_override: str | None,
    engine: Literal["local", "dask"] | None,
    address: str | None,
    on_unchanged: Literal["skip", "release"],
) -> release.StagedRelease | SkippedRelease:
    """The pipeline, each stage under the watchdog's time limit (flows.watchdog)."""
    with watchdog.stage("load-spec"):
        loaded = load_spec_task(spec_path, source_override)
        spec = with_execution(loaded, engine=engine, address=address)
    with watchdog.stage("plan"):
        plan = plan_task(spec)
    release_id = release.new_release_id(spec)
    directory = release.release_directory(out_dir, release_id)
    with watchdog.stage("register"):
        spent_before = register_task(
            spec, plan, catalog_url, release_id, str(directory), on_unchanged
        )
    if isinstance(spent_before, SkippedRelease):
        return spent_before  # nothing read, nothing charged
    watchdog.set_release(release_id)
    watchdog.on_stop = lambda reason: release.mark_stopped(
        Catalog(catalog_url), release_id, directory, status="failed"
    )
    try:
        with watchdog.stage("ingest"):
            ingested = ingest_task(spec, plan, catalog_url)
        with watchdog.stage("measure"):
            measurement = measure_task(ingested, spec, plan, catalog_url, release_id)
        with watchdog.stage("reconstruct"):
            tables = reconstruct_task(spec, plan, measurement)
        with watchdog.stage("validate"):
            validation = validate_task(tables, plan, str(directory))
        with watchdog.stage("stage"):
            staged = stage_task(
                spec,
                plan,
                release_id,
                str(directory),
                ingested,
                measurement,
                tables,
                validation,
                spent_before,
                catalog_url,
            )
        with watchdog.stage("notify"):
            notify_reviewers_task(catalog_url, staged.release_id)  # review.notify; never raises
        return staged
    except KeyboardInterrupt:
        release.mark_stopped(Catalog(catalog_url), release_id, directory, status="aborted")
        raise
    except BaseException:
        release.mark_stopped(Catalog(catalog_url), release_id, directory, status="failed")
        raise


def release_flow_on(address: str | None) -> Flow:
    """The release flow with its fan-out tasks on the Dask cluster at ``address`` (None: local)."""
    if address is None:
        return release_flow
    from prefect_dask import DaskTaskRunner

    return release_flow.with_options(task_runner=DaskTaskRunner(address=address))


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
        return release_flow_on(address)(
            spec_path=spec_path,
            out_dir=out_dir,
            catalog_url=catalog_url,
            source_override=source_override,
            engine=execution.engine,
            address=address,
        )
