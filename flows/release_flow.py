"""The ``release`` flow: spec → plan → budget check → ingest → measure → reconstruct → validate → stage.

One flow for every mechanism (central, data-dependent, local model): the plan carries the chosen
mechanism and its strategy, and each task asks the mechanism to do its part.  Flow parameters are
public (a spec path, an output folder, a catalog URL); data never is.  A run that stops after the
ledger was charged keeps its charge and is marked ``failed`` (``aborted`` on Ctrl-C).
"""

from __future__ import annotations

from prefect import flow

from catalog import release
from catalog.ledger import Catalog, default_url
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
) -> release.StagedRelease:
    """Run one release for the spec at ``spec_path``; returns the staged release (public).

    ``source_override`` (a path, e.g. a newly arrived file) replaces the spec's ``dataset.source``.
    """
    catalog_url = catalog_url or default_url()
    spec = load_spec_task(spec_path, source_override)
    plan = plan_task(spec)
    release_id = release.new_release_id(spec)
    directory = release.release_directory(out_dir, release_id)
    spent_before = register_task(spec, plan, catalog_url, release_id, str(directory))
    try:
        ingested = ingest_task(spec, plan, catalog_url)
        measurement = measure_task(ingested, spec, plan, catalog_url, release_id)
        tables = reconstruct_task(spec, plan, measurement)
        validation = validate_task(tables, plan, str(directory))
        return stage_task(
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
    except KeyboardInterrupt:
        release.mark_stopped(Catalog(catalog_url), release_id, directory, status="aborted")
        raise
    except BaseException:
        release.mark_stopped(Catalog(catalog_url), release_id, directory, status="failed")
        raise
