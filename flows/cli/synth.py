"""``dprelease synth``: a synthetic Parquet file sampled from the model fitted to a published
``reconstruct: pgm`` release (:mod:`catalog.publishing.synthetic`).  Post-processing of published
values: no budget is charged, the confidential data are never read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dprelease.flows.cli.common import stdout


def synth(
    release_id: Annotated[
        str, typer.Argument(help="A published release (see `dprelease releases`).")
    ],
    rows: Annotated[int, typer.Option(help="Number of synthetic records.")],
    out: Annotated[
        Path | None,
        typer.Option(help="Parquet file to write (default ./<RELEASE_ID>-synthetic.parquet)."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed of the sampler (public randomness); recorded when drawn."),
    ] = None,
) -> None:
    """Sample a synthetic Parquet file from the model of a published `reconstruct: pgm` release
    (post-processing: no budget is charged); the file is recorded in the catalog."""
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.publishing.synthetic import synthesize

    target = out if out is not None else Path(f"{release_id}-synthetic.parquet")
    record = synthesize(release_id, rows=rows, out=target, catalog=Catalog(), seed=seed)
    stdout.print(
        f"wrote {record.rows:,} synthetic rows of release {record.release_id} to {record.path} "
        f"(seed {record.seed}, sha256 {record.sha256[:12]}…; no budget charged)"
    )
