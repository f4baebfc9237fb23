"""Stage time limits, a signal backstop and run records: a release run never hangs for good.

Every stage of the ``release`` flow runs inside :meth:`RunWatchdog.stage`, which gives it a time
limit (``DPRELEASE_STAGE_TIMEOUT`` seconds, default :data:`DEFAULT_STAGE_TIMEOUT_SECONDS`) and
three ways out, each for a worse case than the one before:

1. **Python-level stop.**  At the limit the monitor thread logs which stage ran out of time and
   raises :class:`StageTimeLimitExceeded` in the stage's thread (``PyThreadState_SetAsyncExc``):
   the flow marks its release ``failed`` (charges kept) and Prefect records the failure with that
   message.  The same thread watches SIGTERM/SIGINT (through the signal wake-up fd, when nobody
   else owns it): a stop signal that Prefect's handler has not turned into an exit within
   :data:`STOP_GRACE_SECONDS` is treated like a timed-out stage.
2. **Hard exit.**  A stage still running :data:`STOP_GRACE_SECONDS` later (its thread is inside
   one long C call) is ended with ``os._exit(EXIT_STAGE_TIMEOUT)`` after the release is marked
   ``failed`` (bounded: a locked catalog must not hold the exit).
3. **Native backstop.**  Both of the above need the interpreter.  When native code holds it (the
   deadlock an import thread once caused: a ``dlopen`` on one thread holding the GIL against
   ``dl_iterate_phdr`` on another), ``faulthandler``'s C watchdog thread, armed for every stage
   :data:`NATIVE_MARGIN_SECONDS` after the hard exit would have happened, writes every thread's
   stack to standard error and ends the process.  ``dprelease recover`` then moves the release.

Run records: while a stage runs, ``$DPRELEASE_HOME/run/releases/<pid>.json`` names the process
(pid, host, start time), the spec, the release (once registered), the stage and its deadline.
:func:`inspect_runs` (``dprelease recover``) finds runs whose process is gone and runs whose
process is alive but past its deadline (stuck); :func:`stop_stuck` ends the latter.  Records hold
public facts only.

The monitor thread imports nothing after it starts (no import may run beside native loaders).
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


def runs_folder(home: Path) -> Path:
    return home / RUNS_FOLDER


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
        self._record_path = runs_folder(home) / f"{os.getpid()}.json"
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
        self._signals: tuple[socket.socket, socket.socket] | None = None
        self._arm_signals()
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
        self._monitor.join(timeout=2 * MONITOR_TICK_SECONDS + 1.0)
        self._disarm_signals()
        with contextlib.suppress(FileNotFoundError):
            self._record_path.unlink()

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

    def _arm_signals(self) -> None:
        """Watch SIGTERM/SIGINT through the wake-up fd, unless this is not the main thread or
        another guard (the CLI's Ctrl-C guard) already owns the fd."""
        if threading.current_thread() is not threading.main_thread():
            return
        opened = wakeup_socket()
        if opened is None:  # pragma: no cover - not the main thread after all
            return
        reader, writer, previous = opened
        if previous != -1:  # someone else watches signals: give the fd back
            signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            return
        self._signals = (reader, writer)

    def _disarm_signals(self) -> None:
        if self._signals is None:
            return
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)  # armed only when nobody else held the fd
        for sock in self._signals:
            sock.close()
        self._signals = None

    def _watch(self) -> None:
        stop_signals = {bytes([signal.SIGTERM]), bytes([signal.SIGINT])}
        while not self._closed.is_set():
            if self._signals is not None:
                try:
                    ready, _, _ = select.select([self._signals[0]], [], [], MONITOR_TICK_SECONDS)
                    data = self._signals[0].recv(64) if ready else b""
                except OSError:
                    data = b""
                if any(sig in data for sig in stop_signals) and self._stop_deadline is None:
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


def wakeup_socket() -> tuple[socket.socket, socket.socket, int] | None:
    """(reader, writer, previous fd): a non-blocking socket pair whose writer is now the signal
    wake-up fd, so a thread sees each signal number at once; None off the main thread."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:
        reader.close()
        writer.close()
        return None
    return reader, writer, previous


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
    folder = runs_folder(home)
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
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _same_process_alive(record):
            return True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(record.pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _same_process_alive(record):
            time.sleep(0.05)
    return not _same_process_alive(record)


def forget(problem: RunProblem) -> None:
    with contextlib.suppress(FileNotFoundError):
        problem.path.unlink()


def _same_process_alive(record: RunRecord) -> bool:
    # exact start match: a record without one never matches a process procfs dates (no kill by a
    # bare, possibly reused pid)
    return is_alive(record.pid) and process_start(record.pid) == record.process_start
