"""The stage watchdog (flows.watchdog): every way a stage can hang ends, in its own process.

Each case runs a small script in a fresh Python process (a hard exit or the native backstop ends
the process), with the grace periods shortened so that a case takes seconds.  The ``PyDLL`` call
holds the GIL in native code the way the import-thread deadlock did: only the native backstop can
end that process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dprelease.catalog.processes import process_start
from dprelease.flows import watchdog
from dprelease.flows.watchdog import (
    STAGE_TIMEOUT_ENV,
    RunRecord,
    WatchdogSettingError,
    forget,
    inspect_runs,
    stage_timeout_seconds,
    stop_stuck,
)

ROOT = Path(__file__).resolve().parents[2]
CASE_SECONDS = 60  # bounded wait for every child; each case ends in a few seconds when it works

PRELUDE = """
import ctypes, os, sys, threading, time
from pathlib import Path
from dprelease.flows import watchdog
watchdog.STOP_GRACE_SECONDS = 1.0
watchdog.NATIVE_MARGIN_SECONDS = 1.0
home = Path(sys.argv[1])
stopped = home / "on_stop.txt"
dog = watchdog.RunWatchdog(
    home=home, spec="case.yaml", limit_seconds=1.0,
    on_stop=lambda reason: stopped.write_text(reason),
)
"""


def _run_case(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], float]:
    script = PRELUDE + textwrap.dedent(body)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=CASE_SECONDS,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return result, time.monotonic() - started


def test_stage_timeout_setting_is_validated() -> None:
    assert stage_timeout_seconds({}) == watchdog.DEFAULT_STAGE_TIMEOUT_SECONDS
    assert stage_timeout_seconds({STAGE_TIMEOUT_ENV: " 90 "}) == 90.0
    for bad in ("0", "-5", "nan", "inf", "ten"):
        with pytest.raises(WatchdogSettingError, match=f"{STAGE_TIMEOUT_ENV}=.*seconds > 0"):
            stage_timeout_seconds({STAGE_TIMEOUT_ENV: bad})
    with pytest.raises(WatchdogSettingError, match="limit_seconds"):
        watchdog.RunWatchdog(home=Path("/nonexistent"), spec="s", limit_seconds=0.0)


def test_a_python_stage_past_its_limit_raises_a_clear_error(tmp_path: Path) -> None:
    result, took = _run_case(
        tmp_path,
        """
        try:
            with dog.stage("plan"):
                while True:
                    pass
        except watchdog.StageTimeLimitExceeded as exc:
            print("caught:", exc)
        dog.close()
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "caught: stage 'plan' exceeded its time limit of 1 s" in result.stdout
    assert STAGE_TIMEOUT_ENV in result.stdout
    assert took < CASE_SECONDS / 2
    assert not list((tmp_path / "run" / "releases").glob("*.json"))  # gone with the run


def test_a_stage_that_ignores_the_error_is_ended_and_its_release_marked(tmp_path: Path) -> None:
    """A thread blocked in a C call never sees the asynchronous error: the hard exit ends it."""
    result, took = _run_case(
        tmp_path,
        """
        held = threading.Lock()
        held.acquire()
        dog.set_release("r-1")
        with dog.stage("measure"):
            held.acquire()  # blocks in C: the asynchronous exception waits for it forever
        print("not reached")
        """,
    )
    assert result.returncode == watchdog.EXIT_STAGE_TIMEOUT, result.stderr
    assert "not reached" not in result.stdout
    assert "stage 'measure' exceeded its time limit of 1 s" in result.stderr
    assert "ending the process" in result.stderr
    assert "measure" in (tmp_path / "on_stop.txt").read_text()
    record = json.loads(next((tmp_path / "run" / "releases").glob("*.json")).read_text())
    assert record["stage"] == "measure" and record["release_id"] == "r-1"
    assert took < CASE_SECONDS / 2


def test_native_code_holding_the_interpreter_is_ended_by_the_native_backstop(
    tmp_path: Path,
) -> None:
    """What the import-thread deadlock looked like: no Python thread can run, not even the
    monitor; faulthandler's C thread still ends the process and says where it was."""
    result, took = _run_case(
        tmp_path,
        """
        libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL
        with dog.stage("plan"):
            libc.sleep(45)
        print("not reached")
        """,
    )
    assert result.returncode != 0
    assert "not reached" not in result.stdout
    assert "Timeout" in result.stderr and "most recent call first" in result.stderr
    assert took < 30  # 45 s without the backstop


def test_a_stop_signal_the_flow_does_not_act_on_ends_the_process(tmp_path: Path) -> None:
    """SIGTERM whose handler cannot stop the stage (as when the flow's thread is busy) is
    honoured within the grace period."""
    result, took = _run_case(
        tmp_path,
        """
        import signal
        signal.signal(signal.SIGTERM, lambda *_: None)  # a handler that does not stop anything
        dog.limit_seconds = 600.0
        with dog.stage("ingest"):
            os.kill(os.getpid(), signal.SIGTERM)
            while True:
                time.sleep(0.05)
        """,
    )
    assert result.returncode == watchdog.EXIT_STAGE_TIMEOUT, result.stderr
    assert "did not stop within 1 s of a stop signal" in result.stderr
    assert took < CASE_SECONDS / 2


def test_close_wakes_a_monitor_waiting_for_stop_signals(tmp_path: Path) -> None:
    """In a process's main thread the monitor waits for SIGTERM/SIGINT in ``select``, a tick at a
    time; closing the watchdog wakes it, so a run does not end a tick late.  The tick is 30 s
    here: a close that waited it out would take about 30 s."""
    result, _ = _run_case(
        tmp_path,
        """
        import json
        assert dog._signals is not None  # the main thread of a fresh process owns the fd
        watchdog.MONITOR_TICK_SECONDS = 30.0
        time.sleep(1.0)  # the monitor's next wait is a 30 s select
        started = time.monotonic()
        dog.close()
        alive = [t.name for t in threading.enumerate() if t.name == "dprelease-stage-watchdog"]
        print(json.dumps({"seconds": time.monotonic() - started, "alive": alive}))
        """,
    )
    assert result.returncode == 0, result.stderr
    closed = json.loads(result.stdout)
    assert closed["alive"] == []
    assert closed["seconds"] < 10.0, closed


def _write_record(home: Path, record: RunRecord) -> Path:
    folder = home / "run" / "releases"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{record.pid}.json"
    path.write_text(json.dumps(record.__dict__))
    return path


def _record(pid: int, *, deadline: float, host: str | None = None) -> RunRecord:
    return RunRecord(
        pid=pid,
        host=host or socket.gethostname(),
        process_start=process_start(pid),
        spec="monthly.yaml",
        stage="plan",
        stage_started=deadline - 10,
        deadline=deadline,
    )


def test_recover_finds_gone_and_stuck_runs_and_stops_only_the_stuck_process(
    tmp_path: Path,
) -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait(timeout=CASE_SECONDS)
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    healthy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        now = time.time()
        gone_record = _record(finished.pid, deadline=now + 100)
        gone_record = RunRecord(**{**gone_record.__dict__, "process_start": "1"})
        _write_record(tmp_path, gone_record)
        _write_record(tmp_path, _record(stuck.pid, deadline=now - 600))
        _write_record(tmp_path, _record(healthy.pid, deadline=now + 600))
        _write_record(tmp_path, _record(healthy.pid + 10**6, deadline=now - 600, host="elsewhere"))
        problems = {p.record.pid: p for p in inspect_runs(tmp_path, now=now)}
        assert set(problems) == {finished.pid, stuck.pid}
        assert problems[finished.pid].kind == "gone"
        assert problems[stuck.pid].kind == "stuck"
        assert "stuck in stage 'plan'" in problems[stuck.pid].describe(now=now)
        assert stop_stuck(problems[stuck.pid], grace=2.0)
        assert stuck.wait(timeout=CASE_SECONDS) == -signal.SIGTERM
        assert healthy.poll() is None  # a run within its limit is left alone
        forget(problems[finished.pid])
        after = {p.record.pid: p.kind for p in inspect_runs(tmp_path, now=now)}
        assert after == {stuck.pid: "gone"}  # stopped: `recover` now forgets it
    finally:
        for process in (stuck, healthy):
            process.kill()
            process.wait(timeout=CASE_SECONDS)
