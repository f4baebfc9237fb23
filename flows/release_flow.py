"""The ``release`` flow: spec → plan → budget check → count → measure → reconstruct → validate → stage.

Flow parameters are public (a spec path, an output folder, a catalog URL); data never is.  A run
that fails after the ledger was charged is marked ``failed`` and keeps its charge.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from catalog import release
from catalog.ledger import Catalog, default_url
from tasks.count import count_task
from tasks.dawa import dawa_measure_task, dawa_reconstruct_task, partition_task
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
    spent_before = register_task(spec, plan, catalog_url, release_id)
    try:
        counted = count_task(spec)
        partition = None
        if plan.chosen == "dawa":
            partition = partition_task(counted, spec, catalog_url, release_id)
            measurement, strategy = dawa_measure_task(
                counted, spec, partition, catalog_url, release_id
            )
            tables = dawa_reconstruct_task(spec, strategy, measurement)
        else:
            measurement = measure_task(counted, spec, plan, catalog_url, release_id)
            tables = reconstruct_task(spec, plan, measurement)
        validation = validate_task(tables, plan, str(directory))
        return stage_task(
            spec,
            plan,
            release_id,
            str(directory),
            counted,
            measurement,
            tables,
            validation,
            spent_before,
            catalog_url,
            partition,
        )
    except BaseException:
        _mark_failed(catalog_url, release_id, directory)
        raise


def _mark_failed(catalog_url: str, release_id: str, directory: Path) -> None:
    catalog = Catalog(catalog_url)
    if catalog.release(release_id).status == "measuring":
        catalog.update_release(
            release_id, status="failed", directory=str(directory) if directory.exists() else None
        )
