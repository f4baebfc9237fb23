"""The ``dprelease`` command line (typer): demo, run, plan, budget, releases, review, verify.

Environment: ``DPRELEASE_HOME`` (default ``./.dprelease``) holds the SQLite catalog and Prefect's
local state; ``DPRELEASE_CATALOG_URL`` points the catalog at any SQLAlchemy database instead.
Flows run against a temporary local Prefect server unless ``PREFECT_API_URL`` is set.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from functools import wraps
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from catalog.errors import DprReleaseError
from mechanisms.privacy import PrivacyError

console = Console(stderr=True, soft_wrap=True)
stdout = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="dprelease",
    help=(
        "Publish differentially private statistics: a release spec names a Parquet dataset, a public "
        "domain, a workload and a privacy level; dprelease picks a workload-aware strategy, charges a "
        "persistent privacy-budget ledger, adds vetted noise, reconstructs, validates and stages an "
        "auditable release for review."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _prefect_defaults() -> None:
    """Local, quiet, telemetry-free Prefect unless the user configured otherwise."""
    home = Path(os.environ.get("DPRELEASE_HOME", ".dprelease")).resolve()
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_UI_ENABLED", "false")


def _clear_errors(function: F) -> F:
    """Report the project's errors as one clear message and a non-zero exit, not a traceback."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (DprReleaseError, PrivacyError) as exc:
            console.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(code=2 if isinstance(exc, ValueError) else 1) from None

    return wrapper  # type: ignore[return-value]


def bundled_spec() -> Path:
    """The demo spec shipped inside the package (UCI Adult, CC BY 4.0)."""
    return Path(str(resources.files("flows") / "examples" / "adult-demo.yaml"))


def _run_release(spec_path: Path, out_dir: Path) -> Any:
    _prefect_defaults()
    from catalog.spec import load_spec

    spec = load_spec(spec_path)  # fail fast on a bad spec, before Prefect starts
    console.print(
        f"[bold]dprelease[/] release [cyan]{spec.name}[/] of dataset [cyan]{spec.dataset.id}[/] "
        f"({spec.num_cells:,} cells, {len(spec.workload)} workload items)",
        highlight=False,
    )
    from flows.release_flow import release_flow

    started = time.perf_counter()
    with console.status("starting Prefect and running the release flow…", spinner="dots"):
        staged = release_flow(spec_path=str(spec_path), out_dir=str(out_dir))
    console.print(f"finished in {time.perf_counter() - started:.1f} s", highlight=False)
    return staged


def _print_staged(staged: Any) -> None:
    charged = ", ".join(f"{k}={v:.6g}" for k, v in staged.charged.items())
    stdout.print(f"release id: {staged.release_id}", highlight=False)
    stdout.print(f"artifacts:  {staged.directory}", highlight=False)
    stdout.print(f"mechanism:  {staged.mechanism}; privacy charged: {charged}", highlight=False)
    stdout.print(f"report:     {Path(staged.directory) / 'report.html'}", highlight=False)
    stdout.print(
        f"next:       dprelease review {staged.release_id} --approve --reviewer NAME   "
        f"(or --reject); dprelease verify {staged.directory}",
        highlight=False,
    )


@app.command()
@_clear_errors
def demo(
    out: Annotated[Path, typer.Option("--out", help="Folder for release directories.")] = Path(
        "releases"
    ),
) -> None:
    """Release the bundled UCI Adult example end to end and stage it for review."""
    _print_staged(_run_release(bundled_spec(), out))


@app.command()
@_clear_errors
def run(
    spec: Annotated[Path, typer.Argument(help="Release spec (YAML).")],
    out: Annotated[Path, typer.Option("--out", help="Folder for release directories.")] = Path(
        "releases"
    ),
) -> None:
    """Run the release flow for SPEC: ingest, count, plan, measure, reconstruct, validate, stage."""
    _print_staged(_run_release(spec, out))


@app.command()
@_clear_errors
def plan(
    spec: Annotated[
        Path, typer.Argument(help="Release spec (YAML); dataset.source is not needed.")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Data-free plan: each candidate's expected error, the SVD lower bound, the choice and the cost."""
    from catalog.planning import make_plan
    from catalog.spec import load_spec

    result = make_plan(load_spec(spec))
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
        return
    table = Table(title=f"plan: {result.num_queries:,} queries over {result.num_cells:,} cells")
    for column in ("mechanism", "rmse", "total variance", "ratio to bound", "seconds", "note"):
        table.add_column(column, justify="left" if column in ("mechanism", "note") else "right")
    for c in result.candidates:
        ratio = (
            f"{c.rmse / result.lower_bound_rmse:.3f}"
            if c.rmse is not None and result.lower_bound_rmse
            else ""
        )
        table.add_row(
            ("* " if c.mechanism == result.chosen else "  ") + c.mechanism,
            f"{c.rmse:.4f}" if c.rmse is not None else "n/a",
            f"{c.total_variance:.6g}" if c.total_variance is not None else "n/a",
            ratio,
            f"{c.seconds:.3f}",
            c.note or "",
        )
    stdout.print(table)
    bound = f"{result.lower_bound_rmse:.4f}" if result.lower_bound_rmse else "n/a"
    stdout.print(f"SVD lower bound on rmse: {bound} ({result.lower_bound_note})", highlight=False)
    stdout.print(f"chosen: {result.chosen} — {result.reason}", highlight=False)
    stdout.print(
        f"privacy cost: {result.expected_cost.describe()} ({result.noise_kind} noise)",
        highlight=False,
    )


@app.command()
@_clear_errors
def budget(
    dataset_id: Annotated[
        str | None, typer.Argument(help="Dataset id (all datasets if omitted).")
    ] = None,
) -> None:
    """Spent and remaining privacy budget per dataset, with the ledger entries (oldest first)."""
    from catalog.ledger import Catalog

    catalog = Catalog()
    ids = [dataset_id] if dataset_id else catalog.dataset_ids()
    if not ids:
        stdout.print("no datasets in the catalog yet", highlight=False)
    for current in ids:
        cap = catalog.cap(current)
        spent = catalog.spent(current)
        stdout.print(
            f"[bold]{current}[/]: cap {cap.describe()}; spent {spent.describe()}; "
            f"remaining {spent.remaining(cap).describe()}",
            highlight=False,
        )
        table = Table(show_header=True)
        for column in ("#", "when (UTC)", "release", "charge", "label"):
            table.add_column(column)
        for entry in catalog.ledger_entries(current):
            table.add_row(
                str(entry.seq),
                entry.created_at,
                entry.release_id,
                entry.cost.describe(),
                entry.label,
            )
        stdout.print(table)


@app.command()
@_clear_errors
def releases(
    dataset: Annotated[str | None, typer.Option(help="Only this dataset id.")] = None,
    status: Annotated[
        str | None, typer.Option(help="Only this status (staged, published, ...).")
    ] = None,
) -> None:
    """The release catalog."""
    from catalog.ledger import Catalog

    table = Table(title="releases")
    for column in ("release id", "dataset", "status", "mechanism", "created (UTC)", "directory"):
        table.add_column(column)
    for record in Catalog().releases(dataset_id=dataset, status=status):
        table.add_row(
            record.id,
            record.dataset_id,
            record.status,
            record.mechanism or "",
            record.created_at,
            record.directory or "",
        )
    stdout.print(table)


@app.command()
@_clear_errors
def review(
    release_id: Annotated[str, typer.Argument(help="Release id (see `dprelease releases`).")],
    reviewer: Annotated[str, typer.Option("--reviewer", help="Who decides (recorded).")],
    approve: Annotated[
        bool, typer.Option("--approve/--reject", help="Approve (publish) or reject.")
    ],
    note: Annotated[str, typer.Option("--note", help="Why (recorded).")] = "",
    publish_dir: Annotated[
        Path | None, typer.Option("--publish-dir", help="Where approved releases are copied.")
    ] = None,
) -> None:
    """Audited review: approve publishes a copy; reject keeps the spent budget spent."""
    from catalog import release
    from catalog.ledger import Catalog

    result = release.review(
        Catalog(),
        release_id,
        approve=approve,
        reviewer=reviewer,
        note=note,
        publish_dir=publish_dir,
    )
    stdout.print(f"{release_id}: {result['status']}", highlight=False)
    if "published_directory" in result:
        stdout.print(f"published to {result['published_directory']}", highlight=False)


@app.command()
@_clear_errors
def verify(
    release_dir: Annotated[
        Path, typer.Argument(help="A release directory (contains manifest.json).")
    ],
) -> None:
    """Re-check a release offline: artifact hashes, manifest, ledger receipts, validation results."""
    from catalog import artifacts
    from catalog.ledger import Catalog

    artifacts.verify(release_dir, Catalog())
    stdout.print(
        f"OK: {release_dir} matches its manifest, the ledger and its validation results",
        highlight=False,
    )


def main() -> None:  # pragma: no cover - console-script entry point
    app()
