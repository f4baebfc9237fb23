"""Register one Prefect deployment per release spec (``dprelease deploy [SPECS_DIR]``).

Each spec becomes a deployment of :func:`flows.deployed_release.release_deployment_flow`
(``release-deployment/<spec name>``) on a *process* work pool, with the spec's cron ``schedule``
and, for ``trigger: arrival``, a trigger on the watcher's events.  One release per dataset id at a
time: the pool's work queue ``dataset-<dataset id>`` (concurrency 1; a run paused for review does
not count, and queued runs wait on the server, not as worker processes) and a one-slot global
concurrency limit ``dprelease-dataset-<dataset id>`` that the flow holds while it releases.

Default parameters are public only: a server catalog URL may carry credentials, so the worker
reads it from ``DPRELEASE_CATALOG_URL``; only a local SQLite URL is stored.  Re-running updates in
place and keeps what an operator paused; a ``review.notify`` block the server lacks is refused
before anything is registered.  Needs a real Prefect server (``deploy/README.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.load import load_spec
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.flows import flow_run_process
from dprelease.flows.deployed_release import (
    DEFAULT_REVIEW_TIMEOUT_SECONDS,
    ensure_dataset_limit,
    release_deployment_flow,
)
from dprelease.flows.watch import ARRIVAL_EVENT, resource_id, spec_files

WORK_POOL = "dprelease-process"
DEPLOYMENT_TAG = "dprelease"
DATASET_QUEUE_PREFIX = "dataset-"


def dataset_queue_name(dataset_id: str) -> str:
    """The work queue (1 run at a time) of all deployments of ``dataset_id``."""
    return DATASET_QUEUE_PREFIX + dataset_id


@dataclass(frozen=True, kw_only=True)
class DeploymentSummary:
    """What ``dprelease deploy`` registered for one spec (public)."""

    name: str
    dataset_id: str
    schedule: str | None
    arrival_trigger: bool
    concurrency_limit: str


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


@dataclass(frozen=True, kw_only=True)
class DeployOptions:
    """What ``dprelease deploy`` sets on every deployment it registers (public values only).

    ``interval_seconds`` adds an interval schedule (development and tests: cron's finest step is a
    minute)."""

    work_pool: str = WORK_POOL
    out_dir: Path = Path("releases")
    catalog_url: str | None = None
    publish_dir: Path | None = None
    review_timeout_seconds: int = DEFAULT_REVIEW_TIMEOUT_SECONDS
    interval_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.review_timeout_seconds < 1:
            raise ValueError(f"review_timeout_seconds ({self.review_timeout_seconds}) must be >= 1")
        if self.interval_seconds is not None and not self.interval_seconds >= 1:
            raise ValueError(f"interval_seconds ({self.interval_seconds}) must be >= 1")


def build_deployment(
    spec_path: Path, spec: ReleaseSpec, *, kept: KeptState | None = None, **options: Any
) -> Any:
    """The ``RunnerDeployment`` of one spec (not yet registered); ``options`` are the fields of
    :class:`DeployOptions`.  ``kept``: what an operator paused on the registered deployment stays
    paused."""
    from prefect.deployments.runner import EntrypointType, RunnerDeployment
    from prefect.schedules import Cron, Interval

    settings = DeployOptions(**options)
    kept = kept or KeptState()
    schedules = []
    if spec.schedule is not None:
        cron, timezone = spec.schedule.cron, spec.schedule.timezone
        active = _cron_key(cron, timezone) not in kept.inactive_schedules
        schedules.append(Cron(cron, timezone=timezone, active=active))
    if settings.interval_seconds is not None:
        seconds = float(settings.interval_seconds)
        active = _interval_key(seconds) not in kept.inactive_schedules
        schedules.append(Interval(timedelta(seconds=seconds), active=active))
    partitions = spec.dataset.partitions
    parameters: dict[str, Any] = {
        "spec_path": str(spec_path.resolve()),
        "out_dir": str(settings.out_dir.resolve()),
        "review_timeout_seconds": settings.review_timeout_seconds,
    }
    if settings.catalog_url is not None:
        parameters["catalog_url"] = settings.catalog_url
    if settings.publish_dir is not None:
        parameters["publish_dir"] = str(settings.publish_dir.resolve())
    return RunnerDeployment.from_flow(
        release_deployment_flow,
        name=spec.name,
        schedules=schedules or None,
        paused=kept.paused,
        triggers=[arrival_trigger(spec.dataset.id)] if spec.trigger == "arrival" else None,
        parameters=parameters,
        description=(
            f"dprelease: release series {spec.name!r} of dataset {spec.dataset.id!r}; unchanged "
            f"input on a schedule or trigger: {spec.on_unchanged}"
            + (
                f"; partitioned by {partitions.declaration()} (declared disjoint)"
                if partitions is not None
                else ""
            )
        ),
        tags=[DEPLOYMENT_TAG, f"dataset:{spec.dataset.id}"],
        work_pool_name=settings.work_pool,
        work_queue_name=dataset_queue_name(spec.dataset.id),
        entrypoint_type=EntrypointType.MODULE_PATH,  # the installed package, any working directory
        job_variables={"command": flow_run_process.COMMAND},  # no workspace supervisor per run
    )


@dataclass(frozen=True, kw_only=True)
class KeptState:
    """What an operator paused on a registered deployment, kept when ``deploy`` runs again:
    the whole deployment, and schedules (by cron + timezone or interval) set inactive."""

    paused: bool = False
    inactive_schedules: frozenset[str] = frozenset()


def _cron_key(cron: str, timezone: str | None) -> str:
    return f"cron {cron} {timezone or 'UTC'}"


def _interval_key(seconds: float) -> str:
    return f"interval {seconds:g}"


def kept_state(client: Any, full_name: str) -> KeptState:
    """The pause state of the registered deployment ``flow/name`` (nothing paused if it is new)."""
    from prefect.exceptions import ObjectNotFound

    try:
        existing = client.read_deployment_by_name(full_name)
    except ObjectNotFound:
        return KeptState()
    inactive = set()
    for entry in existing.schedules or []:
        if entry.active:
            continue
        schedule = entry.schedule
        if getattr(schedule, "cron", None):
            inactive.add(_cron_key(schedule.cron, schedule.timezone))
        elif getattr(schedule, "interval", None) is not None:
            inactive.add(_interval_key(schedule.interval.total_seconds()))
    return KeptState(paused=bool(existing.paused), inactive_schedules=frozenset(inactive))


def check_notification_blocks(client: Any, specs: list[tuple[Path, ReleaseSpec]]) -> None:
    """Every block a spec names in ``review.notify`` must be saved on this Prefect server: a
    missing one would only show when the first release is staged and nobody is told."""
    from prefect.exceptions import ObjectNotFound

    for path, spec in specs:
        if spec.review is None or spec.review.notify is None:
            continue
        block_type, name = spec.review.notify.split("/", 1)
        try:
            client.read_block_document_by_name(name, block_type, include_secrets=False)
        except ObjectNotFound:
            raise SpecError(
                f"spec {str(path)!r}: review.notify names the notification block "
                f"{spec.review.notify!r}, which is not saved on the Prefect server "
                f"{client.api_url}; save it first (deploy/setup-notifications.sh, "
                "deploy/NOTIFICATIONS.md)"
            ) from None


def ensure_work_pool(client: Any, name: str) -> None:
    """Create the process work pool ``name`` unless it exists (it must be a process pool)."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    try:
        pool = client.read_work_pool(name)
    except ObjectNotFound:
        template = ProcessWorker.get_default_base_job_template()
        client.create_work_pool(
            WorkPoolCreate(name=name, type="process", base_job_template=template)
        )
        return
    if pool.type != "process":
        raise SpecError(f"work pool {name!r} is a {pool.type!r} pool; dprelease needs 'process'")


def ensure_dataset_queue(client: Any, dataset_id: str, work_pool: str) -> str:
    """Create the dataset's work queue in ``work_pool``, or set its concurrency limit back to 1
    (the server hands out none of its runs while one is Pending or Running)."""
    from prefect.exceptions import ObjectAlreadyExists

    name = dataset_queue_name(dataset_id)
    try:
        client.create_work_queue(name=name, work_pool_name=work_pool, concurrency_limit=1)
    except ObjectAlreadyExists:
        queue = client.read_work_queue_by_name(name, work_pool_name=work_pool)
        if queue.concurrency_limit != 1:
            client.update_work_queue(queue.id, concurrency_limit=1)
    return name


def find_specs(specs_dir: Path) -> list[Path]:
    """The YAML specs directly inside ``specs_dir`` (sorted)."""
    if not specs_dir.is_dir():
        raise SpecError(f"specs dir {str(specs_dir)!r} is not a folder")
    found = spec_files(specs_dir)
    if not found:
        raise SpecError(f"specs dir {str(specs_dir)!r} holds no *.yaml or *.yml spec")
    return found


def deploy_specs(spec_paths: list[Path], **options: Any) -> list[DeploymentSummary]:
    """Validate every spec and the :class:`DeployOptions` ``options`` first (nothing is registered
    if one is invalid), then register them."""
    from prefect.client.orchestration import get_client

    settings = DeployOptions(**options)
    specs = [(path, load_spec(path)) for path in spec_paths]
    names: dict[str, Path] = {}
    for path, spec in specs:
        if spec.name in names:
            raise SpecError(
                f"specs {names[spec.name]} and {path} share the name {spec.name!r}; each "
                "deployment is named after its spec, so names must be unique"
            )
        names[spec.name] = path
    with get_client(sync_client=True) as client:
        check_notification_blocks(client, specs)
        ensure_work_pool(client, settings.work_pool)
    summaries = []
    for path, spec in specs:
        limit = ensure_dataset_limit(spec.dataset.id)
        with get_client(sync_client=True) as client:
            ensure_dataset_queue(client, spec.dataset.id, settings.work_pool)
            kept = kept_state(client, f"{release_deployment_flow.name}/{spec.name}")
        deployment = build_deployment(path, spec, kept=kept, **options)
        deployment.apply()
        schedule = None
        if spec.schedule is not None:
            schedule = f"cron {spec.schedule.cron} ({spec.schedule.timezone})"
        if (interval := settings.interval_seconds) is not None:
            schedule = ((schedule + "; ") if schedule else "") + f"every {interval:g} s"
        summaries.append(
            DeploymentSummary(
                name=deployment.full_name,
                dataset_id=spec.dataset.id,
                schedule=schedule,
                arrival_trigger=spec.trigger == "arrival",
                concurrency_limit=limit,
            )
        )
    return summaries
