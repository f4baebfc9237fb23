"""Disjoint partitions (parallel composition): the spec's declaration, which partitions a release
reads (public information only), per-partition caps in the ledger, the chain over the new entry
kinds, and the migration of version-2 catalogs."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import partitions
from dprelease.catalog.errors import BudgetExceededError, CatalogError, SpecError
from dprelease.catalog.ledger.chain import GENESIS, entry_digest
from dprelease.catalog.ledger.schema import SCHEMA_VERSION
from dprelease.catalog.ledger.spending import MAX_PARTITIONS_PER_RELEASE, running_spend
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.spec.load import parse_spec
from tests.privacy.test_ledger_chain import V1_SCHEMA, pure, sql
from tests.stages import release_stages


def spec_dict(source: Path | None = None, **dataset: Any) -> dict[str, Any]:
    return {
        "name": "monthly",
        "dataset": {
            "id": "survey",
            "budget": {"epsilon": 1.5},
            **({"source": str(source)} if source else {}),
            **dataset,
        },
        "domain": {"period": {"values": ["2026-10", "2026-11"]}, "a": {"min": 0, "max": 3}},
        "workload": [{"name": "a", "marginal": ["a"]}],
        "mechanism": "identity",
        "privacy": {"epsilon": 1.0},
    }


def catalog_at(tmp_path: Path) -> Catalog:
    return Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")


# --- the declaration in the spec ---------------------------------------------------------------


def test_the_declaration_forms() -> None:
    by_file = parse_spec(spec_dict(partitions={"by": "file"}))
    assert partitions.declaration(by_file) == "file"
    short = parse_spec(spec_dict(partitions={"column": "period"}))
    long = parse_spec(spec_dict(partitions={"by": "column", "column": "period"}))
    assert partitions.declaration(short) == partitions.declaration(long) == "column:period"
    plain = parse_spec(spec_dict())
    assert partitions.declaration(plain) is None and partitions.release_partitions(plain) is None
    assert partitions.assumption(plain) is None and partitions.manifest_record(plain, None) is None
    # the declaration is part of the spec's fingerprint; absent, old fingerprints are unchanged
    assert "partitions" not in plain.canonical_json()
    assert short.fingerprint() != plain.fingerprint()


@pytest.mark.parametrize(
    ("declared", "extra", "match"),
    [
        ({"by": "column"}, {}, r"partitions \{by: column\} needs column: NAME"),
        ({"by": "file", "column": "period"}, {}, r"partitions \{by: file\} takes no column"),
        ({"by": "rows"}, {}, r"dataset\.partitions\.by"),
        ({"column": "zip"}, {}, r"partitions\.column \('zip'\) must be an attribute of the domain"),
        ({"by": "file"}, {"model": "local"}, r"dataset\.partitions applies to central releases"),
        ({"by": "file", "extra": 1}, {}, r"dataset\.partitions\.extra"),
    ],
)
def test_declaration_validators(declared: dict, extra: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse_spec({**spec_dict(partitions=declared), **extra})


# --- which partitions a release reads: public information only ----------------------------------


def test_by_file_names_the_listed_files_without_reading_them(tmp_path: Path) -> None:
    folder = tmp_path / "landing"
    (folder / "sub").mkdir(parents=True)
    for name in ("2026-10.parquet", "2026-11.parquet", "sub/2026-11.parquet"):
        (folder / name).write_bytes(b"not parquet: names are all that is read")
    spec = parse_spec(spec_dict(folder, partitions={"by": "file"}))
    # same base name in two folders: one partition, charged together (conservative)
    assert partitions.release_partitions(spec) == ("2026-10.parquet", "2026-11.parquet")
    one = parse_spec(spec_dict(folder / "2026-11.parquet", partitions={"by": "file"}))
    assert partitions.release_partitions(one) == ("2026-11.parquet",)
    read = (str(folder / "2026-10.parquet"),)  # what the ingest read wins over the listing
    assert partitions.release_partitions(spec, files=read) == ("2026-10.parquet",)
    with pytest.raises(SpecError, match=r"\{by: file\} needs dataset\.source"):
        partitions.release_partitions(parse_spec(spec_dict(partitions={"by": "file"})))


def _write(path: Path, periods: list[str]) -> None:
    rng = np.random.default_rng(3)  # public randomness: synthetic test data
    pq.write_table(
        pa.table(
            {
                "period": pa.array([periods[k % len(periods)] for k in range(60)]),
                "a": pa.array(rng.integers(0, 4, 60), pa.int16()),
            }
        ),
        path,
    )


def test_by_column_is_the_domain_never_the_values_in_the_data(tmp_path: Path) -> None:
    """Rule: the partitions are every cell of the column's *domain*.  Data holding only one period
    (or none of them) is charged to the same partitions as data holding both, so the charges say
    nothing about which values occur."""
    both, only_one = tmp_path / "both.parquet", tmp_path / "one.parquet"
    _write(both, ["2026-10", "2026-11"])
    _write(only_one, ["2026-11"])
    touched = {
        partitions.release_partitions(
            parse_spec(spec_dict(source, partitions={"column": "period"}))
        )
        for source in (both, only_one)
    }
    assert touched == {("period=2026-10", "period=2026-11")}
    narrowed = spec_dict(only_one, partitions={"column": "period"})
    narrowed["domain"]["period"] = {"values": ["2026-11"]}
    assert partitions.release_partitions(parse_spec(narrowed)) == ("period=2026-11",)


def test_too_many_partitions_are_refused_before_anything(tmp_path: Path) -> None:
    wide = spec_dict(partitions={"column": "day"})
    wide["domain"]["day"] = {"min": 0, "max": MAX_PARTITIONS_PER_RELEASE}
    with pytest.raises(SpecError, match=r"reads 1001 partitions \(cells of domain\.day\)"):
        partitions.release_partitions(parse_spec(wide))


# --- the ledger: a cap per partition --------------------------------------------------------------


def test_each_partition_has_the_cap_and_whole_dataset_charges_count_against_all(
    tmp_path: Path,
) -> None:
    catalog = catalog_at(tmp_path)
    catalog.ensure_dataset("survey", cap=pure(1.5), partitioned_by="file")
    catalog.charge("survey", pure(1.0), release_id="r-oct", label="oct", partitions=("oct",))
    catalog.charge("survey", pure(1.0), release_id="r-nov", label="nov", partitions=("nov",))
    # without the declaration these two would have needed 2.0 > 1.5: parallel composition
    assert catalog.spent("survey") == pure(1.0)
    assert catalog.spent("survey", partitions=("oct",)) == pure(1.0)
    assert catalog.spent("survey", partitions=("dec",)) == pure(0.0)
    with pytest.raises(BudgetExceededError, match=r"dataset 'survey' partition 'nov' would be"):
        catalog.check_budget("survey", pure(1.0), partitions=("dec", "nov"))
    with pytest.raises(BudgetExceededError, match=r"partition 'oct'"):
        catalog.charge("survey", pure(1.0), release_id="r-x", label="x", partitions=("oct", "dec"))
    assert len(catalog.ledger_entries("survey")) == 2  # refused whole: no partial charge
    catalog.charge("survey", pure(0.25), release_id="r-all", label="all")  # whole dataset
    assert catalog.spent("survey", partitions=("dec",)) == pure(0.25)
    assert catalog.spent("survey") == pure(1.25)
    rows = [
        (p.partition, p.spent.epsilon, p.remaining.epsilon)
        for p in catalog.partition_spending("survey")
    ]
    assert rows == [("nov", 1.25, 0.25), ("oct", 1.25, 0.25)]
    # a release over several partitions charges each of them
    catalog.charge("survey", pure(0.2), release_id="r-2", label="two", partitions=("dec", "oct"))
    entries = catalog.ledger_entries("survey")
    assert [(e.release_id, e.partition, e.cost.epsilon) for e in entries[-2:]] == [
        ("r-2", "dec", 0.2),
        ("r-2", "oct", 0.2),
    ]
    spend = running_spend(entries, "pure")
    assert [round(c.epsilon, 9) for c in spend] == [1.0, 1.0, 1.25, 0.45, 1.45]
    assert catalog.spent("survey") == pure(1.25 + 0.2)
    assert catalog.verify_chain() == []
    assert catalog.partitioned_by("survey") == "file"


def test_a_partitioning_is_added_once_and_never_changed(tmp_path: Path) -> None:
    catalog = catalog_at(tmp_path)
    catalog.ensure_dataset("survey", cap=pure(1.5))
    catalog.charge("survey", pure(0.5), release_id="r0", label="before the declaration")
    catalog.ensure_dataset("survey", cap=pure(1.5), partitioned_by="column:period")
    assert catalog.partitioned_by("survey") == "column:period"
    assert catalog.spent("survey", partitions=("period=2026-11",)) == pure(0.5)
    catalog.ensure_dataset("survey", cap=pure(1.5))  # a spec without it: whole-dataset release
    with pytest.raises(CatalogError, match=r"registered as partitioned by 'column:period'.*'file'"):
        catalog.ensure_dataset("survey", cap=pure(1.5), partitioned_by="file")
    with pytest.raises(CatalogError, match=r"dataset 'nowhere' is not in the catalog"):
        catalog.partitioned_by("nowhere")


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ((), r"partitions must name at least one partition"),
        (("a", "a"), r"name a partition twice"),
        (("",), r"partition '' must be a non-empty name"),
        (("x" * 257,), r"must be a non-empty name of at most 256 characters"),
        (
            tuple(str(k) for k in range(MAX_PARTITIONS_PER_RELEASE + 1)),
            r"reads 1001 partitions; at most 1000",
        ),
    ],
)
def test_partition_validators(tmp_path: Path, given: tuple[str, ...], match: str) -> None:
    catalog = catalog_at(tmp_path)
    catalog.ensure_dataset("survey", cap=pure(1.5))
    with pytest.raises(CatalogError, match=match):
        catalog.charge("survey", pure(0.1), release_id="r", label="x", partitions=given)
    with pytest.raises(CatalogError, match=match):
        catalog.check_budget("survey", pure(0.1), partitions=given)


# --- the chain covers the kind and the partition -----------------------------------------------------


def test_the_chain_covers_partition_and_kind(tmp_path: Path) -> None:
    catalog = catalog_at(tmp_path)
    catalog.ensure_dataset("survey", cap=pure(1.5), partitioned_by="file")
    catalog.charge("survey", pure(0.5), release_id="r1", label="p", partitions=("oct",))
    [entry] = catalog.ledger_entries()
    fields = {
        "seq": entry.seq,
        "receipt_id": entry.receipt_id,
        "dataset_id": entry.dataset_id,
        "release_id": entry.release_id,
        "label": entry.label,
        "measure": "pure",
        "epsilon": 0.5,
        "rho": 0.0,
        "delta": 0.0,
        "created_at": entry.created_at,
        "prev_hash": GENESIS,
        "entry_kind": "charge",
        "partition_key": "oct",
    }
    assert entry_digest(**fields) == entry.entry_hash
    for name, value in (
        ("partition_key", "nov"),
        ("partition_key", None),
        ("entry_kind", "skipped"),
    ):
        assert entry_digest(**{**fields, name: value}) != entry.entry_hash, (name, value)
    path = tmp_path / "catalog.db"
    sql(path, "UPDATE ledger SET partition_key = 'nov'")
    assert any("was edited" in p for p in Catalog(f"sqlite:///{path}").verify_chain())
    sql(path, "UPDATE ledger SET partition_key = NULL")  # moved onto the whole dataset
    assert any("was edited" in p for p in Catalog(f"sqlite:///{path}").verify_chain())
    sql(path, "UPDATE ledger SET partition_key = 'oct', entry_kind = 'skipped'")
    assert any("was edited" in p for p in Catalog(f"sqlite:///{path}").verify_chain())
    sql(path, "UPDATE ledger SET entry_kind = 'charge'")
    assert Catalog(f"sqlite:///{path}").verify_chain() == []


# --- version-2 catalogs are migrated -----------------------------------------------------------------

V2_COLUMNS = [
    "ALTER TABLE ledger ADD COLUMN prev_hash VARCHAR(64)",
    "ALTER TABLE ledger ADD COLUMN entry_hash VARCHAR(64)",
    *(
        f"ALTER TABLE releases ADD COLUMN {column}"
        for column in (
            "owner_pid INTEGER",
            "owner_host VARCHAR(255)",
            "owner_start VARCHAR(32)",
            "heartbeat_at VARCHAR(40)",
            "interrupted_at VARCHAR(40)",
        )
    ),
    "CREATE TABLE catalog_meta (key VARCHAR(64) NOT NULL PRIMARY KEY, value TEXT NOT NULL)",
    "INSERT INTO catalog_meta VALUES ('schema', 'dprelease-catalog'), ('version', '2'),"
    " ('chain', 'dprelease-ledger-entry/1')",
]


def make_v2_catalog(path: Path, charges: list[float]) -> list[str]:
    """A catalog as schema version 2 wrote it: chained entries, no kinds or partitions."""
    stamp = "2026-06-01T00:00:00.000000+00:00"
    statements = [*V1_SCHEMA, *V2_COLUMNS]
    statements.append(f"INSERT INTO datasets VALUES ('ds', 'pure', 3.0, 0.0, 0.0, '{stamp}')")
    previous, hashes = GENESIS, []
    for k, epsilon in enumerate(charges):
        values = {
            "seq": k + 1,
            "receipt_id": f"rcpt-v2-{k}",
            "dataset_id": "ds",
            "release_id": f"v2-{k}",
            "label": f"v2 step {k}",
            "measure": "pure",
            "epsilon": epsilon,
            "rho": 0.0,
            "delta": 0.0,
            "created_at": stamp,
            "prev_hash": previous,
        }
        digest = entry_digest(**values)  # format 1: what version 2 computed
        statements.append(
            f"INSERT INTO ledger VALUES ({k + 1}, 'rcpt-v2-{k}', 'ds', 'v2-{k}', 'v2 step {k}',"
            f" 'pure', {epsilon!r}, 0.0, 0.0, '{stamp}', '{previous}', '{digest}')"
        )
        previous = digest
        hashes.append(digest)
    statements.append(
        "INSERT INTO releases VALUES ('v2-0', 'old', 'ds', 'staged', 'ffff', 'eeee', 'identity',"
        f" NULL, NULL, NULL, '{stamp}', '{stamp}', NULL, NULL, NULL, NULL, NULL)"
    )
    sql(path, *statements)
    return hashes


def test_a_version_2_catalog_is_migrated_and_its_chain_still_verifies(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    hashes = make_v2_catalog(path, [0.5, 0.75])
    catalog = Catalog(f"sqlite:///{path}")
    entries = catalog.ledger_entries()
    assert [(e.kind, e.partition, e.entry_hash) for e in entries] == [
        ("charge", None, hashes[0]),
        ("charge", None, hashes[1]),
    ]
    assert catalog.verify_chain() == []
    assert catalog.spent("ds") == pure(1.25) and catalog.partitioned_by("ds") is None
    assert catalog.release("v2-0").series_key is None
    with sqlite3.connect(path) as connection:
        marker = dict(connection.execute("SELECT key, value FROM catalog_meta").fetchall())
    assert marker["version"] == str(SCHEMA_VERSION) == "3"
    # new kinds of entry after the migration, and the chain still verifies on reopening
    catalog.ensure_dataset("ds", cap=pure(3.0), partitioned_by="file")
    catalog.charge("ds", pure(1.0), release_id="new", label="p", partitions=("a", "b"))
    assert catalog.spent("ds", partitions=("a",)) == pure(2.25)
    assert Catalog(f"sqlite:///{path}").verify_chain() == []


# --- a release over a partition, end to end (no Prefect) ----------------------------------------------


def test_a_release_of_one_period_charges_that_partition_only(tmp_path: Path, zero_noise) -> None:
    source = tmp_path / "survey.parquet"
    _write(source, ["2026-10", "2026-11"])
    raw = spec_dict(source, partitions={"column": "period"})
    raw["domain"]["period"] = {"values": ["2026-11"]}  # this release: November only
    raw["on_out_of_domain"] = "drop"
    spec = parse_spec(raw)
    catalog = catalog_at(tmp_path)
    directory = release_stages(spec, catalog, tmp_path / "out")
    [entry] = catalog.ledger_entries("survey")
    assert entry.partition == "period=2026-11"
    assert entry.cost.epsilon == pytest.approx(1.0, abs=1e-9)
    assert catalog.spent("survey", partitions=("period=2026-10",)) == pure(0.0)
    manifest = artifacts.read_manifest(directory)
    assert manifest["partitions"]["charged"] == ["period=2026-11"]
    assert "disjoint sets of people" in manifest["partitions"]["assumption"]
    assert [r["partition"] for r in manifest["ledger_receipts"]] == ["period=2026-11"]
    assert manifest["budget"]["after"]["epsilon"] == pytest.approx(1.0, abs=1e-9)
    artifacts.verify(directory, catalog)


def test_budget_shows_the_spending_per_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from typer.testing import CliRunner

    from dprelease.flows.cli import app

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    catalog = Catalog()
    catalog.ensure_dataset("survey", cap=pure(1.5), partitioned_by="file")
    catalog.charge("survey", pure(1.0), release_id="r-oct", label="oct", partitions=("oct",))
    catalog.charge("survey", pure(0.25), release_id="r-all", label="all")
    shown = CliRunner().invoke(app, ["budget", "survey", "--json"])
    assert shown.exit_code == 0, shown.output
    [dataset] = json.loads(shown.stdout)["datasets"]
    assert dataset["partitioned_by"] == "file"
    assert dataset["spent"] == {"epsilon": 1.25}
    assert dataset["partitions"] == [
        {
            "partition": "oct",
            "spent": {"epsilon": 1.25},
            "remaining": {"epsilon": 0.25},
            "entries": 1,
        }
    ]
    assert [(e["partition"], e["cumulative"]) for e in dataset["ledger"]] == [
        ("oct", {"epsilon": 1.0}),
        (None, {"epsilon": 1.25}),
    ]
    text = CliRunner().invoke(app, ["budget", "survey"])
    assert text.exit_code == 0, text.output
    assert "partitioned by file" in text.stdout and "spending per partition" in text.stdout
