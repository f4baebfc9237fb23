"""The run starter: a process beside each worker that has imported Prefect's engine and the deployed
flow once, and forks a flow-run process for each run the worker starts.

A flow-run process started fresh spends most of its CPU importing (Prefect's engine, numpy, scipy,
pyarrow, SQLAlchemy, dprelease's flow); ``benchmarks/flow_run_start_bench.py`` measures it.
``flows/worker_host.py`` starts this module as its child (it ends with the worker) and puts its
socket in ``DPRELEASE_RUN_STARTER_SOCKET``; the deployments' command
(``flows/flow_run_process.py``) asks it for a run process and falls back to starting the engine
itself whenever the starter is missing, refuses, or fails before the fork.

What a forked run gets, as a fresh process would: its own session and process group, the
requester's stdin/stdout/stderr (passed over the socket), working directory and environment,
Prefect's settings read again from that environment, and fresh random state (Python's ``random``
reseeds itself after ``fork``; numpy's legacy global state is reseeded here; noise comes from
OpenDP, which this process never imports, and ``os.urandom``).

Privacy and safety obligations:
* fork only from a single-threaded process: a preload that leaves a thread running turns the
  starter into a refuser (every run starts fresh);
* the run's environment must equal the starter's, as a process worker extends it (its Prefect
  settings as variables), except Prefect's per-run variables (``PREFECT__*``): what was read at
  import time stays true, and a refusal names the differing variables, never their values;
* the requester's death (Prefect's SIGKILL after a cancellation's grace period) kills its run; the
  starter's own end leaves runs alone (a paused run outlives a stopped worker, as before).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from dprelease.catalog.processes import send_line, service_log

SOCKET_ENV = "DPRELEASE_RUN_STARTER_SOCKET"
SWITCH_ENV = "DPRELEASE_RUN_STARTER"  # "off": every flow run starts fresh
RUN_MODULE = "prefect.engine"
# what every deployed release imports: the engine and the flow, and what the flow imports only
# when it runs (Arrow datasets to read the input, FastAPI's encoder for the flow's parameters,
# scipy's normal quantile for intervals), about 0.4 CPU-s per run.  Never OpenDP: the noise
# library is imported by each run itself (its randomness is the run's own).
PRELOAD = (
    "prefect.engine",
    "dprelease.flows.deployed_release",
    "pyarrow.dataset",
    "fastapi.encoders",
    "scipy.special",
)
PER_RUN_PREFIX = "PREFECT__"  # the worker's per-run variables (flow run id, control channel)
MAX_REQUEST_BYTES = 1 << 20
REQUEST_TIMEOUT_SECONDS = 5.0
PARENT_CHECK_SECONDS = 1.0
PRELOADED_WARNING = r".*found in sys\.modules after import of package"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """What a requester sends (public: a module name, a folder and its environment's names and
    values, which the worker gave it)."""

    module: str
    cwd: str
    env: dict[str, str]


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "").strip().lower() != "off"


def differing_variables(run_env: dict[str, str], starter_env: dict[str, str]) -> list[str]:
    """Names (never values) of the variables, other than ``PREFECT__*``, that differ."""
    names = set(run_env) | set(starter_env)
    return sorted(
        name
        for name in names
        if not name.startswith(PER_RUN_PREFIX) and run_env.get(name) != starter_env.get(name)
    )


def parse_request(raw: bytes) -> RunRequest:
    """One request line: ``{"module": str, "cwd": str, "env": {str: str}}``."""
    message = json.loads(raw)
    if not isinstance(message, dict):
        raise ValueError("request: must be a JSON object")
    module, cwd, env = message.get("module"), message.get("cwd"), message.get("env")
    if not isinstance(module, str) or not isinstance(cwd, str):
        raise ValueError("request: module and cwd must be strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("request: env must map strings to strings")
    return RunRequest(module=module, cwd=cwd, env=env)


def _log(message: str) -> None:
    service_log("run starter", message)


class Starter:
    """The serving loop: single-threaded, so that each fork copies one consistent thread."""

    def __init__(self, path: Path, *, parent_pid: int, run_module: str) -> None:
        self.path = path
        self.parent_pid = parent_pid
        self.run_module = run_module
        self.pid = os.getpid()
        self.env = dict(os.environ)
        self.refusal: str | None = None  # set when forking is unsafe: every request refused
        # run pid -> its requester's connection (None once the requester ended)
        self.runs: dict[int, socket.socket | None] = {}
        self.stops: list[int] = []

    def preload(self, modules: list[str]) -> None:
        """Import what every run imports, once; forking stays allowed only with one thread."""
        for name in modules:
            importlib.import_module(name)
        if "prefect.settings" in sys.modules:
            from prefect.settings import get_current_settings

            # a process worker gives each run its own settings as variables as well
            self.env.update(get_current_settings().to_environment_variables(exclude_unset=True))
        # what the preload made moves to the permanent generation: a run's collections neither
        # scan nor copy it (copy-on-write pages stay shared), O(objects) once here
        gc.freeze()
        if threading.active_count() > 1:
            names = ", ".join(sorted(t.name for t in threading.enumerate()))
            self.refusal = f"threads run after the preload ({names}): forking is unsafe"
            _log(f"{self.refusal}; every run starts fresh")

    def serve(self) -> tuple[RunRequest, list[int]] | None:
        """Serve until stopped or the parent is gone (None); in a forked run process, return
        ``(request, [stdin, stdout, stderr])``."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)  # SIGCHLD and stop signals wake select
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda received, _frame: self.stops.append(received))
        self.path.unlink(missing_ok=True)  # a socket left by a killed starter
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        previous = os.umask(0o177)  # the socket file is created 0600
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(previous)
        listener.listen(16)
        _log(f"listening on {self.path}")
        started: tuple[RunRequest, list[int]] | None = None
        try:
            while started is None and not self.stops and os.getppid() == self.parent_pid:
                watched = [listener, wake_read, *filter(None, self.runs.values())]
                try:
                    ready, _, _ = select.select(watched, [], [], PARENT_CHECK_SECONDS)
                except InterruptedError:
                    continue
                if wake_read in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_read, 512)
                self._reap()
                for connection in ready:
                    if connection is listener:
                        started = self._accept(listener, (wake_read, wake_write))
                    elif isinstance(connection, socket.socket):
                        self._requester_gone(connection)
                    if started is not None:
                        break
        finally:
            if os.getpid() == self.pid:  # the starter (a run process closed these already)
                signal.set_wakeup_fd(-1)
                listener.close()
                self.path.unlink(missing_ok=True)
                for connection in filter(None, self.runs.values()):
                    connection.close()  # the runs go on; their requesters wait for them
        return started

    def _accept(
        self, listener: socket.socket, wake: tuple[int, int]
    ) -> tuple[RunRequest, list[int]] | None:
        connection, _ = listener.accept()
        connection.settimeout(REQUEST_TIMEOUT_SECONDS)
        fds: list[int] = []
        try:
            data = b""
            while not data.endswith(b"\n") and len(data) < MAX_REQUEST_BYTES:
                chunk, received, _, _ = socket.recv_fds(connection, 65536, 3)
                fds.extend(received)
                if not chunk:
                    break
                data += chunk
            request = parse_request(data)
            if len(fds) != 3:
                raise ValueError(f"request: {len(fds)} file descriptors passed, 3 expected")
        except (OSError, ValueError) as exc:
            _log(f"bad request refused: {type(exc).__name__}")  # the type only
            send_line(connection, {"refused": "bad request"})
            _close(connection, fds)
            return None
        reason = self._refusal_for(request)
        if reason is not None:
            _log(f"run refused, it starts fresh: {reason}")
            send_line(connection, {"refused": reason})
            _close(connection, fds)
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the run process: nothing of the starter's stays open in it
            os.setsid()  # first: a session and process group of its own, as a fresh run has
            signal.set_wakeup_fd(-1)
            for fd in wake:
                os.close(fd)
            for other in [listener, connection, *filter(None, self.runs.values())]:
                other.close()
            self.runs.clear()
            for signum in (*STOP_SIGNALS, signal.SIGCHLD):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            return request, fds
        _close(None, fds)
        connection.settimeout(None)
        send_line(connection, {"pid": pid})
        self.runs[pid] = connection
        return None

    def _refusal_for(self, request: RunRequest) -> str | None:
        if self.refusal is not None:
            return self.refusal
        if request.module != self.run_module:
            return f"module {request.module!r} is not this starter's ({self.run_module!r})"
        differing = differing_variables(request.env, self.env)
        if differing:
            return "environment differs from the starter's in " + ", ".join(differing)
        return None

    def _reap(self) -> None:
        while self.runs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = self.runs.pop(pid, None)
            if connection is not None:
                send_line(connection, {"exit": os.waitstatus_to_exitcode(status)})
                connection.close()

    def _requester_gone(self, connection: socket.socket) -> None:
        """A requester says nothing after its request: readable means it ended (Prefect's
        SIGKILL after a cancellation's grace period), and its run ends with it."""
        for pid, owned in self.runs.items():
            if owned is connection:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _log(f"the requester of run process {pid} ended: run process killed")
                connection.close()
                self.runs[pid] = None  # reaped later
                return


def _close(connection: socket.socket | None, fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    if connection is not None:
        connection.close()


def run(request: RunRequest, fds: list[int]) -> int:
    """In a forked run process: become the requester's run and run ``request.module`` as
    ``__main__`` (its ``SystemExit`` ends the process, as it ends ``python -m``)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    starter_folder = os.getcwd()
    os.chdir(request.cwd)
    if sys.path and sys.path[0] == starter_folder:  # ``python -m`` puts its folder first
        sys.path[0] = request.cwd
    os.environ.clear()
    os.environ.update(request.env)
    if "prefect.context" in sys.modules:  # settings from this run's environment
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()
    if "numpy" in sys.modules:  # numpy's legacy global state from OS entropy, as in a new process
        import numpy

        numpy.random.seed()
    sys.argv = [request.module]  # as ``python -m MODULE``: no argument of the starter's
    with warnings.catch_warnings():
        # the module was imported by the preload on purpose; its ``__main__`` copy runs alone
        warnings.filterwarnings("ignore", PRELOADED_WARNING, RuntimeWarning)
        runpy.run_module(request.module, run_name="__main__", alter_sys=True)
    return 0


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dprelease.flows.run_starter")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--run-module", default=RUN_MODULE)
    parser.add_argument("--preload", action="append", help=f"default: {', '.join(PRELOAD)}")
    args = parser.parse_args(argv)
    starter = Starter(args.socket, parent_pid=args.parent_pid, run_module=args.run_module)
    starter.preload(args.preload or list(PRELOAD))
    started = starter.serve()
    return 0 if started is None else run(*started)


if __name__ == "__main__":  # pragma: no cover - the starter's entry point
    raise SystemExit(main(sys.argv[1:]))
