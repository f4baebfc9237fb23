"""Failures of the real ``dprelease`` program (issue 13 item 4, issue 14 item 3), in subprocesses.

* a spec error is reported before prefect (or Great Expectations, matplotlib) is imported and
  before any server starts, as one short block, exit 2;
* an internal error is one line pointing to a log that holds the traceback (no data value), exit 1;
* a data error found inside the Prefect flow is as short as a spec error (Prefect's own console
  traceback is not shown);
* Ctrl-C during ``run`` exits within 5 s with 130, the release is ``aborted`` with its charges kept,
  and no process of the command is left (the shared server, in its own session, stays up).

All runs share one state home and so one local Prefect server, stopped by PID at the end.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dprelease.catalog import processes
from dprelease.flows import server
from dprelease.flows.cli.release import bundled_spec
from tests.flows.conftest import write_spec

pytestmark = pytest.mark.flow
ROOT = Path(__file__).resolve().parents[2]
DPRELEASE = str(Path(sys.executable).parent / "dprelease")
HEAVY = ("prefect", "great_expectations", "matplotlib")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One state home for the module; its shared Prefect server is stopped by PID at the end."""
    state = tmp_path_factory.mktemp("cli-failures") / "home"
    saved = {
        k: os.environ.get(k) for k in ("DPRELEASE_HOME", "DPRELEASE_CACHE_DIR", "PREFECT_HOME")
    }
    os.environ["DPRELEASE_HOME"] = str(state)
    # a cache of the migrated Prefect database, shared by test runs (keyed by Prefect's version)
    os.environ["DPRELEASE_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / "dprelease-test-cache")
    os.environ.pop("PREFECT_HOME", None)
    try:
        yield state
    finally:
        record = server.read_record(state) if state.exists() else None
        if record is not None:
            server.stop_processes(record, grace=5)
            assert not server.group_members(record.pid)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _env() -> dict[str, str]:
    env = {**os.environ}
    for key in ("PREFECT_API_URL", "DPRELEASE_DEBUG", "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"):
        env.pop(key, None)
    return env


def _run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=_env(), cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


def _program(snippet: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``snippet`` in a fresh interpreter (``app()`` as the console script does)."""
    return _run(sys.executable, "-c", snippet, *args)


AS_PROGRAM = f"""
import json, sys
from dprelease.flows.cli import app
sys.argv = ["dprelease", *sys.argv[1:]]
try:
    app()
    code = 0
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


def _verdict(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_spec_error_is_reported_before_prefect_or_a_server(tmp_path: Path, home: Path) -> None:
    spec = yaml.safe_load(bundled_spec().read_text())
    spec["privacy"] = {"epsilon": -1}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    result = _program(AS_PROGRAM, "run", str(bad))
    assert _verdict(result) == {"code": 2, "heavy": []}
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[-1].startswith("what to do: ")
    assert len(lines) <= 5 and "Traceback" not in result.stderr
    assert not (home / server.SERVER_FILE).exists() and not (home / "prefect").exists()


def test_plan_imports_no_orchestration_or_validation_library(tmp_path: Path, home: Path) -> None:
    spec = {
        "name": "small",
        "dataset": {"id": "small", "budget": {"epsilon": 1}},
        "domain": {"v": {"min": 1, "max": 8}},
        "workload": [{"name": "all", "all_ranges": ["v"]}],
        "mechanism": "identity",
        "privacy": {"epsilon": 0.5},
    }
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = _program(AS_PROGRAM, "plan", str(path), "--json")
    assert _verdict(result) == {"code": 0, "heavy": []}, result.stderr


def test_internal_error_is_one_line_and_a_log_with_the_traceback(home: Path) -> None:
    snippet = (
        "import dprelease.catalog.planning.planner\n"
        "def broken(*a, **k):\n"
        "    raise ValueError('row 4242 is odd')\n"
        "dprelease.catalog.planning.planner.make_plan = broken\n" + AS_PROGRAM
    )
    result = _program(snippet, "plan", str(bundled_spec()))
    assert _verdict(result)["code"] == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "internal error: ValueError; the traceback is in "
    )
    log = Path(lines[0].split("the traceback is in ")[1].split(" (or run with --debug)")[0])
    assert log.parent == home / "logs" and log.name.startswith("dprelease-")
    text = log.read_text()
    assert "Traceback (most recent call last):" in text and "in broken" in text
    assert "builtins.ValueError: (message withheld" in text
    assert "row 4242 is odd'" not in text.split("raise ValueError(")[0]  # only the code line


def test_data_error_inside_the_flow_is_short(
    tmp_path: Path, tiny_dataset: Path, home: Path
) -> None:
    spec_path = write_spec(
        tmp_path,
        tiny_dataset,
        domain={
            "a": {"min": 0, "max": 4},
            "b": {"values": ["x", "y", "z"]},
            "c": {"min": 0, "max": 3},
        },
        workload=[{"name": "a_by_b", "marginal": ["a", "b"]}],
        mechanism="identity",
    )
    result = _run(DPRELEASE, "run", str(spec_path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and "| ERROR" not in result.stderr
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(errors) == 1 and "'a'" in lines[errors[0]]
    assert lines[-1].startswith("what to do: ") and len(lines) - errors[0] <= 4


def test_ctrl_c_during_run_aborts_within_5_s_and_leaves_no_process(
    tmp_path: Path, tiny_dataset: Path, home: Path
) -> None:
    spec_path = write_spec(tmp_path, tiny_dataset, mechanism="identity")
    command = subprocess.Popen(
        [DPRELEASE, "run", str(spec_path), "--out", str(tmp_path / "out")],
        env=_env(),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own session, like a terminal's foreground job
    )
    try:
        release_id, charges = _wait_for_measuring(home / "catalog.db", command, timeout=300)
        interrupted = time.monotonic()
        os.killpg(command.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        _, err = command.communicate(timeout=30)
        elapsed = time.monotonic() - interrupted
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait(timeout=30)
    assert command.returncode == 130, err
    assert elapsed < 5.0, f"took {elapsed:.1f} s to exit after Ctrl-C"
    assert f"release {release_id} recorded as aborted; its privacy charges stay spent" in err
    assert "Traceback" not in err
    with sqlite3.connect(home / "catalog.db") as db:
        status = db.execute("select status from releases where id = ?", (release_id,)).fetchone()
        after = db.execute(
            "select count(*) from ledger where release_id = ?", (release_id,)
        ).fetchone()
    assert status == ("aborted",)
    assert after[0] >= charges  # charges stay spent
    assert _session_processes(command.pid) == []  # nothing of the command is left
    record = server.read_record(home)  # the shared server is not the command's: it stays up
    assert record is not None and server.healthy(record.url)


def _wait_for_measuring(
    catalog: Path, command: subprocess.Popen[str], *, timeout: float
) -> tuple[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if command.poll() is not None:
            pytest.fail(f"the run ended before measuring: {command.communicate()[1][-2000:]}")
        try:
            with sqlite3.connect(f"file:{catalog}?mode=ro", uri=True, timeout=0.5) as db:
                row = db.execute("select id from releases where status = 'measuring'").fetchone()
                if row is not None:
                    count = db.execute(
                        "select count(*) from ledger where release_id = ?", (row[0],)
                    ).fetchone()
                    return str(row[0]), int(count[0])
        except sqlite3.Error:
            pass  # not created yet, or locked for a moment
        time.sleep(0.02)
    pytest.fail("no release reached measuring")


def _session_processes(session: int) -> list[int]:
    return [pid for pid, fields in processes.live_processes() if fields[3] == str(session)]


def test_a_run_through_the_shared_server_validates_in_its_service(
    tmp_path: Path, tiny_dataset: Path, home: Path
) -> None:
    """The server's validation service imports GX once; a `run` then never imports it itself."""
    started = _program("from dprelease.flows import server; server.connect()")
    assert started.returncode == 0, started.stderr[-2000:]
    record = server.read_record(home)
    assert record is not None
    socket_path = server.validation_socket(home)
    deadline = time.monotonic() + 120  # GX's import in the service, on a busy machine
    while not socket_path.is_socket():
        assert time.monotonic() < deadline, "the validation service never listened"
        time.sleep(0.1)
    service = [
        pid
        for pid in server.group_members(record.pid)
        if "dprelease.catalog.validation.service" in (processes.command_line(pid) or "")
    ]
    assert len(service) == 1  # in the server's process group: stopped with it

    spec_path = write_spec(tmp_path, tiny_dataset, mechanism="identity")
    out = tmp_path / "out"
    result = _program(AS_PROGRAM, "run", str(spec_path), "--out", str(out))
    verdict = _verdict(result)
    assert verdict["code"] == 0, result.stderr[-3000:]
    assert "great_expectations" not in verdict["heavy"]  # validated in the service
    (results,) = out.glob("*/validation/results.json")
    assert json.loads(results.read_text())["success"] is True
    assert (results.parent / "docs" / "index.html").is_file()
    log = Path(record.log).read_text()
    assert f"validation service {service[0]}: validated" in log


def test_a_stage_past_its_time_limit_fails_the_release_with_a_clear_message(
    tmp_path: Path, tiny_dataset: Path, home: Path
) -> None:
    """A stage that runs past DPRELEASE_STAGE_TIMEOUT ends the command (no hang): the message
    names the stage and the limit, the release is ``failed``, nothing was charged (the stage is
    ingest, before measure) and the run record is gone.  Ingest is slowed down in the command's
    own process; every other stage is the real one."""
    spec_path = write_spec(tmp_path, tiny_dataset, mechanism="identity")
    snippet = (
        "import os, time, dprelease.catalog.release\n"
        "def slow_ingest(*args, **kwargs):\n"
        "    for _ in range(2400):\n"
        "        time.sleep(0.05)\n"
        "dprelease.catalog.release.ingest = slow_ingest\n"
        "os.environ['DPRELEASE_STAGE_TIMEOUT'] = '20'\n" + AS_PROGRAM
    )
    started = time.monotonic()
    result = _program(snippet, "run", str(spec_path), "--out", str(tmp_path / "out"))
    took = time.monotonic() - started
    assert _verdict(result)["code"] == 1, result.stderr[-3000:]
    assert "stage 'ingest' exceeded its time limit of 20 s" in result.stderr
    assert "DPRELEASE_STAGE_TIMEOUT" in result.stderr.splitlines()[-1]  # what to do
    assert took < 100  # 120 s of sleeping without the watchdog
    with sqlite3.connect(home / "catalog.db") as db:
        rows = db.execute(
            "select r.status, (select count(*) from ledger l where l.release_id = r.id) "
            "from releases r where r.dataset_id = ?",
            ("tiny-" + tmp_path.name[-12:],),
        ).fetchall()
    assert rows == [("failed", 0)]
    assert not list((home / "run" / "releases").glob("*.json"))


def test_an_invalid_stage_timeout_is_refused_before_prefect(tmp_path: Path, home: Path) -> None:
    snippet = "import os\nos.environ['DPRELEASE_STAGE_TIMEOUT'] = 'soon'\n" + AS_PROGRAM
    result = _program(snippet, "run", str(bundled_spec()), "--out", str(tmp_path / "out"))
    assert _verdict(result) == {"code": 2, "heavy": []}
    assert "DPRELEASE_STAGE_TIMEOUT='soon': must be a finite number of seconds > 0" in result.stderr


def test_a_release_predicted_past_the_memory_limit_is_refused_with_nothing_charged(
    tmp_path: Path, tiny_dataset: Path, home: Path
) -> None:
    """Exit 2 before any data is read: the message names the stage and the size that drives it,
    and the catalog holds no release and no charge for the dataset."""
    spec_path = write_spec(tmp_path, tiny_dataset, mechanism="identity")
    snippet = "import os\nos.environ['DPRELEASE_MEMORY_LIMIT'] = '50MB'\n" + AS_PROGRAM
    result = _program(snippet, "run", str(spec_path), "--out", str(tmp_path / "out"))
    assert _verdict(result)["code"] == 2, result.stderr[-3000:]
    assert "error: not enough memory for this release" in result.stderr
    assert "limit 50 MB (DPRELEASE_MEMORY_LIMIT)" in result.stderr
    assert "Traceback" not in result.stderr
    dataset = "tiny-" + tmp_path.name[-12:]
    if (home / "catalog.db").exists():
        with sqlite3.connect(home / "catalog.db") as db:
            released = db.execute(
                "select count(*) from releases where dataset_id = ?", (dataset,)
            ).fetchone()
            charged = db.execute(
                "select count(*) from ledger where dataset_id = ?", (dataset,)
            ).fetchone()
        assert released == (0,) and charged == (0,)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
