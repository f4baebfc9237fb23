"""The CLI's side of Ctrl-C (flows/interrupt.py), without Prefect: what is aborted, what is kept,
which processes are stopped.  The end-to-end run is in tests/flows/test_cli_failures.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dprelease.catalog.ledger import schema
from dprelease.catalog.ledger.store import Catalog
from dprelease.flows import interrupt


def _release(catalog: Catalog, release_id: str) -> None:
    catalog.create_release(
        release_id=release_id,
        name="t",
        dataset_id="d",
        spec_fingerprint="0" * 64,
        mechanism="identity",
    )


def _foreign(catalog: Catalog, release_id: str) -> None:
    """Pretend another (live) process owns the release."""
    with catalog.engine.begin() as conn:
        conn.execute(
            schema.releases.update()
            .where(schema.releases.c.id == release_id)
            .values(owner_pid=1, owner_start="1")
        )


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")


@pytest.fixture(autouse=True)
def stopped_children(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the guard's calls of ``stop_own_children`` instead of making them: inside pytest it
    would stop this process's helpers (the session's Prefect server, PostgreSQL, Dask); the real
    one is tested in a fresh interpreter below."""
    calls: list[int] = []
    monkeypatch.setattr(interrupt, "stop_own_children", lambda: calls.append(1) or [])
    return calls


def test_an_interrupt_aborts_only_this_process_releases(
    catalog: Catalog, stopped_children: list[int]
) -> None:
    _release(catalog, "mine-measuring")
    _release(catalog, "mine-failed")
    catalog.update_release("mine-failed", status="failed")  # what Prefect's ValueError left
    _release(catalog, "mine-staged")
    catalog.update_release("mine-staged", status="staged")
    _release(catalog, "theirs")
    _foreign(catalog, "theirs")

    with (
        pytest.raises(interrupt.Interrupted) as raised,
        interrupt.InterruptGuard(catalog_url=catalog.url),
    ):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ValueError("Task run is not set")  # noqa: B904 - Prefect's replacement, chained

    assert "mine-measuring" in str(raised.value) and "mine-failed" in str(raised.value)
    assert "charges stay spent" in str(raised.value)
    status = {r.id: r.status for r in catalog.releases()}
    assert status == {
        "mine-measuring": "aborted",
        "mine-failed": "aborted",
        "mine-staged": "staged",  # finished before the interrupt: kept
        "theirs": "measuring",  # another process's run goes on
    }
    assert catalog.release("mine-measuring").interrupted_at is not None
    assert stopped_children == [1]  # and its own children were stopped, once


def test_an_ordinary_failure_is_not_an_interrupt(
    catalog: Catalog, stopped_children: list[int]
) -> None:
    _release(catalog, "r")
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(RuntimeError), interrupt.InterruptGuard(catalog_url=catalog.url):
        raise RuntimeError("disk full")
    assert catalog.release("r").status == "measuring"  # the flow's own handler decides
    assert signal.getsignal(signal.SIGINT) is handler  # restored
    assert stopped_children == []


def test_the_guard_turns_sigint_into_an_interrupt(catalog: Catalog) -> None:
    _release(catalog, "r")
    with pytest.raises(interrupt.Interrupted), interrupt.InterruptGuard(catalog_url=catalog.url):
        signal.raise_signal(signal.SIGINT)
    assert catalog.release("r").status == "aborted"


def test_nothing_measured_says_nothing_was_charged(catalog: Catalog) -> None:
    with (
        pytest.raises(interrupt.Interrupted, match="no release was being measured"),
        interrupt.InterruptGuard(catalog_url=catalog.url),
    ):
        raise KeyboardInterrupt


STOP_CHILDREN = """
import json, subprocess, sys
from dprelease.flows import interrupt
sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
child = subprocess.Popen(sleeper)
grandchild_parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"])
detached = subprocess.Popen(sleeper, start_new_session=True)  # like the shared server
import time; time.sleep(1.0)
stopped = interrupt.stop_own_children(grace=5)
codes = [child.wait(timeout=10), grandchild_parent.wait(timeout=10)]
alive = detached.poll() is None
detached.kill(); detached.wait(timeout=10)
print(json.dumps({"stopped": len(stopped), "child": child.pid in stopped,
                  "detached": detached.pid in stopped, "codes": codes, "alive": alive}))
"""


def test_own_children_are_stopped_but_not_other_sessions() -> None:
    # in a fresh interpreter: inside pytest it would also stop the session's own helpers
    result = subprocess.run(
        [sys.executable, "-c", STOP_CHILDREN],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout.strip().splitlines()[-1])
    assert verdict == {
        "stopped": 3,  # the child, the other child and its own child (a grandchild)
        "child": True,
        "detached": False,
        "codes": [-signal.SIGTERM, -signal.SIGTERM],
        "alive": True,
    }


def test_catalog_records_what_the_abort_relies_on() -> None:
    columns = {c.name for c in schema.releases.columns}
    assert {"owner_pid", "owner_host", "owner_start", "interrupted_at"} <= columns
    assert "aborted" in schema.STATUSES
