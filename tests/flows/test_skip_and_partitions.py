"""Budget-respecting operations against a real ``prefect server start`` and a process worker.

* Don't spend on nothing: a deployment on a 10-second schedule releases its data once; the next
  scheduled runs find input and spec unchanged, charge nothing and record ``skipped`` entries
  (that new content is released again is shown without a server, in
  tests/unit/catalog/test_skip_unchanged.py).
* Two arrivals of the same content never start two releases: an arrival announced by
  ``dprelease watch`` and then delivered a second time (a duplicated event) starts two runs, one
  releases and one is skipped; a copy of the file under another name is not announced at all.
* Disjoint arrivals: with ``dataset.partitions: {by: file}`` two files each get the dataset's cap
  (1.5; two releases of ε = 1 would need 2), a release of the whole folder is refused before any
  data is read because it would charge both partitions, and ``dprelease budget`` shows the
  spending per partition.

Ledger totals are asserted from the catalog after each step.  The server and the worker are
started as in ``test_operations.py`` (its helpers) and stopped by PID.  The work pool runs one
flow run at a time (each is a process importing Prefect and Great Expectations: a 2-core machine
must not start a dozen of them when a schedule's runs pile up).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from tests.flows.test_operations import (
    RUN_TIMEOUT,
    Operations,
    _deployment,
    _runs_of,
    _spec,
    _wait_for,
    _write_tiny_parquet,
    serve,
)

pytestmark = [pytest.mark.flow]


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operations]:
    base = tmp_path_factory.mktemp("budget-operations")
    data = base / "data" / "nightly.parquet"
    _write_tiny_parquet(data, seed=7)
    landing = base / "landing"
    for folder in ("sk-arrival", "pt-arrival"):
        (landing / folder).mkdir(parents=True)
    specs_dir, schedule_dir = base / "specs", base / "scheduled"
    specs_dir.mkdir()
    schedule_dir.mkdir()
    partitioned = {
        "id": "pt-arrival",
        "source": str(landing / "pt-arrival"),
        "budget": {"epsilon": 1.5},
        "partitions": {"by": "file"},
    }
    specs = {
        "scheduled": (schedule_dir, _spec("sk-nightly", "sk-nightly", data, cap=5.0)),
        "arrival": (
            specs_dir,
            _spec("sk-arrival", "sk-arrival", landing / "sk-arrival", cap=5.0, trigger="arrival"),
        ),
        "partitioned": (
            specs_dir,
            _spec("pt-arrival", "pt-arrival", landing, cap=1.5, trigger="arrival")
            | {"dataset": partitioned},
        ),
    }
    spec_paths = {}
    for key, (folder, spec) in specs.items():
        spec_paths[key] = folder / f"{spec['name']}.yaml"
        spec_paths[key].write_text(yaml.safe_dump(spec))
    # review timeout 5 s: a released run stops waiting soon (its release stays staged); one
    # flow-run process at a time
    with serve(
        base, specs=spec_paths, landing=landing, deploy=[str(specs_dir)], review_timeout=5,
        pool_limit=1,
    ) as operations:  # fmt: skip
        yield operations


def _entries(ops: Operations, dataset_id: str) -> list[Any]:
    return Catalog(ops.catalog_url).ledger_entries(dataset_id)


def _kinds(ops: Operations, dataset_id: str) -> list[str]:
    return [entry.kind for entry in _entries(ops, dataset_id)]


def _watch(ops: Operations) -> subprocess.CompletedProcess[str]:
    watched = ops.cli(
        "watch", str(ops.landing), "--spec-dir", str(ops.specs["arrival"].parent), "--once",
        "--interval", "1",
    )  # fmt: skip
    assert watched.returncode == 0, watched.stdout + watched.stderr
    return watched


def _final_runs(ops: Operations, name: str, count: int) -> list[Any]:
    deployment = _deployment(ops, name)

    def finished() -> list[Any] | None:
        runs = _runs_of(ops, deployment.id)
        done = [run for run in runs if run.state.is_final()]
        return done if len(done) >= count else None

    return _wait_for(finished, what=f"{count} finished runs of {name}", timeout=2 * RUN_TIMEOUT)


def test_two_arrivals_of_the_same_content_start_one_release(ops: Operations) -> None:
    from dprelease.flows.watch import ArrivalEvent, prefect_emitter
    from tests.flows.test_operations import keyed

    arrived = ops.landing / "sk-arrival" / "2026-11.parquet"
    _write_tiny_parquet(arrived, seed=11)
    assert "announced 1 file(s)" in _watch(ops).stdout
    # the same event delivered a second time (a duplicated delivery, or a second watcher
    # with its own state): a second triggered run
    prefect_emitter(ops.api_url)(
        ArrivalEvent(
            dataset_id="sk-arrival",
            path=str(arrived),
            fingerprint=keyed(arrived.read_bytes(), ops.catalog_url),
            size=arrived.stat().st_size,
        )
    )
    runs = _final_runs(ops, "sk-arrival", 2)
    assert {run.parameters["source_override"] for run in runs} == {str(arrived)}
    kinds = _kinds(ops, "sk-arrival")
    assert sorted(kinds) == ["charge", "skipped"], kinds
    catalog = Catalog(ops.catalog_url)
    [record] = catalog.releases(dataset_id="sk-arrival")
    assert catalog.spent("sk-arrival").epsilon == pytest.approx(1.0, abs=1e-6)
    [skip] = [e for e in _entries(ops, "sk-arrival") if e.kind == "skipped"]
    assert f"unchanged since {record.id}" in skip.label

    # the same bytes under another name are not announced again: no third run
    shutil.copy(arrived, arrived.with_name("copy-of-2026-11.parquet"))
    assert "announced 0 file(s)" in _watch(ops).stdout
    assert len(_runs_of(ops, _deployment(ops, "sk-arrival").id, scheduled=True)) == 2
    assert _kinds(ops, "sk-arrival") == kinds


def test_disjoint_arrivals_are_charged_per_partition(ops: Operations) -> None:
    folder = ops.landing / "pt-arrival"
    _write_tiny_parquet(folder / "2026-10.parquet", seed=31)
    _write_tiny_parquet(folder / "2026-11.parquet", seed=32)
    assert "announced 2 file(s)" in _watch(ops).stdout
    runs = _final_runs(ops, "pt-arrival", 2)
    catalog = Catalog(ops.catalog_url)
    entries = _entries(ops, "pt-arrival")
    assert sorted((e.partition, round(e.cost.epsilon, 6)) for e in entries) == [
        ("2026-10.parquet", 1.0),
        ("2026-11.parquet", 1.0),
    ], [(run.name, run.state.message) for run in runs]
    # cap 1.5 and two releases of 1.0: each partition spent 1.0, so the dataset spent 1.0
    assert catalog.spent("pt-arrival").epsilon == pytest.approx(1.0, abs=1e-6)
    assert catalog.partitioned_by("pt-arrival") == "file"
    for record in catalog.releases(dataset_id="pt-arrival"):
        manifest = artifacts.read_manifest(Path(record.directory))
        assert manifest["partitions"]["charged"] == manifest["input_files"]
        assert "disjoint sets of people" in manifest["partitions"]["assumption"]
        assert "disjoint sets of people" in (Path(record.directory) / "report.html").read_text()
        artifacts.verify(Path(record.directory), catalog)

    # the whole folder (a run by hand of the same spec): it would charge both partitions
    # (2.0 > 1.5), so it is refused before any data is read, and nothing is charged
    from dprelease.catalog import release
    from dprelease.catalog.errors import BudgetExceededError
    from dprelease.catalog.planning.planner import make_plan
    from dprelease.catalog.spec.load import load_spec

    spec = load_spec(ops.specs["partitioned"])
    with pytest.raises(BudgetExceededError, match=r"partition '2026-1[01]\.parquet' would be"):
        release.register(spec, make_plan(spec), catalog, release_id="pt-whole-folder")
    assert len(_entries(ops, "pt-arrival")) == 2
    assert catalog.spent("pt-arrival").epsilon == pytest.approx(1.0, abs=1e-6)

    shown = ops.cli("budget", "pt-arrival")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "partitioned by file" in shown.stdout
    per_partition = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in shown.stdout.splitlines()
        if ".parquet" in line and line.count("│") == 5
    ]
    assert per_partition == [
        ["2026-10.parquet", "epsilon=1", "epsilon=0.5", "1"],
        ["2026-11.parquet", "epsilon=1", "epsilon=0.5", "1"],
    ], shown.stdout


def test_an_unchanged_scheduled_release_is_skipped(ops: Operations) -> None:
    deployed = ops.cli(
        "deploy", str(ops.specs["scheduled"]), "--every", "10", "--review-timeout", "5"
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    deployment = _deployment(ops, "sk-nightly")
    try:
        _wait_for(
            lambda: "skipped" in _kinds(ops, "sk-nightly"),
            what="a skipped scheduled run",
            timeout=3 * RUN_TIMEOUT,
            ops=ops,
        )
    finally:
        with ops.api() as client:
            client.pause_deployment(deployment.id)
    _wait_for(
        lambda: not [run for run in _runs_of(ops, deployment.id)
                     if run.state.is_running() or run.state.is_pending() or run.state.is_paused()],
        what="the started scheduled runs to finish", timeout=2 * RUN_TIMEOUT, ops=ops,
    )  # fmt: skip
    catalog = Catalog(ops.catalog_url)
    [first] = catalog.releases(dataset_id="sk-nightly")
    entries = _entries(ops, "sk-nightly")
    assert entries[0].kind == "charge" and entries[0].release_id == first.id
    assert len(entries) >= 2 and all(e.kind == "skipped" for e in entries[1:]), entries
    assert all(f"unchanged since {first.id}" in e.label for e in entries[1:])
    assert all(e.cost.epsilon == 0 for e in entries[1:])
    assert catalog.spent("sk-nightly").epsilon == pytest.approx(1.0, abs=1e-6)
    runs = _runs_of(ops, deployment.id)
    skipped_runs = [run for run in runs if run.state.is_completed() and run.auto_scheduled]
    assert skipped_runs  # a skipped run completes: no review pause, no failure
    assert catalog.verify_chain() == []
