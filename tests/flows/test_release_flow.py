"""End to end through Prefect: the release flow, its cache, the ledger, review and verification."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.errors import BudgetExceededError, VerificationError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from dprelease.catalog.review.decisions import review
from tests.flows.conftest import write_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]


def _exact_answers(parquet: Path) -> dict[str, np.ndarray]:
    """Independent reference: pandas counts straight from the rows."""
    frame = pq.read_table(parquet).to_pandas()
    a_by_b = (
        frame.groupby(["a", "b"])
        .size()
        .reindex([(a, b) for a in range(10) for b in "xyz"], fill_value=0)
    )
    a_counts = frame["a"].value_counts().reindex(range(10), fill_value=0).to_numpy()
    c_counts = frame["c"].value_counts().reindex(range(4), fill_value=0).to_numpy()
    c_ranges = [c_counts[lo : hi + 1].sum() for lo in range(4) for hi in range(lo, 4)]
    return {
        "a_by_b": a_by_b.to_numpy(),
        "a_cdf": np.cumsum(a_counts),
        "c_ranges": np.array(c_ranges),
        "a_halves": np.array([a_counts[:5].sum(), a_counts[5:].sum()]),
        "everyone": np.array([len(frame)]),
    }


def test_zero_noise_release_equals_exact_answers(
    tmp_path: Path, tiny_dataset: Path, zero_noise
) -> None:
    from dprelease.flows.release_flow import release_flow

    spec_path = write_spec(tmp_path, tiny_dataset)
    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    staged = release_flow(
        spec_path=str(spec_path), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
    )
    directory = Path(staged.directory)
    expected = _exact_answers(tiny_dataset)
    for name, answers in expected.items():
        table = pq.read_table(directory / "tables" / f"{name}.parquet")
        np.testing.assert_allclose(table["estimate"].to_numpy(), answers, atol=1e-8, err_msg=name)
        assert (table["std_error"].to_numpy() > 0).all()
    labels = pq.read_table(directory / "tables" / "a_by_b.parquet").to_pydict()
    assert labels["a"][:3] == [0, 0, 0] and labels["b"][:3] == ["x", "y", "z"]
    ranges = pq.read_table(directory / "tables" / "a_halves.parquet").to_pydict()
    assert ranges["a_low"] == [0, 5] and ranges["a_high"] == [4, 9]
    assert zero_noise.calls and zero_noise.calls[0][0] == "laplace"

    catalog = Catalog(catalog_url)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["release_id"] == staged.release_id
    assert manifest["review"]["status"] == "staged"
    assert manifest["privacy"]["charged"]["epsilon"] <= 1.0
    assert [r["receipt_id"] for r in manifest["ledger_receipts"]] == [
        e.receipt_id for e in catalog.ledger_entries(manifest["dataset_id"])
    ]
    assert set(manifest["artifacts"]) >= {
        "report.html",
        "validation/results.json",
        "tables/a_cdf.parquet",
    }
    assert catalog.release(staged.release_id).status == "staged"
    assert "std_error" in (directory / "report.html").read_text()
    artifacts.verify(directory, catalog)

    result = review(
        catalog,
        staged.release_id,
        approve=True,
        reviewer="Ada",
        note="checked",
        publish_dir=tmp_path / "pub",
    )
    assert result["status"] == "published"
    published = Path(result["published_directory"])
    artifacts.verify(published, catalog)
    trail = json.loads((published / "manifest.json").read_text())["review"]
    assert trail["status"] == "published" and trail["trail"][0]["reviewer"] == "Ada"

    # a tampered table is caught
    (directory / "tables" / "a_cdf.parquet").write_bytes(b"not the table")
    with pytest.raises(VerificationError, match=r"a_cdf\.parquet was modified"):
        artifacts.verify(directory, catalog)


def test_over_budget_is_refused_before_reading_data(
    tmp_path: Path, tiny_dataset: Path, zero_noise, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dprelease.catalog.confidential.source
    from dprelease.flows.release_flow import release_flow

    reads: list[str] = []
    original = dprelease.catalog.confidential.source.count_cells
    monkeypatch.setattr(
        dprelease.catalog.confidential.source,
        "count_cells",
        lambda spec, **kwargs: reads.append("read") or original(spec, **kwargs),
    )
    spec_path = write_spec(tmp_path, tiny_dataset, privacy={"epsilon": 1.5})
    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    release_flow(spec_path=str(spec_path), out_dir=str(tmp_path / "out"), catalog_url=catalog_url)
    assert reads == ["read"]
    with pytest.raises(
        BudgetExceededError, match=r"requested epsilon=1\.5.*spent epsilon=1\.5.*cap epsilon=2\.5"
    ):
        release_flow(
            spec_path=str(spec_path), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
        )
    assert reads == ["read"]  # refused before the data was read
    entries = Catalog(catalog_url).ledger_entries()
    assert len(entries) == 1


def test_failure_after_charge_keeps_the_charge(
    tmp_path: Path, tiny_dataset: Path, zero_noise, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dprelease.tasks.stages
    from dprelease.flows.release_flow import release_flow

    def crash(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("simulated crash after the charge")

    monkeypatch.setattr(dprelease.tasks.stages.release, "reconstruct", crash)
    spec_path = write_spec(tmp_path, tiny_dataset)
    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    with pytest.raises(RuntimeError, match="simulated crash"):
        release_flow(
            spec_path=str(spec_path), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
        )
    catalog = Catalog(catalog_url)
    [record] = catalog.releases()
    assert record.status == "failed"
    assert catalog.spent(record.dataset_id).epsilon == pytest.approx(1.0, abs=1e-6)


def test_plan_is_cached_by_workload_and_a_changed_workload_misses(
    tmp_path: Path, tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect import flow

    import dprelease.tasks.stages
    from dprelease.catalog.spec.load import load_spec

    calls: list[str] = []
    original = dprelease.tasks.stages.make_plan
    monkeypatch.setattr(
        dprelease.tasks.stages, "make_plan", lambda spec: calls.append(spec.name) or original(spec)
    )

    @flow
    def plan_twice(path: str) -> list[str]:
        spec = load_spec(path)
        first = dprelease.tasks.stages.plan_task(spec)
        second = dprelease.tasks.stages.plan_task(spec)
        return [first.chosen, second.chosen]

    unique = tmp_path.name[-8:].replace("_", "")  # a workload no earlier test has planned
    spec_path = write_spec(
        tmp_path, tiny_dataset, workload=[{"name": f"cdf{unique}", "prefix": "a"}]
    )
    first, second = plan_twice(str(spec_path))
    assert first == second
    assert len(calls) == 1  # the second call was a cache hit
    changed = write_spec(tmp_path, tiny_dataset, workload=[{"name": f"cdf{unique}", "prefix": "c"}])
    plan_twice(str(changed))
    assert len(calls) == 2  # a different workload fingerprint is a miss
