"""The ledger under real concurrency: two processes charging one catalog at the same time never
overspend the cap together, and a process that dies right after a charge keeps that charge.  Every
test runs on SQLite and on a real PostgreSQL server (the ``catalog_url`` fixture).

Privacy: the cap is the lifetime guarantee of a dataset; if the budget check and the ledger insert
of two processes could interleave, both could pass the check and together exceed the cap.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dprelease.catalog.ledger.store import Catalog
from dprelease.mechanisms.primitives.privacy import PrivacyCost

REPO = Path(__file__).resolve().parents[2]
CAP = 5.0
CHARGE = 0.6
ATTEMPTS = 10  # per process: 20 attempts in all, room for floor(5.0 / 0.6) = 8

CHARGER = """
import json, sys, time
from pathlib import Path
from dprelease.catalog.errors import BudgetExceededError
from dprelease.catalog.ledger.store import Catalog
from dprelease.mechanisms.primitives.privacy import PrivacyCost

url, name, ready, go, attempts, charge = sys.argv[1:7]
catalog = Catalog(url)
catalog.spent("ds")  # connect before the start signal
Path(ready).touch()
deadline = time.monotonic() + 60
while not Path(go).exists():
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.0005)
granted, refused = [], 0
for k in range(int(attempts)):
    try:
        catalog.charge(
            "ds",
            PrivacyCost(measure="pure", epsilon=float(charge)),
            release_id=f"{name}-{k}",
            label="concurrent",
        )
        granted.append(k)
    except BudgetExceededError:
        refused += 1
print(json.dumps({"granted": granted, "refused": refused}))
"""

CRASH_AFTER_CHARGE = """
import os, sys
from dprelease.catalog.ledger.store import Catalog
from dprelease.mechanisms.primitives.privacy import PrivacyCost

catalog = Catalog(sys.argv[1])
receipt = catalog.charge(
    "ds", PrivacyCost(measure="pure", epsilon=0.6), release_id="doomed", label="then crash"
)
print(receipt, flush=True)
os._exit(17)  # no cleanup, no atexit, no rollback
"""


def python(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(paths: list[Path], processes: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in paths):
        for process in processes:
            if process.poll() is not None:
                pytest.fail(f"charger exited early: {process.communicate()[1]}")
        if time.monotonic() > deadline:
            pytest.fail("chargers did not start within 60 s")
        time.sleep(0.01)


def test_two_processes_never_overspend(tmp_path: Path, catalog_url: str) -> None:
    url = catalog_url
    Catalog(url).ensure_dataset("ds", cap=PrivacyCost(measure="pure", epsilon=CAP))
    go = tmp_path / "go"
    names = ["a", "b"]
    ready = [tmp_path / f"ready-{name}" for name in names]
    chargers = [
        python("-c", CHARGER, url, name, str(flag), str(go), str(ATTEMPTS), str(CHARGE))
        for name, flag in zip(names, ready, strict=True)
    ]
    try:
        wait_for(ready, chargers)
        go.touch()  # both start charging at the same moment
        outputs = [process.communicate(timeout=120) for process in chargers]
    finally:
        for process in chargers:
            if process.poll() is None:
                process.kill()
    results = []
    for process, (stdout, stderr) in zip(chargers, outputs, strict=True):
        assert process.returncode == 0, stderr
        results.append(json.loads(stdout))

    granted = sum(len(r["granted"]) for r in results)
    assert granted == 8  # floor(5.0 / 0.6): every charge that fits is granted, no more
    assert all(len(r["granted"]) + r["refused"] == ATTEMPTS for r in results)
    catalog = Catalog(url)
    entries = catalog.ledger_entries("ds")
    assert len(entries) == 8
    assert {e.release_id for e in entries} == {
        f"{name}-{k}" for name, r in zip(names, results, strict=True) for k in r["granted"]
    }
    spent = catalog.spent("ds").epsilon
    assert spent <= CAP
    assert spent == pytest.approx(8 * CHARGE)


def test_crash_right_after_a_charge_keeps_the_charge(catalog_url: str) -> None:
    url = catalog_url
    Catalog(url).ensure_dataset("ds", cap=PrivacyCost(measure="pure", epsilon=CAP))
    process = python("-c", CRASH_AFTER_CHARGE, url)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 17, stderr
    catalog = Catalog(url)
    [entry] = catalog.ledger_entries("ds")
    assert entry.receipt_id == stdout.strip()
    assert entry.release_id == "doomed"
    assert catalog.spent("ds") == PrivacyCost(measure="pure", epsilon=0.6)
