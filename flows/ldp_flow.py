"""The ``ldp-release`` flow: spec → strategy (cached) → budget check → ingest responses → charge the
collection → estimate → validate → stage.

The local-model counterpart of ``flows/release_flow.py``; ``dprelease run SPEC`` dispatches here
when the spec says ``model: local``.  Flow parameters are public (paths and a catalog URL).  A run
that fails is marked ``failed``; a failure before the charge (for example a bad responses file)
charges nothing, and a charged collection stays charged.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from catalog import ldp_release
from catalog.ldp_release import StrategyRecord
from catalog.ledger import Catalog, default_url
from catalog.release import StagedRelease, new_release_id
from catalog.spec import ReleaseSpec
from mechanisms.ldp import LDPStrategy
from tasks.ldp import (
    ldp_charge_task,
    ldp_estimate_task,
    ldp_ingest_task,
    ldp_register_task,
    ldp_stage_task,
    ldp_strategy_task,
    ldp_validate_task,
)
from tasks.load_spec import load_spec_task


@flow(name="ldp-release", log_prints=False, validate_parameters=True)
def ldp_release_flow(
    spec_path: str,
    out_dir: str = "releases",
    catalog_url: str | None = None,
    source_override: str | None = None,
    strategy_dir: str | None = None,
) -> StagedRelease:
    """Release the workload estimates of one local-model collection; returns the staged release.

    ``strategy_dir`` (a folder written by ``dprelease ldp strategy``) names the published strategy
    explicitly; by default it is the spec's optimised strategy from the strategy store (the same
    one ``dprelease ldp strategy`` publishes).  ``source_override`` replaces ``dataset.source``.
    """
    catalog_url = catalog_url or default_url()
    spec = load_spec_task(spec_path, source_override)
    ldp_release.require_local(spec)
    strategy, record = _strategy(spec, strategy_dir)
    release_id = new_release_id(spec)
    directory = ldp_release.release_directory(out_dir, release_id)
    spent_before = ldp_register_task(spec, record.fingerprint, catalog_url, release_id)
    try:
        ingested = ldp_ingest_task(spec, strategy)
        charge = ldp_charge_task(spec, ingested, catalog_url, release_id)
        tables = ldp_estimate_task(spec, strategy, ingested)
        validation = ldp_validate_task(spec, tables, str(directory))
        return ldp_stage_task(
            spec,
            record,
            release_id,
            str(directory),
            ingested,
            charge,
            tables,
            validation,
            spent_before,
            catalog_url,
        )
    except BaseException:
        ldp_release.mark_failed(Catalog(catalog_url), release_id, Path(directory))
        raise


def _strategy(spec: ReleaseSpec, strategy_dir: str | None) -> tuple[LDPStrategy, StrategyRecord]:
    if strategy_dir is None:
        return ldp_strategy_task(spec)
    strategy, record = ldp_release.read_strategy_artifact(Path(strategy_dir))
    ldp_release.check_strategy_fits(spec, strategy)
    return strategy, record
