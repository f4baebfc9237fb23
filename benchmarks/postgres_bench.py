"""Concurrent releases racing for one budget cap: SQLite against a real PostgreSQL server.

16 releases from 4 processes (4 each, started at the same moment by a signal file) on one dataset
whose lifetime cap admits exactly 5 of them (cap epsilon = 5, each release epsilon = 1).  Every
release goes through the real release path without Prefect: ``register`` (cap registered, budget
pre-checked, intent recorded), ``ingest`` (reads a seeded synthetic Parquet file), ``measure``
(the ledger charge, then noise through the choke point) and ``reconstruct``; staging (manifest,
report) is not run.  A release refused by the budget (in ``register``'s pre-check or atomically in
``measure``'s charge) is marked ``failed``.

Checked on each backend, in the same run: exactly 5 releases succeed, the ledger holds exactly
their charges and sums to <= the cap, the hash chain and its anchor verify, and no release is left
``measuring``.  ``kill -9`` at each stage (of a charge, and after each stage of a release) is
proved by ``tests/privacy/test_ledger_kill_stages.py`` on both backends.

The PostgreSQL server is started by ``tests/pg_server.py`` (Debian's binaries, a temporary data
directory, 127.0.0.1, stopped by PID).  Usage (from the repository root)::

    .venv/bin/python benchmarks/postgres_bench.py
    .venv/bin/python benchmarks/postgres_bench.py --processes 4 --per-process 4 --admits 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.pg_server

EPSILON_PER_RELEASE = 1.0
START_TIMEOUT = 300.0  # s: imports of every worker on a loaded 2-core machine
RUN_TIMEOUT = 900.0


def spec_dict(source: Path, *, cap: float) -> dict[str, Any]:
    return {
        "name": "race",
        "dataset": {"id": "race", "source": str(source), "budget": {"epsilon": cap}},
        "domain": {"v": {"min": 0, "max": 63}},
        "workload": [{"name": "hist", "marginal": ["v"]}],
        "mechanism": "identity",
        "privacy": {"epsilon": EPSILON_PER_RELEASE},
    }


def worker(url: str, spec_path: Path, name: str, releases: int, ready: Path, go: Path) -> None:
    """One process: ``releases`` releases one after the other; prints what became of them."""
    from dprelease.catalog import release
    from dprelease.catalog.errors import BudgetExceededError
    from dprelease.catalog.ledger.store import Catalog
    from dprelease.catalog.planning.planner import make_plan
    from dprelease.catalog.spec.load import parse_spec

    spec = parse_spec(json.loads(spec_path.read_text()))
    plan = make_plan(spec)
    catalog = Catalog(url)
    ready.touch()
    deadline = time.monotonic() + START_TIMEOUT
    while not go.exists():
        if time.monotonic() > deadline:
            sys.exit("no start signal")
        time.sleep(0.001)
    outcomes = []
    for k in range(releases):
        release_id = f"{name}-{k}"
        try:
            release.register(spec, plan, catalog, release_id=release_id)
        except BudgetExceededError:
            outcomes.append("refused-before-data")
            continue
        try:
            ingested = release.ingest(spec, plan, catalog)
            measurement = release.measure(ingested, spec, plan, catalog, release_id=release_id)
            release.reconstruct(spec, plan, measurement)
        except BudgetExceededError:
            catalog.update_release(release_id, status="failed")
            outcomes.append("refused-at-charge")
            continue
        catalog.update_release(release_id, status="staged")
        outcomes.append("released")
    print(json.dumps(outcomes))


def race(url: str, work: Path, *, processes: int, per_process: int, admits: int) -> dict[str, Any]:
    """Start the workers, release them at once, check the ledger; returns one table row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dprelease.catalog.ledger.store import Catalog

    work.mkdir(parents=True, exist_ok=True)
    source = work / "data.parquet"
    rng = np.random.default_rng(20261125)  # public randomness: synthetic benchmark data
    pq.write_table(pa.table({"v": pa.array(rng.integers(0, 64, 10_000), pa.int16())}), source)
    cap = admits * EPSILON_PER_RELEASE
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec_dict(source, cap=cap)))
    go = work / "go"
    ready = [work / f"ready-{i}" for i in range(processes)]
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, __file__, "--worker", url, str(spec_path), f"p{i}"),
                *(str(per_process), str(ready[i]), str(go)),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not all(r.exists() for r in ready):
            failed = [p for p in procs if p.poll() is not None]
            if failed:
                raise SystemExit(f"a worker exited early: {failed[0].communicate()[1]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"workers not ready within {START_TIMEOUT:g} s")
            time.sleep(0.01)
        started = time.perf_counter()
        go.touch()
        outputs = [p.communicate(timeout=RUN_TIMEOUT) for p in procs]
        seconds = time.perf_counter() - started
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    outcomes: list[str] = []
    for p, (stdout, stderr) in zip(procs, outputs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"a worker failed (exit code {p.returncode}):\n{stderr}")
        outcomes += json.loads(stdout.strip().splitlines()[-1])
    catalog = Catalog(url)
    entries = catalog.ledger_entries("race")
    spent = catalog.spent("race").epsilon
    released = outcomes.count("released")
    paid = {e.release_id for e in entries}
    staged = {r.id for r in catalog.releases(dataset_id="race", status="staged")}
    checks = {
        f"exactly {admits} succeed": released == admits,
        "ledger <= cap": spent <= cap + 1e-12,
        "charges = releases": paid == staged and len(entries) == released,
        "chain verifies": catalog.verify_chain() == [],
        "none left measuring": not catalog.releases(dataset_id="race", status="measuring"),
    }
    return {
        "releases": len(outcomes),
        "released": released,
        "refused_early": outcomes.count("refused-before-data"),
        "refused_at_charge": outcomes.count("refused-at-charge"),
        "spent": spent,
        "cap": cap,
        "seconds": seconds,
        "failed_checks": [name for name, ok in checks.items() if not ok],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--per-process", type=int, default=4)
    parser.add_argument("--admits", type=int, default=5, help="releases the cap admits")
    args = parser.parse_args()
    if args.admits > args.processes * args.per_process:
        parser.error("--admits must be <= processes x per-process (else nothing races)")
    from tests.pg_server import running_server

    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="dprelease-pgbench-") as tmp:
        os.environ["DPRELEASE_HOME"] = str(Path(tmp) / "home")  # the catalog keys and anchors
        shape = {"processes": args.processes, "per_process": args.per_process}
        rows["sqlite"] = race(
            f"sqlite:///{tmp}/catalog.db", Path(tmp) / "sqlite", admits=args.admits, **shape
        )
        with running_server() as server:
            url = server.create_database("bench")
            rows["postgresql"] = race(url, Path(tmp) / "postgresql", admits=args.admits, **shape)
    baseline = rows["sqlite"]["seconds"]
    print(
        f"{args.processes} processes x {args.per_process} releases racing for a cap that admits "
        f"{args.admits} (epsilon {EPSILON_PER_RELEASE:g} each; register, ingest, measure, "
        "reconstruct)\n"
    )
    header = (
        f"{'backend':<11} {'releases':>8} {'succeeded':>9} {'refused early':>13} "
        f"{'refused at charge':>17} {'ledger eps':>10} {'cap':>5} {'seconds':>8} "
        f"{'x sqlite':>8}  checks"
    )
    print(header)
    print("-" * len(header))
    for backend, row in rows.items():
        print(
            f"{backend:<11} {row['releases']:>8} {row['released']:>9} {row['refused_early']:>13} "
            f"{row['refused_at_charge']:>17} {row['spent']:>10.3g} {row['cap']:>5.3g} "
            f"{row['seconds']:>8.2f} {row['seconds'] / baseline:>8.2f}  "
            + ("ok" if not row["failed_checks"] else "FAILED: " + ", ".join(row["failed_checks"]))
        )
    if any(row["failed_checks"] for row in rows.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        url, spec_path, name, releases, ready, go = sys.argv[2:8]
        worker(url, Path(spec_path), name, int(releases), Path(ready), Path(go))
    else:
        main()
