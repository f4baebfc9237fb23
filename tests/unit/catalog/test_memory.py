"""The memory predictor, DPRELEASE_MEMORY_LIMIT, and the refusal before any data is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import release
from dprelease.catalog.errors import MemoryLimitError, SettingError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning import memory
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec


def make_spec(source: Path) -> ReleaseSpec:
    return parse_spec(
        {
            "name": "mem",
            "dataset": {"id": "ds", "source": str(source), "budget": {"epsilon": 2.0}},
            "domain": {"a": {"min": 0, "max": 99}},
            "workload": [{"name": "a", "marginal": ["a"]}, {"name": "r", "all_ranges": ["a"]}],
            "mechanism": "identity",
            "privacy": {"epsilon": 1.0},
        }
    )


def write(path: Path, rows: int) -> Path:
    rng = np.random.default_rng(7)  # public randomness: synthetic test data
    pq.write_table(pa.table({"a": pa.array(rng.integers(0, 100, rows), pa.int64())}), path)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2GB", 2 * 10**9), ("1500MB", 1_500_000_000), ("1000000", 1_000_000), (" 1.5 gb", 1.5e9)],
)
def test_memory_limit_sizes(text: str, expected: float) -> None:
    assert memory.parse_limit(text) == int(expected)


@pytest.mark.parametrize("text", ["lots", "-2GB", "0", "2XB", "nanGB", "GB"])
def test_an_invalid_memory_limit_is_refused_naming_the_variable(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPRELEASE_MEMORY_LIMIT", text)
    with pytest.raises(SettingError, match=r"DPRELEASE_MEMORY_LIMIT=.*must be a positive size"):
        memory.memory_limit()


def test_without_the_variable_the_limit_is_the_machines_available_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DPRELEASE_MEMORY_LIMIT", raising=False)
    limit = memory.memory_limit()
    assert limit is not None and limit[1] == "MemAvailable" and limit[0] > 0


def test_prediction_grows_with_each_stages_driving_size() -> None:
    small = memory.predict(cells=10, queries=10, strategy_rows=10, released_rows=10, input_bytes=0)
    big = memory.predict(cells=10, queries=10**8, strategy_rows=10, released_rows=10, input_bytes=0)
    assert small.peak[1] < 2 * memory.BASE_BYTES
    assert big.peak[0] == "reconstruct" and "100,000,000 queries x 10 cells" in big.peak[2]
    wide = memory.predict(
        cells=10, queries=10, strategy_rows=10, released_rows=10**7, input_bytes=0
    )
    assert wide.peak[0] == "validate"
    read = memory.predict(
        cells=10, queries=10, strategy_rows=10, released_rows=10, input_bytes=10**9
    )
    assert read.peak[0] == "ingest"


def test_input_size_comes_from_parquet_metadata(tmp_path: Path) -> None:
    small = memory.parquet_bytes(write(tmp_path / "s.parquet", 1_000), ["a"])
    large = memory.parquet_bytes(write(tmp_path / "l.parquet", 100_000), ["a"])
    assert 0 < small < large and large >= 100_000 * 8 * 0.5
    assert memory.parquet_bytes(tmp_path / "l.parquet", ["other"]) == 0


def test_register_refuses_past_the_limit_before_any_charge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = make_spec(write(tmp_path / "d.parquet", 1_000))
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    plan = make_plan(spec)
    monkeypatch.setenv("DPRELEASE_MEMORY_LIMIT", "10MB")
    with pytest.raises(MemoryLimitError, match=r"needs ~.* limit 10 MB \(DPRELEASE_MEMORY_LIMIT\)"):
        release.register(spec, plan, catalog, release_id="r1")
    assert catalog.ledger_entries("ds") == []
    assert catalog.releases() == []
    monkeypatch.setenv("DPRELEASE_MEMORY_LIMIT", "100GB")
    release.register(spec, plan, catalog, release_id="r2")
    assert [(r.id, r.status) for r in catalog.releases()] == [("r2", "measuring")]


def test_reconstruct_without_a_cell_vector_is_explained_by_queries_alone() -> None:
    sizes = {"queries": 10**8, "strategy_rows": 10, "released_rows": 10, "input_bytes": 0}
    marginals = memory.predict(cells=10**17, input_kind="marginals", **sizes)
    stage, peak, driver = marginals.peak
    assert stage == "reconstruct" and driver == "100,000,000 queries (no cell vector is held)"
    assert peak == memory.predict(cells=10, input_kind="marginals", **sizes).peak[1]
