"""``dprelease demo``, ``run``, ``plan``, ``check`` and ``verify``: a release from its spec to its
staged directory, and back to the checks of that directory."""

from __future__ import annotations

import os
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from dprelease.flows import errors
from dprelease.flows.cli.common import (
    JsonOption,
    OutOption,
    console,
    cost_text,
    prefect_api,
    prefect_defaults,
    print_json,
    server_ready,
    stdout,
)
from dprelease.flows.cli.review import print_review_policy

if TYPE_CHECKING:
    from dprelease.catalog.planning.planner import Plan


def bundled_spec() -> Path:
    """The demo spec shipped inside the package (UCI Adult, CC BY 4.0)."""
    return Path(str(resources.files("dprelease.flows") / "examples" / "adult-demo.yaml"))


def _run_release(
    spec_path: Path, out_dir: Path, *, engine: str | None = None, address: str | None = None
) -> Any:
    from dprelease.catalog.engine import resolve_execution
    from dprelease.catalog.spec.load import check_runnable_before_planning, load_spec
    from dprelease.flows.watchdog import stage_timeout_seconds
    from dprelease.mechanisms.primitives.workload import magnitude

    spec = load_spec(spec_path)  # fail fast on a bad spec: before Prefect or any server starts
    check_runnable_before_planning(spec)  # sizes only: a too-large release is never planned
    execution = resolve_execution(spec.execution, engine=engine, address=address)  # CLI wins
    stage_timeout_seconds()  # a bad DPRELEASE_STAGE_TIMEOUT is refused before Prefect starts
    prefect_defaults()
    console.print(
        f"[bold]dprelease[/] release [cyan]{spec.name}[/] of dataset [cyan]{spec.dataset.id}[/] "
        f"({magnitude(spec.num_cells)} cells, {len(spec.workload)} workload items)"
    )
    started = time.perf_counter()
    with (
        console.status("connecting to the local Prefect server…", spinner="dots") as status,
        prefect_api() as connection,
    ):
        # The server starts in the background while the flow's modules (and prefect) import.
        from dprelease.flows.release_flow import run_release

        if connection is not None and connection.started:
            # Data-free planning fills the strategy store on the other core while the server
            # starts; the flow's plan task then finds the strategy there.
            status.update("planning while the local Prefect server starts (reused later)…")
            from dprelease.catalog.planning.memory import check_memory, predict_plan
            from dprelease.catalog.planning.planner import make_plan

            check_memory(predict_plan(spec, make_plan(spec)))  # before the flow charges
        with server_ready(connection):
            status.update("running the release flow…")
            from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

            from dprelease.flows.interrupt import InterruptGuard

            # No flow-run heartbeats for a run inside this command (the user sees it end or
            # crash): Prefect's heartbeat thread sleeps in 1 s steps and is joined at the flow's
            # end, up to one step of every command.  A deployed run keeps them (crash detection)
            # for its process; its release subflow, like this run, has none.
            with (
                InterruptGuard(write=lambda text: console.print(text)),
                temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
            ):
                staged = run_release(
                    spec_path=str(spec_path), out_dir=str(out_dir), execution=execution
                )
    console.print(f"finished in {time.perf_counter() - started:.1f} s")
    return staged


def _print_staged(staged: Any) -> None:
    stdout.print(
        f"release id: {staged.release_id}",
        f"artifacts:  {staged.directory}",
        f"mechanism:  {staged.mechanism}; privacy charged: {cost_text(staged.charged)}",
        f"report:     {Path(staged.directory) / 'report.html'}",
        f"next:       dprelease review {staged.release_id} --approve --reviewer NAME   "
        f"(or --reject); dprelease verify {staged.directory}",
        sep="\n",
    )
    print_review_policy(staged.release_id)


def demo(out: OutOption = Path("releases")) -> None:
    """Release the bundled UCI Adult example end to end and stage it for review."""
    _print_staged(_run_release(bundled_spec(), out))


def run(
    spec: Annotated[Path, typer.Argument(help="Release spec (YAML).")],
    out: OutOption = Path("releases"),
    engine: Annotated[
        str | None,
        typer.Option(
            help="local or dask: where counting and fan-out tasks run (overrides the spec's "
            "execution.engine; default local). dask without --address starts a local cluster.",
        ),
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(help="Dask scheduler tcp://host:port to join (implies --engine dask)."),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="Your operator key's name (default $DPRELEASE_KEY): signs the run and its "
            "charges; required on a dataset whose custodian registered keys.",
        ),
    ] = None,
) -> None:
    """Run the release flow for SPEC: ingest, count, plan, measure, reconstruct, validate, stage."""
    if key is not None:
        from dprelease.catalog.identity.keys import load_signing_key
        from dprelease.catalog.identity.signing import KEY_ENV

        load_signing_key(key)  # refused here (missing, or readable by others) before the flow
        os.environ[KEY_ENV] = key  # the name only: each stage loads the key where it signs
    _print_staged(_run_release(spec, out, engine=engine, address=address))


def plan(
    spec: Annotated[
        Path, typer.Argument(help="Release spec (YAML); dataset.source is not needed.")
    ],
    as_json: JsonOption = False,
    time_budget: Annotated[
        float,
        typer.Option(
            help="Seconds of predicted planning work auto may spend; candidates predicted to take "
            "longer are skipped (and listed with the reason). A mechanism the spec names is "
            "always planned.",
            min=0.001,
        ),
    ] = 120.0,
) -> None:
    """Data-free plan: the candidates' expected errors, the SVD lower bound, the choice and the cost.

    A spec with accuracy targets (accuracy: {max_std_error: ...}) is planned at the smallest
    privacy level that meets every table's target; the table that binds and the dataset's
    remaining budget are shown.

    A spec that names a mechanism plans only that one; auto plans the registry's mechanisms
    cheapest first and stops once one is within 0.5% of the lower bound.  Optimised strategies
    are kept in the strategy store, so `run` after `plan` reuses them.
    """
    from dprelease.catalog.planning.memory import predict_plan
    from dprelease.catalog.planning.planner import make_plan
    from dprelease.catalog.spec.load import load_spec
    from dprelease.mechanisms.primitives.workload import magnitude

    loaded = load_spec(spec)
    result = make_plan(loaded, time_budget=time_budget)
    memory = predict_plan(loaded, result)
    series = _series_summary(loaded, result)
    if as_json:
        print_json(result.to_json() | {"memory": memory.to_json()} | series)
        return
    table = Table(
        title=f"plan: {result.num_queries:,} queries over {magnitude(result.num_cells)} cells"
    )
    weighted = ("weighted total",) if result.weighted else ()  # items with a weight
    columns = ("mechanism", "rmse", "total variance", *weighted, "ratio to bound", "seconds")
    for column in (*columns, "note"):
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
            *[_number(c.weighted_total_variance) for _ in weighted],
            ratio,
            f"{c.seconds:.3f}",
            c.note or "",
        )
    stdout.print(table)
    bound = f"{result.lower_bound_rmse:.4f}" if result.lower_bound_rmse else "n/a"
    peak_stage, _, driver = memory.peak
    stdout.print(
        f"SVD lower bound on rmse: {bound} ({result.lower_bound_note})",
        f"chosen: {result.chosen} — {result.reason}",
        f"objective: {result.objective}; {_std_errors_line(result)}",
        *_targets_lines(result, loaded.dataset.id),
        f"privacy cost: {result.expected_cost.describe()} ({result.noise_kind} noise)",
        "predicted memory: "
        + ", ".join(f"{name} {size / 1e6:,.0f} MB" for name, size, _ in memory.stages)
        + f"; peak {peak_stage} ({driver})",
        sep="\n",
    )
    if series:
        _print_series(series["series"])


def _series_summary(spec: Any, result: Plan) -> dict[str, Any]:
    """``{"series": summary}`` of the horizon plan for a series spec (data-free), else ``{}``.

    Once the series' first release recorded its plan, that plan is shown (what later releases
    follow) with the periods released so far; a spec that would change it is shown its own plan
    and ``follows_recorded: false`` (its run would be refused)."""
    if spec.series is None:
        return {}
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.planning.series import make_series_plan, spec_key
    from dprelease.catalog.series import recorded_periods, recorded_plan

    catalog = Catalog()
    columns = spec.series.columns  # column periods: each period named by its declared value
    values = {} if columns is None else {"period_values": list(columns.values)}
    recorded = recorded_plan(catalog, spec) if spec.dataset.id in catalog.dataset_ids() else None
    if recorded is None:
        return {"series": make_series_plan(spec, result).summary() | {"recorded": False} | values}
    if recorded.spec_key != spec_key(spec):
        summary = make_series_plan(spec, result).summary()
        return {"series": summary | {"recorded": True, "follows_recorded": False} | values}
    released = len(recorded_periods(catalog, spec))
    return {
        "series": recorded.summary()
        | {"recorded": True, "follows_recorded": True, "periods_released": released}
        | values
    }


def _recorded_text(summary: dict[str, Any]) -> str:
    if not summary["recorded"]:
        return "(recorded at the first release; later releases follow it)"
    if not summary["follows_recorded"]:
        return (
            "— this spec changes the series' recorded plan: its run would be refused (start a new "
            "series under another name)"
        )
    return (
        f"(the recorded plan; {summary['periods_released']} of {summary['horizon']} periods "
        "released)"
    )


def _print_series(summary: dict[str, Any]) -> None:
    """The horizon plan: strategy, σ, worst and per-period standard errors, cost per person."""
    stdout.print(
        f"series {summary['series']}: {summary['horizon']} periods, time workload "
        f"{summary['time_workload']}, time strategy {summary['time_strategy']} composed with "
        f"{summary['cell_mechanism']}; {summary['unit']} level; noise sigma "
        f"{summary['sigma']:.4g} per answer",
        f"privacy over the horizon: rho {summary['rho_per_person_total']:.6g} per person at most "
        "(charged period by period: each release pays every period it reads its increment)",
        f"plan sha256: {summary['plan_sha256']} " + _recorded_text(summary),
        sep="\n",
    )
    table = Table(title="predicted standard error of the worst cell, by period")
    names = list(summary["std_errors_by_period"])
    table.add_column("period", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    values = summary.get("period_values")
    for t in range(summary["horizon"]):
        period = str(t + 1) if values is None else f"{t + 1} ({values[t]})"
        table.add_row(period, *(f"{summary['std_errors_by_period'][n][t]:.4g}" for n in names))
    table.add_row("worst", *(f"{summary['worst_std_error'][n]:.4g}" for n in names))
    stdout.print(table)


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def _targets_lines(result: Plan, dataset_id: str) -> list[str]:
    """Accuracy targets: the level found, the table that decides it, and the dataset's budget."""
    binding = result.binding_table
    if binding is None or result.targets is None:
        return []
    from dprelease.catalog.ledger.store import Catalog

    catalog = Catalog()
    if dataset_id in catalog.dataset_ids():
        cap, spent = catalog.cap(dataset_id), catalog.spent(dataset_id)
        budget = (
            f"dataset {dataset_id}: remaining {cost_text(spent.remaining(cap).as_dict())} of "
            f"cap {cost_text(cap.as_dict())}"
        )
    else:
        budget = f"dataset {dataset_id}: not in the catalog yet (nothing spent)"
    return [
        f"accuracy targets: {result.expected_cost.describe()} is the smallest privacy level that "
        f"meets every table's max_std_error (table {binding} binds: "
        f"{result.targets[binding]:g}); {budget}",
    ]


def _std_errors_line(result: Plan) -> str:
    """The chosen strategy's largest cell standard error, and its range over the tables."""
    largest = result.largest_std_error
    if largest is None or result.item_std_errors is None:
        return "cell standard errors: not predicted (data-dependent)"
    values = result.item_std_errors.values()
    return (
        f"largest cell standard error {largest[1]:.4f} (table {largest[0]}); per table "
        f"{min(values):.4f} to {max(values):.4f} over {len(result.item_std_errors)} tables "
        "(--json lists each)"
    )


def check(
    spec: Annotated[
        Path, typer.Argument(help="Release spec (YAML) whose dataset.source to check.")
    ],
) -> None:
    """For the data custodian: the exact input problems a release reports only by column and rule.

    Reads the spec's data here, without Prefect, and prints null and out-of-domain rows per column (with example values), wrong column types and persons above the contribution bound. The output is CONFIDENTIAL (exact counts and raw values); it is stored nowhere: no file, no catalog entry, no log.

    Exit status: 0 when no problem was found, 3 when problems were found, 2 for an invalid spec or an unreadable source.
    """
    from dprelease.catalog.confidential.check import check_data, format_report
    from dprelease.catalog.spec.load import load_spec

    report = check_data(load_spec(spec))
    typer.echo(format_report(report))
    if report.problems:
        raise SystemExit(3)  # not an error of the command: it found what it looks for


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
    receipts, input fingerprint key, validation results; and every signature (keys, roles in
    force when it was made, the attestation files over exactly these tables)."""
    from dprelease.catalog.errors import VerificationError
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.series_audit import verify_release_and_series as verify_release

    if as_json:
        notes: list[str] = []
        try:
            notes = verify_release(release_dir, Catalog(), input_path=input_path)
        except VerificationError as exc:
            problems: tuple[str, ...] = exc.problems
        else:
            problems = ()
        report: dict[str, Any] = {
            "release_dir": str(release_dir),
            "ok": not problems,
            "problems": problems,
        }
        print_json(report | ({"signatures": notes} if notes else {}))
        if problems:
            raise typer.Exit(code=errors.EXIT_CHECK_FAILED)
        return
    notes = verify_release(release_dir, Catalog(), input_path=input_path)
    stdout.print(f"OK: {release_dir} matches its manifest, the ledger and its validation results")
    for note in notes:
        stdout.print(f"  review: {note}")
