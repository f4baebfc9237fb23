"""Run a Prefect worker with a Great Expectations validation service beside it.

``python -m dprelease.flows.worker_host -- prefect worker start --pool NAME ...`` starts
``python -m dprelease.catalog.validation.service`` as its child on a socket of its own
(:func:`worker_socket`), puts the socket in ``DPRELEASE_VALIDATION_SOCKET`` and then *execs* the
command: the worker keeps this process's pid (what ``deploy/start-worker.sh`` records), the service
stays its child, and every flow-run process the worker starts inherits the variable.  A deployed
release then validates in the service, where GX is imported once per worker, instead of importing
GX (seconds of CPU) in every flow-run process.

The service ends with the worker: it gets SIGTERM when its parent dies (``PR_SET_PDEATHSIG``) and
checks its parent pid every second.  ``DPRELEASE_VALIDATION_SERVICE=off`` (a host short of the
memory GX keeps) runs the command alone; a run then validates in its own process, as it does
whenever the service is missing, still importing past its wait, or fails.

Beside the service it starts the run starter (``flows/run_starter.py``, socket in
``DPRELEASE_RUN_STARTER_SOCKET``): a process that has imported Prefect's engine and the deployed
flow once and forks each flow-run process from that state.  ``DPRELEASE_RUN_STARTER=off`` leaves it
out; every run then starts a fresh interpreter.

The launcher is replaced by the worker at once; it imports only ``flows.server`` and the
service's marker helpers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dprelease.catalog.validation import service as validation_service
from dprelease.flows import run_starter
from dprelease.flows.server import (
    VALIDATION_SOCKET_ENV,
    service_enabled,
    spawn_child,
    spawn_validation_service,
    state_home,
    validation_socket,
)


def worker_socket(home: Path, pid: int) -> Path:
    """``home/run/worker-<pid>-validation.sock`` (or its short stand-in): one per worker, so two
    workers of one home, or a worker beside the shared server's service, never share a socket."""
    return validation_socket(home / "run", name=f"worker-{pid}-validation.sock")


def starter_socket(home: Path, pid: int) -> Path:
    """``home/run/worker-<pid>-starter.sock`` (or its short stand-in): the worker's run starter."""
    return validation_socket(home / "run", name=f"worker-{pid}-starter.sock")


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        sys.stderr.write(
            "usage: python -m dprelease.flows.worker_host -- COMMAND [ARGS...] (the command to run "
            "with a validation service beside it, e.g. prefect worker start --pool NAME)\n"
        )
        return 2
    if service_enabled():
        path = worker_socket(state_home(), os.getpid())
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        service = spawn_validation_service(path)
        # a flow run started before the service names itself waits for it instead of importing
        # GX beside it
        validation_service.write_start_marker(
            validation_service.start_marker(path), pid=service.pid
        )
        os.environ[VALIDATION_SOCKET_ENV] = str(path)
    # ``python`` in the deployments' command (flows/flow_run_process.py) is this interpreter
    os.environ["PATH"] = os.pathsep.join(
        [
            os.path.dirname(sys.executable),
            *filter(None, os.environ.get("PATH", "").split(os.pathsep)),
        ]
    )
    if run_starter.enabled():
        path = starter_socket(state_home(), os.getpid())
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # set before the spawn: the starter's environment is the one the worker gives its runs
        os.environ[run_starter.SOCKET_ENV] = str(path)
        spawn_child(
            [sys.executable, "-m", "dprelease.flows.run_starter", "--socket", str(path),
             "--parent-pid", str(os.getpid())]
        )  # fmt: skip
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], command)  # the worker keeps this pid; the service stays its child
    return 1  # pragma: no cover - execvp does not return


if __name__ == "__main__":  # pragma: no cover - the launcher's entry point
    raise SystemExit(main(sys.argv[1:]))
