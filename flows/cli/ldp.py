"""``dprelease ldp``: ``strategy`` plans a spec's ε-LDP strategy (optimised, or reused from the
strategy store: the very one ``dprelease run`` uses) and writes it as the public artifact clients
randomise with; ``simulate`` plays the clients (``mechanisms.local.randomizer.randomize``)."""

from __future__ import annotations

from functools import wraps
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from dprelease.catalog.errors import DprReleaseError
from dprelease.flows.cli.common import F, JsonOption, command_group, console, print_json, stdout
from dprelease.mechanisms.primitives.privacy import PrivacyError

ldp_app = command_group(
    "ldp",
    "Local-model (LDP) collections: publish the optimised randomiser for a spec's workload and "
    "simulate client responses.  `dprelease run SPEC` releases the estimates.",
    kind=typer.Typer,  # its commands report errors their own way (_ldp_errors)
)


def _ldp_errors(function: F) -> F:
    """The project's errors (and invalid values) as one clear message and a non-zero exit: exit 2
    for an invalid value, 1 otherwise (not ``flows/errors.py``'s blocks)."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except (DprReleaseError, PrivacyError, ValueError) as exc:
            console.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(code=2 if isinstance(exc, ValueError) else 1) from None

    return wrapper  # type: ignore[return-value]


@ldp_app.command()
@_ldp_errors
def strategy(
    spec: Annotated[Path, typer.Argument(help="Release spec (YAML) with model: local.")],
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for strategy.npy/.json (default ldp-strategies/NAME)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Plan (optimise or reuse) and publish the spec's epsilon-LDP strategy, with its promised
    variance per user against the baselines (reconstruction of Thm 3.10)."""
    from dprelease.catalog.planning import responses
    from dprelease.catalog.spec.load import load_spec

    loaded = load_spec(spec)
    responses.require_local(loaded)
    with console.status("looking up the strategy store…", spinner="dots") as status:
        result = responses.plan_strategy(loaded, progress=lambda text: status.update(text + "…"))
    directory = out or responses.default_strategy_dir(loaded)
    array_path, json_path = responses.write_strategy_artifact(loaded, result, directory)
    if as_json:
        print_json(responses.strategy_summary(result))
        return
    record = result.parameters
    table = Table(title=f"{loaded.name}: variance per user (N = 1), worst and average case")
    for column in ("mechanism", "outputs", "worst", "average", f"worst / {result.name}"):
        table.add_column(column, justify="left" if column == "mechanism" else "right")
    rows = [(result.name, record), *record["baselines"].items()]
    for name, values in rows:
        table.add_row(
            name,
            str(values["rows"]),
            f"{values['worst_variance']:.6g}",
            f"{values['average_variance']:.6g}",
            f"{values['worst_variance'] / record['worst_variance']:.3f}",
        )
    stdout.print(table)
    stdout.print(
        f"lower bound (Cor 5.7): {record['lower_bound']:.6g}; epsilon per user "
        f"{result.epsilon:g}; optimised in {record['seconds']:.1f} s",
        f"fingerprint: {result.fingerprint}",
        f"wrote {array_path} and {json_path}",
        sep="\n",
    )


@ldp_app.command()
@_ldp_errors
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
    out: Annotated[Path, typer.Option(help="Parquet of responses to write.")] = Path(
        "responses.parquet"
    ),
    seed: Annotated[
        int | None,
        typer.Option(
            help="Seed for a reproducible SIMULATION only; real clients use OS entropy. "
            "Default: OS entropy.",
        ),
    ] = None,
) -> None:
    """Randomise every row of a Parquet of true items with the published strategy (simulation of
    the clients), writing one response index per user plus the strategy fingerprint."""
    from dprelease.catalog.confidential import responses as response_files
    from dprelease.catalog.planning import responses
    from dprelease.catalog.spec.load import load_spec

    loaded = load_spec(spec)
    responses.require_local(loaded)
    directory = strategy_dir or responses.default_strategy_dir(loaded)
    published = responses.read_strategy_artifact(directory)
    rng = np.random.default_rng(seed)  # None: fresh OS entropy, as on a real device
    summary = response_files.simulate(
        loaded, published, input_path=str(input_path), output_path=out, rng=rng
    )
    dropped = (
        # the exact count is confidential: `dprelease check` shows it to the custodian
        " (out-of-domain rows dropped; `dprelease check SPEC` counts them)"
        if summary.dropped_rows
        else ""
    )
    stdout.print(
        f"wrote {summary.num_responses:,} responses to {summary.output}{dropped}; strategy "
        f"fingerprint {summary.strategy_fingerprint[:16]}…"
    )
    if seed is not None:
        console.print(
            "note: --seed makes the simulation reproducible; real clients must never use a seed"
        )
