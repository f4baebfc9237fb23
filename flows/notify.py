"""Tell reviewers that a release is staged, through a Prefect notification block.

A spec's ``review: {notify: BLOCK_TYPE/BLOCK_NAME}`` names a notification block on the release's
Prefect server (``dprelease notify webhook NAME --url URL`` saves one; see
deploy/NOTIFICATIONS.md); the ``notify-reviewers`` task sends one message when the release is staged.

Privacy: the message holds public facts only (ids, spec name, budget spent, approvals needed, who
ran it, the report's path, the deciding command); never a count, a released value or a row.  A
failed notification does not fail the release: it is recorded with the review policy and
``dprelease notify send ID`` sends again.
"""

from __future__ import annotations

import re
from pathlib import Path

from prefect import get_run_logger, task
from prefect.blocks.abstract import NotificationBlock
from prefect.blocks.core import Block
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.cache_policies import NO_CACHE

from dprelease.catalog.errors import CatalogError
from dprelease.catalog.identity.roles import requires_signatures
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.review.policy import policy_of, record_notification

MAX_ERROR_CHARACTERS = 500
# What a webhook block saved by `dprelease notify webhook` posts (Prefect fills the placeholders).
WEBHOOK_JSON = {"subject": "{{subject}}", "body": "{{body}}", "source": "{{name}}"}


def review_notice(catalog: Catalog, release_id: str) -> tuple[str, str]:
    """The subject and body of a staged release's notice, from the catalog and its manifest
    (public fields only)."""
    from dprelease.catalog.publishing import artifacts

    record = catalog.release(release_id)
    policy = policy_of(catalog, release_id)
    directory = Path(str(record.directory))
    charged = artifacts.read_manifest(directory)["privacy"]["charged"]
    spent = ", ".join(f"{k}={float(v):.6g}" for k, v in charged.items()) or "nothing"
    operator = policy.operator if policy.exclude_operator else None
    body = "\n".join(
        [
            f"release: {record.id}",
            f"dataset: {record.dataset_id}",
            f"spec: {record.name}",
            f"privacy budget spent (whatever the decision): {spent}",
            f"approvals needed: {policy.required_approvals} (distinct reviewers"
            + (f", not {operator}, who ran it)" if operator else ")"),
            f"report: {directory / 'report.html'}",
            f"decide: dprelease review {record.id} --approve|--reject "
            + (
                "--key NAME"
                if requires_signatures(catalog, record.dataset_id)
                else "--reviewer NAME"
            ),
        ]
    )
    return f"dprelease: release {record.id} awaits review", body


def load_notification_block(reference: str) -> NotificationBlock:
    """The saved block ``BLOCK_TYPE/BLOCK_NAME``; it must be a notification block."""
    try:
        block = Block.load(reference)
    except ValueError as exc:  # Prefect: "Unable to find block document named ..."
        raise CatalogError(
            f"notification block {reference!r} is not saved on this Prefect server ({exc}); save "
            "it first (deploy/NOTIFICATIONS.md: `dprelease notify webhook NAME --url URL`)"
        ) from None
    if not isinstance(block, NotificationBlock):
        raise CatalogError(
            f"block {reference!r} is a {type(block).__name__}, not a notification block"
        )
    return block


def send_notice(catalog: Catalog, release_id: str) -> str | None:
    """Send the release's notice through its policy's block; record and return the error (None:
    sent).  A release whose policy names no block is not notified (returns None, records nothing)."""
    policy = policy_of(catalog, release_id)
    if policy.notify is None:
        return None
    try:
        subject, body = review_notice(catalog, release_id)
        load_notification_block(policy.notify).notify(body=body, subject=subject)
    except Exception as exc:  # any failure of the block: recorded, the release stays staged
        # the HTTP client's text names the webhook URL, whose path or query often holds a token
        error = re.sub(r"https?://\S+", "<webhook URL>", f"{type(exc).__name__}: {exc}")
        error = error[:MAX_ERROR_CHARACTERS]
    else:
        error = None
    record_notification(catalog, release_id, error=error)
    return error


@task(name="notify-reviewers", cache_policy=NO_CACHE, retries=0, persist_result=False)
def notify_reviewers_task(catalog_url: str, release_id: str) -> str | None:
    """:func:`send_notice`; a failure is logged, never raised (the release is staged, its budget
    spent)."""
    error = send_notice(Catalog(catalog_url), release_id)
    if error is not None:
        get_run_logger().warning(
            "reviewers of %s were not notified: %s; send again with `dprelease notify send %s`",
            release_id,
            error,
            release_id,
        )
    return error


def save_webhook_block(
    name: str,
    *,
    url: str,
    headers: dict[str, str] | None = None,
    overwrite: bool = False,
) -> str:
    """Save a Custom Webhook block that POSTs ``WEBHOOK_JSON``; return its reference
    (``custom-webhook/NAME``).  Header values (often tokens) are the block's secrets, masked by
    Prefect."""
    names = {header: f"header{k}" for k, header in enumerate(headers or {})}
    block = CustomWebhookNotificationBlock(
        name="dprelease reviewers",
        url=url,
        method="POST",
        json_data=dict(WEBHOOK_JSON),
        headers={header: "{{" + key + "}}" for header, key in names.items()} or None,
        secrets={key: (headers or {})[header] for header, key in names.items()},
    )
    block.save(name, overwrite=overwrite)
    return f"{block.get_block_type_slug()}/{name}"
