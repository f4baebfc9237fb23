"""What every ``dprelease`` command shares: the two consoles, the error reporting, the Prefect
connection, JSON output and the options several commands take."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import click
import typer
from rich.console import Console
from rich.table import Table

from dprelease.catalog.home import default_home
from dprelease.flows import errors

console = Console(stderr=True, soft_wrap=True)
stdout = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

OutOption = Annotated[Path, typer.Option("--out", help="Folder for release directories.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
PublishDirOption = Annotated[
    Path | None, typer.Option("--publish-dir", help="Where approved releases are copied.")
]


def prefect_defaults() -> None:
    """Local, quiet, telemetry-free Prefect unless the user configured otherwise."""
    os.environ.setdefault("PREFECT_HOME", str(default_home() / "prefect"))
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_UI_ENABLED", "false")
    if not errors.debug_enabled():
        # Prefect prints a failed task's traceback on the console; we report the error ourselves.
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")


def clear_errors(function: F) -> F:
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


class Commands(typer.Typer):
    """Commands that report failures as ``flows/errors.py`` promises (:func:`clear_errors`), from
    registration on: no command can forget it."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[F], F]:
        register = super().command(*args, **kwargs)
        return lambda function: register(clear_errors(function))


def command_group(name: str, help_text: str, *, kind: type[typer.Typer] = Commands) -> typer.Typer:
    """``dprelease`` or one of its groups (``dprelease NAME COMMAND``)."""
    return kind(
        name=name,
        help=help_text,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )


@contextlib.contextmanager
def prefect_api() -> Iterator[Any]:
    """The Prefect API for this command (``flows.server.connect``, not yet waited for), with
    ``PREFECT_API_URL`` pointing at it; None when the user configured one."""
    from dprelease.flows import server

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
def server_ready(connection: Any) -> Iterator[None]:
    """Wait (bounded) until the shared server is healthy; keep its idle timer fresh meanwhile."""
    if connection is None:
        yield
        return
    from dprelease.flows import server

    connection.wait()
    with server.keep_alive():
        yield


@contextlib.contextmanager
def prefect_connected() -> Iterator[None]:
    """Prefect configured for this command and its API (shared local server or PREFECT_API_URL)."""
    prefect_defaults()
    with prefect_api() as connection, server_ready(connection):
        yield


def require_prefect_server(command: str) -> str:
    """The configured Prefect API URL; schedules, triggers and pools need a real server."""
    prefect_defaults()
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


def print_json(value: Any) -> None:
    """One JSON document on stdout (``--json``): nothing else is printed there."""
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def add_id_column(table: Table, header: str, ids: list[str]) -> None:
    """A column that shows every id in full: as wide as the longest, folded (never cut) if the
    terminal is narrower still."""
    width = max([len(header), *(len(i) for i in ids)])
    table.add_column(header, min_width=width, overflow="fold")


def cost_text(cost: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.6g}" for k, v in cost.items())
