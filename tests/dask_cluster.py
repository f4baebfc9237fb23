"""A real Dask cluster on loopback for tests: ``dask scheduler`` + two ``dask worker`` processes.

Started with the ``dask`` CLI of this virtualenv (the same one a deployment uses), each process in
its own session; start-up waits are bounded; every process is stopped by its PID (SIGTERM, then
SIGKILL after a bounded wait), also when start-up fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
DASK = str(Path(sys.executable).with_name("dask"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)


@contextmanager
def dask_cluster(log_dir: Path, *, workers: int = 2, memory_limit: str = "2GB") -> Iterator[str]:
    """Yield the scheduler address ``tcp://127.0.0.1:PORT`` once ``workers`` workers joined."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> None:
        with open(log_dir / f"{name}.log", "wb") as log:
            processes.append(
                subprocess.Popen(  # fixed argv: this venv's dask CLI
                    [DASK, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    try:
        start(
            "scheduler",
            ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0"],
        )
        for k in range(workers):
            start(
                f"worker{k}",
                [
                    "worker",
                    address,
                    "--host",
                    "127.0.0.1",
                    "--nworkers",
                    "1",
                    "--nthreads",
                    "1",
                    "--memory-limit",
                    memory_limit,
                    "--no-dashboard",
                    "--local-directory",
                    str(log_dir / f"worker{k}-space"),
                ],
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        client = None
        while client is None:
            if any(p.poll() is not None for p in processes):
                raise RuntimeError(f"a dask process exited during start-up; logs in {log_dir}")
            try:
                client = Client(address, timeout=5, set_as_default=False)
            except (OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no dask scheduler at {address} after {START_TIMEOUT_S} s"
                    ) from None
        try:
            client.wait_for_workers(workers, timeout=max(1.0, deadline - time.monotonic()))
        finally:
            client.close()
        yield address
    finally:
        for process in reversed(processes):
            _stop(process)
