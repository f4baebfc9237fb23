"""The ``dprelease`` command line (typer): commands live by group in this package; this module
assembles ``app``.

``DPRELEASE_HOME`` (default ``./.dprelease``) holds the SQLite catalog and Prefect's state;
``DPRELEASE_CATALOG_URL`` points the catalog elsewhere.  Flows use the shared local Prefect server
(``flows/server.py``) unless ``PREFECT_API_URL`` is set.  Failures are reported by
``flows/errors.py``; spec errors are reported before Prefect is imported or a server starts.
"""

from __future__ import annotations

import os

# The BLAS thread policy of mechanisms/primitives/threads.py for the whole command, set before
# numpy loads (multi-threaded BLAS on small strategy matrices only contends); users may override.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gc
import sys
from typing import Annotated, Any

import typer

from dprelease.flows import errors
from dprelease.flows.cli import budget, keys, operations, release, review, synth
from dprelease.flows.cli.catalog import catalog_app
from dprelease.flows.cli.common import Commands, command_group, console
from dprelease.flows.cli.ldp import ldp_app


class _ConsoleScript(Commands):
    """``dprelease`` run as a program (``app()``; ``CliRunner`` does not go through here)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from dprelease.flows.interrupt import allow_hard_exit

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


app = command_group(
    "dprelease",
    "Publish differentially private statistics: a release spec names a Parquet dataset, a public "
    "domain, a workload and a privacy level; dprelease picks a workload-aware strategy, charges a "
    "persistent privacy-budget ledger, adds vetted noise, reconstructs, validates and stages an "
    "auditable release for review.",
    kind=_ConsoleScript,
)


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


# `dprelease --help` lists the commands in this order, then the groups.
for _command in (
    release.demo,
    release.run,
    release.plan,
    release.check,
    budget.budget,
    budget.releases,
    review.review,
    operations.deploy,
    operations.watch,
    release.verify,
    review.show,
    operations.recover,
    synth.synth,
):
    app.command()(_command)
app.add_typer(
    ldp_app, name="ldp", help="Local differential privacy: publish a strategy, simulate clients."
)
app.add_typer(review.notify_app, name="notify")
app.add_typer(keys.keys_app, name="keys")
app.add_typer(catalog_app, name="catalog")
app.add_typer(operations.server_app, name="server")
