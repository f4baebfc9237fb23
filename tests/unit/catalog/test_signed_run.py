"""A release run through the stages (no Prefect) on a dataset whose custodian registered keys:
refused before any charge without an operator key, else its run and charges are signed by the
operator key (``DPRELEASE_KEY``, loaded by name; only its id is recorded), two reviewer keys
publish it, and the published copy verifies; the operator key cannot approve it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import release
from dprelease.catalog.identity import roles, signing
from dprelease.catalog.identity.keys import IdentityError, create_key
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.review import decisions, signatures
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms.primitives.privacy import PrivacyCost


def _spec(source: Path):
    return parse_spec(
        {
            "name": "signed",
            "dataset": {"id": "ds", "source": str(source), "budget": {"epsilon": 5}},
            "domain": {"v": {"min": 0, "max": 7}},
            "workload": [{"name": "v", "prefix": "v"}],
            "privacy": {"epsilon": 1.0},
            "review": {"approvers": 2},
        }
    )


def _run(spec, catalog: Catalog, out: Path) -> release.StagedRelease:
    plan = make_plan(spec)
    release_id = release.new_release_id(spec)
    before = release.register(spec, plan, catalog, release_id=release_id)
    ingested = release.ingest(spec, plan, catalog)
    measurement = release.measure(ingested, spec, plan, catalog, release_id=release_id)
    tables = release.reconstruct(spec, plan, measurement)
    directory = release.release_directory(out, release_id)
    validation = release.validate(tables, plan, directory=directory)
    return release.stage(
        spec=spec,
        plan=plan,
        release_id=release_id,
        directory=directory,
        ingested=ingested,
        measurement=measurement,
        tables=tables,
        validation=validation,
        spent_before=before,
        catalog=catalog,
    )


def test_a_signed_run_reviewed_by_two_keys_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    rng = np.random.default_rng(3)  # public randomness: synthetic test data
    source = tmp_path / "d.parquet"
    pq.write_table(pa.table({"v": pa.array(rng.integers(0, 8, 200), pa.int16())}), source)
    spec = _spec(source)
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    catalog.ensure_dataset("ds", cap=PrivacyCost(measure="pure", epsilon=5.0))
    keys = {name: create_key(name)[0] for name in ("cara", "svc", "ada", "bob")}
    for name, granted in [
        ("cara", "custodian"),
        ("svc", "operator"),
        ("ada", "reviewer"),
        ("bob", "reviewer"),
    ]:
        roles.register_key(
            catalog,
            dataset_id="ds",
            public=keys[name].public,
            name=name,
            roles=[granted],
            signer=keys["cara"],
        )
    with pytest.raises(IdentityError, match="requires signed runs"):
        _run(spec, catalog, tmp_path / "releases")
    monkeypatch.setenv(signing.KEY_ENV, "ada")  # a reviewer, not an operator
    with pytest.raises(IdentityError, match=r"not operator: it may not run releases"):
        _run(spec, catalog, tmp_path / "releases")
    assert catalog.spent("ds").epsilon == 0 and catalog.releases() == []  # nothing charged
    monkeypatch.setenv(signing.KEY_ENV, "svc")
    staged = _run(spec, catalog, tmp_path / "releases")
    steps = signing.steps(catalog, staged.release_id)
    charges = [e for e in catalog.ledger_entries("ds") if e.kind == "charge"]
    assert [s.step for s in steps] == ["run"] + ["charge"] * len(charges)
    assert {s.key_id for s in steps} == {keys["svc"].key_id}
    assert signing.step_problems(catalog, staged.release_id, "ds") == []
    directory = Path(staged.directory)
    from dprelease.flows.notify import review_notice

    _, notice = review_notice(catalog, staged.release_id)
    assert notice.endswith(
        f"decide: dprelease review {staged.release_id} --approve|--reject --key NAME"
    )
    for name in ("svc", "ada", "bob"):
        signature = signatures.sign_decision(directory, key=keys[name], approve=True)
        if name == "svc":
            with pytest.raises(IdentityError, match="signed the run"):
                decisions.review(
                    catalog,
                    staged.release_id,
                    approve=True,
                    reviewer="someone",
                    note="",
                    signature=signature,
                )
            continue
        outcome = decisions.review(
            catalog, staged.release_id, approve=True, reviewer=name, note="", signature=signature
        )
    assert outcome["status"] == "published"
    report = (Path(outcome["published_directory"]) / "report.html").read_text()
    assert "<th class='lab'>signed by</th>" in report
    assert all(f"key {keys[name].key_id} (reviewer)" in report for name in ("ada", "bob"))
    notes = signatures.verify_release(Path(outcome["published_directory"]), catalog)
    assert len(notes) == 2 and all("(reviewer)" in note for note in notes)


def test_a_series_period_needs_an_operator_key_and_its_charges_are_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dprelease.catalog import series
    from tests.unit.catalog.test_series_release import _spec as series_spec
    from tests.unit.catalog.test_series_release import _write_period

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    folder = tmp_path / "periods"
    folder.mkdir()
    _write_period(folder, 1, seed=1)
    spec = series_spec(folder)
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    catalog.ensure_dataset(spec.dataset.id, cap=spec.dataset.budget_cap(), partitioned_by="file")
    cara, svc = create_key("cara")[0], create_key("svc")[0]
    for key, name, granted in [(cara, "cara", "custodian"), (svc, "svc", "operator")]:
        roles.register_key(
            catalog,
            dataset_id=spec.dataset.id,
            public=key.public,
            name=name,
            roles=[granted],
            signer=cara,
        )
    plan = make_plan(spec)
    directory = release.release_directory(tmp_path / "out", "s-1")
    with pytest.raises(IdentityError, match="requires signed runs"):
        series.register(spec, plan, catalog, release_id="s-1", directory=directory)
    assert catalog.spent(spec.dataset.id).rho == 0 and catalog.releases() == []
    monkeypatch.setenv(signing.KEY_ENV, "svc")
    step, _ = series.register(spec, plan, catalog, release_id="s-1", directory=directory)
    series.measure(spec, plan, step, catalog, release_id="s-1")
    assert (
        signing.sign_unsigned(
            catalog,
            release_id="s-1",
            dataset_id=spec.dataset.id,
            spec_fingerprint=spec.fingerprint(),
        )
        >= 1
    )  # what release.stage does for a series period
    assert signing.step_problems(catalog, "s-1", spec.dataset.id) == []
    assert {s.key_id for s in signing.steps(catalog, "s-1")} == {svc.key_id}
