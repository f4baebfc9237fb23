"""The run starter (``flows/run_starter.py``) and the deployments' command that asks it for a run
(``flows/flow_run_process.py``), with a stand-in for Prefect's engine
(``tests/unit/run_starter_target.py``): real processes, a real socket, bounded waits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dprelease.catalog.processes import is_alive
from dprelease.flows.run_starter import SOCKET_ENV, differing_variables, parse_request

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests.unit.run_starter_target"
WAIT = 60.0


@dataclass
class Starter:
    process: subprocess.Popen[bytes]
    env: dict[str, str]
    log: Path


def _wait(check: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT:.0f} s waiting for {what}")
        time.sleep(0.05)


def _start(folder: Path, *preload: str) -> Starter:
    socket_path = folder / "starter.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DPRELEASE_"))}
    env.update(PYTHONPATH=str(ROOT), **{SOCKET_ENV: str(socket_path)})
    log = folder / "starter.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "dprelease.flows.run_starter", "--socket", str(socket_path),
             "--parent-pid", str(os.getpid()), "--run-module", TARGET,
             *[arg for module in preload for arg in ("--preload", module)]],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    _wait(lambda: socket_path.exists() or process.poll() is not None, "the starter's socket")
    assert process.poll() is None, log.read_text()
    return Starter(process=process, env=env, log=log)


@pytest.fixture
def folder() -> Iterator[Path]:
    short = Path(tempfile.mkdtemp(prefix="rs-"))  # a socket path must stay under 108 bytes
    yield short
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def starter(folder: Path) -> Iterator[Starter]:
    started = _start(folder, "numpy", "dprelease.mechanisms.primitives.noise", TARGET)
    yield started
    _stop(started)


def _stop(starter: Starter) -> None:
    if starter.process.poll() is None:
        starter.process.terminate()
        starter.process.wait(timeout=WAIT)


def _request(starter: Starter, cwd: Path, **per_run: str) -> subprocess.Popen[str]:
    env = {**starter.env, "PREFECT__FLOW_RUN_ID": "run-1", **per_run}
    return subprocess.Popen(
        [sys.executable, "-m", "dprelease.flows.flow_run_process", TARGET],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _report(process: subprocess.Popen[str]) -> dict[str, object]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, process.stderr.read() if process.stderr else ""
    return json.loads(line)


def test_a_run_gets_a_forked_process_with_the_requesters_streams_folder_and_exit_code(
    starter: Starter, tmp_path: Path
) -> None:
    client = _request(starter, tmp_path, PREFECT__TEST_EXIT="3")
    out, err = client.communicate(timeout=WAIT)
    report = json.loads(out)
    assert client.returncode == 3
    assert report["pid"] != client.pid  # forked by the starter, not started here
    assert report["ppid"] == starter.process.pid
    assert report["leader"] is True  # a session and process group of its own
    assert report["cwd"] == report["path0"] == str(tmp_path)  # as under ``python -m`` there
    assert report["run"] == "run-1"
    [path] = report["argv"]  # type: ignore[misc] # none of the starter's arguments
    assert path.endswith("run_starter_target.py")
    assert "a line on stderr" in err
    assert "RuntimeWarning" not in err  # runpy's note on a preloaded module is expected


def test_two_runs_draw_independent_noise_and_random_state(starter: Starter, tmp_path: Path) -> None:
    """Privacy: a forked run must not replay another's randomness (OpenDP's noise, numpy's and
    Python's global state)."""
    reports = []
    for _ in range(2):
        client = _request(starter, tmp_path)
        out, _ = client.communicate(timeout=WAIT)
        assert client.returncode == 0
        reports.append(json.loads(out))
    assert reports[0]["pid"] != reports[1]["pid"]
    for key in ("noise", "numpy_global", "random"):
        assert reports[0][key] != reports[1][key], key


def test_a_signal_to_the_requester_reaches_the_run_and_ends_both_alike(
    starter: Starter, tmp_path: Path
) -> None:
    client = _request(starter, tmp_path, PREFECT__TEST_SLEEP="60")
    run_pid = int(_report(client)["pid"])  # type: ignore[call-overload]
    client.send_signal(signal.SIGTERM)  # what Prefect sends to cancel a run
    client.communicate(timeout=WAIT)
    assert client.returncode == -signal.SIGTERM
    _wait(lambda: not is_alive(run_pid), "the run to end")


def test_a_killed_requester_takes_its_run_with_it(starter: Starter, tmp_path: Path) -> None:
    client = _request(starter, tmp_path, PREFECT__TEST_SLEEP="60")
    run_pid = int(_report(client)["pid"])  # type: ignore[call-overload]
    client.kill()  # Prefect's SIGKILL after a cancellation's grace period
    client.communicate(timeout=WAIT)
    _wait(lambda: not is_alive(run_pid), "the starter to kill the run")
    assert "ended: run process killed" in starter.log.read_text()


def test_a_stopped_starter_leaves_its_runs_running_and_the_requester_waits(
    starter: Starter, tmp_path: Path
) -> None:
    client = _request(starter, tmp_path, PREFECT__TEST_SLEEP="2", PREFECT__TEST_EXIT="0")
    run_pid = int(_report(client)["pid"])  # type: ignore[call-overload]
    _stop(starter)  # as when its worker stops: a paused run outlives it
    assert is_alive(run_pid)
    _, err = client.communicate(timeout=WAIT)
    assert client.returncode == 1  # its code went with the starter
    assert not is_alive(run_pid)
    assert "waiting for the run" in err


def test_a_different_environment_is_refused_by_name_and_the_run_starts_fresh(
    starter: Starter, tmp_path: Path
) -> None:
    client = _request(starter, tmp_path, EXTRA_SETTING="value-7919", PREFECT__TEST_EXIT="4")
    out, err = client.communicate(timeout=WAIT)
    assert client.returncode == 4
    assert json.loads(out)["pid"] == client.pid  # exec'd here: the pid the worker recorded
    assert "environment differs from the starter's in EXTRA_SETTING" in err
    log = starter.log.read_text()
    assert "EXTRA_SETTING" in log and "value-7919" not in log  # names, never values


def test_without_a_starter_the_engine_starts_in_the_requester(folder: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DPRELEASE_"))}
    env.update(PYTHONPATH=str(ROOT), PREFECT__TEST_EXIT="5", **{SOCKET_ENV: str(folder / "none")})
    done = subprocess.run(
        [sys.executable, "-m", "dprelease.flows.flow_run_process", TARGET],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert done.returncode == 5
    report = json.loads(done.stdout)
    assert report["leader"] is True
    assert "did not fork (no answer from" in done.stderr and "FileNotFoundError" in done.stderr


def test_a_starter_with_a_thread_running_refuses_to_fork(folder: Path, tmp_path: Path) -> None:
    threaded = _start(folder, "tests.unit.run_starter_thread")
    try:
        client = _request(threaded, tmp_path)
        out, err = client.communicate(timeout=WAIT)
        assert client.returncode == 0
        assert json.loads(out)["pid"] == client.pid
        assert "forking is unsafe" in err
    finally:
        _stop(threaded)


def test_the_environment_check_ignores_only_per_run_variables() -> None:
    starter = {"PATH": "/bin", "PREFECT_API_URL": "http://a", "HOME": "/root"}
    run = {**starter, "PREFECT__FLOW_RUN_ID": "x", "PREFECT__CONTROL_PORT": "1"}
    assert differing_variables(run, starter) == []
    assert differing_variables({**run, "PREFECT_API_URL": "http://b"}, starter) == [
        "PREFECT_API_URL"
    ]
    assert differing_variables({k: v for k, v in run.items() if k != "HOME"}, starter) == ["HOME"]


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        (b"[]", "must be a JSON object"),
        (b'{"module": 1, "cwd": "/", "env": {}}', "module and cwd must be strings"),
        (b'{"module": "m", "cwd": "/", "env": {"A": 1}}', "env must map strings to strings"),
    ],
)
def test_a_malformed_request_is_refused_with_its_rule(raw: bytes, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        parse_request(raw)


def test_a_starter_that_answers_nothing_leaves_the_run_to_the_requester(
    folder: Path, tmp_path: Path
) -> None:
    """A socket that takes the request and closes: the engine starts in the requester."""
    import socket
    import threading

    path = folder / "mute.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def close_at_once() -> None:
        connection, _ = listener.accept()
        connection.close()

    closer = threading.Thread(target=close_at_once, daemon=True)
    closer.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DPRELEASE_"))}
    env.update(PYTHONPATH=str(ROOT), PREFECT__TEST_EXIT="6", **{SOCKET_ENV: str(path)})
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dprelease.flows.flow_run_process", TARGET],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=WAIT, check=False,
        )  # fmt: skip
    finally:
        closer.join(timeout=WAIT)
        listener.close()
    assert done.returncode == 6
    assert json.loads(done.stdout)["leader"] is True
    assert "did not fork (no answer from" in done.stderr  # a closed or broken connection


def test_the_default_preload_leaves_opendp_out_and_no_thread_running() -> None:
    """Each run imports the noise library itself, so its randomness is its own; the preload must
    leave one thread, or every run would start fresh."""
    check = (
        "import importlib, sys, threading\n"
        "from dprelease.flows.run_starter import PRELOAD\n"
        "for name in PRELOAD: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opendp'), "
        "threading.active_count())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=WAIT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "1"], done.stdout


def test_a_refusal_sent_before_the_request_call_returns_still_reaches_the_requester(
    folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A starter that refuses at once may answer and close before the requester's send returns;
    the requester must then read the reason, not break on a second, empty send (EPIPE)."""
    import socket
    import threading

    from dprelease.catalog.processes import send_line
    from dprelease.flows import flow_run_process

    path = folder / "quick.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    answered = threading.Event()

    def refuse_at_once() -> None:
        connection, _ = listener.accept()
        data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        while not data.endswith(b"\n"):
            data += connection.recv(1 << 20)
        for fd in fds:
            os.close(fd)
        send_line(connection, {"refused": "threads run after the preload: forking is unsafe"})
        connection.close()
        answered.set()

    send_fds = socket.send_fds

    def send_then_wait_for_the_answer(*args: object, **kwargs: object) -> int:
        sent = send_fds(*args, **kwargs)  # type: ignore[arg-type]
        answered.wait(WAIT)  # the order that the race produces now and then
        return sent

    monkeypatch.setattr(flow_run_process.socket, "send_fds", send_then_wait_for_the_answer)
    refuser = threading.Thread(target=refuse_at_once, daemon=True)
    refuser.start()
    try:
        assert flow_run_process.run_through_starter(path, TARGET) is None
    finally:
        refuser.join(timeout=WAIT)
        listener.close()
    assert answered.is_set()
    assert (
        "did not fork (threads run after the preload: forking is unsafe)" in capsys.readouterr().err
    )
