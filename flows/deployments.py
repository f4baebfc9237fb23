"""Register one Prefect deployment per release spec (``dprelease deploy [SPECS_DIR]``).

Each spec becomes a deployment of :func:`flows.deployed_release.release_deployment_flow` named
after the spec (``release-deployment/<spec name>``) on a *process* work pool, with

* a cron schedule when the spec has ``schedule: {cron, timezone}``;
* an arrival trigger when it has ``trigger: arrival``: a ``DeploymentEventTrigger`` on the
  ``dprelease.data.arrived`` event of resource ``dprelease.dataset.<dataset id>`` that passes the
  event's ``path`` (and ``fingerprint``) as flow parameters;
* a global concurrency limit ``dprelease-dataset-<dataset id>`` with one slot, which the flow holds
  while it releases: one running release per dataset id, across all of the dataset's specs;
* the spec's ``on_unchanged`` policy (default ``skip``): a scheduled or triggered run whose input
  and spec equal the series' last release charges nothing (``flows.deployed_release``); and, for
  a spec with ``dataset.partitions``, per-partition charges (``catalog.partitions``);
* default parameters that are public only: absolute spec path, output and publish folders, the
  catalog URL when it is a local SQLite file (a server URL may carry credentials: the worker gets
  it from ``DPRELEASE_CATALOG_URL`` instead), the review timeout.

Deployments, schedules, triggers and limits need a real Prefect server (``PREFECT_API_URL``); see
``deploy/README.md``.  Re-running ``dprelease deploy`` updates the deployments in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from catalog.errors import SpecError
from catalog.spec import ReleaseSpec, load_spec
from flows.deployed_release import (
    DEFAULT_REVIEW_TIMEOUT_SECONDS,
    ensure_dataset_limit,
    release_deployment_flow,
)
from flows.watch import ARRIVAL_EVENT, resource_id

WORK_POOL = "dprelease-process"
DEPLOYMENT_TAG = "dprelease"


@dataclass(frozen=True, kw_only=True)
class DeploymentSummary:
    """What ``dprelease deploy`` registered for one spec (public)."""

    name: str
    deployment_id: str
    spec_path: str
    dataset_id: str
    schedule: str | None
    arrival_trigger: bool
    work_pool: str
    concurrency_limit: str
    on_unchanged: str = "skip"
    partitioned_by: str | None = None


def arrival_trigger(dataset_id: str) -> Any:
    """Run the deployment once per ``dprelease.data.arrived`` event of ``dataset_id``."""
    from prefect.events import DeploymentEventTrigger

    return DeploymentEventTrigger(
        name=f"dprelease arrival of {dataset_id}",
        expect={ARRIVAL_EVENT},
        match={"prefect.resource.id": resource_id(dataset_id)},
        parameters={
            "source_override": "{{ event.payload.path }}",
            "expected_fingerprint": "{{ event.payload.fingerprint }}",
        },
    )


def _parameters(
    spec_path: Path,
    *,
    out_dir: Path,
    catalog_url: str | None,
    publish_dir: Path | None,
    review_timeout_seconds: int,
) -> dict[str, Any]:
    parameters: dict[str, Any] = {
        "spec_path": str(spec_path.resolve()),
        "out_dir": str(out_dir.resolve()),
        "review_timeout_seconds": review_timeout_seconds,
    }
    if catalog_url is not None:
        parameters["catalog_url"] = catalog_url
    if publish_dir is not None:
        parameters["publish_dir"] = str(publish_dir.resolve())
    return parameters


def build_deployment(
    spec_path: Path,
    spec: ReleaseSpec,
    *,
    work_pool: str = WORK_POOL,
    out_dir: Path = Path("releases"),
    catalog_url: str | None = None,
    publish_dir: Path | None = None,
    review_timeout_seconds: int = DEFAULT_REVIEW_TIMEOUT_SECONDS,
    interval_seconds: float | None = None,
) -> Any:
    """The ``RunnerDeployment`` of one spec (not yet registered).

    ``interval_seconds`` adds an interval schedule (development and tests: cron's finest step is a
    minute).
    """
    from prefect.deployments.runner import EntrypointType, RunnerDeployment
    from prefect.schedules import Cron, Interval

    if review_timeout_seconds < 1:
        raise ValueError(f"review_timeout_seconds ({review_timeout_seconds}) must be >= 1")
    if interval_seconds is not None and not interval_seconds >= 1:
        raise ValueError(f"interval_seconds ({interval_seconds}) must be >= 1")
    schedules = []
    if spec.schedule is not None:
        schedules.append(Cron(spec.schedule.cron, timezone=spec.schedule.timezone))
    if interval_seconds is not None:
        schedules.append(Interval(timedelta(seconds=interval_seconds)))
    return RunnerDeployment.from_flow(
        release_deployment_flow,
        name=spec.name,
        schedules=schedules or None,
        triggers=[arrival_trigger(spec.dataset.id)] if spec.trigger == "arrival" else None,
        parameters=_parameters(
            spec_path,
            out_dir=out_dir,
            catalog_url=catalog_url,
            publish_dir=publish_dir,
            review_timeout_seconds=review_timeout_seconds,
        ),
        description=(
            f"dprelease: release series {spec.name!r} of dataset {spec.dataset.id!r}; unchanged "
            f"input on a schedule or trigger: {spec.on_unchanged}"
            + (
                f"; partitioned by {spec.dataset.partitions.declaration()} (declared disjoint)"
                if spec.dataset.partitions is not None
                else ""
            )
        ),
        tags=[DEPLOYMENT_TAG, f"dataset:{spec.dataset.id}"],
        work_pool_name=work_pool,
        entrypoint_type=EntrypointType.MODULE_PATH,  # the installed package, any working directory
    )


def ensure_work_pool(name: str = WORK_POOL) -> None:
    """Create the process work pool ``name`` unless it exists (it must be a process pool)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(
                WorkPoolCreate(
                    name=name,
                    type="process",
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                )
            )
            return
    if pool.type != "process":
        raise SpecError(f"work pool {name!r} is a {pool.type!r} pool; dprelease needs 'process'")


def find_specs(specs_dir: Path) -> list[Path]:
    """The YAML specs directly inside ``specs_dir`` (sorted)."""
    if not specs_dir.is_dir():
        raise SpecError(f"specs dir {str(specs_dir)!r} is not a folder")
    found = sorted(
        p for pattern in ("*.yaml", "*.yml") for p in specs_dir.glob(pattern) if p.is_file()
    )
    if not found:
        raise SpecError(f"specs dir {str(specs_dir)!r} holds no *.yaml or *.yml spec")
    return found


def deploy_specs(
    spec_paths: list[Path],
    *,
    work_pool: str = WORK_POOL,
    out_dir: Path = Path("releases"),
    catalog_url: str | None = None,
    publish_dir: Path | None = None,
    review_timeout_seconds: int = DEFAULT_REVIEW_TIMEOUT_SECONDS,
    interval_seconds: float | None = None,
) -> list[DeploymentSummary]:
    """Validate every spec first (nothing is registered if one is invalid), then register them."""
    specs = [(path, load_spec(path)) for path in spec_paths]
    names: dict[str, Path] = {}
    for path, spec in specs:
        if spec.name in names:
            raise SpecError(
                f"specs {names[spec.name]} and {path} share the name {spec.name!r}; each "
                "deployment is named after its spec, so names must be unique"
            )
        names[spec.name] = path
    ensure_work_pool(work_pool)
    summaries = []
    for path, spec in specs:
        limit = ensure_dataset_limit(spec.dataset.id)
        deployment = build_deployment(
            path,
            spec,
            work_pool=work_pool,
            out_dir=out_dir,
            catalog_url=catalog_url,
            publish_dir=publish_dir,
            review_timeout_seconds=review_timeout_seconds,
            interval_seconds=interval_seconds,
        )
        deployment_id = deployment.apply()
        schedule = None
        if spec.schedule is not None:
            schedule = f"cron {spec.schedule.cron} ({spec.schedule.timezone})"
        if interval_seconds is not None:
            schedule = ((schedule + "; ") if schedule else "") + f"every {interval_seconds:g} s"
        summaries.append(
            DeploymentSummary(
                name=deployment.full_name,
                deployment_id=str(deployment_id),
                spec_path=str(path.resolve()),
                dataset_id=spec.dataset.id,
                schedule=schedule,
                arrival_trigger=spec.trigger == "arrival",
                work_pool=work_pool,
                concurrency_limit=limit,
                on_unchanged=spec.on_unchanged,
                partitioned_by=(
                    None
                    if spec.dataset.partitions is None
                    else spec.dataset.partitions.declaration()
                ),
            )
        )
    return summaries
