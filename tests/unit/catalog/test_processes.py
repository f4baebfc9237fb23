"""catalog.processes against real child processes: alive, killed, zombie, a reused pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dprelease.catalog import processes

pytestmark = pytest.mark.skipif(not processes.procfs_available(), reason="needs Linux procfs")

SLEEPER = "import time; time.sleep(30)"


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def test_a_running_child_is_alive_with_its_start_time(child: subprocess.Popen[bytes]) -> None:
    start = processes.process_start(child.pid)
    assert start is not None and start.isdigit()
    assert processes.is_alive(child.pid)
    assert processes.is_alive(child.pid, started_at=start)
    assert processes.process_start(child.pid) == start  # stable while it runs


def test_a_killed_and_reaped_child_is_not_alive(child: subprocess.Popen[bytes]) -> None:
    start = processes.process_start(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    assert not processes.is_alive(child.pid)
    assert not processes.is_alive(child.pid, started_at=start)
    assert processes.process_start(child.pid) is None
    assert processes.stat_fields(child.pid) is None
    assert processes.command_line(child.pid) is None


def test_a_zombie_is_not_alive(child: subprocess.Popen[bytes]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
    fields = processes.stat_fields(child.pid)
    assert fields is not None and fields[0] == "Z"
    assert not processes.is_alive(child.pid)
    assert child.pid not in dict(processes.live_processes())


def test_a_reused_pid_is_not_the_recorded_process(child: subprocess.Popen[bytes]) -> None:
    start = processes.process_start(child.pid)
    assert start is not None
    other = str(int(start) + 1)  # the start time another process with this pid would have
    assert not processes.is_alive(child.pid, started_at=other)


def test_the_command_line_names_the_program(child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while SLEEPER not in (processes.command_line(child.pid) or "") and time.monotonic() < deadline:
        time.sleep(0.01)  # forked, not yet exec'd
    line = processes.command_line(child.pid)
    assert line is not None
    assert SLEEPER in line and sys.executable in line


def test_stat_fields_of_this_process() -> None:
    fields = processes.stat_fields(os.getpid())
    assert fields is not None
    assert fields[0] in "RSD"  # running, sleeping or in disk wait
    assert int(fields[1]) == os.getppid()
    assert int(fields[3]) == os.getsid(0)
    assert fields[19] == processes.process_start(os.getpid())


def test_stat_fields_survive_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    program = tmp_path / "a b) c"  # /proc/PID/stat shows it as "(a b) c)"
    program.symlink_to(sys.executable)
    process = subprocess.Popen([str(program), "-c", SLEEPER])
    try:
        fields = processes.stat_fields(process.pid)
        assert fields is not None
        assert int(fields[1]) == os.getpid()
        assert processes.is_alive(process.pid, started_at=processes.process_start(process.pid))
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def test_live_processes_lists_a_child_with_its_parent(child: subprocess.Popen[bytes]) -> None:
    found = dict(processes.live_processes())
    assert int(found[child.pid][1]) == os.getpid()
    assert os.getpid() in found


def test_a_pid_that_never_existed_is_not_alive() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert not processes.is_alive(pid_max + 1)
    assert processes.process_start(pid_max + 1) is None
