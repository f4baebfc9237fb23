"""Local-model files and the release pipeline's local-model path without Prefect: response ingest
validation, simulation encoding, the published strategy artifact, spec checks, and the collection
charged once through ``catalog.release`` (register → ingest → measure)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease.catalog import release
from dprelease.catalog.confidential import inputs
from dprelease.catalog.confidential import responses as response_files
from dprelease.catalog.confidential.source import resolve_source
from dprelease.catalog.errors import BudgetExceededError, DataError, SpecError
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning import responses
from dprelease.catalog.planning.planner import Plan, make_plan
from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import ReleaseSpec
from dprelease.mechanisms.local import baselines, randomizer
from dprelease.mechanisms.local.mechanism import COLLECTION_LABEL
from dprelease.mechanisms.local.strategy import LocalStrategy, describe
from dprelease.mechanisms.primitives.operators import Prefix
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

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


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh DPRELEASE_HOME: the released-intermediates store and the catalog key per test."""
    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> StrategyStore:
    """One strategy store for the module: the spec's strategy is optimised once."""
    return StrategyStore(tmp_path_factory.mktemp("store"))


def randomized_response(n: int) -> LocalStrategy:
    """Randomised response on ``n`` cells (1-LDP) as a published strategy for a CDF workload."""
    workload = Workload(domain_shape=(n,), items=(WorkloadItem(name="c", factors=(Prefix(n),)),))
    return describe(
        baselines.randomized_response(n, epsilon=1.0),
        workload=workload,
        ordered=(True,),
        workload_fingerprint="w" * 64,
        settings={},
        seconds=0.0,
    )


@pytest.fixture(scope="module")
def rr16() -> LocalStrategy:
    return randomized_response(16)


def planned(store: StrategyStore, **changes: Any) -> tuple[ReleaseSpec, Plan]:
    spec = local_spec(mechanism_options=FAST, **changes)
    return spec, make_plan(spec, cache=store)


# --- spec checks and planning ---------------------------------------------------------------------


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
        responses.require_local(central)
    with pytest.raises(SpecError, match="the LDP pipeline needs model: local"):
        responses.plan_strategy(central)


@pytest.mark.parametrize("mechanism", ["auto", "optimized"])
def test_planning_refuses_a_huge_domain_naming_the_limit(mechanism: str) -> None:
    spec = local_spec({"v": {"min": 0, "max": 4096}}, mechanism=mechanism)
    with pytest.raises(SpecError, match="at most 2,048 cells"):
        make_plan(spec)


def test_planning_refuses_one_cell() -> None:
    with pytest.raises(SpecError, match=re.escape("1 cell(s); local-model releases need >= 2")):
        make_plan(local_spec({"v": {"min": 0, "max": 0}}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            {"mechanism_options": {"rows_factor": 0}},
            "mechanism_options.rows_factor (0) must be an integer >= 1",
            id="local-option",
        ),
        pytest.param(
            {"mechanism": "wavelet"},
            "unknown mechanism 'wavelet' for model: local",
            id="central-mechanism",
        ),
        pytest.param(
            {"mechanism_options": {"branching": 4}},
            "mechanism_options ['branching'] do not apply",
            id="central-option",
        ),
    ],
)
def test_local_specs_validate_mechanism_and_options(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        local_spec(**changes)


def test_local_options_do_not_apply_to_a_central_spec() -> None:
    with pytest.raises(SpecError, match=re.escape("mechanism_options ['iterations'] do not")):
        parse_spec(
            {
                "name": "c",
                "dataset": {"id": "c", "budget": {"epsilon": 1}},
                "domain": {"v": {"min": 0, "max": 3}},
                "workload": [{"name": "t", "total": True}],
                "privacy": {"epsilon": 1.0},
                "mechanism_options": {"iterations": 5},
            }
        )


def test_plan_of_a_local_spec_records_the_local_model(store: StrategyStore) -> None:
    spec, plan = planned(store)
    assert plan.model == "local" and plan.mechanism.input_kind == "responses"
    assert plan.expected_cost.as_dict() == {"epsilon": 1.0}
    assert plan.strategy_parameters["fingerprint"] == plan.strategy.fingerprint
    assert responses.plan_strategy(spec, cache=store).fingerprint == plan.strategy.fingerprint


def test_strategy_must_fit_the_spec(rr16: LocalStrategy) -> None:
    spec = local_spec()
    with pytest.raises(DataError, match="has 8 columns but the spec's domain has 16 cells"):
        responses.check_strategy_fits(spec, randomized_response(8))
    with pytest.raises(DataError, match=re.escape("is 1.0-LDP but the spec asks for epsilon 2.0")):
        responses.check_strategy_fits(local_spec(epsilon=2.0), rr16)


# --- the published artifact -----------------------------------------------------------------------


def test_cli_json_has_exactly_the_contract_keys(store: StrategyStore) -> None:
    _, plan = planned(store)
    data = responses.strategy_summary(plan.strategy)
    assert set(data) == {"mechanism", "worst_variance", "average_variance", "baselines"}
    assert data["mechanism"] == plan.chosen
    assert set(data["baselines"]) == {"randomized_response", "hadamard", "hierarchical", "rappor"}
    for values in data["baselines"].values():
        assert set(values) == {"worst_variance", "average_variance"}


def test_artifact_round_trip_and_tamper_detection(store: StrategyStore, tmp_path: Path) -> None:
    spec, plan = planned(store)
    strategy = plan.strategy
    directory = tmp_path / "artifact"
    responses.write_strategy_artifact(spec, strategy, directory)
    read = responses.read_strategy_artifact(directory)
    assert (
        read.fingerprint == strategy.fingerprint == randomizer.strategy_fingerprint(read.randomiser)
    )
    assert dict(read.parameters) == {
        **strategy.parameters,
        "spec_name": spec.name,
        "spec_fingerprint": spec.fingerprint(),
    }
    swapped = np.array(strategy.randomiser.Q)[:, ::-1]
    np.save(directory / "strategy.npy", swapped)
    with pytest.raises(DataError, match=r"does not match its record.*was modified"):
        responses.read_strategy_artifact(directory)
    broken = np.array(strategy.randomiser.Q)
    broken[0, 0] *= 10
    np.save(directory / "strategy.npy", broken)
    with pytest.raises(DataError, match="is not an epsilon-LDP strategy"):
        responses.read_strategy_artifact(directory)
    with pytest.raises(DataError, match="cannot read the LDP strategy"):
        responses.read_strategy_artifact(tmp_path / "nowhere")
    record = directory / "strategy.json"
    record.write_text(record.read_text().replace('"model": "local"', '"model": "remote"'))
    with pytest.raises(DataError, match=r"cannot read the LDP strategy.*unknown mechanism"):
        responses.read_strategy_artifact(directory)


# --- response ingest ------------------------------------------------------------------------------


def _write(path: Path, table: pa.Table, fingerprint: str | None) -> Path:
    if fingerprint is not None:
        table = table.replace_schema_metadata(
            {response_files.FINGERPRINT_METADATA_KEY: fingerprint.encode()}
        )
    pq.write_table(table, path)
    return path


def test_ingest_counts_valid_files(tmp_path: Path, rr16: LocalStrategy) -> None:
    fingerprint = rr16.fingerprint
    folder = tmp_path / "responses"
    folder.mkdir()
    _write(
        folder / "a.parquet", pa.table({"response": pa.array([0, 3, 3], pa.int32())}), fingerprint
    )
    column = pa.table({"response": [15, 0], "strategy_fingerprint": [fingerprint] * 2})
    _write(folder / "b.parquet", column, None)
    ingested = inputs.ingest_responses(local_spec(source=str(folder)), rr16)
    expected = np.zeros(16, dtype=np.int64)
    expected[[0, 3, 15]] = [2, 2, 1]
    np.testing.assert_array_equal(ingested.data.counts, expected)
    assert ingested.data.num_responses == 5
    assert ingested.data.strategy_fingerprint == fingerprint
    assert len(ingested.input_fingerprint) == 64
    assert [Path(f).name for f in ingested.files] == ["a.parquet", "b.parquet"]
    assert ingested.privacy_unit == responses.PRIVACY_UNIT


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
        "column 'response' in 'bad.parquet' has value(s) outside [0, 16); the strategy has 16 "
        "outputs",
        id="index-too-large",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": [-1, 3]}), fp),
        "has value(s) outside [0, 16)",
        id="negative-index",
    ),
    pytest.param(
        lambda fp: (pa.table({"response": pa.array([1, None, 2], pa.int64())}), fp),
        "column 'response' in 'bad.parquet' has null value(s); every row must hold one response",
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
        "hold fewer than 2 responses; an estimate needs at least 2",
        id="too-few-responses",
    ),
]


@pytest.mark.parametrize(("make", "message"), BAD_FILES)
def test_bad_response_files_fail_clearly(
    tmp_path: Path, rr16: LocalStrategy, make: Any, message: str
) -> None:
    table, fingerprint = make(rr16.fingerprint)
    path = _write(tmp_path / "bad.parquet", table, fingerprint)
    with pytest.raises(DataError, match=re.escape(message)) as caught:
        inputs.ingest_responses(local_spec(source=str(path)), rr16)
    assert not re.search(r"\b(min|max)\b|\d+ (null )?value", str(caught.value))  # no data values


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"response\n1\n2\n", "is not a readable Parquet file", id="csv"),
        pytest.param(b"", "is not a readable Parquet file", id="empty"),
    ],
)
def test_a_file_that_is_not_parquet_fails_clearly(
    tmp_path: Path, rr16: LocalStrategy, content: bytes, message: str
) -> None:
    path = tmp_path / "responses.parquet"
    path.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(f"'responses.parquet' {message}")):
        inputs.ingest_responses(local_spec(source=str(path)), rr16)


def test_missing_source_fails_clearly(tmp_path: Path, rr16: LocalStrategy) -> None:
    with pytest.raises(DataError, match="matches no file"):
        inputs.ingest_responses(local_spec(source=str(tmp_path / "none.parquet")), rr16)
    with pytest.raises(DataError, match=re.escape("dataset.source is not set")):
        inputs.ingest_responses(local_spec(), rr16)


def test_ingest_refuses_a_strategy_that_does_not_fit(tmp_path: Path, rr16: LocalStrategy) -> None:
    path = _write(tmp_path / "r.parquet", pa.table({"response": [1, 2]}), rr16.fingerprint)
    with pytest.raises(DataError, match=re.escape("the spec asks for epsilon 2.0")):
        inputs.ingest_responses(local_spec(source=str(path), epsilon=2.0), rr16)


# --- simulation encoding --------------------------------------------------------------------------


def test_encode_items_matches_the_central_cell_order(tmp_path: Path) -> None:
    spec = local_spec(
        {"a": {"min": 0, "max": 2}, "b": {"values": ["x", "y"]}},
        [{"name": "ab", "marginal": ["a", "b"]}],
    )
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"a": [0, 2, 1, 2], "b": ["y", "x", "x", "y"], "z": [9] * 4}), path)
    items, dropped = response_files.encode_items(spec, str(path))
    np.testing.assert_array_equal(items, [1, 4, 2, 5])
    assert dropped == 0


def test_encode_items_out_of_domain_error_and_drop(tmp_path: Path) -> None:
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"v": pa.array([1, 99, None, 3], pa.int64())}), path)
    with pytest.raises(
        DataError, match=re.escape("column 'v' has row(s) that are null or outside")
    ) as caught:
        response_files.encode_items(local_spec(), str(path))
    assert "2" not in str(caught.value)  # no count of true items
    items, dropped = response_files.encode_items(local_spec(on_out_of_domain="drop"), str(path))
    np.testing.assert_array_equal(items, [1, 3])
    assert dropped == 2


def test_encode_items_checks_types(tmp_path: Path) -> None:
    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"v": ["a", "b"]}), path)
    with pytest.raises(DataError, match="column 'v' does not hold integer values"):
        response_files.encode_items(local_spec(), str(path))


def test_simulated_responses_carry_the_fingerprint(tmp_path: Path, rr16: LocalStrategy) -> None:
    items = tmp_path / "items.parquet"
    pq.write_table(pa.table({"v": np.arange(16).repeat(5)}), items)
    out = tmp_path / "responses.parquet"
    summary = response_files.simulate(
        local_spec(), rr16, input_path=str(items), output_path=out, rng=np.random.default_rng(3)
    )
    assert summary.num_responses == 80 and summary.strategy_fingerprint == rr16.fingerprint
    ingested = inputs.ingest_responses(local_spec(source=str(out)), rr16)
    assert ingested.data.num_responses == 80
    metadata = pq.read_schema(out).metadata
    assert metadata[response_files.FINGERPRINT_METADATA_KEY].decode() == rr16.fingerprint


# --- the collection charge through the release pipeline -------------------------------------------


def _responses(tmp_path: Path, plan: Plan, values: list[int], name: str) -> Path:
    return _write(tmp_path / name, pa.table({"response": values}), plan.strategy.fingerprint)


def _release(spec: ReleaseSpec, plan: Plan, catalog: Catalog, release_id: str) -> Any:
    release.register(spec, plan, catalog, release_id=release_id)
    ingested = release.ingest(spec, plan, catalog)
    return release.measure(ingested, spec, plan, catalog, release_id=release_id)


def test_a_collection_is_charged_once(tmp_path: Path, store: StrategyStore) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    _, plan = planned(store)
    source = _responses(tmp_path, plan, [1, 2, 3], "one.parquet")
    spec = local_spec(source=str(source), mechanism_options=FAST)
    measured = [_release(spec, plan, catalog, release_id) for release_id in ("r1", "r2")]
    entries = catalog.ledger_entries(spec.dataset.id)
    assert len(entries) == 1 and entries[0].release_id == "r1"
    assert COLLECTION_LABEL in entries[0].label
    assert entries[0].cost.epsilon == 1.0
    assert [m.details["collection_reused"] for m in measured] == [False, True]
    assert [m.charged.as_dict() for m in measured] == [{"epsilon": 1.0}, {"epsilon": 0.0}]
    assert measured[0].receipts == measured[1].receipts == (entries[0].receipt_id,)

    other = _responses(tmp_path, plan, [4, 5, 6], "two.parquet")
    spec2 = local_spec(source=str(other), mechanism_options=FAST)
    assert not _release(spec2, plan, catalog, "r3").details["collection_reused"]
    assert len(catalog.ledger_entries(spec.dataset.id)) == 2
    assert catalog.spent(spec.dataset.id).epsilon == 2.0


def test_a_scheduled_release_hashes_its_input_once_before_the_charge(
    tmp_path: Path, store: StrategyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The skip check's keyed fingerprint is the one ``cost_due`` asks the mechanism about: the
    files are read once for both (a second O(bytes) pass on every scheduled run otherwise)."""
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    _, plan = planned(store)
    source = _responses(tmp_path, plan, [1, 2, 3], "one.parquet")
    spec = local_spec(source=str(source), mechanism_options=FAST)
    hashed: list[str] = []

    def counting(path: str, **kwargs: Any) -> Any:
        hashed.append(str(path))
        return resolve_source(path, **kwargs)

    monkeypatch.setattr(release, "resolve_source", counting)
    before = release.register(spec, plan, catalog, release_id="r1", on_unchanged="skip")
    assert before.as_dict() == {"epsilon": 0.0}  # registered (nothing to skip), nothing spent yet
    assert hashed == [str(source)]
    assert release.cost_due(spec, plan, catalog).as_dict() == {"epsilon": 1.0}
    assert hashed == [str(source)] * 2  # without a fingerprint from its caller it hashes itself


def test_a_charged_collection_is_released_again_without_budget_left(
    tmp_path: Path, store: StrategyStore
) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    _, plan = planned(store, budget=1.5)
    source = _responses(tmp_path, plan, [1, 2, 3], "one.parquet")
    spec = local_spec(source=str(source), budget=1.5, mechanism_options=FAST)
    _release(spec, plan, catalog, "r1")  # 0.5 left: less than one collection
    assert release.cost_due(spec, plan, catalog).as_dict() == {"epsilon": 0.0}
    again = _release(spec, plan, catalog, "r2")  # re-estimating a paid collection is free
    assert again.details["collection_reused"] and again.charged.as_dict() == {"epsilon": 0.0}
    garbage = tmp_path / "new.parquet"
    garbage.write_bytes(b"not parquet: register must refuse before reading it")
    new = local_spec(source=str(garbage), budget=1.5, mechanism_options=FAST)
    with pytest.raises(BudgetExceededError, match="would be exceeded"):
        release.register(new, plan, catalog, release_id="r3")
    assert [r.id for r in catalog.releases(dataset_id=spec.dataset.id)] == ["r1", "r2"]
    assert len(catalog.ledger_entries(spec.dataset.id)) == 1


def test_an_over_budget_collection_is_refused_before_reading(
    tmp_path: Path, store: StrategyStore
) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    source = tmp_path / "responses.parquet"
    source.write_bytes(b"not parquet: register must refuse before reading it")
    spec, plan = planned(store, source=str(source), budget=0.5)
    with pytest.raises(BudgetExceededError, match="would be exceeded"):
        release.register(spec, plan, catalog, release_id="r1")
    assert catalog.releases(dataset_id=spec.dataset.id) == []
    assert catalog.ledger_entries(spec.dataset.id) == []


def test_a_bad_responses_file_charges_nothing(tmp_path: Path, store: StrategyStore) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    _, plan = planned(store)
    source = _responses(tmp_path, plan, [0, 1, 10_000], "bad.parquet")
    spec = local_spec(source=str(source), mechanism_options=FAST)
    release.register(spec, plan, catalog, release_id="r1")
    with pytest.raises(DataError, match="outside"):
        release.ingest(spec, plan, catalog)
    assert catalog.ledger_entries(spec.dataset.id) == []
