"""``dprelease ldp``: publish a local-model strategy and simulate client responses.

* ``dprelease ldp strategy SPEC [--out DIR] [--json]`` optimises (or reuses from the strategy store)
  the ε-LDP strategy Q for the spec's workload and writes ``strategy.npy`` and ``strategy.json``
  into DIR (default ``./ldp-strategies/<spec name>/``): the public artifact clients randomise with.
* ``dprelease ldp simulate SPEC --strategy DIR --input TRUE.parquet --out RESPONSES.parquet
  [--seed N]`` plays the clients: each row's item is randomised with ``mechanisms.ldp.randomize``.

Registered by ``flows/cli.py`` as ``app.add_typer(ldp_app, name="ldp")``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from catalog.errors import DprReleaseError
from mechanisms.privacy import PrivacyError

console = Console(stderr=True, soft_wrap=True)
stdout = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

ldp_app = typer.Typer(
    name="ldp",
    help=(
        "Local-model (LDP) collections: publish the optimised randomiser for a spec's workload and "
        "simulate client responses.  `dprelease run SPEC` releases the estimates."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _clear_errors(function: F) -> F:
    """The project's errors (and invalid values) as one clear message and a non-zero exit."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (DprReleaseError, PrivacyError, ValueError) as exc:
            console.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(code=2 if isinstance(exc, ValueError) else 1) from None

    return wrapper  # type: ignore[return-value]


@ldp_app.command()
@_clear_errors
def strategy(
    spec: Annotated[Path, typer.Argument(help="Release spec (YAML) with model: local.")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for strategy.npy/.json (default ldp-strategies/NAME)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Optimise (or reuse) and publish the spec's epsilon-LDP strategy, with its promised variance
    per user against the baselines (reconstruction of Thm 3.10)."""
    from catalog import ldp_release
    from catalog.spec import load_spec

    loaded = load_spec(spec)
    ldp_release.require_local(loaded)
    status = console.status("looking up the strategy store…", spinner="dots")
    status.start()
    try:
        result, record = ldp_release.ensure_strategy(
            loaded, on_optimize=lambda text: status.update(text + "…")
        )
    finally:
        status.stop()
    directory = out or ldp_release.default_strategy_dir(loaded)
    array_path, json_path = ldp_release.write_strategy_artifact(result, record, directory)
    if as_json:
        sys.stdout.write(json.dumps(record.cli_json(), indent=2) + "\n")
        return
    table = Table(title=f"{loaded.name}: variance per user (N = 1), worst and average case")
    for column in ("mechanism", "outputs", "worst", "average", "worst / optimized"):
        table.add_column(column, justify="left" if column == "mechanism" else "right")
    rows = [("optimized", record.rows, record.worst_variance, record.average_variance)] + [
        (name, b.rows, b.worst_variance, b.average_variance) for name, b in record.baselines.items()
    ]
    for name, outputs, worst, average in rows:
        table.add_row(
            name,
            str(outputs),
            f"{worst:.6g}",
            f"{average:.6g}",
            f"{worst / record.worst_variance:.3f}",
        )
    stdout.print(table)
    stdout.print(
        f"lower bound (Cor 5.7): {record.lower_bound:.6g}; epsilon per user {record.epsilon:g}; "
        f"optimised in {record.seconds:.1f} s",
        highlight=False,
    )
    stdout.print(f"fingerprint: {record.fingerprint}", highlight=False)
    stdout.print(f"wrote {array_path} and {json_path}", highlight=False)


@ldp_app.command()
@_clear_errors
def simulate(
    spec: Annotated[Path, typer.Argument(help="Release spec (YAML) with model: local.")],
    strategy_dir: Annotated[
        Path | None,
        typer.Option(
            "--strategy", help="Folder from `dprelease ldp strategy` (default ldp-strategies/NAME)."
        ),
    ] = None,
    input_path: Annotated[
        Path, typer.Option("--input", help="Parquet of true items (the spec's domain columns).")
    ] = Path("items.parquet"),
    out: Annotated[Path, typer.Option("--out", help="Parquet of responses to write.")] = Path(
        "responses.parquet"
    ),
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed",
            help="Seed for a reproducible SIMULATION only; real clients use OS entropy. "
            "Default: OS entropy.",
        ),
    ] = None,
) -> None:
    """Randomise every row of a Parquet of true items with the published strategy (simulation of
    the clients), writing one response index per user plus the strategy fingerprint."""
    from catalog import ldp_release
    from catalog.spec import load_spec

    loaded = load_spec(spec)
    ldp_release.require_local(loaded)
    directory = strategy_dir or ldp_release.default_strategy_dir(loaded)
    published, _ = ldp_release.read_strategy_artifact(directory)
    rng = np.random.default_rng(seed)  # None: fresh OS entropy, as on a real device
    summary = ldp_release.simulate(
        loaded, published, input_path=str(input_path), output_path=out, rng=rng
    )
    dropped = (
        f" ({summary.dropped_rows} out-of-domain rows dropped)" if summary.dropped_rows else ""
    )
    stdout.print(
        f"wrote {summary.num_responses:,} responses to {summary.output}{dropped}; strategy "
        f"fingerprint {summary.strategy_fingerprint[:16]}…",
        highlight=False,
    )
    if seed is not None:
        console.print(
            "note: --seed makes the simulation reproducible; real clients must never use a seed",
            highlight=False,
        )
