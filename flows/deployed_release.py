"""The deployed release: one ``release`` run per dataset at a time, then a pause for audited review.

``release_deployment_flow`` (registered by ``dprelease deploy``) checks that an arrival's file
still has its announced content (before any budget is spent), takes the dataset's one-slot
concurrency limit ``dprelease-dataset-<id>`` (not held during review), runs the ``release``
subflow, records the run awaiting review (``catalog.watch_state.ReviewRuns``) and pauses for a
typed :class:`ReviewDecision` until ``review.approvers`` distinct reviewers approved.  ``dprelease
review`` records each decision in the reviewer's own process (its database login: under
PostgreSQL roles only a reviewer may), publishes once the policy is satisfied, then resumes the
run, which reads the outcome from the catalog; a decision typed into the paused run's form (the
Prefect UI) is recorded by the run itself (:func:`catalog.review.decisions.review`; a rejection
keeps the budget spent).  Where an approval publishes is kept with the paused run
(``review_runs.publish_dir``).

Unchanged input (``on_unchanged``, default ``skip``): a scheduled or triggered run whose keyed
input fingerprint and spec (less its source) equal the series' last release charges nothing,
records a ``skipped`` entry and returns ``skipped``; a run by hand always releases.  The check
runs inside the slot and again when the release is recorded, so a duplicated event never starts
two releases.  No decision within ``review_timeout_seconds``: the run fails, the release stays
``staged`` for ``dprelease review``.  All parameters are public.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import Field, ValidationError

from dprelease.catalog.errors import CatalogError, DataError, DprReleaseError
from dprelease.catalog.ledger.database import default_url
from dprelease.catalog.ledger.leases import ReleaseRecord
from dprelease.catalog.ledger.store import Catalog, SkippedRelease
from dprelease.catalog.release import StagedRelease
from dprelease.catalog.review import decisions as reviewing
from dprelease.catalog.review import signatures
from dprelease.catalog.spec.load import load_spec
from dprelease.catalog.watch_state import ReviewRun, ReviewRuns
from dprelease.flows.release_flow import release_flow
from dprelease.flows.watch import file_fingerprint

DATASET_LIMIT_PREFIX = "dprelease-dataset-"
DEFAULT_REVIEW_TIMEOUT_SECONDS = 24 * 3600
REVIEW_POLL_SECONDS = 1  # a paused run reads its flow run once a second for a decision
RESUME_POLL_SECONDS = 0.25  # `dprelease review` reads the catalog for the decision it sent


def ensure_dataset_limit(dataset_id: str) -> str:
    """Create (or reset to 1 slot) the global concurrency limit that serialises releases of the
    dataset; return its name."""
    from prefect.client.orchestration import get_client

    name = DATASET_LIMIT_PREFIX + dataset_id
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, limit=1)
    return name


class ReviewDecision(RunInput):
    """The reviewer's decision, typed: the Prefect UI renders it as a form."""

    approve: bool = Field(description="true: publish the release; false: reject it")
    # The pattern is part of the JSON schema the server checks on resume: a blank reviewer is
    # refused there and the run stays paused (a Python-only validator would fail the run instead).
    reviewer: str = Field(
        min_length=1, pattern=r"\S", description="who decides (recorded in the audit trail)"
    )
    note: str = Field(default="", description="why (recorded in the audit trail)")
    signature: str = Field(
        default="",
        description="the reviewer's signed decision (DSSE JSON, made by `dprelease review --key`); "
        "required on a dataset whose custodian registered keys",
    )
    recorded: bool = Field(
        default=False,
        description="true: the reviewer's own process (`dprelease review`) recorded the decision "
        "and published; the run only reads the outcome from the catalog",
    )


@dataclass(frozen=True, kw_only=True)
class DeployedRelease:
    """Outcome of a deployed release (public)."""

    release_id: str
    status: str  # "published", "rejected", "staged" (awaits more approvals) or "skipped"
    directory: str | None = None  # None: skipped
    published_directory: str | None = None
    reviewer: str | None = None
    flow_run_id: str | None
    unchanged_since: str | None = None
    """A skipped run: the release of the series whose input and spec it repeats."""


StartedBy = Literal["schedule", "trigger", "hand"]


def started_by(run: Any | None) -> StartedBy:
    """How a deployed flow run started: ``schedule`` (the scheduler created it), ``trigger`` (an
    automation did: the arrival trigger) or ``hand`` (anything else, or no run: called directly)."""
    if run is None:
        return "hand"
    if getattr(run, "auto_scheduled", False):
        return "schedule"
    created_by = getattr(run, "created_by", None)
    if created_by is not None and getattr(created_by, "type", None) == "AUTOMATION":
        return "trigger"
    return "hand"


def unchanged_policy(
    spec_policy: Literal["skip", "release"], started: StartedBy
) -> Literal["skip", "release"]:
    """The spec's ``on_unchanged`` for scheduled and triggered runs; a run by hand releases."""
    return "release" if started == "hand" else spec_policy


def _current_run() -> Any | None:
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    if run_id is None:
        return None
    with get_client(sync_client=True) as client:
        return client.read_flow_run(UUID(str(run_id)))


def check_arrived_file(path: str, expected_fingerprint: str) -> None:
    """Refuse a file whose bytes changed since the watcher announced them (reads bytes, no rows).

    A plain call, not a Prefect task: a task's run events, written by a SQLite Prefect server just
    as this run takes the dataset's concurrency slot and starts its subflow, made one of those
    writes fail (SQLITE_BUSY_SNAPSHOT, HTTP 503) on most arrival runs, and the client retried it
    about 2 s later.  A failed check fails the flow run with this message, as the task did."""
    if not Path(path).is_file():
        raise DataError(f"announced file {path!r} no longer exists")
    if file_fingerprint(path) != expected_fingerprint:
        raise DataError(
            f"announced file {path!r} changed since it was announced (its keyed fingerprint "
            "differs); the new content will be announced again"
        )


@task(name="record-review", cache_policy=NO_CACHE, retries=0, persist_result=False)
def record_review_task(
    catalog_url: str,
    release_id: str,
    approve: bool,
    reviewer: str,
    note: str,
    publish_dir: str | None,
    signature: str = "",
) -> dict[str, Any]:
    return reviewing.review(
        Catalog(catalog_url),
        release_id,
        approve=approve,
        reviewer=reviewer,
        note=note,
        publish_dir=Path(publish_dir) if publish_dir else None,
        signature=signatures.envelope_from_json(signature) if signature else None,
    )


@flow(name="release-deployment", log_prints=False, validate_parameters=True)
def release_deployment_flow(
    spec_path: str,
    out_dir: str = "releases",
    catalog_url: str | None = None,
    source_override: str | None = None,
    expected_fingerprint: str | None = None,
    publish_dir: str | None = None,
    review_timeout_seconds: int = DEFAULT_REVIEW_TIMEOUT_SECONDS,
    on_unchanged: Literal["skip", "release"] | None = None,
) -> DeployedRelease:
    """Release under the dataset's concurrency slot, then wait for a reviewer's decision.

    ``source_override`` is the arrived file (from the ``dprelease.data.arrived`` event's payload);
    ``expected_fingerprint`` its announced sha256.  ``on_unchanged``: None applies the spec's
    policy to scheduled and triggered runs and releases a run started by hand (module docstring).

    Privacy: the subflow charges the ledger before noise; the review never refunds.
    """
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    if review_timeout_seconds < 1:
        raise ValueError(f"review_timeout_seconds ({review_timeout_seconds}) must be >= 1")
    logger = get_run_logger()
    catalog_url = catalog_url or default_url()
    spec = load_spec(spec_path)
    run = _current_run()
    started = started_by(run)
    flow_run_id = None if run is None else str(run.id)
    policy = on_unchanged or unchanged_policy(spec.on_unchanged, started)
    if source_override is not None and expected_fingerprint is not None:
        check_arrived_file(source_override, expected_fingerprint)
    limit = ensure_dataset_limit(spec.dataset.id)
    waited = time.perf_counter()
    with (
        concurrency(limit, occupy=1, strict=True),  # one running release per dataset id
        # this run's heartbeats speak for the process; the subflow's own would only add the join
        # of Prefect's heartbeat thread (it sleeps in 1 s steps) to every release's end
        temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        logger.info(
            "holding %s after %.1f s; running the release", limit, time.perf_counter() - waited
        )
        staged = release_flow(
            spec_path=spec_path,
            out_dir=out_dir,
            catalog_url=catalog_url,
            source_override=source_override,
            on_unchanged=policy,
        )
    if isinstance(staged, SkippedRelease):
        logger.info(
            "%s (started by %s): input and spec unchanged since release %s; skipped, nothing "
            "charged (ledger receipt %s)",
            staged.release_id,
            started,
            staged.unchanged_since,
            staged.receipt_id,
        )
        return DeployedRelease(
            release_id=staged.release_id,
            status="skipped",
            flow_run_id=flow_run_id,
            unchanged_since=staged.unchanged_since,
        )
    reviews = ReviewRuns(catalog_url)
    if flow_run_id is not None:
        reviews.record(
            release_id=staged.release_id,
            flow_run_id=flow_run_id,
            api_url=PREFECT_API_URL.value(),
            # absolute: the reviewer's process publishes, from its own working directory
            publish_dir=str(Path(publish_dir).resolve()) if publish_dir else None,
        )
    try:
        decision, outcome = _collect_review(
            staged, catalog_url, publish_dir, review_timeout_seconds, logger=logger
        )
    except FlowPauseTimeout:
        if flow_run_id is not None:
            reviews.mark(staged.release_id, status="expired")
        logger.warning(
            "no decision on %s within %d s: this run ends, the release stays staged; decide "
            "with `dprelease review %s`",
            staged.release_id,
            review_timeout_seconds,
            staged.release_id,
        )
        raise
    finally:
        awaiting = None if flow_run_id is None else reviews.get(staged.release_id)
        if awaiting is not None and awaiting.status == "awaiting":  # not after a time-out
            reviews.mark(staged.release_id, status="decided")
    return DeployedRelease(
        release_id=staged.release_id,
        status=outcome["status"],
        directory=staged.directory,
        published_directory=outcome.get("published_directory"),
        reviewer=decision.reviewer,
        flow_run_id=flow_run_id,
    )


MAX_REVIEW_PAUSES = 50
"""Decisions one run waits for (refused ones included) before it leaves the rest to
``dprelease review``; every pause also ends after ``review_timeout_seconds``."""


def _collect_review(
    staged: StagedRelease,
    catalog_url: str,
    publish_dir: str | None,
    review_timeout_seconds: int,
    *,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> tuple[ReviewDecision, dict[str, Any]]:
    """Pause for decisions until the release is published or rejected (``review.approvers: N``
    needs N distinct reviewers).  A decision the policy refuses (the operator approving their own
    release, the same reviewer twice) is logged, not recorded, and awaited again."""
    cost = ", ".join(f"{k}={v:.6g}" for k, v in staged.charged.items())
    prompt = (
        f"### Review release `{staged.release_id}`\n"
        f"* audit report: `{Path(staged.directory) / 'report.html'}`\n"
        f"* privacy charged (already spent, whatever the decision): **{cost}**\n\n"
        "Approve to publish a copy; reject to keep it unpublished (the budget stays spent)."
    )
    pause = 0
    while True:  # ends by a final decision, a pause's time-out or MAX_REVIEW_PAUSES
        pause += 1
        decision = pause_flow_run(
            wait_for_input=ReviewDecision.with_initial_data(description=prompt),
            timeout=review_timeout_seconds,
            poll_interval=min(REVIEW_POLL_SECONDS, review_timeout_seconds),
            key=f"review-{pause}",  # one key per pause (lowercase letters, digits, dashes)
        )
        if decision.recorded:  # decided by the reviewer's process (its database login)
            outcome = _recorded_outcome(Catalog(catalog_url), staged.release_id)
            if outcome["status"] != "staged":
                return decision, outcome
            logger.info(
                "%s's decision on %s is recorded; the release stays staged, waiting for the next "
                "reviewer",
                decision.reviewer,
                staged.release_id,
            )
        else:
            try:
                outcome = _decide(staged, catalog_url, publish_dir, decision, logger=logger)
            except DprReleaseError as refused:
                logger.warning("decision refused, waiting for another: %s", refused)
                outcome = {"status": "staged"}
            if outcome["status"] != "staged":
                return decision, outcome
        if pause >= MAX_REVIEW_PAUSES:
            logger.warning(
                "%s still awaits approvals after %d decisions; decide with `dprelease review %s`",
                staged.release_id,
                MAX_REVIEW_PAUSES,
                staged.release_id,
            )
            return decision, outcome


def _recorded_outcome(catalog: Catalog, release_id: str) -> dict[str, Any]:
    """The outcome a reviewer's process recorded, read from the catalog (nothing is written)."""
    record = catalog.release(release_id)
    return {"status": record.status, "published_directory": record.published_directory}


def _decide(
    staged: StagedRelease,
    catalog_url: str,
    publish_dir: str | None,
    decision: ReviewDecision,
    *,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> dict[str, Any]:
    """Check and record a decision typed into the paused run (the Prefect UI's form): the run's
    own database login records it.  Raises :class:`DprReleaseError` for a refused decision."""
    reviewing.check_reviewer(  # refused here, the decision fails no task
        Catalog(catalog_url),
        staged.release_id,
        approve=decision.approve,
        reviewer=decision.reviewer,
    )
    signature = decision.signature
    signatures.accept(
        Catalog(catalog_url),
        staged.release_id,
        approve=decision.approve,
        signature=signatures.envelope_from_json(signature) if signature else None,
    )
    outcome = record_review_task(
        catalog_url,
        staged.release_id,
        decision.approve,
        decision.reviewer,
        decision.note,
        publish_dir,
        signature,
    )
    if outcome["status"] == "staged":
        logger.info(
            "%s approved %s: %d of %d approvals; waiting for the next reviewer",
            decision.reviewer,
            staged.release_id,
            len(outcome.get("approvals", [])),
            outcome.get("required_approvals", 0),
        )
    return outcome


class ReviewRunNotPaused(CatalogError):
    """The release's flow run is no longer paused (it timed out, failed or was already resumed)."""


def resume_review(
    run: ReviewRun,
    *,
    approve: bool,
    reviewer: str,
    note: str,
    catalog: Catalog,
    wait_seconds: float = 120.0,
    signature: str = "",
    recorded: bool = False,
) -> ReleaseRecord:
    """Resume the paused flow run of ``run`` with the decision; return once the catalog records it.

    ``recorded``: the caller recorded (and published) the decision itself, under its own database
    login; the run only reads the outcome and ends (or pauses for the next approval), and this
    returns the release as recorded without waiting.

    Raises :class:`ReviewRunNotPaused` when the run can no longer decide (the caller then decides
    in the catalog directly), :class:`CatalogError` when it is running (someone else resumed it)
    or the decision did not arrive within ``wait_seconds``.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if not wait_seconds > 0:
        raise ValueError(f"wait_seconds ({wait_seconds}) must be > 0")
    try:
        decision = ReviewDecision(
            approve=approve, reviewer=reviewer, note=note, signature=signature, recorded=recorded
        )
    except ValidationError:
        raise CatalogError(f"reviewer ({reviewer!r}) must name a person") from None
    settings = (
        temporary_settings(updates={PREFECT_API_URL: run.api_url}) if run.api_url else nullcontext()
    )
    with settings:
        from prefect.flow_runs import resume_flow_run

        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(UUID(run.flow_run_id)).state
        except ObjectNotFound:
            raise ReviewRunNotPaused(
                f"flow run {run.flow_run_id} of release {run.release_id} is not on {run.api_url}"
            ) from None
        if state is None or not state.is_paused():
            if state is not None and state.is_running():
                raise CatalogError(
                    f"flow run {run.flow_run_id} of release {run.release_id} is running: someone "
                    "resumed it already; its decision will appear in `dprelease releases`"
                )
            raise ReviewRunNotPaused(
                f"flow run {run.flow_run_id} of release {run.release_id} is "
                f"{state.name if state else 'unknown'}, not paused"
            )
        decided = len(catalog.reviews(run.release_id))
        resume_flow_run(
            UUID(run.flow_run_id),
            run_input=decision.model_dump(
                include={"approve", "reviewer", "note", "signature", "recorded"}
            ),
        )
    if recorded:
        return catalog.release(run.release_id)
    deadline = time.monotonic() + wait_seconds
    while True:
        # reviews first: a decision and the status it sets commit together, so a release read
        # after its new review shows that status (the other order can report a completed "staged")
        reviewed = len(catalog.reviews(run.release_id)) > decided
        record = catalog.release(run.release_id)
        if record.status in ("published", "rejected") or (record.status == "staged" and reviewed):
            return record
        if time.monotonic() > deadline:
            raise CatalogError(
                f"resumed flow run {run.flow_run_id}, but release {run.release_id} is still "
                f"{record.status} after {wait_seconds:.0f} s; check the run in the Prefect UI"
            )
        time.sleep(RESUME_POLL_SECONDS)
