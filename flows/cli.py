"""The ``dprelease`` command line (typer): demo, run, plan, budget, releases, review, verify, deploy,
watch.

Environment: ``DPRELEASE_HOME`` (default ``./.dprelease``) holds the SQLite catalog and Prefect's
local state; ``DPRELEASE_CATALOG_URL`` points the catalog at any SQLAlchemy database instead.
Flows run against one local Prefect server shared by all commands (``flows/server.py``: started
on first use, stopped after ``DPRELEASE_SERVER_IDLE_SECONDS`` idle; ``dprelease server status|stop``)
unless ``PREFECT_API_URL`` is set.

Failures (``flows/errors.py``): a user error is one short block on stderr and exit 2, an internal
error one line pointing to a log under ``$DPRELEASE_HOME/logs/`` and exit 1, Ctrl-C exit 130;
``--debug`` shows tracebacks.  Spec errors are reported before Prefect is imported or a server
starts; prefect and Great Expectations are imported only by the commands that need them.
"""

from __future__ import annotations

import os

# The BLAS thread policy of mechanisms/threads.py (single_threaded_blas), for the whole command: it
# must be set before numpy loads.  Multi-threaded BLAS on the small matrices of strategy work only
# contends on two cores (many times slower under load: benchmarks/strategy_bench.py
# --blas-threads).  Users can still override it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import contextlib
import gc
import json
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from functools import wraps
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, TypeVar

import click
import typer
from rich.console import Console
from rich.table import Table

from catalog.errors import CatalogError, DprReleaseError
from flows import errors

console = Console(stderr=True, soft_wrap=True)
stdout = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])


class _ConsoleScript(typer.Typer):
    """``dprelease`` run as a program (``app()``; ``CliRunner`` does not go through here)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from flows.interrupt import allow_hard_exit

        allow_hard_exit()  # the Ctrl-C watchdog may end this process
        try:
            return super().__call__(*args, **kwargs)
        except KeyboardInterrupt as exc:  # outside a command (e.g. a sub-app's)
            sys.exit(errors.report_interrupt(console, str(exc)))
        except Exception as exc:
            sys.exit(errors.report(exc, console))
        finally:
            # Exit hooks still run (Prefect drains its event and log workers), but the final
            # garbage collection skips the heap prefect, GX and pandas built: seconds on two busy
            # cores, which Ctrl-C's 5-second promise cannot afford.
            gc.freeze()


app = _ConsoleScript(
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
    if not errors.debug_enabled():
        # Prefect prints a failed task's traceback on the console; we report the error ourselves.
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")


def _clear_errors(function: F) -> F:
    """Report failures as ``flows/errors.py`` promises (short block, exit 2 / log file, exit 1)."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt as exc:
            raise typer.Exit(code=errors.report_interrupt(console, str(exc))) from None
        except Exception as exc:
            raise typer.Exit(code=errors.report(exc, console)) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def _global_options(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Show full tracebacks on this terminal (never stored) and Prefect's own log lines.",
        ),
    ] = False,
) -> None:
    errors.set_debug(debug)


def bundled_spec() -> Path:
    """The demo spec shipped inside the package (UCI Adult, CC BY 4.0)."""
    return Path(str(resources.files("flows") / "examples" / "adult-demo.yaml"))


def _run_release(
    spec_path: Path, out_dir: Path, *, engine: str | None = None, address: str | None = None
) -> Any:
    from catalog.engine import resolve_execution
    from catalog.spec import check_runnable_before_planning, load_spec

    spec = load_spec(spec_path)  # fail fast on a bad spec: before Prefect or any server starts
    check_runnable_before_planning(spec)  # sizes only: a too-large release is never planned
    execution = resolve_execution(spec.execution, engine=engine, address=address)  # CLI wins
    from flows.watchdog import stage_timeout_seconds

    stage_timeout_seconds()  # a bad DPRELEASE_STAGE_TIMEOUT is refused before Prefect starts
    _prefect_defaults()
    console.print(
        f"[bold]dprelease[/] release [cyan]{spec.name}[/] of dataset [cyan]{spec.dataset.id}[/] "
        f"({spec.num_cells:,} cells, {len(spec.workload)} workload items)",
        highlight=False,
    )
    started = time.perf_counter()
    with (
        console.status("connecting to the local Prefect server…", spinner="dots") as status,
        _prefect_api() as connection,
    ):
        # The server starts in the background while the flow's modules (and prefect) import.
        from flows.release_flow import run_release

        if connection is not None and connection.started:
            # Data-free planning fills the strategy store on the other core while the server
            # starts; the flow's plan task then finds the strategy there.
            status.update("planning while the local Prefect server starts (reused later)…")
            from catalog.memory import check_memory, predict_plan
            from catalog.planning import make_plan

            check_memory(predict_plan(spec, make_plan(spec)))  # before the flow charges
        with _server_ready(connection):
            status.update("running the release flow…")
            from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

            from flows.interrupt import InterruptGuard

            # No flow-run heartbeats for a run inside this command (the user sees it end or
            # crash): Prefect's heartbeat thread sleeps in 1 s steps and is joined at the flow's
            # end, up to one step of every command.  Deployed runs keep them (crash detection).
            with (
                InterruptGuard(write=lambda text: console.print(text, highlight=False)),
                temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
            ):
                staged = run_release(
                    spec_path=str(spec_path), out_dir=str(out_dir), execution=execution
                )
    console.print(f"finished in {time.perf_counter() - started:.1f} s", highlight=False)
    return staged


@contextlib.contextmanager
def _prefect_api() -> Iterator[Any]:
    """The Prefect API for this command (``flows.server.connect``, not yet waited for), with
    ``PREFECT_API_URL`` pointing at it; None when the user configured one."""
    from flows import server

    connection = server.connect(wait=False)
    if connection.record is None:
        yield None
        return
    if "prefect.settings" in sys.modules:  # already imported (in-process use): a context
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: connection.url}):
            yield connection
        return
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = connection.url  # read when prefect is imported
    try:
        yield connection
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous


@contextlib.contextmanager
def _server_ready(connection: Any) -> Iterator[None]:
    """Wait (bounded) until the shared server is healthy; keep its idle timer fresh meanwhile."""
    if connection is None:
        yield
        return
    from flows import server

    connection.wait()
    with server.keep_alive():
        yield


def _print_staged(staged: Any) -> None:
    charged = _cost(staged.charged)
    stdout.print(f"release id: {staged.release_id}", highlight=False)
    stdout.print(f"artifacts:  {staged.directory}", highlight=False)
    stdout.print(f"mechanism:  {staged.mechanism}; privacy charged: {charged}", highlight=False)
    stdout.print(f"report:     {Path(staged.directory) / 'report.html'}", highlight=False)
    stdout.print(
        f"next:       dprelease review {staged.release_id} --approve --reviewer NAME   "
        f"(or --reject); dprelease verify {staged.directory}",
        highlight=False,
    )
    _print_review_policy(staged.release_id)


def _print_review_policy(release_id: str) -> None:
    """Who must approve a just-staged release, and whether its reviewers were notified."""
    from catalog import review as reviewing
    from catalog.ledger.store import Catalog

    current = reviewing.status(Catalog(), release_id)
    if current["operator_excluded"]:
        stdout.print(
            f"review:     {current['required_approvals']} approval(s) by distinct reviewers, "
            f"not {current['operator']} (who ran it)",
            highlight=False,
        )
    if current["notify_error"]:
        console.print(
            f"warning: reviewers were not notified through {current['notify']}: "
            f"{current['notify_error']}; send again with `dprelease notify send {release_id}`",
            highlight=False,
        )
    elif current["notified_at"]:
        stdout.print(f"notified:   reviewers, through {current['notify']}", highlight=False)


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
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="local or dask: where counting and fan-out tasks run (overrides the spec's "
            "execution.engine; default local). dask without --address starts a local cluster.",
        ),
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(
            "--address", help="Dask scheduler tcp://host:port to join (implies --engine dask)."
        ),
    ] = None,
) -> None:
    """Run the release flow for SPEC: ingest, count, plan, measure, reconstruct, validate, stage."""
    _print_staged(_run_release(spec, out, engine=engine, address=address))


@app.command()
@_clear_errors
def plan(
    spec: Annotated[
        Path, typer.Argument(help="Release spec (YAML); dataset.source is not needed.")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    time_budget: Annotated[
        float,
        typer.Option(
            "--time-budget",
            help="Seconds of predicted planning work auto may spend; candidates predicted to take "
            "longer are skipped (and listed with the reason). A mechanism the spec names is "
            "always planned.",
            min=0.001,
        ),
    ] = 120.0,
) -> None:
    """Data-free plan: the candidates' expected errors, the SVD lower bound, the choice and the cost.

    A spec that names a mechanism plans only that one; auto plans the registry's mechanisms
    cheapest first and stops once one is within 0.5% of the lower bound.  Optimised strategies
    are kept in the strategy store, so `run` after `plan` reuses them.
    """
    from catalog.planning import make_plan
    from catalog.spec import load_spec

    loaded = load_spec(spec)
    result = make_plan(loaded, time_budget=time_budget)
    from catalog.memory import predict_plan

    memory = predict_plan(loaded, result)
    if as_json:
        sys.stdout.write(
            json.dumps(result.to_json() | {"memory": memory.to_json()}, indent=2) + "\n"
        )
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
    peak_stage, _, driver = memory.peak
    stdout.print(
        "predicted memory: "
        + ", ".join(f"{name} {size / 1e6:,.0f} MB" for name, size, _ in memory.stages)
        + f"; peak {peak_stage} ({driver})",
        highlight=False,
    )


@app.command()
@_clear_errors
def check(
    spec: Annotated[
        Path, typer.Argument(help="Release spec (YAML) whose dataset.source to check.")
    ],
) -> None:
    """For the data custodian: the exact input problems a release reports only by column and rule.

    Reads the spec's data here, without Prefect, and prints null and out-of-domain rows per column (with example values), wrong column types and persons above the contribution bound. The output is CONFIDENTIAL (exact counts and raw values); it is stored nowhere: no file, no catalog entry, no log.

    Exit status: 0 when no problem was found, 3 when problems were found, 2 for an invalid spec or an unreadable source.
    """
    from catalog.check import check_data, format_report
    from catalog.spec import load_spec

    report = check_data(load_spec(spec))
    typer.echo(format_report(report))
    if report.problems:
        raise SystemExit(3)  # not an error of the command: it found what it looks for


@app.command()
@_clear_errors
def budget(
    dataset_id: Annotated[
        str | None, typer.Argument(help="Dataset id (all datasets if omitted).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Spent and remaining privacy budget per dataset (and per partition of a partitioned
    dataset), with the ledger timeline (oldest first)."""
    from catalog.ledger.spending import running_spend
    from catalog.ledger.store import Catalog

    catalog = Catalog()
    ids = [dataset_id] if dataset_id else catalog.dataset_ids()
    if as_json:
        _print_json({"datasets": [_budget_json(catalog, current) for current in ids]})
        return
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
        _print_partitions(catalog, current)
        table = Table(show_header=True, title=f"{current}: ledger timeline (oldest first)")
        entries = catalog.ledger_entries(current)
        for column in ("#", "when (UTC)", "release", "charge", "cumulative", "remaining", "label"):
            if column == "release":
                _add_id_column(table, column, [entry.release_id for entry in entries])
            else:
                table.add_column(column, overflow="fold")
        if any(entry.partition for entry in entries):
            table.add_column("partition", overflow="fold")
        for entry, running in zip(entries, running_spend(entries, cap.measure), strict=True):
            table.add_row(
                str(entry.seq),
                entry.created_at,
                entry.release_id,
                "skipped (nothing charged)" if entry.kind == "skipped" else entry.cost.describe(),
                running.describe(),
                running.remaining(cap).describe(),
                entry.label,
                *([_partition_cell(entry)] if len(table.columns) > 7 else []),
            )
        stdout.print(table)


def _partition_cell(entry: Any) -> str:
    if entry.partition is not None:
        return str(entry.partition)
    return "" if entry.kind == "skipped" else "(whole dataset)"


def _print_partitions(catalog: Any, dataset_id: str) -> None:
    """Per-partition spending of a partitioned dataset (parallel composition), if any."""
    spending = catalog.partition_spending(dataset_id)
    declared = catalog.partitioned_by(dataset_id)
    if not spending and declared is None:
        return
    stdout.print(
        f"partitioned by {declared or '(declaration dropped)'}: each partition has the cap; "
        "declared to hold disjoint people (the spec's assumption, not checked)",
        highlight=False,
    )
    table = Table(show_header=True, title=f"{dataset_id}: spending per partition")
    for column in ("partition", "spent", "remaining", "entries"):
        table.add_column(column, overflow="fold")
    for row in spending:
        table.add_row(
            row.partition, row.spent.describe(), row.remaining.describe(), str(row.entries)
        )
    stdout.print(table)


def _print_json(value: Any) -> None:
    """One JSON document on stdout (``--json``): nothing else is printed there."""
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def _add_id_column(table: Table, header: str, ids: list[str]) -> None:
    """A column that shows every id in full: as wide as the longest, folded (never cut) if the
    terminal is narrower still."""
    width = max([len(header), *(len(i) for i in ids)])
    table.add_column(header, min_width=width, overflow="fold")


def _budget_json(catalog: Any, dataset_id: str) -> dict[str, Any]:
    """Cap, spent, remaining, per-partition spending and the ledger timeline of one dataset
    (public)."""
    from catalog.ledger.spending import running_spend

    cap = catalog.cap(dataset_id)
    spent = catalog.spent(dataset_id)
    entries = catalog.ledger_entries(dataset_id)
    timeline = []
    for entry, running in zip(entries, running_spend(entries, cap.measure), strict=True):
        timeline.append(
            {
                "seq": entry.seq,
                "created_at": entry.created_at,
                "release_id": entry.release_id,
                "receipt_id": entry.receipt_id,
                "label": entry.label,
                "kind": entry.kind,
                "partition": entry.partition,
                "charge": entry.cost.as_dict(),
                "cumulative": running.as_dict(),
                "remaining": running.remaining(cap).as_dict(),
            }
        )
    return {
        "dataset_id": dataset_id,
        "cap": cap.as_dict(),
        "spent": spent.as_dict(),
        "remaining": spent.remaining(cap).as_dict(),
        "partitioned_by": catalog.partitioned_by(dataset_id),
        "partitions": [row.as_dict() for row in catalog.partition_spending(dataset_id)],
        "ledger": timeline,
    }


@app.command()
@_clear_errors
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

    from catalog.ledger.store import Catalog

    records = Catalog().releases(dataset_id=dataset, status=status)
    if as_json:
        _print_json({"releases": [asdict(record) for record in records]})
        return
    table = Table(title="releases")
    _add_id_column(table, "release id", [record.id for record in records])
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


@app.command()
@_clear_errors
def review(
    release_id: Annotated[str, typer.Argument(help="Release id (see `dprelease releases`).")],
    reviewer: Annotated[
        str | None, typer.Option("--reviewer", help="Who decides (recorded).")
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
    note: Annotated[str, typer.Option("--note", help="Why (recorded).")] = "",
    publish_dir: Annotated[
        Path | None, typer.Option("--publish-dir", help="Where approved releases are copied.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the review status as one JSON object.")
    ] = False,
) -> None:
    """Audited review: approve publishes a copy; reject keeps the spent budget spent.

    A spec's `review: {approvers: N}` needs N distinct reviewers, none of them the person who ran
    the release; until then each approval is recorded and the release stays staged.  A release
    whose deployed flow run is paused for review is decided by resuming that run with the decision
    (the run records it); any other release is decided here, in the catalog.
    """
    from catalog import review as reviewing
    from catalog.ledger.store import Catalog
    from catalog.watch_state import ReviewRuns

    catalog = Catalog()
    if approve is None:
        if reviewer is not None or note or publish_dir is not None:
            raise DprReleaseError(
                "--reviewer, --note and --publish-dir need a decision: add --approve or --reject"
            )
        _print_review_status(reviewing.status(catalog, release_id), as_json=as_json)
        return
    if reviewer is None:
        raise DprReleaseError("--reviewer NAME is required with --approve or --reject")
    paused_run = ReviewRuns(catalog.url).get(release_id)
    if paused_run is not None and paused_run.status == "awaiting":
        # refused here, before the paused run is resumed with a decision it would refuse
        reviewing.check_reviewer(catalog, release_id, approve=approve, reviewer=reviewer)
        if _review_through_flow_run(
            paused_run, approve, reviewer, note, publish_dir, catalog, quiet=as_json
        ):
            if as_json:
                _print_json(reviewing.status(catalog, release_id))
            return
    result = reviewing.review(
        catalog,
        release_id,
        approve=approve,
        reviewer=reviewer,
        note=note,
        publish_dir=publish_dir,
    )
    if as_json:
        _print_json(reviewing.status(catalog, release_id))
        return
    stdout.print(f"{release_id}: {result['status']}", highlight=False)
    if "published_directory" in result:
        stdout.print(f"published to {result['published_directory']}", highlight=False)
    _print_approval_progress(reviewing.status(catalog, release_id))


def _print_approval_progress(current: dict[str, Any]) -> None:
    """After an approval that did not decide: how many are in and how many are still needed."""
    if current["status"] != "staged" or not current["approvers"]:
        return
    missing = current["approvals_missing"]
    more = "1 more approver approves" if missing == 1 else f"{missing} more approvers approve"
    stdout.print(
        f"approval {len(current['approvers'])} of {current['required_approvals']} recorded "
        f"({', '.join(current['approvers'])}); the release stays staged until {more}",
        highlight=False,
    )


def _cost(cost: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.6g}" for k, v in cost.items())


def _print_review_status(current: dict[str, Any], *, as_json: bool, header: bool = True) -> None:
    if as_json:
        _print_json(current)
        return
    if header:
        stdout.print(f"{current['release_id']}: {current['status']}", highlight=False)
    else:
        stdout.print("  review:", highlight=False)
    operator = current["operator"] or "not recorded"
    rule = " (may not approve)" if current["operator_excluded"] else ""
    stdout.print(f"  ran by:    {operator}{rule}", highlight=False)
    stdout.print(
        f"  approvals: {len(current['approvers'])} of {current['required_approvals']} "
        f"required; {current['approvals_missing']} missing",
        highlight=False,
    )
    if current["notify"]:
        outcome = (
            f"failed: {current['notify_error']}"
            if current["notify_error"]
            else f"sent {current['notified_at']}"
            if current["notified_at"]
            else "not sent"
        )
        stdout.print(f"  notifies:  {current['notify']} ({outcome})", highlight=False)
    for entry in current["trail"]:
        note = f" — {entry['note']}" if entry["note"] else ""
        stdout.print(
            f"  {entry['at']}  {entry['decision']} by {entry['reviewer']}{note}", highlight=False
        )
    if not current["trail"]:
        stdout.print("  no decision yet", highlight=False)


def _review_through_flow_run(
    paused_run: Any,
    approve: bool,
    reviewer: str,
    note: str,
    publish_dir: Path | None,
    catalog: Any,
    *,
    quiet: bool = False,
) -> bool:
    """Resume the paused deployed run with the decision; False when it can no longer decide."""
    _prefect_defaults()
    from catalog import review as reviewing
    from catalog.watch_state import ReviewRuns
    from flows.deployed_release import ReviewRunNotPaused, resume_review

    if publish_dir is not None:
        console.print(
            "note: --publish-dir is ignored: the deployment's publish location is used",
            highlight=False,
        )
    try:
        record = resume_review(
            paused_run, approve=approve, reviewer=reviewer, note=note, catalog=catalog
        )
    except ReviewRunNotPaused as exc:
        console.print(f"note: {exc}; deciding in the catalog directly", highlight=False)
        ReviewRuns(catalog.url).mark(paused_run.release_id, status="expired")
        return False
    if quiet:
        return True
    how = "recorded" if record.status == "staged" else "decided"
    stdout.print(
        f"{record.id}: {record.status} ({how} through flow run {paused_run.flow_run_id})",
        highlight=False,
    )
    if record.published_directory:
        stdout.print(f"published to {record.published_directory}", highlight=False)
    _print_approval_progress(reviewing.status(catalog, record.id))
    return True


def _require_prefect_server(command: str) -> str:
    """The configured Prefect API URL; schedules, triggers and pools need a real server."""
    _prefect_defaults()
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise errors.Refused(
            f"{command} needs a running Prefect server and PREFECT_API_URL is not set",
            title="no Prefect server",
            hint="start one (deploy/start-server.sh) and set PREFECT_API_URL, e.g. "
            "http://127.0.0.1:4200/api (see deploy/README.md)",
        )
    return str(url)


@app.command()
@_clear_errors
def deploy(
    specs: Annotated[
        Path, typer.Argument(help="A folder of release specs (*.yaml), or one spec file.")
    ] = Path("specs"),
    pool: Annotated[str, typer.Option("--pool", help="Process work pool to run on.")] = (
        "dprelease-process"
    ),
    out: Annotated[Path, typer.Option("--out", help="Folder for release directories.")] = Path(
        "releases"
    ),
    publish_dir: Annotated[
        Path | None, typer.Option("--publish-dir", help="Where approved releases are copied.")
    ] = None,
    review_timeout: Annotated[
        int,
        typer.Option(
            "--review-timeout",
            help="Seconds a run waits paused for review; after that `dprelease review` decides.",
        ),
    ] = 24 * 3600,
    every: Annotated[
        float | None,
        typer.Option("--every", help="Also run every N seconds (development and testing)."),
    ] = None,
) -> None:
    """Register one Prefect deployment per spec: cron schedule, arrival trigger, work pool, and a
    concurrency limit of one running release per dataset id."""
    api_url = _require_prefect_server("dprelease deploy")
    from catalog.ledger.database import default_url
    from flows.deployments import deploy_specs, find_specs

    paths = [specs] if specs.is_file() else find_specs(specs)
    # A local SQLite catalog is baked into the deployments (a path is public); a server URL may
    # carry credentials, so the worker must get it from DPRELEASE_CATALOG_URL instead.
    catalog_url = None if os.environ.get("DPRELEASE_CATALOG_URL") else default_url()
    summaries = deploy_specs(
        paths,
        work_pool=pool,
        out_dir=out,
        catalog_url=catalog_url,
        publish_dir=publish_dir,
        review_timeout_seconds=review_timeout,
        interval_seconds=every,
    )
    table = Table(title=f"deployments on {api_url}")
    for column in ("deployment", "dataset", "schedule", "arrival trigger", "concurrency limit"):
        table.add_column(column)
    for summary in summaries:
        table.add_row(
            summary.name,
            summary.dataset_id,
            summary.schedule or "",
            "yes" if summary.arrival_trigger else "",
            f"{summary.concurrency_limit} (1 slot)",
        )
    stdout.print(table)
    stdout.print(
        f"next: start a worker for pool {pool!r} (deploy/start-worker.sh); run one now with "
        f"`prefect deployment run '{summaries[0].name}'`",
        highlight=False,
    )


@app.command()
@_clear_errors
def watch(
    directory: Annotated[Path, typer.Argument(help="Landing folder to watch (recursively).")],
    spec_dir: Annotated[
        Path | None,
        typer.Option(
            "--spec-dir",
            help="Specs with `trigger: arrival`: a file belongs to the datasets whose source "
            "covers it (default: DIR/<dataset id>/...).",
        ),
    ] = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls.")] = 5.0,
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="Two polls (--interval apart, to see sizes settle), then exit."
        ),
    ] = False,
    max_polls: Annotated[
        int | None, typer.Option("--max-polls", help="Stop after this many polls.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Log the events instead of sending them.")
    ] = False,
    adopt_claims_from: Annotated[
        str | None,
        typer.Option(
            "--adopt-claims-from",
            help="Copy the arrival claims of the catalog at this URL (e.g. the SQLite catalog "
            "before a move to PostgreSQL) into the current catalog, then exit.",
        ),
    ] = None,
) -> None:
    """Announce complete new Parquet files in DIR as `dprelease.data.arrived` events (one per
    file content, remembered across restarts); files that are not Parquet are logged and skipped."""
    import logging

    from catalog.watch_state import WatchState
    from flows.watch import SpecResolver, Watcher, adopt_claims, logging_emitter, prefect_emitter

    if adopt_claims_from is not None:
        try:
            report = adopt_claims(source_url=adopt_claims_from)
        except ValueError as exc:
            raise CatalogError(str(exc)) from None
        stdout.print(
            f"claims adopted {report.adopted}, already claimed {report.already}, content "
            f"changed {report.changed}, file missing {report.missing}",
            highlight=False,
        )
        return
    if once and max_polls is not None:
        raise errors.Refused(
            "give --once or --max-polls, not both",
            title="conflicting options",
            hint="give --once (two polls) or --max-polls N, not both",
        )
    for role, folder in (("watch folder", directory), ("--spec-dir", spec_dir)):
        if folder is not None and not folder.is_dir():
            state_of = "is not a folder" if folder.exists() else "does not exist"
            raise errors.Refused(
                f"the {role} {str(folder)!r} {state_of}: it must be an existing folder",
                title="cannot watch",
                hint=f"create it (mkdir -p {shlex.quote(str(folder))}) or give the folder "
                "that exists, then run `dprelease watch` again",
            )
    if dry_run:
        emitter, state = logging_emitter, WatchState("sqlite://")
    else:
        emitter, state = prefect_emitter(_require_prefect_server("dprelease watch")), WatchState()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    watch_logger = logging.getLogger("dprelease.watch")
    watch_logger.addHandler(handler)
    watch_logger.setLevel(logging.INFO)
    try:
        watcher = Watcher(
            directory,
            state=state,
            emitter=emitter,
            resolve_datasets=SpecResolver(spec_dir) if spec_dir is not None else None,
        )
        emitted = watcher.run(interval_seconds=interval, max_polls=2 if once else max_polls)
    except ValueError as exc:
        raise CatalogError(str(exc)) from None
    except KeyboardInterrupt:
        stdout.print("stopped", highlight=False)
        return
    finally:
        watch_logger.removeHandler(handler)
    stdout.print(f"announced {len(emitted)} file(s)", highlight=False)
    for event in emitted:
        stdout.print(
            f"  {event.dataset_id}: {event.path} sha256 {event.fingerprint}", highlight=False
        )


@app.command()
@_clear_errors
def verify(
    release_dir: Annotated[
        Path, typer.Argument(help="A release directory (contains manifest.json).")
    ],
    input_path: Annotated[
        Path | None,
        typer.Option(
            "--input",
            help="The release's input (file, directory or glob): re-check its keyed fingerprint.",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON object: ok and every problem (exit 1 when not ok)."
        ),
    ] = False,
) -> None:
    """Re-check a release offline: artifact hashes, manifest, catalog status, ledger chain and
    receipts, input fingerprint key, validation results."""
    from catalog import artifacts
    from catalog.errors import VerificationError
    from catalog.ledger.store import Catalog

    if as_json:
        try:
            artifacts.verify(release_dir, Catalog(), input_path=input_path)
        except VerificationError as exc:
            problems: tuple[str, ...] = exc.problems
        else:
            problems = ()
        _print_json({"release_dir": str(release_dir), "ok": not problems, "problems": problems})
        if problems:
            raise typer.Exit(code=errors.EXIT_CHECK_FAILED)
        return
    artifacts.verify(release_dir, Catalog(), input_path=input_path)
    stdout.print(
        f"OK: {release_dir} matches its manifest, the ledger and its validation results",
        highlight=False,
    )


@app.command()
@_clear_errors
def show(
    release_id: Annotated[str, typer.Argument(help="Release id (see `dprelease releases`).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Everything about one release: spec, status, plan and mechanism, charges with their ledger
    receipts, budget, review trail, artifact paths and the synthetic files sampled from it
    (public facts only)."""
    from catalog.ledger.store import Catalog
    from catalog.show import describe_release

    summary = describe_release(Catalog(), release_id)
    if as_json:
        _print_json(summary)
        return
    _print_summary(summary)


def _print_summary(summary: dict[str, Any]) -> None:
    release = summary["release"]
    lines = [
        f"[bold]{release['id']}[/]: {release['status']}",
        f"  spec:       {release['name']} (dataset {release['dataset_id']}; spec sha256 "
        f"{release['spec_fingerprint']})",
        f"  created:    {release['created_at']} UTC; updated {release['updated_at']} UTC",
    ]
    mechanism = summary["mechanism"]
    if mechanism:
        lines.append(
            f"  mechanism:  {mechanism['name']} ({mechanism['model']}) — {mechanism['reason']}"
        )
    plan = summary["plan"]
    if plan:
        lines.append(
            f"  plan:       {plan.get('num_queries', '?')} queries over "
            f"{plan.get('num_cells', '?')} cells; chosen {plan.get('chosen')}"
        )
    lines.append(f"  charged:    {_cost(summary['charged'] or {}) or 'nothing'}")
    for receipt in summary["receipts"]:
        lines.append(
            f"    ledger #{receipt['seq']} {receipt['receipt_id']} ({receipt['label']}): "
            f"{_cost(receipt['charge'])}"
        )
    budget = summary["budget"]
    if budget:
        lines.append(
            f"  budget:     cap {_cost(budget['cap'])}; spent after this release "
            f"{_cost(budget['after'])}; remaining then {_cost(budget['remaining'])}"
        )
    for line in lines:
        stdout.print(line, highlight=False)
    _print_review_status(summary["review"], as_json=False, header=False)
    paths = summary["paths"]
    stdout.print("  artifacts:", highlight=False)
    for name, path in paths.items():
        stdout.print(f"    {name + ':':<20} {path or '-'}", highlight=False)
    for item in summary["synthetic"]:
        stdout.print(
            f"  synthetic:  {item['path']} ({item['rows']:,} rows, seed {item['seed']}, "
            f"sha256 {item['sha256'][:12]}…, {item['created_at']} UTC)",
            highlight=False,
        )
    if summary["manifest_problem"]:
        console.print(f"warning: {summary['manifest_problem']}", highlight=False)


@app.command()
@_clear_errors
def recover(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    lease_seconds: Annotated[
        float,
        typer.Option(help="A release with no sign of life for this long counts as dead."),
    ] = 3600.0,
    adopt_ledger: Annotated[
        str | None,
        typer.Option(
            "--adopt-ledger",
            metavar="REASON",
            help="Accept the ledger as it is now (e.g. a catalog restored from a backup on "
            "purpose); the reason is kept with the ledger's anchor.",
        ),
    ] = None,
) -> None:
    """Find release runs that ended inside a stage or are stuck past their stage's time limit (the
    stuck ones are stopped: SIGTERM, then SIGKILL), then move releases whose process died (stuck
    in `measuring`) to failed/aborted; charges stay."""
    from catalog.ledger.store import Catalog
    from flows.server import state_home
    from flows.watchdog import forget, inspect_runs, stop_stuck

    catalog = Catalog()
    adopted = catalog.adopt_ledger(reason=adopt_ledger) if adopt_ledger is not None else None
    runs = []
    for problem in inspect_runs(state_home()):
        text = problem.describe(now=time.time())
        if problem.kind == "stuck":
            text += "; stopped" if stop_stuck(problem) else "; could not be stopped"
        if problem.kind == "gone" or text.endswith("; stopped"):
            forget(problem)
        runs.append(
            {
                "kind": problem.kind,
                "pid": problem.record.pid,
                "stage": problem.record.stage,
                "release_id": problem.record.release_id,
                "summary": text,
            }
        )
    moved = catalog.recover(lease_seconds=lease_seconds)
    unfinished = [r.id for r in catalog.releases(status="approved")]
    problems = catalog.verify_chain()
    if as_json:
        report = {
            "runs": runs,
            "recovered": [m.as_dict() for m in moved],
            "unfinished_publications": unfinished,
            "ledger_problems": problems,
            "adopted_chain_head": None if adopted is None else adopted.as_dict(),
        }
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    if adopted is not None:
        stdout.print(f"ledger adopted at entry #{adopted.seq}", highlight=False)
    for run in runs:
        stdout.print(str(run["summary"]), highlight=False)
    for m in moved:
        stdout.print(
            f"{m.release_id}: measuring -> {m.status} ({m.reason}; {m.charges} charge(s) kept)",
            highlight=False,
        )
    for release_id in unfinished:
        stdout.print(
            f"{release_id}: approved, publication unfinished: run `dprelease review {release_id} "
            "--approve --reviewer NAME` to finish it",
            highlight=False,
        )
    for problem in problems:
        console.print(f"ledger problem: {problem}", highlight=False)
    if not (runs or moved or unfinished or problems):
        stdout.print("nothing to recover", highlight=False)


def _register_ldp() -> None:
    from flows.ldp_cli import ldp_app

    app.add_typer(
        ldp_app,
        name="ldp",
        help="Local differential privacy: publish a strategy, simulate clients.",
    )


_register_ldp()


def _register_synth() -> None:
    from flows.synth import synth

    app.command()(_clear_errors(synth))


_register_synth()


def _sub_app(name: str, help_text: str) -> typer.Typer:
    """A command group of ``dprelease`` (``dprelease NAME COMMAND``)."""
    group = typer.Typer(
        name=name,
        help=help_text,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.add_typer(group, name=name)
    return group


notify_app = _sub_app(
    "notify",
    "Tell reviewers when a release is staged: Prefect notification blocks (deploy/NOTIFICATIONS.md).",
)


@contextlib.contextmanager
def _prefect_connected() -> Iterator[None]:
    """Prefect configured for this command and its API (shared local server or PREFECT_API_URL)."""
    _prefect_defaults()
    with _prefect_api() as connection, _server_ready(connection):
        yield


@notify_app.command("webhook")
@_clear_errors
def notify_webhook(
    name: Annotated[str, typer.Argument(help="Block name (lowercase letters, digits, dashes).")],
    url: Annotated[str, typer.Option("--url", help="Where to POST the notice (JSON).")],
    header: Annotated[
        list[str] | None,
        typer.Option("--header", help="NAME:VALUE sent with every notice (repeatable)."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a saved block of this name.")
    ] = False,
) -> None:
    """Save a Custom Webhook notification block that POSTs {subject, body, source} as JSON; name
    it in a spec as `review: {notify: custom-webhook/NAME}`."""
    from catalog.spec import ReviewPolicy

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
    with _prefect_connected():
        from flows.notify import save_webhook_block

        try:
            reference = save_webhook_block(name, url=url, headers=headers, overwrite=overwrite)
        except ValueError as exc:  # Prefect: the name is taken
            raise DprReleaseError(f"{exc}; add --overwrite to replace it") from None
    stdout.print(f"saved {reference}: POST {url}", highlight=False)
    stdout.print(f"in a spec:  review: {{notify: {reference}}}", highlight=False)


@notify_app.command("send")
@_clear_errors
def notify_send(
    release_id: Annotated[str, typer.Argument(help="A staged release whose spec names a block.")],
) -> None:
    """Send a staged release's notice again (e.g. after the webhook was down)."""
    from catalog.ledger.store import Catalog
    from catalog.review_policy import policy_of

    catalog = Catalog()
    record = catalog.release(release_id)
    if record.status != "staged":
        raise CatalogError(
            f"release {release_id!r} is {record.status}; only a staged release awaits review"
        )
    block = policy_of(catalog, release_id).notify
    if block is None:
        raise CatalogError(f"release {release_id!r}: its spec names no review.notify block")
    with _prefect_connected():
        from flows.notify import send_notice

        error = send_notice(catalog, release_id)
    if error is not None:
        raise CatalogError(
            f"notifying the reviewers of {release_id} through {block} failed: {error}"
        )
    stdout.print(f"{release_id}: reviewers notified through {block}", highlight=False)


server_app = _sub_app(
    "server", "The local Prefect server dprelease shares between commands (started on first use)."
)


@server_app.command("status")
@_clear_errors
def server_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Whether the shared server runs, where, since when, and when it stops if left idle."""
    from flows import server

    current = server.status()
    if as_json:
        sys.stdout.write(json.dumps(current.as_dict(), indent=2) + "\n")
        return
    if current.state == "external":
        stdout.print(f"external: PREFECT_API_URL={current.url} (dprelease starts no server)")
        return
    if current.state == "deploy":
        stdout.print(
            f"deploy: {current.url} (deploy/start-server.sh on this Prefect database, pid "
            f"{current.processes[0]}; every command uses it, dprelease starts no server)",
            highlight=False,
        )
        return
    if current.record is None:
        stdout.print("stopped: the next command that needs Prefect starts one", highlight=False)
        return
    record = current.record
    stdout.print(f"{current.state}: {record.url}", highlight=False)
    stdout.print(
        f"  pid {record.pid} (processes {', '.join(map(str, current.processes)) or 'none'}); "
        f"prefect {record.version}; started {record.started_at}",
        highlight=False,
    )
    stdout.print(
        f"  last used {current.last_used_at}; stops when idle at {current.stops_after_idle_at} "
        f"(DPRELEASE_SERVER_IDLE_SECONDS={record.idle_seconds:g})",
        highlight=False,
    )
    stdout.print(f"  home {record.prefect_home}; log {record.log}", highlight=False)


@server_app.command("stop")
@_clear_errors
def server_stop() -> None:
    """Stop the shared server now (by its recorded process id); the next command starts a new one."""
    from flows import server

    if os.environ.get("PREFECT_API_URL"):
        raise DprReleaseError(
            f"PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): that server was not "
            "started by dprelease; stop it where it was started"
        )
    stopped = server.stop()
    if stopped is None:
        stdout.print("no server was running", highlight=False)
    else:
        stdout.print(f"stopped the server on {stopped.url} (pid {stopped.pid})", highlight=False)


@server_app.command("prepare")
@_clear_errors
def server_prepare() -> None:
    """Migrate an empty Prefect database into the user cache (once per Prefect version), so the
    first server on this machine starts in seconds. install.sh runs it."""
    from flows import server

    template, created = server.prepare_template()
    state = "prepared" if created else "already prepared"
    stdout.print(f"{state}: {template}", highlight=False)


def main() -> None:  # pragma: no cover - console-script entry point
    app()
