"""End to end through Prefect: a release with derived items (mean by group, sum, quantiles).

With the zero-noise oracle the derived tables equal the statistics computed here with pandas from
the rows (1-wide integer cells: no binning error), their support tables are released beside them,
validation passes, the manifest describes them and ``verify`` accepts the release.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.publishing import artifacts
from tests.flows.conftest import write_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]


def test_derived_statistics_release_from_the_same_measurement(
    tmp_path: Path, tiny_dataset: Path, zero_noise
) -> None:
    from dprelease.flows.release_flow import release_flow

    spec_path = write_spec(
        tmp_path,
        tiny_dataset,
        workload=[
            {"name": "a_by_b", "marginal": ["a", "b"]},
            {"name": "a_mean", "mean": "a", "by": ["b"]},
            {"name": "c_sum", "sum": "c"},
            {"name": "a_quantiles", "quantiles": {"of": "a", "q": [0.5, 0.9]}},
        ],
    )
    catalog_url = f"sqlite:///{tmp_path / 'catalog.db'}"
    staged = release_flow(
        spec_path=str(spec_path), out_dir=str(tmp_path / "out"), catalog_url=catalog_url
    )
    directory = Path(staged.directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["tables"] == [
        "a_by_b",
        "a_mean.moments",
        "c_sum.moments",
        "a_quantiles.cdf",
        "a_mean",
        "c_sum",
        "a_quantiles",
    ]
    assert manifest["derived_tables"]["a_mean"]["support_table"] == "a_mean.moments"
    assert manifest["derived_tables"]["a_quantiles"]["levels"] == [0.5, 0.9]
    assert manifest["privacy"]["charged"]["epsilon"] <= 1.0  # one measurement for everything

    frame = pq.read_table(tiny_dataset).to_pandas()
    mean = pq.read_table(directory / "tables" / "a_mean.parquet").to_pydict()
    assert mean["b"] == ["x", "y", "z"] and mean["statistic"] == ["mean"] * 3
    expected = frame.groupby("b")["a"].mean().reindex(["x", "y", "z"]).to_numpy()
    np.testing.assert_allclose(mean["estimate"], expected, atol=1e-9)
    assert mean["binning_error"] == [0.0] * 3 and mean["uncertainty"] == ["noise"] * 3
    assert all(
        lo <= e <= hi for lo, e, hi in zip(mean["ci_low"], expected, mean["ci_high"], strict=True)
    )
    total = pq.read_table(directory / "tables" / "c_sum.parquet").to_pydict()
    np.testing.assert_allclose(total["estimate"], [frame["c"].sum()], atol=1e-8)
    quantiles = pq.read_table(directory / "tables" / "a_quantiles.parquet").to_pydict()
    assert quantiles["statistic"] == ["q0.5", "q0.9"]
    exact = [np.quantile(frame["a"], q, method="inverted_cdf") for q in (0.5, 0.9)]
    np.testing.assert_allclose(quantiles["estimate"], exact)
    assert all(
        lo <= e <= hi
        for lo, e, hi in zip(quantiles["ci_low"], exact, quantiles["ci_high"], strict=True)
    )

    validation = json.loads((directory / "validation" / "results.json").read_text())
    assert validation["success"] and {"a_mean", "c_sum", "a_quantiles"} <= set(validation["tables"])
    assert "a_quantiles" in (directory / "report.html").read_text()
    artifacts.verify(directory, Catalog(catalog_url))
