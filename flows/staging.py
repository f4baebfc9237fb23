"""What every release run does once its budget is registered: its own stages (a release's
ingest → measure → reconstruct → validate, or a series period's), then stage and notify, with a
stop anywhere in between marking the release ``failed`` (``aborted`` on Ctrl-C).  Privacy: the
charges a stopped release made stay spent (the noise may have been drawn)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from dprelease.catalog import release
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import Plan
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.flows.notify import notify_reviewers_task
from dprelease.flows.watchdog import RunWatchdog
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import Measurement
from dprelease.tasks.stages import stage_task

if TYPE_CHECKING:
    import pyarrow as pa

MeasuredStages: TypeAlias = (
    "tuple[release.Ingested, Measurement, dict[str, pa.Table], dict[str, Any]]"
)
"""What a run's own stages hand to staging: the ingested input (its data behind the choke
point), the noisy measurement, the released tables and their validation."""


def stage_after_charge(
    watchdog: RunWatchdog,
    spec: ReleaseSpec,
    plan: Plan,
    release_id: str,
    directory: Path,
    spent_before: PrivacyCost,
    catalog_url: str,
    run_stages: Callable[[], MeasuredStages],
) -> release.StagedRelease:
    """``run_stages()``, then stage ``release_id`` in ``directory`` and notify its reviewers, each
    under ``watchdog``; a stop (the watchdog's time limit, an error, Ctrl-C) marks the release
    stopped and is raised again."""
    watchdog.set_release(release_id)
    watchdog.on_stop = lambda reason: release.mark_stopped(
        Catalog(catalog_url), release_id, directory, status="failed"
    )
    try:
        ingested, measurement, tables, validation = run_stages()
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
    except BaseException as stopped:
        status = "aborted" if isinstance(stopped, KeyboardInterrupt) else "failed"
        release.mark_stopped(Catalog(catalog_url), release_id, directory, status=status)
        raise
