"""``flows/worker_host.py``: a command (the Prefect worker) run with a validation service beside it.

The command keeps the launcher's pid (what ``deploy/start-worker.sh`` records), sees the service's
socket in ``DPRELEASE_VALIDATION_SOCKET`` and validates there without importing Great Expectations
itself; the service ends with the command; with the service switched off the command runs alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dprelease.flows.worker_host import worker_socket

SECONDS = 120.0  # GX's import in the service on a busy 2-core machine

# the stand-in for a worker's flow run: validate one table through run_suites and report
FLOW_RUN = """
import json, os, sys
import pyarrow as pa
from dprelease.catalog.validation import service
from dprelease.catalog.validation.checks import table_expectations
table = pa.table({
    "v": [0, 1], "estimate": [1.0, 2.0], "std_error": [1.0, 1.0], "ci_low": [0.0, 1.0],
    "ci_high": [2.0, 3.0], "uncertainty": ["noise-only", "noise-only"],
})
jobs = [("t", table.to_pandas(), table_expectations(table, expected_rows=2))]
summaries = service.run_suites(jobs)
print(json.dumps({
    "pid": os.getpid(),
    "socket": os.environ.get("DPRELEASE_VALIDATION_SOCKET"),
    "gx_here": "great_expectations" in sys.modules,
    "success": summaries["t"]["success"],
    "path": os.environ["PATH"],
}))
"""


def _launch(
    home: Path, *command: str, service: str = "on"
) -> tuple[subprocess.CompletedProcess[str], int]:
    env = {**os.environ, "DPRELEASE_HOME": str(home), "DPRELEASE_VALIDATION_SERVICE": service}
    env.pop("DPRELEASE_VALIDATION_SOCKET", None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dprelease.flows.worker_host", "--", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = launcher.communicate(timeout=SECONDS)
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, out, err), launcher.pid


def test_the_command_keeps_the_pid_and_validates_in_the_service(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done, pid = _launch(home, sys.executable, "-c", FLOW_RUN)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["pid"] == pid  # exec: the worker is the process start-worker.sh recorded
    assert report["socket"] == str(worker_socket(home, pid))
    assert report["success"] is True
    assert report["gx_here"] is False  # validated in the service: GX never imported here
    # `python` in the deployments' command (flows/flow_run_process.py) is the worker's interpreter
    assert report["path"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert "validated 1 suite(s)" in done.stderr  # the service's log line (no table value)
    deadline = time.monotonic() + 30
    while Path(report["socket"]).exists():  # the service ends with its parent, socket removed
        assert time.monotonic() < deadline, "the validation service outlived its worker"
        time.sleep(0.1)


def test_with_the_service_off_the_command_runs_alone(tmp_path: Path) -> None:
    done, pid = _launch(tmp_path / "home", sys.executable, "-c", FLOW_RUN, service="off")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["pid"] == pid
    assert report["socket"] is None
    assert report["gx_here"] is True  # no service: validated in its own process
    assert report["success"] is True


def test_a_flow_runs_process_leads_its_own_session_and_execs_the_engine() -> None:
    """flows/flow_run_process.py (the deployments' ``command``): setsid, then ``python -m
    prefect.engine`` with the same interpreter (``execv`` stubbed to report instead)."""
    probe = (
        "import json, os, sys\n"
        "from dprelease.flows import flow_run_process\n"
        "def report(path, argv):\n"
        "    print(json.dumps({'leader': os.getsid(0) == os.getpid() == os.getpgid(0),"
        " 'path': path, 'argv': argv}))\n"
        "    sys.exit(0)\n"
        "os.execv = report\n"
        "flow_run_process.main([])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["leader"] is True
    assert report["path"] == sys.executable
    assert report["argv"] == [sys.executable, "-m", "prefect.engine"]


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    done, _ = _launch(tmp_path / "home")
    assert done.returncode == 2
    assert "usage: python -m dprelease.flows.worker_host -- COMMAND" in done.stderr
