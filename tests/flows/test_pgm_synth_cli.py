"""``reconstruct: pgm`` as a user runs it: `run` (Prefect flow, vetted OpenDP noise) → `review` →
`synth` → `show`.  Every released table is non-negative and all tables agree on their shared 1-way
marginals; the manifest and report name the estimator; the synthetic file lies in the domain, is
charged nothing and is listed by `show` (text and JSON)."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from dprelease.catalog.spec.load import load_spec
from dprelease.flows.cli import app

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]
runner = CliRunner()

DOMAIN = {
    "a": {"min": 0, "max": 3},
    "b": {"values": ["x", "y", "z"]},
    "d": {"min": 10, "max": 19},
}


def _spec(tmp_path: Path) -> Path:
    rng = np.random.default_rng(41)  # public randomness: synthetic test data
    size = 1500
    a = rng.integers(0, 4, size)
    b = rng.choice(["x", "y", "z"], size, p=[0.7, 0.2, 0.1])
    d = 10 + 2 * a + rng.integers(0, 2, size)  # many empty cells: least squares goes negative
    source = tmp_path / "people.parquet"
    pq.write_table(pa.table({"a": a, "b": b, "d": d}), source)
    spec = {
        "name": "pgm-cli",
        "dataset": {"id": "pgm-cli-ds", "source": str(source), "budget": {"epsilon": 2.0}},
        "domain": DOMAIN,
        "workload": [{"name": "pairs", "marginals": {"attributes": "all", "degree": 2}}],
        "mechanism": "marginal_space",
        "reconstruct": "pgm",
        "privacy": {"epsilon": 0.5},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_pgm_release_review_synth_and_show_through_the_cli(tmp_path: Path) -> None:
    spec_path = _spec(tmp_path)
    result = runner.invoke(app, ["run", str(spec_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    release_id = result.stdout.split("release id:")[1].split()[0]
    directory = tmp_path / "out" / release_id
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["mechanism"]["noise"]["sampler"].startswith("opendp")
    assert manifest["mechanism"]["details"]["estimator"] == "pgm"
    assert "Its error is empirical" in (directory / "report.html").read_text()

    spec = load_spec(spec_path)
    names = list(spec.domain)
    one_way: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for first, second in combinations(names, 2):
        table = pq.read_table(directory / "tables" / f"pairs.{first}.{second}.parquet")
        estimate = table["estimate"].to_numpy()
        assert estimate.min() >= 0.0, (first, second)
        grid = estimate.reshape(spec.domain[first].size, spec.domain[second].size)
        one_way[first].append(grid.sum(axis=1))
        one_way[second].append(grid.sum(axis=0))
    for name, margins in one_way.items():
        assert len(margins) == 2
        np.testing.assert_allclose(margins[1], margins[0], rtol=0, atol=1e-6, err_msg=name)

    refused = runner.invoke(app, ["synth", release_id, "--rows", "10"])
    assert refused.exit_code == 2 and "synth samples from a published release" in refused.output
    approved = runner.invoke(app, ["review", release_id, "--approve", "--reviewer", "Ada"])
    assert approved.exit_code == 0, approved.output
    budget_before = runner.invoke(app, ["budget", "pgm-cli-ds", "--json"]).stdout

    out = tmp_path / "synthetic.parquet"
    synth = runner.invoke(
        app, ["synth", release_id, "--rows", "2000", "--out", str(out), "--seed", "5"]
    )
    assert synth.exit_code == 0, synth.output
    assert "no budget charged" in synth.stdout
    assert runner.invoke(app, ["budget", "pgm-cli-ds", "--json"]).stdout == budget_before
    data = pq.read_table(out)
    assert data.column_names == names and data.num_rows == 2000
    for name, attribute in spec.domain.items():
        _, valid = attribute.encode(np.asarray(data[name].to_pylist(), dtype=object))
        assert valid.all(), name

    shown = runner.invoke(app, ["show", release_id, "--json"])
    assert shown.exit_code == 0, shown.output
    synthetic = json.loads(shown.stdout)["synthetic"]
    assert [(item["path"], item["rows"], item["seed"]) for item in synthetic] == [
        (str(out), 2000, 5)
    ]
    text = runner.invoke(app, ["show", release_id])
    assert f"synthetic:  {out} (2,000 rows, seed 5" in text.stdout
