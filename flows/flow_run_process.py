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
"""

from __future__ import annotations

import os
import sys

COMMAND = "python -m dprelease.flows.flow_run_process"


def main() -> None:
    os.setsid()  # the worker starts us as a plain child, never a group leader: cannot fail
    os.execv(sys.executable, [sys.executable, "-m", "prefect.engine"])


if __name__ == "__main__":  # pragma: no cover - the process worker's entry point
    main()
