"""Local-model pipeline pieces without Prefect: strategy records and store, baselines (test vectors
of ``seed-ldp.md``), the Gram-root and per-item shortcuts against dense computations, response
ingest validation, simulation encoding, the collection ledger charge."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog import ldp_release
from catalog.errors import BudgetExceededError, DataError, SpecError
from catalog.ledger import Catalog
from catalog.planning import build_workload
from catalog.spec import ReleaseSpec, parse_spec
from catalog.strategy_store import StrategyStore
from mechanisms import ldp
from mechanisms.operators import kron_dense

FAST = {"iterations": 60}


def local_spec(
    domain: dict[str, Any] | None = None,
    workload: list[dict[str, Any]] | None = None,
    *,
    epsilon: float = 1.0,
    source: str | None = None,
    budget: float = 3.0,
    dataset: str = "ldp-unit",
    **extra: Any,
) -> ReleaseSpec:
    data: dict[str, Any] = {
        "name": "ldp-unit",
        "model": "local",
        "dataset": {"id": dataset, "budget": {"epsilon": budget}},
        "domain": domain or {"v": {"min": 0, "max": 15}},
        "workload": workload or [{"name": "v_cdf", "prefix": "v"}],
        "privacy": {"epsilon": epsilon},
        **extra,
    }
    if source is not None:
        data["dataset"]["source"] = source
    return parse_spec(data)


def dense_workload(spec: ReleaseSpec) -> np.ndarray:
    return np.vstack([kron_dense(item.factors) for item in build_workload(spec).items])


@pytest.fixture
def store(tmp_path: Path) -> StrategyStore:
    return StrategyStore(tmp_path / "store")


@pytest.fixture
def optimized(store: StrategyStore) -> tuple[ReleaseSpec, ldp.LDPStrategy, Any]:
    spec = local_spec()
    strategy, record = ldp_release.ensure_strategy(
        spec, settings=ldp_release.settings_for(spec, **FAST), store=store
    )
    return spec, strategy, record


# --- test vectors through the pipeline's baseline evaluation --------------------------------------

VECTORS = [
    pytest.param(
        {"g": {"values": [0, 1, 2, 3, 4]}},
        [{"name": "hist", "marginal": ["g"]}],
        "randomized_response",
        11.4298,
        1e-5,
        id="ex3.7-rr-histogram-n5",
    ),
    pytest.param(
        {"v": {"min": 0, "max": 127}},
        [{"name": "cdf", "prefix": "v"}],
        "hierarchical",
        5466.1318,
        1e-7,
        id="sec9.2-hierarchical-prefix-n128-thm3.10",
    ),
]


@pytest.mark.parametrize(("domain", "workload", "name", "expected", "tolerance"), VECTORS)
def test_baseline_variances_match_the_reference_note(
    domain: dict[str, Any], workload: list[dict[str, Any]], name: str, expected: float, tolerance
) -> None:
    spec = local_spec(domain, workload)
    root = ldp_release.workload_root(build_workload(spec))
    summary = ldp_release.evaluate_baselines(spec, root)[name]
    assert summary.worst_variance == pytest.approx(expected, rel=tolerance)


def test_rr_histogram_vector_fails_at_another_epsilon() -> None:
    spec = local_spec({"g": {"values": [0, 1, 2, 3, 4]}}, [{"name": "h", "marginal": ["g"]}])
    other = local_spec(
        {"g": {"values": [0, 1, 2, 3, 4]}}, [{"name": "h", "marginal": ["g"]}], epsilon=1.1
    )
    root = ldp_release.workload_root(build_workload(spec))
    rr = ldp_release.evaluate_baselines(spec, root)["randomized_response"].worst_variance
    rr_other = ldp_release.evaluate_baselines(other, root)["randomized_response"].worst_variance
    assert abs(rr_other - 11.4298) > 0.5 and rr == pytest.approx(11.4298, rel=1e-5)


@pytest.mark.parametrize(
    ("domain", "workload", "expected"),
    [
        pytest.param(
            {"v": {"min": 0, "max": 15}},
            [{"name": "c", "prefix": "v"}],
            {"randomized_response", "hadamard", "hierarchical", "rappor"},
            id="one-ordered-n16",
        ),
        pytest.param(
            {"v": {"min": 0, "max": 16}},
            [{"name": "c", "prefix": "v"}],
            {"randomized_response", "hadamard", "hierarchical"},
            id="n17-no-rappor",
        ),
        pytest.param(
            {"c": {"values": ["a", "b", "c"]}},
            [{"name": "m", "marginal": ["c"]}],
            {"randomized_response", "hadamard", "rappor"},
            id="unordered-no-hierarchical",
        ),
        pytest.param(
            {"a": {"values": [0, 1]}, "b": {"values": [0, 1]}, "c": {"values": [0, 1]}},
            [{"name": "ab", "marginal": ["a", "b"]}],
            {"randomized_response", "hadamard", "rappor", "fourier"},
            id="binary-fourier",
        ),
    ],
)
def test_baseline_applicability(
    domain: dict[str, Any], workload: list[dict[str, Any]], expected: set[str]
) -> None:
    assert set(ldp_release.baseline_strategies(local_spec(domain, workload))) == expected


# --- structural shortcuts against dense computations ----------------------------------------------

MIXED = (
    {"a": {"min": 0, "max": 5}, "b": {"values": ["x", "y", "z"]}},
    [
        {"name": "ab", "marginal": ["a", "b"]},
        {"name": "a_cdf", "prefix": "a"},
        {"name": "a_ranges", "all_ranges": ["a"]},
        {"name": "total", "total": True},
    ],
)


def test_workload_root_has_the_dense_gram_and_variances() -> None:
    spec = local_spec(*MIXED)
    dense = dense_workload(spec)
    root = ldp_release.workload_root(build_workload(spec))
    np.testing.assert_allclose(root.T @ root, dense.T @ dense, atol=1e-9)
    strategy = ldp.hadamard(spec.num_cells, epsilon=1.0)
    np.testing.assert_allclose(
        ldp.per_type_variance(root, strategy), ldp.per_type_variance(dense, strategy), rtol=1e-9
    )
    assert ldp.lower_bound(root, epsilon=1.0) == pytest.approx(
        ldp.lower_bound(dense, epsilon=1.0), rel=1e-9
    )


def test_item_estimates_equal_the_dense_reconstruction(rng: np.random.Generator) -> None:
    spec = local_spec(*MIXED)
    strategy = ldp.randomized_response(spec.num_cells, epsilon=1.0)
    counts = rng.integers(0, 200, strategy.num_outputs)
    dense = ldp.estimate(counts, ldp.reconstruction(dense_workload(spec), strategy))
    operator = ldp_release.least_squares_operator(strategy)
    parts = [
        ldp_release.estimate_item(item, strategy, operator, counts)
        for item in build_workload(spec).items
    ]
    np.testing.assert_allclose(np.concatenate([p.answers for p in parts]), dense.answers, rtol=1e-9)
    np.testing.assert_allclose(
        np.concatenate([p.variance for p in parts]), dense.variance, rtol=1e-8, atol=1e-6
    )


def test_item_estimates_in_small_chunks_equal_one_chunk(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    spec = local_spec(*MIXED)
    strategy = ldp.hadamard(spec.num_cells, epsilon=1.0)
    counts = rng.integers(0, 50, strategy.num_outputs)
    operator = ldp_release.least_squares_operator(strategy)
    item = build_workload(spec).items[2]
    whole = ldp_release.estimate_item(item, strategy, operator, counts)
    monkeypatch.setattr(ldp_release, "V_CHUNK_ENTRIES", strategy.num_outputs * 7)
    chunked = ldp_release.estimate_item(item, strategy, operator, counts)
    np.testing.assert_allclose(chunked.answers, whole.answers, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(chunked.variance, whole.variance, rtol=1e-10, atol=1e-8)


# --- the optimised strategy, its record and the store ---------------------------------------------


def test_optimised_strategy_is_exactly_ldp_and_factorises_w(optimized) -> None:
    spec, strategy, record = optimized
    matrix = strategy.Q
    bound = Fraction(math.exp(1.0))
    for row in matrix:
        assert Fraction(float(row.max())) <= bound * Fraction(float(row.min()))
    for column in matrix.T:
        assert abs(math.fsum(column.tolist()) - 1.0) <= 1e-12
    dense = dense_workload(spec)
    V = ldp.reconstruction(dense, strategy)
    np.testing.assert_allclose(V @ matrix, dense, atol=1e-8)
    assert record.fingerprint == ldp.strategy_fingerprint(strategy)
    assert record.worst_variance == pytest.approx(ldp.worst_case_variance(dense, strategy))
    assert record.average_variance == pytest.approx(ldp.average_case_variance(dense, strategy))
    assert record.worst_variance < min(b.worst_variance for b in record.baselines.values())
    assert record.worst_variance >= record.lower_bound


def test_store_is_reused_without_optimising(optimized, store: StrategyStore) -> None:
    spec, strategy, record = optimized
    calls: list[str] = []
    again, again_record = ldp_release.ensure_strategy(
        spec, settings=ldp_release.settings_for(spec, **FAST), store=store, on_optimize=calls.append
    )
    assert calls == []
    assert again_record == record
    np.testing.assert_array_equal(again.Q, strategy.Q)


def test_a_tampered_store_entry_is_recomputed(optimized, store: StrategyStore) -> None:
    spec, strategy, record = optimized
    settings = ldp_release.settings_for(spec, **FAST)
    key = ldp_release.store_key(spec, settings)
    tampered = np.array(strategy.Q)
    tampered[:, [0, 1]] = tampered[:, [1, 0]]  # still epsilon-LDP, another fingerprint
    store.put_arrays(key, {"Q": tampered})
    calls: list[str] = []
    again, _ = ldp_release.ensure_strategy(
        spec, settings=settings, store=store, on_optimize=calls.append
    )
    assert len(calls) == 1
    assert ldp.strategy_fingerprint(again) == record.fingerprint  # same seed, same strategy


def test_store_key_depends_on_epsilon_and_settings() -> None:
    spec = local_spec()
    key = ldp_release.store_key(spec, ldp_release.settings_for(spec))
    assert key != ldp_release.store_key(spec, ldp_release.settings_for(spec, iterations=10))
    other = local_spec(epsilon=2.0)
    assert key != ldp_release.store_key(other, ldp_release.settings_for(other))
    assert key == ldp_release.store_key(spec, ldp_release.settings_for(spec))


def test_cli_json_has_exactly_the_contract_keys(optimized) -> None:
    _, _, record = optimized
    data = record.cli_json()
    assert set(data) == {"mechanism", "worst_variance", "average_variance", "baselines"}
    assert set(data["baselines"]) == {"randomized_response", "hadamard", "hierarchical", "rappor"}
    for values in data["baselines"].values():
        assert set(values) == {"worst_variance", "average_variance"}


def test_artifact_round_trip_and_tamper_detection(optimized, tmp_path: Path) -> None:
    _, strategy, record = optimized
    directory = tmp_path / "artifact"
    ldp_release.write_strategy_artifact(strategy, record, directory)
    read, read_record = ldp_release.read_strategy_artifact(directory)
    assert read_record == record
    assert ldp.strategy_fingerprint(read) == record.fingerprint
    swapped = np.array(strategy.Q)[:, ::-1]
    np.save(directory / "strategy.npy", swapped)
    with pytest.raises(DataError, match="the artifact was modified"):
        ldp_release.read_strategy_artifact(directory)
    broken = np.array(strategy.Q)
    broken[0, 0] *= 10
    np.save(directory / "strategy.npy", broken)
    with pytest.raises(DataError, match="is not an epsilon-LDP strategy"):
        ldp_release.read_strategy_artifact(directory)
    with pytest.raises(DataError, match="cannot read the LDP strategy"):
        ldp_release.read_strategy_artifact(tmp_path / "nowhere")


# --- validators -----------------------------------------------------------------------------------


def test_require_local_refuses_a_central_spec() -> None:
    central = parse_spec(
        {
            "name": "c",
            "dataset": {"id": "c", "budget": {"epsilon": 1}},
            "domain": {"v": {"min": 0, "max": 3}},
            "workload": [{"name": "t", "total": True}],
            "privacy": {"epsilon": 1.0},
        }
    )
    with pytest.raises(SpecError, match=re.escape("has model 'central'; the LDP pipeline")):
        ldp_release.require_local(central)


def test_require_local_refuses_a_huge_domain() -> None:
    with pytest.raises(SpecError, match="at most 2,048 cells"):
        ldp_release.require_local(local_spec({"v": {"min": 0, "max": 4096}}))


def test_require_local_refuses_one_cell() -> None:
    with pytest.raises(SpecError, match=re.escape("1 cell(s); local-model releases need >= 2")):
        ldp_release.require_local(local_spec({"v": {"min": 0, "max": 0}}))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"rows_factor": 0}, "rows_factor (0) must be >= 1", id="rows"),
        pytest.param({"iterations": -1}, "iterations (-1) must be >= 0", id="iterations"),
        pytest.param({"tolerance": 1.0}, "tolerance (1.0) must be in [0, 1)", id="tolerance"),
        pytest.param({"seed": -3}, "seed (-3) must be >= 0", id="seed"),
    ],
)
def test_optimizer_settings_validation(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ldp_release.OptimizerSettings(**{"seed": 1, **values})


def test_strategy_must_fit_the_spec() -> None:
    spec = local_spec()
    with pytest.raises(DataError, match="has 8 columns but the spec's domain has 16 cells"):
        ldp_release.check_strategy_fits(spec, ldp.randomized_response(8, epsilon=1.0))
    with pytest.raises(DataError, match=re.escape("is 2.0-LDP but the spec asks for epsilon 1.0")):
        ldp_release.check_strategy_fits(spec, ldp.randomized_response(16, epsilon=2.0))


# --- response ingest ------------------------------------------------------------------------------


def _write(path: Path, table: pa.Table, fingerprint: str | None) -> Path:
    if fingerprint is not None:
        table = table.replace_schema_metadata(
            {ldp_release.FINGERPRINT_METADATA_KEY: fingerprint.encode()}
        )
    pq.write_table(table, path)
    return path


@pytest.fixture
def rr16() -> ldp.LDPStrategy:
    return ldp.randomized_response(16, epsilon=1.0)


def test_ingest_counts_valid_files(tmp_path: Path, rr16: ldp.LDPStrategy) -> None:
    fingerprint = ldp.strategy_fingerprint(rr16)
    folder = tmp_path / "responses"
    folder.mkdir()
    _write(
        folder / "a.parquet", pa.table({"response": pa.array([0, 3, 3], pa.int32())}), fingerprint
    )
    column = pa.table({"response": [15, 0], "strategy_fingerprint": [fingerprint] * 2})
    _write(folder / "b.parquet", column, None)
    ingested = ldp_release.ingest_responses(str(folder), rr16)
    expected = np.zeros(16, dtype=np.int64)
    expected[[0, 3, 15]] = [2, 2, 1]
    np.testing.assert_array_equal(ingested.counts, expected)
    assert ingested.num_responses == 5
    assert ingested.strategy_fingerprint == fingerprint
    assert len(ingested.responses_fingerprint) == 64


BAD_FILES = [
    pytest.param(
        lambda fp: (pa.table({"answer": [1, 2]}), fp),
        "has no 'response' column (it has ['answer'])",
        id="missing-column",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": [1.0, 2.0]}), fp),
        "column 'response' in 'bad.parquet' has type double; response indices must be integers",
        id="wrong-type",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": pa.array(["1", "2"])}), fp),
        "has type string; response indices must be integers",
        id="string-type",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": [1, 16, 2]}), fp),
        "has 1 value(s) outside [0, 16) (min 1, max 16); the strategy has 16 outputs",
        id="index-too-large",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": [-1, 3]}), fp),
        "has 1 value(s) outside [0, 16) (min -1, max 3)",
        id="negative-index",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": pa.array([1, None, 2], pa.int64())}), fp),
        "has 1 null value(s); every row must hold one response index",
        id="nulls",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": [1, 2]}), "0" * 64),
        "was randomised with strategy fingerprint(s) ['0000000000000000…'], but this release's",
        id="fingerprint-mismatch-metadata",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": [1, 2], "strategy_fingerprint": [fp, "f" * 64]}), None),
        "was randomised with strategy fingerprint(s)",
        id="fingerprint-mismatch-column",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": [1, 2]}), None),
        "carries no strategy fingerprint",
        id="no-fingerprint",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": [1]}), fp),
        "hold 1 response(s); an estimate needs at least 2",
        id="too-few-responses",
    ),
]


@pytest.mark.parametrize(("make", "message"), BAD_FILES)
def test_bad_response_files_fail_clearly(
    tmp_path: Path, rr16: ldp.LDPStrategy, make: Any, message: str
) -> None:
    table, fingerprint = make(ldp.strategy_fingerprint(rr16))
    path = _write(tmp_path / "bad.parquet", table, fingerprint)
    with pytest.raises(DataError, match=re.escape(message)):
        ldp_release.ingest_responses(str(path), rr16)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"response\n1\n2\n", "is not a readable Parquet file", id="csv"),
        pytest.param(b"", "is not a readable Parquet file", id="empty"),
    ],
)
def test_a_file_that_is_not_parquet_fails_clearly(
    tmp_path: Path, rr16: ldp.LDPStrategy, content: bytes, message: str
) -> None:
    path = tmp_path / "responses.parquet"
    path.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(f"'responses.parquet' {message}")):
        ldp_release.ingest_responses(str(path), rr16)


def test_missing_source_fails_clearly(tmp_path: Path, rr16: ldp.LDPStrategy) -> None:
    with pytest.raises(DataError, match="matches no file"):
        ldp_release.ingest_responses(str(tmp_path / "none.parquet"), rr16)


# --- simulation encoding --------------------------------------------------------------------------


def test_encode_items_matches_the_central_cell_order(tmp_path: Path) -> None:
    spec = local_spec(
        {"a": {"min": 0, "max": 2}, "b": {"values": ["x", "y"]}},
        [{"name": "ab", "marginal": ["a", "b"]}],
    )
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"a": [0, 2, 1, 2], "b": ["y", "x", "x", "y"], "z": [9] * 4}), path)
    items, dropped = ldp_release.encode_items(spec, str(path))
    np.testing.assert_array_equal(items, [1, 4, 2, 5])
    assert dropped == 0


def test_encode_items_out_of_domain_error_and_drop(tmp_path: Path) -> None:
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"v": pa.array([1, 99, None, 3], pa.int64())}), path)
    with pytest.raises(
        DataError, match=re.escape("column 'v' has 2 row(s) that are null or outside")
    ):
        ldp_release.encode_items(local_spec(), str(path))
    items, dropped = ldp_release.encode_items(local_spec(on_out_of_domain="drop"), str(path))
    np.testing.assert_array_equal(items, [1, 3])
    assert dropped == 2


def test_encode_items_checks_types(tmp_path: Path) -> None:
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"v": ["a", "b"]}), path)
    with pytest.raises(DataError, match="column 'v' has type string"):
        ldp_release.encode_items(local_spec(), str(path))


def test_simulated_responses_carry_the_fingerprint(tmp_path: Path, rr16: ldp.LDPStrategy) -> None:
    spec = local_spec()
    items = tmp_path / "items.parquet"
    pq.write_table(pa.table({"v": np.arange(16).repeat(5)}), items)
    out = tmp_path / "responses.parquet"
    summary = ldp_release.simulate(
        spec, rr16, input_path=str(items), output_path=out, rng=np.random.default_rng(3)
    )
    assert summary.num_responses == 80
    ingested = ldp_release.ingest_responses(str(out), rr16)
    assert ingested.num_responses == 80
    metadata = pq.read_schema(out).metadata
    assert metadata[ldp_release.FINGERPRINT_METADATA_KEY].decode() == ldp.strategy_fingerprint(rr16)


# --- estimation -----------------------------------------------------------------------------------


def test_noiseless_tables_recover_the_workload(rr16: ldp.LDPStrategy) -> None:
    spec = local_spec(
        workload=[{"name": "cdf", "prefix": "v"}, {"name": "hist", "marginal": ["v"]}]
    )
    x = np.arange(16, dtype=np.float64) * 10 + 5
    counts = rr16.Q @ x  # the expected response vector: V y must equal W x exactly
    ingested = ldp_release.IngestedResponses(
        counts=counts,
        num_responses=int(x.sum()),
        responses_fingerprint="r" * 64,
        files=(),
        strategy_fingerprint=ldp.strategy_fingerprint(rr16),
    )
    tables = ldp_release.estimate_tables(spec, rr16, ingested)
    np.testing.assert_allclose(tables["cdf"]["estimate"].to_numpy(), np.cumsum(x), rtol=1e-10)
    np.testing.assert_allclose(tables["hist"]["estimate"].to_numpy(), x, rtol=1e-10)
    std_error = tables["cdf"]["std_error"].to_numpy()
    assert (std_error > 0).all()
    assert std_error[-1] < 1e-6 * x.sum()  # the total N is exact: only the rounding floor
    assert std_error[:-1].min() > 1.0


# --- the collection charge ------------------------------------------------------------------------


def _responses(tmp_path: Path, strategy: ldp.LDPStrategy, values: list[int], name: str) -> Path:
    table = pa.table({"response": values})
    return _write(tmp_path / name, table, ldp.strategy_fingerprint(strategy))


def test_a_collection_is_charged_once(tmp_path: Path, rr16: ldp.LDPStrategy) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    source = _responses(tmp_path, rr16, [1, 2, 3], "one.parquet")
    spec = local_spec(source=str(source))
    fingerprint = ldp.strategy_fingerprint(rr16)
    charges = []
    for release_id in ("r1", "r2"):
        ldp_release.register(spec, catalog, release_id=release_id, strategy_fingerprint=fingerprint)
        ingested = ldp_release.ingest_responses(str(source), rr16)
        charges.append(
            ldp_release.charge_collection(spec, catalog, ingested, release_id=release_id)
        )
    entries = catalog.ledger_entries(spec.dataset.id)
    assert len(entries) == 1 and entries[0].release_id == "r1"
    assert ldp_release.COLLECTION_LABEL in entries[0].label
    assert entries[0].cost.epsilon == 1.0
    assert [c.reused for c in charges] == [False, True]
    assert charges[1].receipt_id == charges[0].receipt_id
    assert charges[1].paid_by_release == "r1"

    other = _responses(tmp_path, rr16, [4, 5, 6], "two.parquet")
    spec2 = local_spec(source=str(other))
    ldp_release.register(spec2, catalog, release_id="r3", strategy_fingerprint=fingerprint)
    ingested = ldp_release.ingest_responses(str(other), rr16)
    assert not ldp_release.charge_collection(spec2, catalog, ingested, release_id="r3").reused
    assert len(catalog.ledger_entries(spec.dataset.id)) == 2
    assert len(ldp_release.CollectionRegistry(catalog).for_dataset(spec.dataset.id)) == 2


def test_a_charge_found_only_in_the_ledger_is_reused(tmp_path: Path, rr16: ldp.LDPStrategy) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    source = _responses(tmp_path, rr16, [1, 2, 3], "one.parquet")
    spec = local_spec(source=str(source))
    ingested = ldp_release.ingest_responses(str(source), rr16)
    key = ldp_release.collection_key(
        spec.dataset.id, ingested.strategy_fingerprint, ingested.responses_fingerprint
    )
    catalog.ensure_dataset(spec.dataset.id, cap=spec.dataset.budget_cap())
    receipt = catalog.charge(  # a crash after the charge, before the registry insert
        spec.dataset.id,
        ldp_release.collection_cost(spec),
        release_id="crashed",
        label=ldp_release.collection_label(spec, key),
    )
    ldp_release.register(
        spec, catalog, release_id="r1", strategy_fingerprint=ingested.strategy_fingerprint
    )
    charge = ldp_release.charge_collection(spec, catalog, ingested, release_id="r1")
    assert charge.reused and charge.receipt_id == receipt
    assert len(catalog.ledger_entries(spec.dataset.id)) == 1


def test_an_over_budget_collection_is_refused_before_reading(
    tmp_path: Path, rr16: ldp.LDPStrategy
) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    source = tmp_path / "responses.parquet"
    source.write_bytes(b"not parquet: register must refuse before reading it")
    spec = local_spec(source=str(source), budget=0.5)
    with pytest.raises(BudgetExceededError, match="would be exceeded"):
        ldp_release.register(
            spec, catalog, release_id="r1", strategy_fingerprint=ldp.strategy_fingerprint(rr16)
        )
    assert catalog.releases(dataset_id=spec.dataset.id) == []
    assert catalog.ledger_entries(spec.dataset.id) == []


def test_register_needs_a_source(rr16: ldp.LDPStrategy, tmp_path: Path) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    with pytest.raises(DataError, match=re.escape("dataset.source is not set")):
        ldp_release.register(local_spec(), catalog, release_id="r", strategy_fingerprint="f")
