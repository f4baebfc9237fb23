"""Ctrl-C (or SIGTERM) during a release: out within 5 s, the release ``aborted``, no child left.

The CLI's side, independent of the flow's cooperation: :func:`abort_own_releases` moves the
releases this process holds in ``measuring`` to ``aborted`` (the ledger is untouched: charges stay
spent); :class:`InterruptGuard` does that on ``KeyboardInterrupt``, stops this process's children
and raises :class:`Interrupted`.  In the console script a watchdog thread reads the signal wake-up
fd (so it runs while the main thread is inside one long C call), records the abort at the first
Ctrl-C and, ``GRACE_SECONDS`` later or at a second Ctrl-C, cleans up itself and ``os._exit(130)``.
The shared Prefect server runs in its own session: it is not a child to stop.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from dprelease.catalog.processes import is_alive, live_processes
from dprelease.flows.errors import EXIT_INTERRUPTED, debug_enabled
from dprelease.flows.server import terminate
from dprelease.flows.watchdog import StopSignals

GRACE_SECONDS = 3.5  # + at most ~1 s of clean-up: exit within 5 s of the first Ctrl-C
CLEANUP_SECONDS = 0.8
CHILD_GRACE_SECONDS = 0.3

_hard_exit_allowed = False


def allow_hard_exit() -> None:
    """Called by the console script: the watchdog may end this process (never inside pytest)."""
    global _hard_exit_allowed
    _hard_exit_allowed = True


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the command; the message says what was recorded."""


def abort_own_releases(catalog_url: str | None = None) -> list[str]:
    """After Ctrl-C: move this process's ``measuring`` or ``failed`` releases to ``aborted``
    (charges stay); return the ids of all its aborted releases.

    ``failed`` too: Prefect can turn the interrupt into another exception (a ``KeyboardInterrupt``
    while a task run is being created ends as ``ValueError: Task run is not set``), so the flow
    recorded a failure that was an abort.  Called only once this process has seen a SIGINT.
    """
    from dprelease.catalog.ledger.leases import process_owner
    from dprelease.catalog.ledger.store import Catalog

    catalog = Catalog(catalog_url)
    owner = process_owner()
    mine = (owner["owner_pid"], owner["owner_host"], owner["owner_start"])
    aborted = []
    for record in catalog.releases():
        if (record.owner_pid, record.owner_host, record.owner_start) != mine:
            continue
        if record.status in ("measuring", "failed"):
            with contextlib.suppress(Exception):
                catalog.mark_interrupted(record.id)  # `recover` says aborted even if we die now
            catalog.update_release(record.id, status="aborted")
        if record.status in ("measuring", "failed", "aborted"):  # aborted: by the flow itself
            aborted.append(record.id)
    return aborted


def stop_own_children(*, grace: float = CHILD_GRACE_SECONDS) -> list[int]:
    """SIGTERM (then SIGKILL) this process's descendants in its own session (not the shared
    Prefect server, in its own); return their pids."""
    victims = _descendants(os.getpid())
    terminate(lambda: [pid for pid in victims if is_alive(pid)], grace=grace)
    return victims


def _descendants(root: int) -> list[int]:
    session = os.getsid(0)
    parents: dict[int, list[int]] = {}
    for pid, fields in live_processes():  # nothing without procfs
        if int(fields[3]) == session:
            parents.setdefault(int(fields[1]), []).append(pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found.extend(children)
        frontier.extend(children)
    return found


def _ignore(signum: int, frame: FrameType | None) -> None:
    """SIGINT while cleaning up after the first one: the watchdog (wake-up fd) still sees it."""


def _caused_by_interrupt(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _describe(aborted: list[str]) -> str:
    if not aborted:
        return "no release was being measured; nothing was charged by this command"
    names = ", ".join(aborted)
    return f"release {names} recorded as aborted; its privacy charges stay spent"


def _in_background(target: Callable[[], object]) -> threading.Thread:
    """The watchdog's clean-up, on a daemon thread: the abort recorded at the first Ctrl-C, the
    whole clean-up before a hard exit."""
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    return worker


class InterruptGuard:
    """``with InterruptGuard(): release_flow(...)``: see the module docstring."""

    def __init__(
        self, *, catalog_url: str | None = None, write: Callable[[str], None] | None = None
    ):
        self.catalog_url = catalog_url
        self.write = write or (lambda text: sys.stderr.write(text + "\n"))
        self._done = threading.Event()
        self._cleaned = threading.Lock()
        self._aborted: list[str] | None = None
        self._signals: StopSignals | None = None
        self._thread: threading.Thread | None = None
        self._previous_handler: Any = None
        self.sigint_seen = False

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
            if _hard_exit_allowed:
                # what the watchdog's clean-up needs, imported here: its threads import nothing
                import dprelease.catalog.ledger.store  # noqa: F401

                self._signals = StopSignals()
                self._thread = threading.Thread(
                    target=self._watch, name="dprelease-ctrl-c", daemon=True
                )
                self._thread.start()
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        interrupted = exc is not None and (self.sigint_seen or _caused_by_interrupt(exc))
        if self._previous_handler is not None:
            # after an interrupt a second Ctrl-C must not break the clean-up: the watchdog answers
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGINT, _ignore if interrupted else self._previous_handler)
            self._previous_handler = None
        if interrupted:
            aborted = self._clean_up()
            # the watchdog stays armed until the process is gone: exit hooks must not hang it
            raise Interrupted(_describe(aborted)) from None
        self._disarm()
        return False

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.sigint_seen = True  # whatever exception Prefect turns the interrupt into
        raise KeyboardInterrupt

    def _record_abort(self) -> list[str]:
        with self._cleaned:  # idempotent: at the first Ctrl-C and again in the clean-up
            self._aborted = abort_own_releases(self.catalog_url)
            return self._aborted

    def _record_abort_early(self) -> None:
        with contextlib.suppress(Exception):  # the clean-up tries again and reports a failure
            self._record_abort()

    def _clean_up(self) -> list[str]:
        try:
            aborted = self._record_abort()
        except Exception as error:  # reporting must not hide the interrupt
            self.write(
                f"could not record the abort ({type(error).__name__}); `dprelease recover` will"
            )
            aborted = self._aborted or []
        stop_own_children()
        return aborted

    def _disarm(self) -> None:
        if self._thread is None:
            return
        self._done.set()
        self._thread.join(timeout=1.0)
        self._thread = None
        if self._signals is not None:
            self._signals.close()
            self._signals = None

    def _watch(self) -> None:
        if self._signals is None:
            return
        signals = self._signals
        deadline: float | None = None
        while not self._done.is_set():
            timeout = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
            received = signals.received(timeout)
            if received is None:
                return
            if received:
                if deadline is not None:  # a second Ctrl-C: stop now
                    self._hard_exit()
                deadline = time.monotonic() + GRACE_SECONDS
                # recorded now: the hard exit's CLEANUP_SECONDS may be too short under load
                _in_background(self._record_abort_early)
            if deadline is not None and time.monotonic() >= deadline:
                self._hard_exit()

    def _hard_exit(self) -> None:
        """The main thread did not get out in time: clean up from here and end the process."""
        # bounded: a locked catalog must not hold the exit
        _in_background(self._clean_up).join(timeout=CLEANUP_SECONDS)
        aborted = self._aborted
        if debug_enabled():  # where the main thread was stuck
            with contextlib.suppress(Exception):
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        detail = (
            "could not record the abort in time; `dprelease recover` will"
            if aborted is None
            else _describe(aborted)
        )
        with contextlib.suppress(Exception):
            self.write(f"interrupted: {detail}")
            sys.stderr.flush()
            sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)
