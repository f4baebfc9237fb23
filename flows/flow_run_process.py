"""The process of a deployed release: what the process worker runs for each flow run.

``dprelease deploy`` sets each deployment's job variable ``command`` to :data:`COMMAND`.  Left to
its default, Prefect's process worker (3.8) first starts a workspace supervisor in the new
process: it imports Prefect's client, prepares a working directory from the deployment
(dprelease's deployments name an installed module and have no pull steps), then execs ``python
-m prefect.engine``, which imports Prefect again and loads the flow itself
(``benchmarks/flow_run_start_bench.py`` measures the difference).  This module keeps what the
supervisor gives that matters here: the run gets a session (and process group) of its own, so a
paused run survives a stop of its worker and a signal to the worker's group does not reach it
(from ``setsid``, a few milliseconds after the start); then it execs the engine with the same
interpreter, keeping the pid the worker recorded.

What differs: for a configured command Prefect cancels a run by signalling its pid, not its
group.  SIGTERM lets the engine end what the run started (a Dask ``LocalCluster`` closes with
the flow); the SIGKILL that follows an engine that ignores it would leave such children behind.

``python`` in :data:`COMMAND` is found on the worker's ``PATH``: ``flows/worker_host.py`` (how
``deploy/start-worker.sh`` starts a worker) puts its own interpreter's folder first.

With a run starter beside the worker (``flows/run_starter.py``, its socket in
``DPRELEASE_RUN_STARTER_SOCKET``) this process asks it for the run instead: the starter forks a
process that has imported the engine and the flow already, with this process's stdin, stdout,
stderr, folder and environment.  This process then stands for the run: it passes on the signals
Prefect sends (SIGTERM, SIGINT, SIGHUP) and ends as the run ends, with its exit code or signal.
Whenever the starter is missing, refuses or fails before the fork, the engine starts here as above.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from dprelease.catalog.processes import is_alive
from dprelease.flows.run_starter import RUN_MODULE, SOCKET_ENV

COMMAND = "python -m dprelease.flows.flow_run_process"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
CONNECT_TIMEOUT_SECONDS = 5.0
ORPHAN_POLL_SECONDS = 0.5


def main(argv: list[str]) -> None:
    os.setsid()  # the worker starts us as a plain child, never a group leader: cannot fail
    module = argv[0] if argv else RUN_MODULE  # tests name a module of their own
    path = os.environ.get(SOCKET_ENV)
    if path:
        code = run_through_starter(Path(path), module)
        if code is not None:
            _end_like(code)
    os.execv(sys.executable, [sys.executable, "-m", module])


def run_through_starter(path: Path, module: str) -> int | None:
    """The run's exit code (negative: the signal that ended it), or None when the starter did not
    fork one (then nothing ran and the caller starts the engine itself)."""
    run_pid: list[int] = []
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if run_pid:
            os.kill(run_pid[0], signum)
        else:
            pending.append(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(CONNECT_TIMEOUT_SECONDS)
        try:
            connection.connect(str(path))
            request = {"module": module, "cwd": os.getcwd(), "env": dict(os.environ)}
            payload = json.dumps(request).encode() + b"\n"
            sent = socket.send_fds(connection, [payload], [0, 1, 2])
            if sent < len(payload):  # never an empty send: the starter may have answered and
                connection.sendall(payload[sent:])  # closed, and that send would fail (EPIPE)
            reply = _read_message(connection) or {"refused": f"no answer from {path}"}
        except OSError as exc:
            reply = {"refused": f"no answer from {path}: {type(exc).__name__}"}
        if not isinstance(reply.get("pid"), int):
            _note(f"the run starter did not fork ({reply.get('refused')}): the engine starts here")
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for signum in pending:  # a signal meant for a run that never started
                _end_like(-signum)
            return None
        run_pid.append(int(reply["pid"]))
        for signum in pending:
            os.kill(run_pid[0], signum)
        connection.settimeout(None)
        outcome = _read_message(connection)
    if outcome is None or not isinstance(outcome.get("exit"), int):
        _note(f"the run starter ended before run process {run_pid[0]}: waiting for the run")
        while is_alive(run_pid[0]):
            time.sleep(ORPHAN_POLL_SECONDS)
        return 1
    return int(outcome["exit"])


def _read_message(connection: socket.socket) -> dict[str, Any] | None:
    """The starter's next JSON line; None when it closed, broke the connection or sent garbage."""
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = connection.recv(4096)
            if not chunk:
                return None
            data += chunk
        message = json.loads(data)
    except (OSError, ValueError):
        return None
    return message if isinstance(message, dict) else None


def _end_like(code: int) -> None:
    """Exit as the run did: with its code, or killed by its signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1.0)  # pragma: no cover - the signal ends the process first
        os._exit(128 - code)  # pragma: no cover
    raise SystemExit(code)


def _note(message: str) -> None:
    sys.stderr.write(f"dprelease flow-run process {os.getpid()}: {message}\n")
    sys.stderr.flush()


if __name__ == "__main__":  # pragma: no cover - the process worker's entry point
    main(sys.argv[1:])
