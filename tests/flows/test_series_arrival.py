"""A 24-period series released on arrival (real ``prefect server``, ``dprelease deploy``, a process
worker, one ``dprelease watch`` polling every 0.5 s): 24 monthly Parquet files arrive one by one,
each announced once by the watcher; each triggered run
releases its period, charges each period it reads exactly its increment (checked per partition in
the ledger), publishes its period's rows; earlier releases' files stay byte-identical, and after
the horizon no partition has spent more than the planned ρ (the most-charged spends exactly it).
A 25th file is past the horizon: its run fails and charges nothing."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.series import SeriesPlan
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.series import recorded_plan
from dprelease.catalog.spec.load import load_spec
from dprelease.catalog.watch_state import WatchState
from tests.flows.test_operations import (
    BIN,
    RUN_TIMEOUT,
    Operations,
    _deployment,
    _runs_with,
    _stop,
    _wait_for,
    serve,
)
from tests.unit.catalog.test_spec_series import raw_series_spec

pytestmark = [pytest.mark.flow]

HORIZON = 24
DATASET = "series-arrival"


def _write_month(path: Path, month: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(month)  # public randomness: synthetic test data
    rows = 200
    table = pa.table({"region": rng.choice(["n", "s", "e"], rows), "age": rng.integers(0, 4, rows)})
    scratch = path.with_name(path.name + ".tmp")  # written, then renamed: what the watcher expects
    pq.write_table(table, scratch)
    scratch.rename(path)


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operations]:
    base = tmp_path_factory.mktemp("series-arrival")
    landing = base / "landing"
    (landing / DATASET).mkdir(parents=True)
    specs_dir = base / "specs"
    specs_dir.mkdir()
    raw = raw_series_spec(trigger="arrival")
    raw["name"] = DATASET
    raw["dataset"] = {
        "id": DATASET,
        "source": str(landing / DATASET),
        "budget": {"rho": 0.5},
        "partitions": {"by": "file"},
    }
    raw["series"] = {
        "period": "file",
        "horizon": HORIZON,
        "time_workload": ["period", "cumulative"],
    }
    spec_path = specs_dir / f"{DATASET}.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    with serve(
        base, specs={"series": spec_path}, landing=landing, deploy=[str(specs_dir)],
        review_timeout=1, pool_limit=1,
    ) as operations:  # fmt: skip
        # one watcher for the whole test, as deploy/start-watcher.sh runs it (a command per file
        # would pay a process start per month); stopped by PID
        operations.logs["watcher"] = base / "watcher.log"
        with open(operations.logs["watcher"], "wb") as log:
            watcher = subprocess.Popen(
                [str(BIN / "dprelease"), "watch", str(landing), "--spec-dir", str(specs_dir),
                 "--interval", "0.5"],
                env=operations.env, cwd=base, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                yield operations
            finally:
                _stop(watcher)


def _finished(ops: Operations, count: int) -> list[Any]:
    deployment = _deployment(ops, DATASET)
    with ops.api() as client:  # one client for the whole wait

        def done() -> list[Any] | None:
            runs = [run for run in _runs_with(client, deployment.id) if run.state.is_final()]
            return runs if len(runs) >= count else None

        return _wait_for(done, what=f"{count} finished runs", timeout=RUN_TIMEOUT)


def _digests(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*.parquet"))
    }


def test_24_monthly_arrivals_release_one_period_each(ops: Operations) -> None:
    catalog = Catalog(ops.catalog_url)
    folder = ops.landing / DATASET
    published: dict[Path, dict[str, str]] = {}
    plan: SeriesPlan | None = None
    for month in range(1, HORIZON + 1):
        before = len(catalog.ledger_entries(DATASET)) if month > 1 else 0
        _write_month(folder / f"2026-{month:02d}.parquet", month)  # the watcher announces it
        runs = _finished(ops, month)  # each stops waiting for review after 1 s (staged)
        announced = [a.path for a in WatchState(ops.catalog_url).announcements(DATASET)]
        assert sorted(Path(a).name for a in announced) == [  # each file announced once
            f"2026-{s:02d}.parquet" for s in range(1, month + 1)
        ], ops.diagnostics()
        staged = [r for r in catalog.releases(dataset_id=DATASET) if r.status == "staged"]
        assert len(staged) == month, [(run.name, run.state.message) for run in runs] + [
            ops.diagnostics()
        ]
        if plan is None:
            plan = recorded_plan(catalog, load_spec(ops.specs["series"]))
            assert plan is not None and plan.horizon == HORIZON
        entries = catalog.ledger_entries(DATASET)[before:]
        charges = [e for e in entries if e.kind == "charge"]
        t = month - 1
        assert [e.partition for e in charges] == [
            f"2026-{s:02d}.parquet" for s in range(1, month + 1)
        ]
        unit = charges[-1].cost.rho / plan.A[t, t] ** 2
        assert unit <= plan.rho_unit * (1 + 1e-12)
        for s, entry in enumerate(charges):  # exactly its increment: A[t, s]² per unit
            assert entry.cost.rho == pytest.approx(plan.A[t, s] ** 2 * unit, rel=1e-12)
        [record] = [
            r for r in catalog.releases(dataset_id=DATASET) if r.id == charges[0].release_id
        ]
        directory = Path(record.directory)
        manifest = artifacts.read_manifest(directory)
        assert manifest["mechanism"]["details"]["series"]["period"] == month
        assert manifest["partitions"]["charged"] == [e.partition for e in charges]
        artifacts.verify(directory, catalog)
        published[directory] = _digests(directory)
    for directory, digests in published.items():  # published figures never change
        assert _digests(directory) == digests
    spending = {p.partition: p.spent.rho for p in catalog.partition_spending(DATASET)}
    assert len(spending) == HORIZON
    assert max(spending.values()) <= 0.5 * (1 + 1e-12)
    assert max(spending.values()) == pytest.approx(0.5, rel=1e-6)
    assert catalog.verify_chain() == []

    count = len(catalog.ledger_entries(DATASET))
    _write_month(folder / "2027-01.parquet", HORIZON + 1)
    runs = _finished(ops, HORIZON + 1)
    assert len(WatchState(ops.catalog_url).announcements(DATASET)) == HORIZON + 1
    past = max(runs, key=lambda run: run.expected_start_time)
    assert past.state.is_failed()  # refused past the horizon: no release, nothing charged
    assert len(catalog.releases(dataset_id=DATASET)) == HORIZON
    assert len(catalog.ledger_entries(DATASET)) == count
