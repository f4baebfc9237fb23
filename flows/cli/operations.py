"""``dprelease deploy``, ``watch``, ``recover`` and ``server``: running releases unattended and
putting things right after a crash."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dprelease.catalog.errors import CatalogError, DprReleaseError
from dprelease.flows import errors
from dprelease.flows.cli.common import (
    JsonOption,
    OutOption,
    PublishDirOption,
    command_group,
    console,
    print_json,
    require_prefect_server,
    stdout,
)

server_app = command_group(
    "server", "The local Prefect server dprelease shares between commands (started on first use)."
)


def deploy(
    specs: Annotated[
        Path, typer.Argument(help="A folder of release specs (*.yaml), or one spec file.")
    ] = Path("specs"),
    pool: Annotated[str, typer.Option(help="Process work pool to run on.")] = "dprelease-process",
    out: OutOption = Path("releases"),
    publish_dir: PublishDirOption = None,
    review_timeout: Annotated[
        int,
        typer.Option(
            help="Seconds a run waits paused for review; after that `dprelease review` decides.",
        ),
    ] = 24 * 3600,
    every: Annotated[
        float | None, typer.Option(help="Also run every N seconds (development and testing).")
    ] = None,
) -> None:
    """Register one Prefect deployment per spec: cron schedule, arrival trigger, work pool, and a
    concurrency limit of one running release per dataset id."""
    api_url = require_prefect_server("dprelease deploy")
    from dprelease.catalog.ledger.database import default_url
    from dprelease.flows.deployments import deploy_specs, find_specs

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
        f"`prefect deployment run '{summaries[0].name}'`"
    )


def watch(
    directory: Annotated[Path, typer.Argument(help="Landing folder to watch (recursively).")],
    spec_dir: Annotated[
        Path | None,
        typer.Option(
            help="Specs with `trigger: arrival`: a file belongs to the datasets whose source "
            "covers it (default: DIR/<dataset id>/...).",
        ),
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 5.0,
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="Two polls (--interval apart, to see sizes settle), then exit."
        ),
    ] = False,
    max_polls: Annotated[int | None, typer.Option(help="Stop after this many polls.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Log the events instead of sending them.")
    ] = False,
    adopt_claims_from: Annotated[
        str | None,
        typer.Option(
            help="Copy the arrival claims of the catalog at this URL (e.g. the SQLite catalog "
            "before a move to PostgreSQL) into the current catalog, then exit.",
        ),
    ] = None,
) -> None:
    """Announce complete new Parquet files in DIR as `dprelease.data.arrived` events (one per
    file content, remembered across restarts); files that are not Parquet are logged and skipped."""
    import logging

    from dprelease.catalog.watch_state import WatchState
    from dprelease.flows import watch as arrivals

    if adopt_claims_from is not None:
        try:
            report = arrivals.adopt_claims(source_url=adopt_claims_from)
        except ValueError as exc:
            raise CatalogError(str(exc)) from None
        stdout.print(
            f"claims adopted {report.adopted}, already claimed {report.already}, content "
            f"changed {report.changed}, file missing {report.missing}"
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
        emitter, state = arrivals.logging_emitter, WatchState("sqlite://")
    else:
        emitter = arrivals.prefect_emitter(require_prefect_server("dprelease watch"))
        state = WatchState()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    watch_logger = logging.getLogger("dprelease.watch")
    watch_logger.addHandler(handler)
    watch_logger.setLevel(logging.INFO)
    try:
        watcher = arrivals.Watcher(
            directory,
            state=state,
            emitter=emitter,
            resolve_datasets=arrivals.SpecResolver(spec_dir) if spec_dir is not None else None,
        )
        emitted = watcher.run(interval_seconds=interval, max_polls=2 if once else max_polls)
    except ValueError as exc:
        raise CatalogError(str(exc)) from None
    except KeyboardInterrupt:
        stdout.print("stopped")
        return
    finally:
        watch_logger.removeHandler(handler)
    stdout.print(f"announced {len(emitted)} file(s)")
    for event in emitted:
        stdout.print(f"  {event.dataset_id}: {event.path} sha256 {event.fingerprint}")


def recover(
    as_json: JsonOption = False,
    lease_seconds: Annotated[
        float, typer.Option(help="A release with no sign of life for this long counts as dead.")
    ] = 3600.0,
    adopt_ledger: Annotated[
        str | None,
        typer.Option(
            metavar="REASON",
            help="Accept the ledger as it is now (e.g. a catalog restored from a backup on "
            "purpose); the reason is kept with the ledger's anchor.",
        ),
    ] = None,
) -> None:
    """Find release runs that ended inside a stage or are stuck past their stage's time limit (the
    stuck ones are stopped: SIGTERM, then SIGKILL), then move releases whose process died (stuck
    in `measuring`) to failed/aborted; charges stay."""
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.flows.server import state_home
    from dprelease.flows.watchdog import forget, inspect_runs, stop_stuck

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
        print_json(
            {
                "runs": runs,
                "recovered": [m.as_dict() for m in moved],
                "unfinished_publications": unfinished,
                "ledger_problems": problems,
                "adopted_chain_head": None if adopted is None else adopted.as_dict(),
            }
        )
        return
    if adopted is not None:
        stdout.print(f"ledger adopted at entry #{adopted.seq}")
    for run in runs:
        stdout.print(str(run["summary"]))
    for m in moved:
        stdout.print(
            f"{m.release_id}: measuring -> {m.status} ({m.reason}; {m.charges} charge(s) kept)"
        )
    for release_id in unfinished:
        stdout.print(
            f"{release_id}: approved, publication unfinished: run `dprelease review {release_id} "
            "--approve --reviewer NAME` to finish it"
        )
    for problem in problems:
        console.print(f"ledger problem: {problem}")
    if not (runs or moved or unfinished or problems):
        stdout.print("nothing to recover")


@server_app.command("status")
def server_status(as_json: JsonOption = False) -> None:
    """Whether the shared server runs, where, since when, and when it stops if left idle."""
    from dprelease.flows import server

    current = server.status()
    if as_json:
        print_json(current.as_dict())
        return
    if current.state == "external":
        stdout.print(
            f"external: PREFECT_API_URL={current.url} (dprelease starts no server)", highlight=True
        )
        return
    if current.state == "deploy":
        stdout.print(
            f"deploy: {current.url} (deploy/start-server.sh on this Prefect database, pid "
            f"{current.processes[0]}; every command uses it, dprelease starts no server)"
        )
        return
    if current.record is None:
        stdout.print("stopped: the next command that needs Prefect starts one")
        return
    record = current.record
    stdout.print(
        f"{current.state}: {record.url}",
        f"  pid {record.pid} (processes {', '.join(map(str, current.processes)) or 'none'}); "
        f"prefect {record.version}; started {record.started_at}",
        f"  last used {current.last_used_at}; stops when idle at {current.stops_after_idle_at} "
        f"(DPRELEASE_SERVER_IDLE_SECONDS={record.idle_seconds:g})",
        f"  home {record.prefect_home}; log {record.log}",
        sep="\n",
    )


@server_app.command("stop")
def server_stop() -> None:
    """Stop the shared server now (by its recorded process id); the next command starts a new one."""
    from dprelease.flows import server

    if os.environ.get("PREFECT_API_URL"):
        raise DprReleaseError(
            f"PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): that server was not "
            "started by dprelease; stop it where it was started"
        )
    stopped = server.stop()
    if stopped is None:
        stdout.print("no server was running")
    else:
        stdout.print(f"stopped the server on {stopped.url} (pid {stopped.pid})")


@server_app.command("prepare")
def server_prepare() -> None:
    """Migrate an empty Prefect database into the user cache (once per Prefect version), so the
    first server on this machine starts in seconds. install.sh runs it."""
    from dprelease.flows import server

    template, created = server.prepare_template()
    state = "prepared" if created else "already prepared"
    stdout.print(f"{state}: {template}")
