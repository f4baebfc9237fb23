"""The local model end to end: `ldp strategy` → `ldp simulate` → `dprelease run` (the one release
flow, as for every spec).

Accuracy bound: every non-total query must be within Z_BOUND estimated standard errors of the
truth.  With about 30 queries and Z_BOUND = 7 the normal false-failure rate is below 30 · 2.6e-12,
far under 1e-6, even allowing for the estimated standard error (N = 4000 responses).  The seed is
fixed, so the run is deterministic anyway.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from dprelease.catalog.confidential import responses as response_files
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning import responses
from dprelease.catalog.publishing import artifacts
from dprelease.flows.cli import app
from dprelease.flows.cli.ldp import ldp_app
from dprelease.mechanisms.local.mechanism import COLLECTION_LABEL

runner = CliRunner()
USERS = 4000
Z_BOUND = 7.0


def _spec(tmp_path: Path, source: Path, dataset: str) -> Path:
    spec = {
        "name": "ldp-flow",
        "model": "local",
        "dataset": {"id": dataset, "source": str(source), "budget": {"epsilon": 3.0}},
        "domain": {"v": {"min": 0, "max": 15}},
        "workload": [
            {"name": "v_cdf", "prefix": "v"},
            {"name": "v_hist", "marginal": ["v"]},
        ],
        "mechanism": "optimized",
        "privacy": {"epsilon": 1.0},
    }
    path = tmp_path / "ldp-spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _items(path: Path) -> np.ndarray:
    rng = np.random.default_rng(11)  # public randomness: synthetic true items
    values = np.minimum(rng.geometric(0.2, USERS) - 1, 15)
    pq.write_table(pa.table({"v": pa.array(values, pa.int16())}), path)
    return values


def test_ldp_strategy_json_has_the_contract_keys(tmp_path: Path) -> None:
    spec = _spec(tmp_path, tmp_path / "unused.parquet", "ldp-json")
    result = runner.invoke(ldp_app, ["strategy", str(spec), "--out", str(tmp_path / "s"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"mechanism", "worst_variance", "average_variance", "baselines"}
    assert data["mechanism"] == "optimized"
    assert set(data["baselines"]) == {"randomized_response", "hadamard", "hierarchical", "rappor"}
    for values in data["baselines"].values():
        assert set(values) == {"worst_variance", "average_variance"}
        assert values["worst_variance"] > data["worst_variance"]
    written = json.loads((tmp_path / "s" / "strategy.json").read_text())
    assert written["worst_variance"] == data["worst_variance"]
    assert (tmp_path / "s" / "strategy.npy").is_file()


def test_ldp_cli_reports_errors_clearly(tmp_path: Path) -> None:
    central = tmp_path / "central.yaml"
    central.write_text(
        yaml.safe_dump(
            {
                "name": "c",
                "dataset": {"id": "c", "budget": {"epsilon": 1}},
                "domain": {"v": {"min": 0, "max": 3}},
                "workload": [{"name": "t", "total": True}],
                "privacy": {"epsilon": 1.0},
            }
        )
    )
    result = runner.invoke(ldp_app, ["strategy", str(central)])
    assert result.exit_code == 2
    assert "the LDP pipeline needs model: local" in result.output
    spec = _spec(tmp_path, tmp_path / "x.parquet", "ldp-err")
    missing = runner.invoke(ldp_app, ["simulate", str(spec), "--strategy", str(tmp_path / "no")])
    assert missing.exit_code == 2 and "cannot read the LDP strategy" in missing.output


def _run(spec: Path, out: Path) -> tuple[Path, dict]:
    """`dprelease run SPEC`: the release directory and its manifest."""
    result = runner.invoke(app, ["run", str(spec), "--out", str(out)])
    assert result.exit_code == 0, result.output
    directory = out / result.stdout.split("release id:")[1].split()[0]
    return directory, json.loads((directory / "manifest.json").read_text())


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_strategy_simulate_release_and_rerelease(tmp_path: Path) -> None:
    dataset = "ldp-" + tmp_path.name[-10:]
    values = _items(tmp_path / "items.parquet")
    source = tmp_path / "responses.parquet"
    spec = _spec(tmp_path, source, dataset)
    strategy_dir = tmp_path / "strategy"
    made = runner.invoke(ldp_app, ["strategy", str(spec), "--out", str(strategy_dir)])
    assert made.exit_code == 0, made.output
    simulated = runner.invoke(
        ldp_app,
        [
            "simulate",
            str(spec),
            "--strategy",
            str(strategy_dir),
            "--input",
            str(tmp_path / "items.parquet"),
            "--out",
            str(source),
            "--seed",
            "5",
        ],
    )
    assert simulated.exit_code == 0, simulated.output
    assert f"wrote {USERS:,} responses" in simulated.stdout

    directory, manifest = _run(spec, tmp_path / "out")
    histogram = np.bincount(values, minlength=16)
    truth = {"v_cdf": np.cumsum(histogram), "v_hist": histogram}
    for name, expected in truth.items():
        table = pq.read_table(directory / "tables" / f"{name}.parquet")
        estimate = table["estimate"].to_numpy()
        std_error = table["std_error"].to_numpy()
        assert (std_error > 0).all()
        exact = expected == USERS  # the total is determined by the responses
        z = np.abs(estimate - expected)[~exact] / std_error[~exact]
        assert z.max() < Z_BOUND, (name, z.max())
        assert np.allclose(estimate[exact], USERS, rtol=1e-9)
    # power: the same check against a wrong truth (a quarter of the users moved into bin 0) fails
    wrong = truth["v_hist"].copy()
    wrong[0] += USERS // 4
    table = pq.read_table(directory / "tables" / "v_hist.parquet")
    assert (
        np.abs(table["estimate"].to_numpy() - wrong) / table["std_error"].to_numpy()
    ).max() > Z_BOUND

    catalog = Catalog()  # the default catalog `dprelease run` uses
    entries = catalog.ledger_entries(dataset)
    assert len(entries) == 1 and COLLECTION_LABEL in entries[0].label
    assert entries[0].cost.epsilon == 1.0
    mechanism = manifest["mechanism"]
    assert mechanism["model"] == "local"
    assert mechanism["noise"]["kind"] == "client-side epsilon-LDP randomiser"
    assert manifest["privacy"]["model"].startswith("local:")
    assert manifest["privacy_unit"] == responses.PRIVACY_UNIT
    assert manifest["plan"]["model"] == "local"
    details = mechanism["details"]
    assert details["collection_reused"] is False
    assert details["num_responses"] == USERS
    strategy_json = json.loads((strategy_dir / "strategy.json").read_text())
    assert details["strategy_fingerprint"] == strategy_json["fingerprint"]
    assert manifest["privacy"]["charged"] == {"epsilon": 1.0}
    assert [r["receipt_id"] for r in manifest["ledger_receipts"]] == [entries[0].receipt_id]
    artifacts.verify(directory, catalog)

    second_directory, second = _run(spec, tmp_path / "out")
    assert second["privacy"]["charged"] == {"epsilon": 0.0}
    assert len(catalog.ledger_entries(dataset)) == 1  # the same collection is not charged again
    assert second["mechanism"]["details"]["collection_reused"] is True
    assert second["ledger_receipts"][0]["paid_by_release"] == manifest["release_id"]
    artifacts.verify(second_directory, catalog)
    assert catalog.spent(dataset).epsilon == 1.0


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_bad_responses_fail_the_release_and_charge_nothing(tmp_path: Path) -> None:
    dataset = "ldpbad-" + tmp_path.name[-8:]
    source = tmp_path / "responses.parquet"
    spec = _spec(tmp_path, source, dataset)
    strategy_dir = tmp_path / "strategy"
    assert (
        runner.invoke(ldp_app, ["strategy", str(spec), "--out", str(strategy_dir)]).exit_code == 0
    )
    fingerprint = json.loads((strategy_dir / "strategy.json").read_text())["fingerprint"]
    table = pa.table({"response": [0, 1, 10_000]}).replace_schema_metadata(
        {response_files.FINGERPRINT_METADATA_KEY: fingerprint.encode()}
    )
    pq.write_table(table, source)
    result = runner.invoke(app, ["run", str(spec), "--out", str(tmp_path / "out")])
    assert result.exit_code != 0 and "outside [0," in result.output
    catalog = Catalog()
    assert catalog.ledger_entries(dataset) == []
    assert [r.status for r in catalog.releases(dataset_id=dataset)] == ["failed"]


def test_simulate_names_no_count_of_dropped_rows(tmp_path: Path) -> None:
    """How many true items were out of the domain is confidential: `ldp simulate` says rows
    were dropped and where to count them (`dprelease check`), never how many."""
    items = tmp_path / "items.parquet"
    pq.write_table(pa.table({"v": pa.array([1, 2, 3, 99, 98, 97, 96], pa.int16())}), items)
    spec = _spec(tmp_path, tmp_path / "responses.parquet", "ldp-dropped")
    loaded = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**loaded, "on_out_of_domain": "drop"}))
    strategy_dir = tmp_path / "strategy"
    assert (
        runner.invoke(ldp_app, ["strategy", str(spec), "--out", str(strategy_dir)]).exit_code == 0
    )
    simulated = runner.invoke(
        ldp_app,
        [
            "simulate",
            str(spec),
            "--strategy",
            str(strategy_dir),
            "--input",
            str(items),
            "--out",
            str(tmp_path / "responses.parquet"),
            "--seed",
            "5",
        ],
    )
    assert simulated.exit_code == 0, simulated.output
    assert "out-of-domain rows dropped; `dprelease check SPEC` counts them" in simulated.stdout
    assert "4 out-of-domain" not in simulated.stdout  # 4 of the 7 items are out of the domain
