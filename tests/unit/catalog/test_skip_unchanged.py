"""Don't spend on nothing: an unchanged scheduled or triggered release is skipped (catalog level;
the flow tests against a real Prefect server are in tests/flows/test_skip_and_partitions.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import release
from dprelease.catalog.errors import BudgetExceededError, CatalogError, SpecError
from dprelease.catalog.ledger.budget import DatasetAccountant
from dprelease.catalog.ledger.store import Catalog, SkippedRelease
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec
from tests.privacy.test_ledger_chain import pure


def make_spec(source: Path, **extra: Any) -> ReleaseSpec:
    return parse_spec(
        {
            "name": "nightly",
            "dataset": {"id": "ds", "source": str(source), "budget": {"epsilon": 2.5}},
            "domain": {"a": {"min": 0, "max": 3}},
            "workload": [{"name": "a", "marginal": ["a"]}],
            "mechanism": "identity",
            "privacy": {"epsilon": 1.0},
            **extra,
        }
    )


def write(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)  # public randomness: synthetic test data
    pq.write_table(pa.table({"a": pa.array(rng.integers(0, 4, 50), pa.int16())}), path)
    return path


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    catalog.ensure_dataset("ds", cap=pure(2.5))
    return catalog


def start(catalog: Catalog, release_id: str, **overrides: Any) -> SkippedRelease | None:
    values = {
        "name": "nightly",
        "dataset_id": "ds",
        "spec_fingerprint": "s" * 64,
        "mechanism": "identity",
        "series_key": "k" * 64,
        "input_fingerprint": "f" * 64,
        "skip_unchanged": True,
        **overrides,
    }
    return catalog.create_release(release_id=release_id, **values)


def test_the_same_content_never_starts_two_releases(catalog: Catalog) -> None:
    assert start(catalog, "r1") is None  # still measuring: it counts
    skipped = start(catalog, "r2")
    assert skipped == SkippedRelease(
        release_id="r2",
        name="nightly",
        dataset_id="ds",
        unchanged_since="r1",
        receipt_id=skipped.receipt_id if skipped else "",
    )
    assert [r.id for r in catalog.releases()] == ["r1"]  # no release row for the skipped run
    [entry] = catalog.ledger_entries("ds")
    assert (entry.kind, entry.release_id, entry.cost) == ("skipped", "r2", pure(0.0))
    assert "unchanged since r1" in entry.label
    assert catalog.spent("ds") == pure(0.0) and catalog.verify_chain() == []
    accountant = DatasetAccountant(catalog, dataset_id="ds", release_id="r3")
    assert not accountant.holds(entry.receipt_id)  # a skip is no payment to reuse


def test_what_counts_as_the_last_release_of_the_series(catalog: Catalog) -> None:
    start(catalog, "r1")
    assert start(catalog, "other-input", input_fingerprint="e" * 64) is None
    # the series' last release now has another input: the first content releases again
    assert start(catalog, "r1-again") is None
    catalog.update_release("r1-again", status="failed")  # released nothing: does not count
    assert start(catalog, "after-failure") is None
    catalog.update_release("after-failure", status="rejected")  # a decided release counts
    assert start(catalog, "after-rejection").unchanged_since == "after-failure"
    # another series (name) or another dataset, or another spec: not the same series
    assert start(catalog, "other-name", name="weekly") is None
    catalog.ensure_dataset("ds2", cap=pure(1.0))
    assert start(catalog, "other-dataset", dataset_id="ds2") is None
    assert start(catalog, "other-spec", series_key="j" * 64) is None
    # policy "release": never skipped
    assert start(catalog, "forced", series_key="j" * 64, skip_unchanged=False) is None


def test_a_measuring_release_whose_process_is_gone_does_not_count(catalog: Catalog) -> None:
    import subprocess
    import sys

    start(catalog, "crashed")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    catalog.update_release("crashed", owner_pid=int(gone.stdout))
    assert start(catalog, "after-crash") is None  # it will release nothing: this run releases
    assert start(catalog, "duplicate").unchanged_since == "after-crash"


def test_skip_unchanged_needs_the_keys(catalog: Catalog) -> None:
    with pytest.raises(CatalogError, match=r"skip_unchanged needs the release's series_key"):
        start(catalog, "r1", input_fingerprint=None)


def test_series_key_is_the_spec_less_its_source_and_policy(tmp_path: Path) -> None:
    first = make_spec(tmp_path / "a.parquet")
    moved = make_spec(tmp_path / "elsewhere" / "a.parquet", on_unchanged="release")
    assert first.series_key() == moved.series_key()
    assert first.fingerprint() != moved.fingerprint()
    assert make_spec(tmp_path, privacy={"epsilon": 0.5}).series_key() != first.series_key()
    assert "on_unchanged" not in first.canonical_json()  # the default changes no fingerprint
    with pytest.raises(SpecError, match=r"on_unchanged"):
        make_spec(tmp_path, on_unchanged="never")


def test_register_skips_an_unchanged_input_before_the_budget_check(tmp_path: Path) -> None:
    source = write(tmp_path / "d.parquet", seed=1)
    spec = make_spec(
        source, dataset={"id": "ds", "source": str(source), "budget": {"epsilon": 1.0}}
    )
    catalog = Catalog(f"sqlite:///{tmp_path / 'other.db'}")
    plan = make_plan(spec)
    first = release.register(spec, plan, catalog, release_id="r1", on_unchanged="skip")
    assert first == pure(0.0)
    catalog.charge("ds", pure(1.0), release_id="r1", label="spent it all")
    catalog.update_release("r1", status="staged")
    # unchanged: a skip, not a budget error, although the budget is spent
    skipped = release.register(spec, plan, catalog, release_id="r2", on_unchanged="skip")
    assert isinstance(skipped, SkippedRelease) and skipped.unchanged_since == "r1"
    with pytest.raises(BudgetExceededError):  # a run by hand releases (and is refused here)
        release.register(spec, plan, catalog, release_id="r3", on_unchanged="release")
    write(source, seed=2)  # new content: released (refused by the budget, so an error)
    with pytest.raises(BudgetExceededError):
        release.register(spec, plan, catalog, release_id="r4", on_unchanged="skip")
    assert [e.kind for e in catalog.ledger_entries("ds")] == ["charge", "skipped"]


def test_how_a_deployed_run_started_decides_the_policy() -> None:
    from dprelease.flows.deployed_release import started_by, unchanged_policy

    assert started_by(None) == "hand"
    assert started_by(SimpleNamespace(auto_scheduled=True, created_by=None)) == "schedule"
    automation = SimpleNamespace(type="AUTOMATION")
    assert started_by(SimpleNamespace(auto_scheduled=False, created_by=automation)) == "trigger"
    person = SimpleNamespace(type="USER")
    assert started_by(SimpleNamespace(auto_scheduled=False, created_by=person)) == "hand"
    assert unchanged_policy("skip", "schedule") == "skip"
    assert unchanged_policy("skip", "trigger") == "skip"
    assert unchanged_policy("skip", "hand") == "release"
    assert unchanged_policy("release", "trigger") == "release"
