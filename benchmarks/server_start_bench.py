"""Prefect server start-up: CPU until ``/api/health`` answers, with and without registering every
block type at start.

dprelease's own server (``flows/server.py``) and the test servers (``tests/prefect_template.py:
NO_BLOCK_REGISTRATION``) skip the registration; ``deploy/start-server.sh`` keeps it for the UI's
block catalogue.  Each start copies the migrated template database (``dprelease server prepare``)
into a new ``PREFECT_HOME``, as a new home does; the figure is the server process's user + system
time read from ``/proc`` once healthy (Linux).  Usage (from the repository root)::

    .venv/bin/python benchmarks/server_start_bench.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from count_bench import median_rows, print_table  # benchmarks/ is on sys.path when run as a script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.prefect_template import NO_BLOCK_REGISTRATION

START_TIMEOUT = 120.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def start_cpu(template: Path, extra: dict[str, str]) -> float:
    """CPU s of one ``prefect server start`` on a copy of ``template`` until it is healthy."""
    with tempfile.TemporaryDirectory(prefix="server-start-bench-") as home:
        shutil.copyfile(template, Path(home) / "prefect.db")
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PREFECT_HOME=home, DO_NOT_TRACK="1", PREFECT_UI_ENABLED="false", **extra)
        server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
             "--port", str(port), "--analytics-off", "--no-ui"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1):
                        return _cpu_seconds(server.pid)
                except OSError:
                    time.sleep(0.2)
            raise SystemExit(f"the server on port {port} did not answer in {START_TIMEOUT:.0f} s")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit(f"--repeats ({args.repeats}) must be >= 1")
    from dprelease.flows.server import prepare_template

    template, _ = prepare_template()
    results = {}
    for label, extra in (("registers block types", {}), ("skips them", NO_BLOCK_REGISTRATION)):
        results[label] = [start_cpu(template, extra) for _ in range(args.repeats)]
    rows = median_rows(results, baseline="registers block types")
    print(f"prefect server start on the migrated template, median of {args.repeats}")
    print_table(["start", "CPU s", "range", "vs registering"], rows)


if __name__ == "__main__":
    main()
