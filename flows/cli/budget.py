"""``dprelease budget`` and ``releases``: the privacy-budget ledger and the release catalog
(public facts only)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from dprelease.flows.cli.common import JsonOption, add_id_column, cost_text, print_json, stdout

# A ledger entry's fields in `budget --json`, in this order, before its charge and running totals.
ENTRY_FIELDS = ("seq", "created_at", "release_id", "receipt_id", "label", "kind", "partition")


def budget(
    dataset_id: Annotated[
        str | None, typer.Argument(help="Dataset id (all datasets if omitted).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Spent and remaining privacy budget per dataset (and per partition of a partitioned
    dataset), with the ledger timeline (oldest first)."""
    from dprelease.catalog.ledger.store import Catalog

    catalog = Catalog()
    ids = [dataset_id] if dataset_id else catalog.dataset_ids()
    datasets = [_budget_json(catalog, current) for current in ids]
    if as_json:
        print_json({"datasets": datasets})
        return
    if not ids:
        stdout.print("no datasets in the catalog yet")
    for current in datasets:  # the text is rendered from the JSON view: one set of facts
        stdout.print(
            f"[bold]{current['dataset_id']}[/]: cap {cost_text(current['cap'])}; spent "
            f"{cost_text(current['spent'])}; remaining {cost_text(current['remaining'])}"
        )
        _print_partitions(current)
        _print_series(current)
        entries = current["ledger"]
        table = Table(title=f"{current['dataset_id']}: ledger timeline (oldest first)")
        for column in ("#", "when (UTC)", "release", "charge", "cumulative", "remaining", "label"):
            if column == "release":
                add_id_column(table, column, [entry["release_id"] for entry in entries])
            else:
                table.add_column(column, overflow="fold")
        if any(entry["partition"] for entry in entries):
            table.add_column("partition", overflow="fold")
        for entry in entries:
            skipped = entry["kind"] == "skipped"
            record = entry["kind"] not in ("charge", "skipped")  # e.g. series-plan: zero cost
            partition = entry["partition"]
            where = (
                str(partition)
                if partition is not None
                else ""
                if skipped or record
                else "(whole dataset)"
            )
            table.add_row(
                str(entry["seq"]),
                entry["created_at"],
                entry["release_id"],
                "skipped (nothing charged)"
                if skipped
                else f"{entry['kind']} (nothing charged)"
                if record
                else cost_text(entry["charge"]),
                cost_text(entry["cumulative"]),
                cost_text(entry["remaining"]),
                entry["label"],
                *([where] if len(table.columns) > 7 else []),
            )
        stdout.print(table)


def _print_partitions(current: dict[str, Any]) -> None:
    """Per-partition spending of a partitioned dataset (parallel composition), if any."""
    spending, declared = current["partitions"], current["partitioned_by"]
    if not spending and declared is None:
        return
    stdout.print(
        f"partitioned by {declared or '(declaration dropped)'}: each partition has the cap; "
        "declared to hold disjoint people (the spec's assumption, not checked)"
    )
    table = Table(title=f"{current['dataset_id']}: spending per partition")
    for column in ("partition", "spent", "remaining", "entries"):
        table.add_column(column, overflow="fold")
    for row in spending:
        table.add_row(
            row["partition"],
            cost_text(row["spent"]),
            cost_text(row["remaining"]),
            str(row["entries"]),
        )
    stdout.print(table)


def _print_series(current: dict[str, Any]) -> None:
    """Per series on the dataset: each period's partition (a column period's declared
    ``NAME=<value>`` also before its release), its planned rho over the horizon and what the
    series has spent on it so far."""
    for series in current["series"]:
        table = Table(
            title=f"series {series['name']}: {series['periods_released']} of {series['horizon']} "
            f"periods released ({series['unit']} level, rho {series['rho']:.6g} over the horizon; "
            f"plan sha256 {series['plan_sha256'][:12]}…)"
        )
        for column in ("period", "partition", "planned rho (horizon)", "spent so far"):
            table.add_column(column, overflow="fold")
        for row in series["periods"]:
            status = "(whole dataset)" if row["released"] else "(not released)"  # person level
            where = row["partition"] or f"{row['period_name'] or ''} {status}".lstrip()
            table.add_row(
                str(row["period"]), where, f"{row['planned_rho']:.6g}", f"{row['spent_rho']:.6g}"
            )
        stdout.print(table)


def _budget_json(catalog: Any, dataset_id: str) -> dict[str, Any]:
    """Cap, spent, remaining, per-partition spending and the ledger timeline of one dataset
    (public)."""
    from dprelease.catalog.ledger.spending import running_spend
    from dprelease.catalog.series_audit import series_budget

    cap = catalog.cap(dataset_id)
    spent = catalog.spent(dataset_id)
    entries = catalog.ledger_entries(dataset_id)
    timeline = [
        {name: getattr(entry, name) for name in ENTRY_FIELDS}
        | {
            "charge": entry.cost.as_dict(),
            "cumulative": running.as_dict(),
            "remaining": running.remaining(cap).as_dict(),
        }
        for entry, running in zip(entries, running_spend(entries, cap.measure), strict=True)
    ]
    return {
        "dataset_id": dataset_id,
        "cap": cap.as_dict(),
        "spent": spent.as_dict(),
        "remaining": spent.remaining(cap).as_dict(),
        "partitioned_by": catalog.partitioned_by(dataset_id),
        "partitions": [row.as_dict() for row in catalog.partition_spending(dataset_id)],
        "series": series_budget(catalog, dataset_id),
        "ledger": timeline,
    }


def releases(
    dataset: Annotated[str | None, typer.Option(help="Only this dataset id.")] = None,
    status: Annotated[
        str | None, typer.Option(help="Only this status (staged, published, ...).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (every catalog field).")
    ] = False,
) -> None:
    """The release catalog (oldest first); full release ids, never shortened."""
    from dataclasses import asdict

    from dprelease.catalog.ledger.store import Catalog

    records = Catalog().releases(dataset_id=dataset, status=status)
    if as_json:
        print_json({"releases": [asdict(record) for record in records]})
        return
    table = Table(title="releases")
    add_id_column(table, "release id", [record.id for record in records])
    for column in ("dataset", "status", "mechanism", "created (UTC)", "directory"):
        table.add_column(column, overflow="fold")
    for record in records:
        table.add_row(
            record.id,
            record.dataset_id,
            record.status,
            record.mechanism or "",
            record.created_at,
            record.directory or "",
        )
    stdout.print(table)
