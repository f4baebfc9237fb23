"""Run the release pipeline's stages in-process, without Prefect (catalog-level tests)."""

from __future__ import annotations

from pathlib import Path

from dprelease.catalog import release
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.spec.model import ReleaseSpec


def release_stages(spec: ReleaseSpec, catalog: Catalog, out_dir: Path) -> Path:
    """register → ingest → measure → reconstruct → validate → stage; the release directory."""
    plan = make_plan(spec)
    release_id = release.new_release_id(spec)
    directory = release.release_directory(out_dir, release_id)
    spent_before = release.register(spec, plan, catalog, release_id=release_id, directory=directory)
    ingested = release.ingest(spec, plan, catalog)
    measurement = release.measure(ingested, spec, plan, catalog, release_id=release_id)
    tables = release.reconstruct(spec, plan, measurement)
    release.stage(
        spec=spec,
        plan=plan,
        release_id=release_id,
        directory=directory,
        ingested=ingested,
        measurement=measurement,
        tables=tables,
        validation=release.validate(tables, plan, directory=directory),
        spent_before=spent_before,
        catalog=catalog,
    )
    return directory
