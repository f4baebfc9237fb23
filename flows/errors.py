"""How ``dprelease`` reports a failure: short, actionable, and never a data value.

A user error (spec, data against the spec, budget, privacy parameters, a refused operation, an
unusable path) prints its message and what to do, exit 2; a failed check (``verify``, validation)
the same, exit 1; anything else one line naming the exception type and a log under
``$DPRELEASE_HOME/logs/`` with the traceback, exit 1; Ctrl-C exit 130.  ``--debug`` (or
``DPRELEASE_DEBUG=1``) prints tracebacks.

Privacy: the log never holds local variables, and holds messages only of this project's
exceptions and of :data:`SAFE_MESSAGE_TYPES`; any other message may quote a data value (pyarrow's
and numpy's do), so only its type and code locations are logged.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.text import Text

from dprelease.catalog.errors import (
    CatalogError,
    DataError,
    DprReleaseError,
    MemoryLimitError,
    SettingError,
    SpecError,
    StageTimeLimitExceeded,
    ValidationFailedError,
    VerificationError,
)
from dprelease.catalog.home import default_home
from dprelease.mechanisms.primitives.privacy import BudgetExceededError, PrivacyError

EXIT_INTERNAL = 1
EXIT_CHECK_FAILED = 1
EXIT_USER = 2
EXIT_INTERRUPTED = 130
MAX_MESSAGE_LINES = 12
OUR_PACKAGES = ("dprelease",)
# Messages of these exact types come from the interpreter about code, not data ("takes 2
# positional arguments but 3 were given", "has no attribute"); subclasses (pyarrow's ArrowTypeError
# quotes values) do not count.  The catalog database holds no confidential value: SQLAlchemy's
# messages are safe too.
SAFE_MESSAGE_TYPES = (
    TypeError,
    AttributeError,
    NameError,
    ImportError,
    ModuleNotFoundError,
    NotImplementedError,
    RecursionError,
    ZeroDivisionError,
)
SAFE_MESSAGE_PACKAGES = (*OUR_PACKAGES, "sqlalchemy")

_debug = False


def set_debug(enabled: bool) -> None:
    global _debug
    _debug = enabled


def debug_enabled() -> bool:
    return _debug or os.environ.get("DPRELEASE_DEBUG", "") not in ("", "0", "false", "no")


@dataclass(frozen=True)
class Failure:
    """How one exception is reported."""

    title: str  # what failed
    hint: str  # what to do
    exit_code: int = EXIT_USER


class Refused(DprReleaseError):
    """A refusal that knows its own title and what to do (e.g. a missing watch folder: create
    it), reported like the other user errors with exit 2."""

    def __init__(self, message: str, *, title: str, hint: str) -> None:
        super().__init__(message)
        self.title = title
        self.hint = hint


# Most specific first.
_USER_ERRORS: dict[type[BaseException], Failure] = {
    SpecError: Failure(
        "invalid release spec",
        "fix the spec and run again; `dprelease plan SPEC` checks a spec without reading any data",
    ),
    DataError: Failure(
        "the input data does not fit the spec",
        "fix the data, or the spec's domain and privacy unit (out-of-domain rows can be dropped "
        "with on_out_of_domain: drop), then run again",
    ),
    BudgetExceededError: Failure(
        "privacy budget exceeded",
        "see `dprelease budget DATASET`; ask for less (a lower epsilon or rho) or use a dataset "
        "whose budget allows it",
    ),
    PrivacyError: Failure(
        "privacy accounting refused the request",
        "check the spec's privacy and dataset.budget sections (same measure, valid values)",
    ),
    VerificationError: Failure(
        "verification failed",
        "do not publish this release; compare it with the original release directory",
        EXIT_CHECK_FAILED,
    ),
    ValidationFailedError: Failure(
        "the release failed validation",
        "nothing was staged and the budget stays spent; see the validation results and the "
        "spec's privacy level",
        EXIT_CHECK_FAILED,
    ),
    MemoryLimitError: Failure(
        "not enough memory for this release",
        "nothing was read or charged; run on a machine with more memory (or set "
        "DPRELEASE_MEMORY_LIMIT if the limit is wrong), or narrow the workload; "
        "`dprelease plan SPEC` shows each stage's predicted memory",
    ),
    SettingError: Failure("invalid setting", "fix or unset the environment variable named above"),
    StageTimeLimitExceeded: Failure(
        "the release stopped",
        "if the stage needs longer, raise DPRELEASE_STAGE_TIMEOUT (seconds) and run again; "
        "`dprelease recover` lists runs that ended inside a stage",
        EXIT_CHECK_FAILED,
    ),
    CatalogError: Failure(
        "the catalog refused the operation",
        "see `dprelease releases` for each release's status; the reason above names the release, "
        "dataset or setting refused and what to change",
    ),
    DprReleaseError: Failure("dprelease refused", "fix the input named above"),
}
_PATH_ERROR = Failure(
    title="a path cannot be used",
    hint="check that the path exists and that you may read or write it",
)


_PERMISSION_DENIED = Failure(
    title="the catalog database refused this role",
    hint="your database role may not do this (deploy/postgres.md, 'Database roles'): connect as "
    "a role that may (PGUSER), or ask the custodian; `dprelease catalog roles --print` lists "
    "what each role may write",
)
INSUFFICIENT_PRIVILEGE = "42501"  # PostgreSQL's SQLSTATE of "permission denied"


def classify(exc: BaseException) -> Failure | None:
    """The user-facing report of ``exc``; None for an internal error."""
    if isinstance(exc, Refused):
        return Failure(title=exc.title, hint=exc.hint)
    if _sqlstate(exc) == INSUFFICIENT_PRIVILEGE:
        return _PERMISSION_DENIED
    for kind, failure in _USER_ERRORS.items():
        if isinstance(exc, kind):
            return failure
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return _PATH_ERROR
    return None


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (SQLAlchemy's wrapper of a psycopg error), or None."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None)


def user_message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.strerror}: {exc.filename}"
    if _sqlstate(exc) == INSUFFICIENT_PRIVILEGE:  # the server's line, not the statement
        return str(getattr(exc, "orig", exc)).splitlines()[0]
    return str(exc) or type(exc).__name__


def report(exc: BaseException, console: Console, *, argv: list[str] | None = None) -> int:
    """Print ``exc`` the way this module promises and return the exit code."""
    if debug_enabled():
        console.print(Text("".join(traceback.format_exception(exc)).rstrip(), style="dim"))
    failure = classify(exc)
    if failure is None:
        return _report_internal(exc, console, argv=argv)
    message = _shorten(user_message(exc))
    head = message if failure.title in message.lower() else f"{failure.title}: {message}"
    block = Text("error: ", style="bold red")
    block.append(head)
    block.append("\nwhat to do: ", style="bold")
    block.append(failure.hint)
    console.print(block, soft_wrap=True)
    return failure.exit_code


def _shorten(message: str) -> str:
    lines = message.strip().splitlines() or [""]
    if len(lines) <= MAX_MESSAGE_LINES:
        return "\n".join(lines)
    kept = lines[: MAX_MESSAGE_LINES - 1]
    return "\n".join([*kept, f"  … and {len(lines) - len(kept)} more line(s)"])


def _report_internal(exc: BaseException, console: Console, *, argv: list[str] | None) -> int:
    what = type(exc).__qualname__
    if _message_is_safe(exc) and str(exc):
        what += f": {_shorten(str(exc)).splitlines()[0]}"
    try:
        log = write_log(exc, argv=argv if argv is not None else sys.argv)
        where = f"the traceback is in {log}"
    except OSError as log_error:
        where = f"the traceback could not be written ({log_error.strerror}); run with --debug"
    line = Text("internal error: ", style="bold red")
    line.append(f"{what}; {where}" + ("" if debug_enabled() else " (or run with --debug)"))
    console.print(line, soft_wrap=True)
    return EXIT_INTERNAL


def report_interrupt(console: Console, detail: str = "") -> int:
    console.print(Text(f"interrupted{': ' + detail if detail else ''}", style="bold yellow"))
    return EXIT_INTERRUPTED


def write_log(exc: BaseException, *, argv: list[str]) -> Path:
    """Write the safe traceback of ``exc`` to a new timestamped file in ``$DPRELEASE_HOME/logs``."""
    directory = default_home() / "logs"
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = directory / f"dprelease-{stamp}-{os.getpid()}.log"
    header = [
        f"dprelease internal error at {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"command: {' '.join(argv)}",
        f"versions: dprelease {_version('dprelease')}, prefect {_version('prefect')}, "
        f"python {sys.version.split()[0]}",
        "",
    ]
    path.write_text("\n".join(header) + safe_traceback(exc))
    return path


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _message_is_safe(exc: BaseException) -> bool:
    return type(exc) in SAFE_MESSAGE_TYPES or (
        type(exc).__module__.split(".")[0] in SAFE_MESSAGE_PACKAGES
    )


def safe_traceback(exc: BaseException) -> str:
    """The traceback chain of ``exc`` (code locations, never local variables) with the messages of
    this project's exceptions and of :data:`SAFE_MESSAGE_TYPES` only: another message may quote a
    confidential value."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    link = ""
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, "The above exception was the direct cause of:"
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, "During handling of the above, another occurred:"
        else:
            current = None
    parts = []
    for item, link_text in reversed(chain):
        frames = traceback.extract_tb(item.__traceback__)
        parts.append(
            "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
        )
        name = f"{type(item).__module__}.{type(item).__qualname__}"
        message = (
            str(item)
            if _message_is_safe(item)
            else "(message withheld: a third-party message may quote a data value; "
            "--debug shows it on the terminal)"
        )
        parts.append(f"{name}: {message}\n")
        if link_text:
            parts.append(f"\n{link_text}\n\n")
    return "".join(parts)
