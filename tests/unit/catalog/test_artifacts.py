"""Release directories and offline verification (``catalog.publishing.artifacts.verify``).

One release is built per module with the real stage functions (no Prefect): register → count →
measure → reconstruct → validate → stage, on a tiny synthetic Parquet file, with the zero-noise
sampler patched in as the production sampler, so the released tables must equal the exact answers.
Each tampering test works on a copy of that directory and checks that ``verify`` names the problem.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import release
from dprelease.catalog.errors import BudgetExceededError, VerificationError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import Plan, build_workload, make_plan
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.publishing.artifacts import verify
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms import registry
from dprelease.mechanisms.primitives import noise
from tests.samplers import ZeroNoise

ROWS = 400
SEED = 20261122


@dataclass(frozen=True, kw_only=True)
class Built:
    spec: ReleaseSpec
    plan: Plan
    catalog: Catalog
    directory: Path
    release_id: str
    data: pa.Table
    sampler: ZeroNoise
    tables: dict[str, pa.Table]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    root = tmp_path_factory.mktemp("release")
    rng = np.random.default_rng(SEED)
    data = pa.table(
        {
            "age": pa.array(rng.integers(0, 10, ROWS), pa.int16()),
            "sex": pa.array(rng.choice(["F", "M"], ROWS)),
        }
    )
    pq.write_table(data, root / "people.parquet")
    spec = parse_spec(
        {
            "name": "tiny",
            "dataset": {
                "id": "tiny-ds",
                "source": str(root / "people.parquet"),
                "budget": {"epsilon": 3.0},
            },
            "domain": {"age": {"min": 0, "max": 9}, "sex": {"values": ["F", "M"]}},
            "workload": [
                {"name": "age_by_sex", "marginal": ["age", "sex"]},
                {"name": "age_cdf", "prefix": "age"},
                {"name": "everyone", "total": True},
            ],
            "privacy": {"epsilon": 1.0},
        }
    )
    catalog = Catalog(f"sqlite:///{root}/catalog.db")
    sampler = ZeroNoise()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(noise, "production_sampler", lambda: sampler)
        plan = make_plan(spec)
        release_id = release.new_release_id(spec)
        directory = release.release_directory(root / "out", release_id)
        spent_before = release.register(spec, plan, catalog, release_id=release_id)
        ingested = release.ingest(spec, plan, catalog)
        measurement = release.measure(ingested, spec, plan, catalog, release_id=release_id)
        tables = release.reconstruct(spec, plan, measurement)
        validation = release.validate(tables, plan, directory=directory)
        release.stage(
            spec=spec,
            plan=plan,
            release_id=release_id,
            directory=directory,
            ingested=ingested,
            measurement=measurement,
            tables=tables,
            validation=validation,
            spent_before=spent_before,
            catalog=catalog,
        )
    yield Built(
        spec=spec,
        plan=plan,
        catalog=catalog,
        directory=directory,
        release_id=release_id,
        data=data,
        sampler=sampler,
        tables=tables,
    )


@pytest.fixture
def copy(built: Built, tmp_path: Path) -> Path:
    """A fresh copy of the staged release directory (the catalog still vouches for it)."""
    target = tmp_path / built.release_id
    shutil.copytree(built.directory, target)
    return target


def read_manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "manifest.json").read_text())


def write_manifest_text(directory: Path, manifest: dict[str, Any]) -> None:
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def true_cells(data: pa.Table) -> np.ndarray:
    cells = np.zeros((10, 2))
    sex = (np.asarray(data["sex"].to_pylist()) == "M").astype(int)
    np.add.at(cells, (data["age"].to_numpy().astype(int), sex), 1)
    return cells


# --- the built release ---------------------------------------------------------------------------


def test_release_with_zero_noise_equals_the_exact_answers(built: Built) -> None:
    assert built.plan.chosen in registry.names(model="central")
    assert len(built.sampler.calls) == 1  # one measurement, through the patched sampler
    cells = true_cells(built.data)
    exact = {item.name: item.answer(cells.ravel()) for item in build_workload(built.spec).items}
    for name, table in built.tables.items():
        np.testing.assert_allclose(table["estimate"].to_numpy(), exact[name], atol=1e-9)
        assert np.all(table["std_error"].to_numpy() > 0)
    # labels line up with the estimates (checked against the data, not the code's own order)
    marginal = built.tables["age_by_sex"].to_pylist()
    assert len(marginal) == 20
    for row in marginal:
        expected = cells[row["age"], ["F", "M"].index(row["sex"])]
        assert row["estimate"] == pytest.approx(expected, abs=1e-9)
    cdf = built.tables["age_cdf"].to_pylist()
    for row in cdf:
        assert row["estimate"] == pytest.approx(cells[: row["age_upper"] + 1].sum(), abs=1e-9)
    assert built.tables["everyone"]["estimate"].to_pylist() == pytest.approx([ROWS])


def test_staged_tables_on_disk_are_the_reconstructed_tables(built: Built) -> None:
    for name, table in built.tables.items():
        on_disk = pq.read_table(built.directory / "tables" / f"{name}.parquet")
        assert on_disk.equals(table)


def test_manifest_records_the_charge_and_every_artifact(built: Built) -> None:
    manifest = read_manifest(built.directory)
    [entry] = built.catalog.ledger_entries("tiny-ds")
    assert entry.release_id == built.release_id
    assert manifest["ledger_receipts"] == [
        {
            "receipt_id": entry.receipt_id,
            "label": entry.label,
            "cost": entry.cost.as_dict(),
            "paid_by_release": built.release_id,
            "seq": entry.seq,
            "entry_hash": entry.entry_hash,
        }
    ]
    assert 0 < entry.cost.epsilon <= 1.0
    assert manifest["budget"]["after"] == entry.cost.as_dict()
    assert set(manifest["artifacts"]) >= {
        "report.html",
        "validation/results.json",
        "tables/age_by_sex.parquet",
        "tables/age_cdf.parquet",
        "tables/everyone.parquet",
    }
    assert manifest["tables"] == ["age_by_sex", "age_cdf", "everyone"]
    record = built.catalog.release(built.release_id)
    assert record.status == "staged"
    assert record.manifest_sha256 == artifacts.sha256_file(built.directory / "manifest.json")


def test_verify_passes_on_the_release_and_on_a_copy(built: Built, copy: Path) -> None:
    assert verify(built.directory, built.catalog) == []
    assert verify(copy, built.catalog) == []


def test_register_refuses_an_over_budget_release_before_recording_it(
    built: Built, tmp_path: Path
) -> None:
    catalog = copied_catalog(built, tmp_path)
    greedy = built.spec.model_copy(update={"privacy": {"epsilon": 2.5}})  # 1 spent of 3
    ledger_before = catalog.ledger_entries()
    with pytest.raises(
        BudgetExceededError, match=r"requested epsilon=2\.5, spent epsilon=1, cap epsilon=3 "
    ):
        release.register(greedy, make_plan(greedy), catalog, release_id="greedy-1")
    assert [r.id for r in catalog.releases()] == [built.release_id]
    assert catalog.ledger_entries() == ledger_before


# --- tampering -------------------------------------------------------------------------------------


def test_modified_table(built: Built, copy: Path) -> None:
    path = copy / "tables" / "age_by_sex.parquet"
    table = pq.read_table(path)
    estimates = table["estimate"].to_numpy().copy()
    estimates[0] += 1.0
    pq.write_table(
        table.set_column(table.schema.get_field_index("estimate"), "estimate", pa.array(estimates)),
        path,
    )
    with pytest.raises(
        VerificationError,
        match=r"artifact tables/age_by_sex\.parquet was modified \(sha256 \w+…, manifest says \w+…\)",
    ):
        verify(copy, built.catalog)


def test_flipped_byte_in_a_table(built: Built, copy: Path) -> None:
    path = copy / "tables" / "age_cdf.parquet"
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x01
    path.write_bytes(bytes(content))
    with pytest.raises(VerificationError, match=r"artifact tables/age_cdf\.parquet was modified"):
        verify(copy, built.catalog)


def test_garbage_table_is_reported_as_unreadable(built: Built, copy: Path) -> None:
    (copy / "tables" / "everyone.parquet").write_bytes(b"not parquet")
    with pytest.raises(VerificationError, match=r"table everyone is not readable Parquet"):
        verify(copy, built.catalog)


def test_edited_manifest(built: Built, copy: Path) -> None:
    manifest = read_manifest(copy)
    manifest["privacy"]["requested"] = {"epsilon": 0.1}  # claim a smaller cost
    write_manifest_text(copy, manifest)
    with pytest.raises(
        VerificationError,
        match=r"manifest\.json was modified: its sha256 does not match the one the catalog recorded",
    ):
        verify(copy, built.catalog)


def test_consistent_forgery_is_caught_by_the_catalog_hash(built: Built, copy: Path) -> None:
    """A table changed *and* its hash updated in the manifest: only the catalog's record catches it."""
    (copy / "tables" / "everyone.parquet").write_bytes(
        (copy / "tables" / "age_cdf.parquet").read_bytes()
    )
    manifest = read_manifest(copy)
    manifest.pop("artifacts")
    artifacts.write_manifest(copy, manifest)  # rehashes every file
    with pytest.raises(VerificationError) as caught:
        verify(copy, built.catalog)
    message = str(caught.value)
    assert "manifest.json was modified" in message
    assert "was modified (sha256" not in message  # the artifact hashes themselves now agree


def test_whitespace_only_manifest_edit(built: Built, copy: Path) -> None:
    path = copy / "manifest.json"
    path.write_text(path.read_text() + "\n")
    with pytest.raises(VerificationError, match=r"manifest\.json was modified"):
        verify(copy, built.catalog)


@pytest.mark.parametrize(
    "name",
    ["report.html", "tables/age_cdf.parquet", "validation/docs/index.html"],
    ids=["report", "table", "data-docs"],
)
def test_missing_file(built: Built, copy: Path, name: str) -> None:
    (copy / name).unlink()
    with pytest.raises(VerificationError, match="missing artifact " + re.escape(name)):
        verify(copy, built.catalog)


def test_missing_validation_results(built: Built, copy: Path) -> None:
    (copy / "validation" / "results.json").unlink()
    with pytest.raises(VerificationError) as caught:
        verify(copy, built.catalog)
    assert "missing artifact validation/results.json" in str(caught.value)
    assert "validation/results.json is missing" in str(caught.value)


@pytest.mark.parametrize(
    "name",
    [
        "notes.txt",
        "tables/extra.parquet",
        "validation/docs/injected.html",
        "tables/manifest.json",
    ],
    ids=["top-level", "table", "nested", "nested-file-named-manifest"],
)
def test_extra_file(built: Built, copy: Path, name: str) -> None:
    (copy / name).write_text("added later")
    with pytest.raises(
        VerificationError,
        match=f"unexpected file {re.escape(name)} is not in the manifest",
    ):
        verify(copy, built.catalog)


def test_tampered_receipt_id(built: Built, copy: Path) -> None:
    manifest = read_manifest(copy)
    manifest["ledger_receipts"][0]["receipt_id"] = "rcpt-" + "0" * 32
    write_manifest_text(copy, manifest)
    with pytest.raises(VerificationError) as caught:
        verify(copy, built.catalog)
    assert f"ledger receipt rcpt-{'0' * 32} is not in the ledger" in str(caught.value)


def test_receipt_with_a_different_cost(built: Built, copy: Path) -> None:
    manifest = read_manifest(copy)
    receipt = manifest["ledger_receipts"][0]
    receipt["cost"] = {"epsilon": 0.01}
    write_manifest_text(copy, manifest)
    with pytest.raises(
        VerificationError,
        match=rf"ledger receipt {receipt['receipt_id']} charged \{{'epsilon': [0-9.]+\}}, "
        r"manifest says \{'epsilon': 0\.01\}",
    ):
        verify(copy, built.catalog)


def copied_catalog(built: Built, tmp_path: Path) -> Catalog:
    """A private copy of the module's catalog, for tests that write to it."""
    target = tmp_path / "catalog-copy.db"
    shutil.copyfile(Path(built.catalog.engine.url.database or ""), target)
    return Catalog(f"sqlite:///{target}")


def test_receipt_of_another_release(built: Built, copy: Path, tmp_path: Path) -> None:
    catalog = copied_catalog(built, tmp_path)
    other = catalog.charge(
        "tiny-ds",
        catalog.ledger_entries("tiny-ds")[0].cost,
        release_id="someone-else",
        label="other",
    )
    manifest = read_manifest(copy)
    manifest["ledger_receipts"][0]["receipt_id"] = other
    write_manifest_text(copy, manifest)
    with pytest.raises(
        VerificationError, match=rf"ledger receipt {other} belongs to release someone-else"
    ):
        verify(copy, catalog)


def test_corrupt_validation_results_are_a_verification_error(built: Built, copy: Path) -> None:
    (copy / "validation" / "results.json").write_text("{truncated")
    with pytest.raises(VerificationError, match=r"artifact validation/results\.json was modified"):
        verify(copy, built.catalog)


def test_validation_results_recording_a_failure(built: Built, copy: Path) -> None:
    path = copy / "validation" / "results.json"
    results = json.loads(path.read_text())
    results["success"] = False
    path.write_text(json.dumps(results))
    with pytest.raises(VerificationError, match=r"validation results record a failure"):
        verify(copy, built.catalog)


def test_release_unknown_to_the_catalog(copy: Path, tmp_path: Path) -> None:
    empty = Catalog(f"sqlite:///{tmp_path}/empty.db")
    with pytest.raises(
        VerificationError, match=r"release '[\w.-]+' is not in the catalog at sqlite"
    ):
        verify(copy, empty)


def test_missing_manifest(built: Built, copy: Path) -> None:
    (copy / "manifest.json").unlink()
    with pytest.raises(VerificationError, match=r"has no manifest\.json"):
        verify(copy, built.catalog)


def test_manifest_that_is_not_json(built: Built, copy: Path) -> None:
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(VerificationError, match=r"manifest\.json is not valid JSON"):
        verify(copy, built.catalog)


def test_manifest_that_is_not_a_json_object(built: Built, copy: Path) -> None:
    (copy / "manifest.json").write_text("[]\n")
    with pytest.raises(VerificationError, match=r"manifest\.json"):
        verify(copy, built.catalog)
