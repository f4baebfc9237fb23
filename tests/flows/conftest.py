"""Fixtures for end-to-end flow tests: a tiny synthetic Parquet dataset and a matching spec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

ROWS = 500


@pytest.fixture
def tiny_dataset(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)  # public randomness: synthetic test data
    table = pa.table(
        {
            "a": pa.array(rng.integers(0, 10, ROWS), pa.int16()),
            "b": pa.array(rng.choice(["x", "y", "z"], ROWS)),
            "c": pa.array(rng.integers(0, 4, ROWS), pa.int8()),
            "ignored": pa.array(rng.normal(size=ROWS)),
        }
    )
    path = tmp_path / "tiny.parquet"
    pq.write_table(table, path)
    return path


def write_spec(tmp_path: Path, source: Path, **overrides: object) -> Path:
    spec = {
        "name": "tiny",
        "dataset": {
            "id": "tiny-" + tmp_path.name[-12:],
            "source": str(source),
            "budget": {"epsilon": 2.5},
        },
        "domain": {
            "a": {"min": 0, "max": 9},
            "b": {"values": ["x", "y", "z"]},
            "c": {"min": 0, "max": 3},
        },
        "workload": [
            {"name": "a_by_b", "marginal": ["a", "b"]},
            {"name": "a_cdf", "prefix": "a"},
            {"name": "c_ranges", "all_ranges": ["c"]},
            {"name": "a_halves", "ranges": {"a": [[0, 4], [5, 9]]}},
            {"name": "everyone", "total": True},
        ],
        "mechanism": "auto",
        "privacy": {"epsilon": 1.0},
    }
    spec.update(overrides)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path
