"""``dprelease review``, ``show`` and ``notify``: the audited review of a staged release and
everything recorded about it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from dprelease.catalog.errors import CatalogError, DprReleaseError
from dprelease.flows.cli.common import (
    JsonOption,
    PublishDirOption,
    command_group,
    console,
    cost_text,
    prefect_connected,
    prefect_defaults,
    print_json,
    stdout,
)

notify_app = command_group(
    "notify",
    "Tell reviewers when a release is staged: Prefect notification blocks (deploy/NOTIFICATIONS.md).",
)


def print_review_policy(release_id: str) -> None:
    """Who must approve a just-staged release, and whether its reviewers were notified."""
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.review import decisions as reviewing

    current = reviewing.status(Catalog(), release_id)
    if current["operator_excluded"]:
        stdout.print(
            f"review:     {current['required_approvals']} approval(s) by distinct reviewers, "
            f"not {current['operator']} (who ran it)"
        )
    if current["notify_error"]:
        console.print(
            f"warning: reviewers were not notified through {current['notify']}: "
            f"{current['notify_error']}; send again with `dprelease notify send {release_id}`"
        )
    elif current["notified_at"]:
        stdout.print(f"notified:   reviewers, through {current['notify']}")


def review(
    release_id: Annotated[str, typer.Argument(help="Release id (see `dprelease releases`).")],
    reviewer: Annotated[
        str | None,
        typer.Option(help="Who decides (recorded; default: the name of --key)."),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="Your signing key (default $DPRELEASE_KEY): signs the decision over the staged "
            "tables; required on a dataset whose custodian registered keys.",
        ),
    ] = None,
    approve: Annotated[
        bool | None,
        typer.Option(
            "--approve/--reject",
            help="Approve (publish once the spec's approvals are in) or reject; without either, "
            "show where the review stands.",
            show_default=False,
        ),
    ] = None,
    note: Annotated[str, typer.Option(help="Why (recorded).")] = "",
    publish_dir: PublishDirOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the review status as one JSON object.")
    ] = False,
) -> None:
    """Audited review: approve publishes a copy; reject keeps the spent budget spent.

    A spec's `review: {approvers: N}` needs N distinct reviewers, none of them the person who ran
    the release; until then each approval is recorded and the release stays staged.  On a dataset
    whose custodian registered keys, each decision is signed with --key (a key holding the
    reviewer role, never the key that ran the release) and approvals count distinct keys.  The
    decision is recorded here, under your own database login; a release whose deployed flow run
    is paused for review is then published where the deployment publishes, and the run resumed:
    it reads the outcome and ends.
    """
    from dprelease.catalog.identity.roles import requires_signatures
    from dprelease.catalog.identity.signing import KEY_ENV
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.review import decisions as reviewing
    from dprelease.catalog.watch_state import ReviewRuns

    catalog = Catalog()
    outcome = None
    if key is None and approve is not None and os.environ.get(KEY_ENV, "").strip():
        # the environment's key signs only where signatures are required (--key always does)
        dataset_id = catalog.release(release_id).dataset_id
        if requires_signatures(catalog, dataset_id):
            key = os.environ[KEY_ENV].strip()
    if approve is None:
        if reviewer is not None or note or publish_dir is not None or key is not None:
            raise DprReleaseError(
                "--reviewer, --key, --note and --publish-dir need a decision: add --approve or "
                "--reject"
            )
    elif reviewer is None and key is None:
        raise DprReleaseError(
            "--reviewer NAME is required with --approve or --reject (or --key NAME, whose name "
            "is recorded)"
        )
    else:
        signature = None if key is None else _signed(catalog, release_id, key, approve, note)
        reviewer = reviewer or key
        paused_run = ReviewRuns(catalog.url).get(release_id)
        if paused_run is not None and paused_run.status != "awaiting":
            paused_run = None  # its run no longer waits: nothing to resume
        if paused_run is not None:
            # recorded (and published) here, under this process's database login; then the
            # paused run is resumed and reads the outcome
            if publish_dir is not None:
                console.print(
                    "note: --publish-dir is ignored: the deployment's publish location is used"
                )
            publish_dir = Path(paused_run.publish_dir) if paused_run.publish_dir else None
        outcome = reviewing.review(
            catalog,
            release_id,
            approve=approve,
            reviewer=reviewer,
            note=note,
            publish_dir=publish_dir,
            signature=signature,
        )
        if paused_run is not None:
            outcome |= _resume_paused_run(paused_run, approve, reviewer, note, catalog)
    current = reviewing.status(catalog, release_id)
    if as_json:
        print_json(current)
    elif outcome is None:
        _print_review_status(current)
    else:
        stdout.print(f"{release_id}: {outcome['status']}{outcome.get('through', '')}")
        if outcome.get("published_directory"):
            stdout.print(f"published to {outcome['published_directory']}")
        _print_approval_progress(current)


def _signed(catalog: Any, release_id: str, key: str, approve: bool, note: str) -> Any:
    """The decision signed with the local key ``key`` over the staged release (only the key id
    and the envelope leave this function)."""
    from dprelease.catalog.identity.keys import load_signing_key
    from dprelease.catalog.review.signatures import sign_release_decision

    return sign_release_decision(
        catalog, release_id, key=load_signing_key(key), approve=approve, note=note
    )


def _print_approval_progress(current: dict[str, Any]) -> None:
    """After an approval that did not decide: how many are in and how many are still needed."""
    if current["status"] != "staged" or not current["approvers"]:
        return
    missing = current["approvals_missing"]
    more = "1 more approver approves" if missing == 1 else f"{missing} more approvers approve"
    stdout.print(
        f"approval {len(current['approvers'])} of {current['required_approvals']} recorded "
        f"({', '.join(current['approvers'])}); the release stays staged until {more}"
    )


def _print_review_status(current: dict[str, Any], *, header: bool = True) -> None:
    operator = current["operator"] or "not recorded"
    rule = " (may not approve)" if current["operator_excluded"] else ""
    stdout.print(
        f"{current['release_id']}: {current['status']}" if header else "  review:",
        f"  ran by:    {operator}{rule}",
        f"  approvals: {len(current['approvers'])} of {current['required_approvals']} "
        f"required; {current['approvals_missing']} missing",
        sep="\n",
    )
    if current["notify"]:
        outcome = (
            f"failed: {current['notify_error']}"
            if current["notify_error"]
            else f"sent {current['notified_at']}"
            if current["notified_at"]
            else "not sent"
        )
        stdout.print(f"  notifies:  {current['notify']} ({outcome})")
    signed = current.get("signed") or [{}] * len(current["trail"])
    keys_used = any(entry.get("key_id") for entry in signed)
    for entry, signature in zip(current["trail"], signed, strict=True):
        note = f" — {entry['note']}" if entry["note"] else ""
        how = ""
        if keys_used:
            key_id = signature.get("key_id")
            how = f" (signed by key {key_id[:16]}…)" if key_id else " (unsigned)"
        stdout.print(f"  {entry['at']}  {entry['decision']} by {entry['reviewer']}{note}{how}")
    if not current["trail"]:
        stdout.print("  no decision yet")


def _resume_paused_run(
    paused_run: Any, approve: bool, reviewer: str, note: str, catalog: Any
) -> dict[str, str]:
    """Resume the paused deployed run with the decision just recorded here: it reads the outcome
    from the catalog and ends (or pauses for the next approval).  ``through``: how, for the
    output line; empty when the run can no longer be resumed (the decision stands)."""
    prefect_defaults()
    from dprelease.catalog.watch_state import ReviewRuns
    from dprelease.flows.deployed_release import ReviewRunNotPaused, resume_review

    try:
        record = resume_review(
            paused_run,
            approve=approve,
            reviewer=reviewer,
            note=note,
            catalog=catalog,
            recorded=True,
        )
    except ReviewRunNotPaused as exc:
        console.print(f"note: {exc}; the decision is recorded in the catalog")
        ReviewRuns(catalog.url).mark(paused_run.release_id, status="expired")
        return {}
    except CatalogError as exc:  # e.g. someone else resumed it: it reads the catalog too
        console.print(f"note: {exc}; the decision is recorded in the catalog")
        return {}
    how = "recorded" if record.status == "staged" else "decided"
    return {"through": f" ({how} through flow run {paused_run.flow_run_id})"}


def show(
    release_id: Annotated[str, typer.Argument(help="Release id (see `dprelease releases`).")],
    as_json: JsonOption = False,
) -> None:
    """Everything about one release: spec, status, plan and mechanism, charges with their ledger
    receipts, budget, review trail, artifact paths and the synthetic files sampled from it
    (public facts only)."""
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.series_audit import series_summary
    from dprelease.catalog.show import describe_release

    catalog = Catalog()
    summary = describe_release(catalog, release_id)
    summary["series"] = series_summary(catalog, release_id)  # None: not a period of a series
    if as_json:
        print_json(summary)
        return
    _print_summary(summary)


SHOWN_TABLES = 10
"""Table paths ``show`` prints before it folds the rest into one line (``--json`` has all)."""


def _print_summary(summary: dict[str, Any]) -> None:
    release = summary["release"]
    stdout.print(
        f"[bold]{release['id']}[/]: {release['status']}",
        f"  spec:       {release['name']} (dataset {release['dataset_id']}; spec sha256 "
        f"{release['spec_fingerprint']})",
        f"  created:    {release['created_at']} UTC; updated {release['updated_at']} UTC",
        sep="\n",
    )
    mechanism = summary["mechanism"]
    if mechanism:
        # manifests written before the local model and the chooser's reason lack those keys
        model = mechanism.get("model", "central")
        reason = f" — {mechanism['reason']}" if mechanism.get("reason") else ""
        stdout.print(f"  mechanism:  {mechanism.get('name', '?')} ({model}){reason}")
    plan = summary["plan"]
    if plan:
        stdout.print(
            f"  plan:       {plan.get('num_queries', '?')} queries over "
            f"{plan.get('num_cells', '?')} cells; chosen {plan.get('chosen')}"
        )
    series = summary.get("series")
    if series:
        stdout.print(
            f"  series:     {series['name']}, period {series['period']} of {series['horizon']} "
            f"({series['period_name']}; {series['unit']} level; {series['time_strategy']}); plan "
            f"sha256 {series['plan_sha256']}"
        )
        for charge in series["charges"]:
            planned = charge["planned_rho"]
            stdout.print(
                f"    partition {charge['partition'] or '(whole dataset)'}: rho={charge['rho']:.6g}"
                + (f" (plan: {planned:.6g})" if planned is not None else " (not in the plan)")
            )
    stdout.print(f"  charged:    {cost_text(summary['charged'] or {}) or 'nothing'}")
    for receipt in summary["receipts"]:
        stdout.print(
            f"    ledger #{receipt['seq']} {receipt['receipt_id']} ({receipt['label']}): "
            f"{cost_text(receipt['charge'])}"
        )
    budget = summary["budget"]
    if budget:
        stdout.print(
            f"  budget:     cap {cost_text(budget['cap'])}; spent after this release "
            f"{cost_text(budget['after'])}; remaining then {cost_text(budget['remaining'])}"
        )
    _print_review_status(summary["review"], header=False)
    stdout.print("  artifacts:")
    tables = [name for name in summary["paths"] if name.startswith("table ")]
    folded = set(tables[SHOWN_TABLES:]) if len(tables) > SHOWN_TABLES + 1 else set()
    for name, path in summary["paths"].items():
        if name in folded:
            continue
        stdout.print(f"    {name + ':':<20} {path or '-'}")
        if folded and name == tables[SHOWN_TABLES - 1]:
            # O(tables) once: 4,525 lines of paths would bury the rest of the summary
            stdout.print(
                f"    {'':<20} … and {len(folded):,} more tables in the same folder "
                "(`--json` lists every path)"
            )
    for item in summary["synthetic"]:
        stdout.print(
            f"  synthetic:  {item['path']} ({item['rows']:,} rows, seed {item['seed']}, "
            f"sha256 {item['sha256'][:12]}…, {item['created_at']} UTC)"
        )
    if summary["manifest_problem"]:
        console.print(f"warning: {summary['manifest_problem']}")


@notify_app.command("webhook")
def notify_webhook(
    name: Annotated[str, typer.Argument(help="Block name (lowercase letters, digits, dashes).")],
    url: Annotated[str, typer.Option(help="Where to POST the notice (JSON).")],
    header: Annotated[
        list[str] | None, typer.Option(help="NAME:VALUE sent with every notice (repeatable).")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a saved block of this name.")
    ] = False,
) -> None:
    """Save a Custom Webhook notification block that POSTs {subject, body, source} as JSON; name
    it in a spec as `review: {notify: custom-webhook/NAME}`."""
    from dprelease.catalog.spec.sections import ReviewPolicy

    headers = {}
    for item in header or []:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise DprReleaseError(f"--header ({item!r}) must be NAME:VALUE")
        headers[key.strip()] = value.strip()
    if not url.startswith(("http://", "https://")):
        raise DprReleaseError(f"--url ({url!r}) must be an http:// or https:// URL")
    try:
        ReviewPolicy(notify=f"custom-webhook/{name}")
    except ValueError:
        raise DprReleaseError(
            f"block name ({name!r}) must be lowercase letters, digits and dashes"
        ) from None
    with prefect_connected():
        from dprelease.flows.notify import save_webhook_block

        try:
            reference = save_webhook_block(name, url=url, headers=headers, overwrite=overwrite)
        except ValueError as exc:  # Prefect: the name is taken
            raise DprReleaseError(f"{exc}; add --overwrite to replace it") from None
    stdout.print(
        f"saved {reference}: POST {url}", f"in a spec:  review: {{notify: {reference}}}", sep="\n"
    )


@notify_app.command("send")
def notify_send(
    release_id: Annotated[str, typer.Argument(help="A staged release whose spec names a block.")],
) -> None:
    """Send a staged release's notice again (e.g. after the webhook was down)."""
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.review.policy import policy_of

    catalog = Catalog()
    record = catalog.release(release_id)
    if record.status != "staged":
        raise CatalogError(
            f"release {release_id!r} is {record.status}; only a staged release awaits review"
        )
    block = policy_of(catalog, release_id).notify
    if block is None:
        raise CatalogError(f"release {release_id!r}: its spec names no review.notify block")
    with prefect_connected():
        from dprelease.flows.notify import send_notice

        error = send_notice(catalog, release_id)
    if error is not None:
        raise CatalogError(
            f"notifying the reviewers of {release_id} through {block} failed: {error}"
        )
    stdout.print(f"{release_id}: reviewers notified through {block}")
