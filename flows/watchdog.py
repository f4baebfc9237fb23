"""Stage time limits, a signal backstop and run records: a release run never hangs for good.

Every stage of the ``release`` flow runs inside :meth:`RunWatchdog.stage` under a time limit
(``DPRELEASE_STAGE_TIMEOUT``, default :data:`DEFAULT_STAGE_TIMEOUT_SECONDS`), with three ways out:

1. At the limit the monitor thread raises :class:`StageTimeLimitExceeded` in the stage's thread
   (``PyThreadState_SetAsyncExc``); the release is marked ``failed``, charges kept.  A SIGTERM or
   SIGINT that Prefect has not turned into an exit within :data:`STOP_GRACE_SECONDS` counts alike.
2. A stage still running :data:`STOP_GRACE_SECONDS` later (inside one long C call) ends the
   process with ``os._exit(EXIT_STAGE_TIMEOUT)`` after marking the release ``failed`` (bounded).
3. When native code holds the interpreter (a ``dlopen`` deadlock), ``faulthandler``'s C watchdog,
   armed :data:`NATIVE_MARGIN_SECONDS` after the hard exit, dumps every stack and ends the process;
   ``dprelease recover`` then moves the release.

While a stage runs, ``$DPRELEASE_HOME/run/releases/<pid>.json`` names the process, spec, release,
stage and deadline (public facts only); :func:`inspect_runs` (``dprelease recover``) finds dead and
stuck runs, :func:`stop_stuck` ends the stuck.  The monitor thread imports nothing once started.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import logging
import math
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from dprelease.catalog.errors import SettingError, StageTimeLimitExceeded
from dprelease.catalog.processes import is_alive, process_start
from dprelease.flows.server import terminate

STAGE_TIMEOUT_ENV = "DPRELEASE_STAGE_TIMEOUT"
DEFAULT_STAGE_TIMEOUT_SECONDS = 6 * 3600.0  # far above the benchmarks' largest stage (10^8 cells)
STOP_GRACE_SECONDS = 15.0
NATIVE_MARGIN_SECONDS = 30.0
MONITOR_TICK_SECONDS = 0.25
EXIT_STAGE_TIMEOUT = 124  # as timeout(1)
RUNS_FOLDER = Path("run") / "releases"

logger = logging.getLogger("dprelease.watchdog")


class WatchdogSettingError(SettingError):
    """``DPRELEASE_STAGE_TIMEOUT`` is not a usable number of seconds."""


def stage_timeout_seconds(environ: dict[str, str] | None = None) -> float:
    """The per-stage limit: ``DPRELEASE_STAGE_TIMEOUT`` (seconds, > 0), else the default."""
    raw = (os.environ if environ is None else environ).get(STAGE_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_STAGE_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise WatchdogSettingError(
            f"{STAGE_TIMEOUT_ENV}={raw!r}: must be a finite number of seconds > 0 "
            f"(default {DEFAULT_STAGE_TIMEOUT_SECONDS:g})"
        )
    return value


@dataclass(frozen=True)
class RunRecord:
    """One running release flow, as its run record file says (public facts only)."""

    pid: int
    host: str
    process_start: str | None
    spec: str
    stage: str
    stage_started: float  # epoch seconds
    deadline: float  # epoch seconds: the stage's time limit
    release_id: str | None = None
    flow_run_id: str | None = None


@dataclass(frozen=True)
class RunProblem:
    """A run :func:`inspect_runs` found: its process is ``gone``, or alive and ``stuck``."""

    record: RunRecord
    path: Path
    kind: Literal["gone", "stuck"]

    def describe(self, *, now: float) -> str:
        r = self.record
        what = f"run of {r.spec} (pid {r.pid}"
        what += f", release {r.release_id})" if r.release_id else ", no release registered yet)"
        if self.kind == "gone":
            return f"{what}: its process ended inside stage {r.stage!r}"
        late = now - r.deadline
        return f"{what}: alive but stuck in stage {r.stage!r}, {late:.0f} s past its time limit"


class RunWatchdog:
    """Time limits and the signal backstop for one flow run in this process (see the module).

    ``on_stop(reason)`` is called once, from the monitor thread, before a hard exit (the flow
    passes a function that marks its release ``failed``); it must not import anything."""

    def __init__(
        self,
        *,
        home: Path,
        spec: str,
        limit_seconds: float,
        on_stop: Callable[[str], None] | None = None,
        flow_run_id: str | None = None,
    ) -> None:
        if not (math.isfinite(limit_seconds) and limit_seconds > 0):
            raise WatchdogSettingError(f"limit_seconds ({limit_seconds!r}) must be finite and > 0")
        self.limit_seconds = limit_seconds
        self.on_stop = on_stop
        self._record_path = home / RUNS_FOLDER / f"{os.getpid()}.json"
        self._base = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "process_start": process_start(os.getpid()),
            "spec": spec,
            "flow_run_id": flow_run_id,
        }
        self.release_id: str | None = None
        self._lock = threading.Lock()
        self._stage: tuple[str, int, float] | None = None  # name, thread ident, monotonic deadline
        self._stop_deadline: float | None = None
        self._raised = False
        self._closed = threading.Event()
        self._signals = _own_stop_signals()
        self._monitor = threading.Thread(
            target=self._watch, name="dprelease-stage-watchdog", daemon=True
        )
        self._monitor.start()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Run the ``with`` body as stage ``name`` under the time limit."""
        started = time.time()
        with self._lock:
            self._stage = (name, threading.get_ident(), time.monotonic() + self.limit_seconds)
            self._raised = False
        self._write_record(name, started=started, deadline=started + self.limit_seconds)
        native = self.limit_seconds + STOP_GRACE_SECONDS + NATIVE_MARGIN_SECONDS
        faulthandler.dump_traceback_later(native, exit=True, file=sys.__stderr__ or 2)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            with self._lock:
                self._stage = None

    def set_release(self, release_id: str) -> None:
        self.release_id = release_id

    def close(self) -> None:
        """Stop the monitor, give the wake-up fd back and remove the run record."""
        self._closed.set()
        if self._signals is not None:
            self._signals.wake()  # the monitor may be in select() for up to a tick
        self._monitor.join(timeout=2 * MONITOR_TICK_SECONDS + 1.0)
        if self._signals is not None:
            self._signals.close()  # armed only when nobody else held the fd: it goes back to -1
            self._signals = None
        self._record_path.unlink(missing_ok=True)

    def __enter__(self) -> RunWatchdog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write_record(self, stage: str, *, started: float, deadline: float) -> None:
        record = RunRecord(
            **self._base,
            stage=stage,
            stage_started=started,
            deadline=deadline,
            release_id=self.release_id,
        )
        try:
            self._record_path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._record_path.with_suffix(".tmp")
            temporary.write_text(json.dumps(asdict(record)))
            temporary.replace(self._record_path)
        except OSError as error:  # the record helps `recover`; the limits hold without it
            logger.warning("run record not written (%s): %s", self._record_path, error.strerror)

    def _watch(self) -> None:
        while not self._closed.is_set():
            if self._signals is not None:
                if self._signals.received(MONITOR_TICK_SECONDS) and self._stop_deadline is None:
                    self._stop_deadline = time.monotonic() + STOP_GRACE_SECONDS
            else:
                self._closed.wait(MONITOR_TICK_SECONDS)
            self._check(time.monotonic())

    def _check(self, now: float) -> None:
        with self._lock:
            stage = self._stage
            raised = self._raised
        if self._stop_deadline is not None and now >= self._stop_deadline:
            name = stage[0] if stage else "(between stages)"
            self._hard_exit(
                f"stage {name!r} did not stop within {STOP_GRACE_SECONDS:g} s of a stop signal"
            )
        if stage is None:
            return
        name, thread_ident, deadline = stage
        if now < deadline:
            return
        message = (
            f"stage {name!r} exceeded its time limit of {self.limit_seconds:g} s "
            f"({STAGE_TIMEOUT_ENV}); the run stops, charges already made stay spent"
        )
        if not raised:
            StageTimeLimitExceeded.last_message = message
            logger.error("%s", message)
            _write_stderr(f"dprelease: {message}")
            with self._lock:
                self._raised = True
            _raise_in_thread(thread_ident, StageTimeLimitExceeded)
        elif now >= deadline + STOP_GRACE_SECONDS:
            self._hard_exit(f"{message} (it did not stop within {STOP_GRACE_SECONDS:g} s)")

    def _hard_exit(self, reason: str) -> None:
        _write_stderr(f"dprelease: {reason}; ending the process")
        if self.on_stop is not None:
            worker = threading.Thread(target=self.on_stop, args=(reason,), daemon=True)
            worker.start()
            worker.join(timeout=5.0)  # a locked catalog must not hold the exit
        with contextlib.suppress(Exception):
            sys.stderr.flush()
            sys.stdout.flush()
        os._exit(EXIT_STAGE_TIMEOUT)


class StopSignals:
    """A non-blocking socket pair whose writer is the signal wake-up fd, so a thread sees each
    SIGTERM/SIGINT at once, even while the main thread is inside one long C call."""

    def __init__(self) -> None:
        """Raises ``ValueError`` off the main thread."""
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        try:
            self.previous = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            self._close_sockets()
            raise

    def received(self, timeout: float) -> bool | None:
        """Whether SIGTERM or SIGINT arrived within ``timeout`` s; None when the socket failed."""
        try:
            ready, _, _ = select.select([self._reader], [], [], timeout)
            data = self._reader.recv(64) if ready else b""
        except OSError:
            return None
        return bytes([signal.SIGINT]) in data or bytes([signal.SIGTERM]) in data

    def wake(self) -> None:
        """End a waiting :meth:`received` now (with a byte that is no stop signal)."""
        with contextlib.suppress(OSError):  # full: a byte is already waiting
            self._writer.send(b"\0")

    def close(self) -> None:
        """Give the wake-up fd back to its previous owner."""
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(self.previous)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._reader.close()
        self._writer.close()


def _own_stop_signals() -> StopSignals | None:
    """:class:`StopSignals` for the watchdog, unless this is not the main thread or another guard
    (the CLI's Ctrl-C guard) already owns the wake-up fd."""
    try:
        signals = StopSignals()
    except ValueError:  # not the main thread
        return None
    if signals.previous != -1:  # someone else watches signals: give the fd back
        signals.close()
        return None
    return signals


def _raise_in_thread(thread_ident: int, kind: type[BaseException]) -> None:
    """Raise ``kind`` in the thread ``thread_ident`` at its next bytecode."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_ident), ctypes.py_object(kind))


def _write_stderr(text: str) -> None:
    with contextlib.suppress(Exception):
        os.write(2, (text + "\n").encode())


def inspect_runs(home: Path, *, now: float | None = None) -> list[RunProblem]:
    """Run records of this host whose process is gone, or alive but past its stage's deadline by
    more than the hard-exit grace (its own watchdog should have ended it)."""
    clock = time.time() if now is None else now
    host = socket.gethostname()
    problems = []
    folder = home / RUNS_FOLDER
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = RunRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being written, or not ours
        if record.host != host:
            continue
        if not _same_process_alive(record):
            problems.append(RunProblem(record=record, path=path, kind="gone"))
        elif clock > record.deadline + STOP_GRACE_SECONDS:
            problems.append(RunProblem(record=record, path=path, kind="stuck"))
    return problems


def stop_stuck(problem: RunProblem, *, grace: float = 5.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace``, the stuck run's process (only that exact process:
    pid and start time); True once it is gone."""
    record = problem.record
    return terminate(lambda: [record.pid] if _same_process_alive(record) else [], grace=grace)


def forget(problem: RunProblem) -> None:
    problem.path.unlink(missing_ok=True)


def _same_process_alive(record: RunRecord) -> bool:
    # exact start match: a record without one never matches a process procfs dates (no kill by a
    # bare, possibly reused pid)
    return is_alive(record.pid) and process_start(record.pid) == record.process_start
