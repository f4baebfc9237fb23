"""Sharded noise keeps the choke point's obligations (catalog/confidential/choke_point.py module docstring).

The ledger is charged once, before any shard is dispatched; every shard is noised exactly once by
the vetted sampler with its own randomness; a failed, missing, duplicated, foreign or re-drawn
shard fails the whole measurement, returns nothing and leaves the charge standing; no failure
message quotes a confidential value.  The last tests run the same rule on a real Dask cluster
(a scheduler and two worker processes started by the ``dask`` CLI, ``tests/dask_cluster.py``).
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client

from dprelease.catalog import release
from dprelease.catalog.confidential.choke_point import (
    NoisyMeasurement,
    ProtectedCells,
    ProtectedMarginals,
    ShardedNoiseError,
    ShardFailedError,
)
from dprelease.catalog.confidential.distributed_noise import (
    DaskShardMapper,
    noise_cluster,
    processing_counts,
    sharded,
)
from dprelease.catalog.engine import Execution
from dprelease.catalog.ledger.store import Catalog
from dprelease.catalog.planning.planner import make_plan
from dprelease.catalog.spec.load import parse_spec
from dprelease.mechanisms.marginal_space import marginal_of
from dprelease.mechanisms.primitives import noise
from dprelease.mechanisms.primitives.noise import NoiseShard, NoisyShard, noise_shard
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.strategies import KronStrategy, build_kron_strategy
from tests.privacy.test_noise_and_session import _SpyAccountant
from tests.privacy.test_protected_marginals import SHAPE, _strategy

SECRET = 987_654.0  # a confidential value no message may quote
CELLS = 40
PURE = PrivacyCost(measure="pure", epsilon=1.0)

ShardFunction = Callable[[NoiseShard], NoisyShard]


def _identity() -> KronStrategy:
    return build_kron_strategy("identity", attribute_roles=[(CELLS, "categorical")])


def _cells() -> ProtectedCells:
    return ProtectedCells(np.full(CELLS, SECRET), domain_shape=(CELLS,), contribution_bound=1)


class _Mapper:
    """In-process mapper that records dispatches in the shared event list."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.shards: list[NoiseShard] = []

    def __call__(self, function: ShardFunction, shards: Sequence[NoiseShard]) -> list[NoisyShard]:
        self.shards = list(shards)
        results = []
        for shard in shards:
            self.events.append(f"dispatch {shard.index}")
            results.append(function(shard))
        return results


def _measure(
    mapper: Callable[..., Sequence[NoisyShard]], events: list[str]
) -> tuple[_SpyAccountant, Callable[[], NoisyMeasurement]]:
    accountant = _SpyAccountant(events)
    cells = _cells().with_shard_mapper(mapper, shard_size=10)

    def run() -> NoisyMeasurement:
        return cells.measure(_identity(), target=PURE, accountant=accountant, label="t")

    return accountant, run


def test_charged_once_before_any_shard_is_dispatched() -> None:
    events: list[str] = []
    mapper = _Mapper(events)
    accountant, run = _measure(mapper, events)
    result = run()
    assert events == ["charge"] + [f"dispatch {i}" for i in range(4)]
    assert len(accountant.charged) == 1
    assert result.values.shape == (CELLS,)
    assert np.all(result.values != SECRET)
    assert {s.count for s in mapper.shards} == {4}
    assert [s.values.size for s in mapper.shards] == [10, 10, 10, 10]


@pytest.mark.parametrize("gaussian", [False, True], ids=["laplace", "gaussian"])
def test_marginals_are_charged_once_before_dispatch(gaussian: bool) -> None:
    events: list[str] = []
    strategy = _strategy(gaussian=gaussian)
    x = np.arange(24.0)
    protected = ProtectedMarginals(
        {axes: marginal_of(x, SHAPE, axes) for axes in strategy.marginal_subsets},
        domain_shape=SHAPE,
        contribution_bound=2,
    ).with_shard_mapper(_Mapper(events), shard_size=5)
    accountant = _SpyAccountant(events)
    target = PrivacyCost(measure="zcdp", rho=0.5) if gaussian else PURE
    result = protected.measure(strategy, target=target, accountant=accountant, label="t")
    dispatches = -(-strategy.num_queries // 5)
    assert events == ["charge"] + [f"dispatch {i}" for i in range(dispatches)]
    assert result.values.shape == (strategy.num_queries,)
    assert result.noise.kind == ("gaussian" if gaussian else "laplace")


def test_the_local_path_is_unchanged_and_the_sharded_path_skips_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local_calls: list[str] = []

    def spy_sampler() -> noise.NoiseSampler:
        local_calls.append("local")
        return noise.OpenDPSampler(threads=1)

    monkeypatch.setattr(noise, "production_sampler", spy_sampler)
    events: list[str] = []
    _measure(_Mapper(events), events)[1]()
    assert local_calls == []
    accountant = _SpyAccountant(events)
    _cells().measure(_identity(), target=PURE, accountant=accountant, label="t")
    assert local_calls == ["local"]


def _failing_on(k: int, error: Exception) -> Callable[[ShardFunction, Sequence[NoiseShard]], list]:
    def mapper(function: ShardFunction, shards: Sequence[NoiseShard]) -> list[NoisyShard]:
        results = []
        for shard in shards:
            if shard.index == k:
                raise error
            results.append(function(shard))
        return results

    return mapper


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (ShardFailedError(2, "KilledWorker on the cluster"), "noise shard 2 of 4 failed"),
        (ValueError(f"worker saw {SECRET}"), "the shard mapper failed (ValueError)"),
        (ShardFailedError(None, "lost"), "a noise shard of 4 failed"),
    ],
)
def test_a_failed_shard_fails_the_measurement_and_the_charge_stands(
    error: Exception, says: str
) -> None:
    events: list[str] = []
    accountant, run = _measure(_failing_on(2, error), events)
    with pytest.raises(ShardedNoiseError) as raised:
        run()
    message = str(raised.value)
    assert says in message
    assert "receipt receipt-1) stands" in message and "no shard is noised again" in message
    assert str(SECRET) not in message and "987654" not in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert len(accountant.charged) == 1  # the charge was made and is not undone


def _twice_returned(function: ShardFunction, shards: Sequence[NoiseShard]) -> list[NoisyShard]:
    results = [function(shard) for shard in shards]
    return [*results[:2], function(shards[1]), *results[2:]]  # shard 1 drawn twice, both returned


def _same_result_twice(function: ShardFunction, shards: Sequence[NoiseShard]) -> list[NoisyShard]:
    results = [function(shard) for shard in shards]
    return [results[0], results[0], *results[2:]]


def _out_of_order(function: ShardFunction, shards: Sequence[NoiseShard]) -> list[NoisyShard]:
    results = [function(shard) for shard in shards]
    return [results[1], results[0], *results[2:]]


def _dropped(function: ShardFunction, shards: Sequence[NoiseShard]) -> list[NoisyShard]:
    return [function(shard) for shard in shards[:-1]]


def _foreign(function: ShardFunction, shards: Sequence[NoiseShard]) -> list[NoisyShard]:
    results = [function(shard) for shard in shards]
    stranger = dataclasses.replace(shards[0], token=b"\0" * 16)  # another measurement's shard
    return [function(stranger), *results[1:]]


def _wrong_shape(function: ShardFunction, shards: Sequence[NoiseShard]) -> list[NoisyShard]:
    results = [function(shard) for shard in shards]
    return [dataclasses.replace(results[0], values=results[0].values[:3]), *results[1:]]


def _not_a_result(function: ShardFunction, shards: Sequence[NoiseShard]) -> list[object]:
    return [shard.values for shard in shards]  # the raw answers, never noised


@pytest.mark.parametrize(
    ("mapper", "says"),
    [
        (_twice_returned, "noise shard 1 of 4 was noised twice"),
        (_same_result_twice, "noise shard 0 of 4 was returned twice"),
        (_out_of_order, "noise shard 1 of 4 came back at position 0"),
        (_dropped, "noise shards [3] of 4 never came back"),
        (_foreign, "shard result 0 is not a noised shard of this measurement"),
        (_wrong_shape, "noise shard 0 of 4 came back with shape (3,), not (10,)"),
        (_not_a_result, "shard result 0 is not a noised shard of this measurement"),
    ],
    ids=["noised-twice", "returned-twice", "order", "dropped", "foreign", "shape", "raw"],
)
def test_a_shard_not_returned_exactly_once_in_order_is_refused(
    mapper: Callable[..., list], says: str
) -> None:
    events: list[str] = []
    accountant, run = _measure(mapper, events)
    with pytest.raises(ShardedNoiseError, match="nothing is released") as raised:
        run()
    assert says in str(raised.value)
    assert "987654" not in str(raised.value)
    assert len(accountant.charged) == 1


def test_each_shard_has_its_own_randomness_and_no_seed() -> None:
    """Shards carry no seed (OpenDP draws from each worker's OS CSPRNG); identical inputs in
    different shards get different noise, and every draw and token is distinct."""
    assert {f.name for f in dataclasses.fields(NoiseShard)} == {
        "index",
        "count",
        "token",
        "kind",
        "scale",
        "values",
    }
    events: list[str] = []
    mapper = _Mapper(events)
    run = _measure(mapper, events)[1]
    first = run().values
    tokens = [s.token for s in mapper.shards]
    second = run().values
    tokens += [s.token for s in mapper.shards]
    assert len(set(tokens)) == 8  # one-time names, never reused across measurements
    pieces = [tuple(p) for p in np.split(np.concatenate([first, second]), 8)]
    assert len(set(pieces)) == 8  # same true values, 8 different noise vectors
    draws = [noise_shard(mapper.shards[0]).draw for _ in range(3)]
    assert len(set(draws)) == 3


def test_a_shard_never_prints_its_values_but_can_travel_to_a_worker() -> None:
    shard = NoiseShard(
        index=0, count=1, token=b"t" * 16, kind="laplace", scale=1.0, values=np.array([SECRET])
    )
    assert "987654" not in repr(shard) and "redacted" in repr(shard)
    assert np.array_equal(pickle.loads(pickle.dumps(shard)).values, [SECRET])
    result = noise_shard(shard)
    assert "987654" not in repr(result) and result.token == shard.token


@pytest.mark.parametrize("size", [0, -3, 2.5, True])
def test_shard_size_must_be_a_positive_integer(size: object) -> None:
    with pytest.raises(ValueError, match=r"shard_size \(.*\) must be an integer >= 1"):
        _cells().with_shard_mapper(_Mapper([]), shard_size=size)  # type: ignore[arg-type]


def test_the_shard_mapper_must_be_callable() -> None:
    with pytest.raises(TypeError, match=r"shard_mapper \(str\) must be callable"):
        _cells().with_shard_mapper("tcp://127.0.0.1:8786")  # type: ignore[arg-type]


def test_a_sharded_choke_point_still_refuses_pickling() -> None:
    sharded = _cells().with_shard_mapper(_Mapper([]))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(sharded)
    assert "987654" not in repr(sharded)


def test_a_shard_with_an_unknown_noise_kind_is_refused() -> None:
    shard = NoiseShard(
        index=0, count=1, token=b"t" * 16, kind="cauchy", scale=1.0, values=np.zeros(2)
    )  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"noise \('cauchy'\) must be one of"):
        noise_shard(shard)


# ---- on a real Dask cluster (two worker processes) ----------------------------------------------


@pytest.fixture
def client(dask_address: str) -> Iterator[Client]:
    """A client of the CLI-started cluster (scheduler + two worker processes)."""
    with Client(dask_address, timeout=30, set_as_default=False) as dask_client:
        yield dask_client


def test_the_engine_picks_the_noise_path(dask_address: str) -> None:
    cells = _cells()
    with noise_cluster(Execution()) as mapper:
        assert mapper is None
        assert sharded(cells, mapper) is cells  # local: exactly today's path
    responses = object()  # a local-model input has no shard mapper: unchanged
    with noise_cluster(Execution(engine="dask", address=dask_address)) as mapper:
        assert isinstance(mapper, DaskShardMapper)
        assert sharded(responses, mapper) is responses
        events: list[str] = []
        accountant = _SpyAccountant(events)
        result = sharded(cells, mapper).measure(
            _identity(), target=PURE, accountant=accountant, label="t"
        )
    assert events == ["charge"] and result.values.shape == (CELLS,)
    assert np.all(result.values != SECRET)


def test_on_a_cluster_every_shard_is_noised_once_on_a_worker(client: Client) -> None:
    events: list[str] = []
    accountant = _SpyAccountant(events)
    n = 6_000
    cells = ProtectedCells(np.zeros(n), domain_shape=(n,), contribution_bound=1)
    strategy = build_kron_strategy("identity", attribute_roles=[(n, "categorical")])
    result = cells.with_shard_mapper(DaskShardMapper(client), shard_size=1_000).measure(
        strategy, target=PURE, accountant=accountant, label="t"
    )
    assert events == ["charge"]
    assert result.values.shape == (n,)
    # six shards of 1,000 Laplace(b) draws: mean |noise| = b (loose: 6 sigma of the mean)
    b = result.noise.scale
    assert abs(np.mean(np.abs(result.values)) - b) < 6 * b / np.sqrt(n)
    assert len({tuple(piece) for piece in np.split(result.values, 6)}) == 6


def test_on_a_cluster_a_failed_shard_names_its_index_and_nothing_else(client: Client) -> None:
    shards = [
        NoiseShard(
            index=i,
            count=3,
            token=bytes([i]) * 16,
            kind="laplace" if i != 1 else "cauchy",  # type: ignore[arg-type]
            scale=1.0,
            values=np.full(4, SECRET),
        )
        for i in range(3)
    ]
    with pytest.raises(ShardFailedError) as raised:
        DaskShardMapper(client)(noise_shard, shards)
    assert raised.value.index == 1
    assert str(raised.value) == "shard 1: ValueError on the cluster"
    assert raised.value.__cause__ is None


def test_on_a_cluster_a_shard_the_scheduler_ran_twice_is_detected(client: Client) -> None:
    shard = NoiseShard(
        index=0, count=1, token=b"x" * 16, kind="laplace", scale=1.0, values=np.zeros(3)
    )
    key = "dprelease-noise-test-rerun-0"
    for _ in range(2):  # the same key computed, released, computed again (as after a lost worker)
        future = client.submit(noise_shard, shard, key=key, pure=False)
        future.result()
        future.release()
        del future
        for _ in range(200):  # bounded wait (10 s) until the scheduler has forgotten the key
            if not client.run_on_scheduler(lambda dask_scheduler: key in dask_scheduler.tasks):
                break
            time.sleep(0.05)
    assert processing_counts(client, [key]) == [2]
    assert processing_counts(client, ["dprelease-noise-never-submitted"]) == [0]


def test_on_a_cluster_the_mapper_refuses_a_shard_the_scheduler_ran_twice(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dprelease.catalog.confidential.distributed_noise as distributed_noise

    monkeypatch.setattr(distributed_noise, "processing_counts", lambda _c, keys: [1, 2, 1])
    shards = [
        NoiseShard(
            index=i, count=3, token=bytes([i]) * 16, kind="laplace", scale=1.0, values=np.zeros(2)
        )
        for i in range(3)
    ]
    with pytest.raises(ShardFailedError, match="shard 1: the scheduler ran it 2 times"):
        DaskShardMapper(client)(noise_shard, shards)


def _dask_release(tmp_path: Path, dask_address: str) -> tuple[Callable[[], object], Catalog, str]:
    """The release stages (no Prefect) for a spec with ``execution: {engine: dask, address}``."""
    values = np.random.default_rng(5).integers(0, 64, 500)  # public randomness: synthetic data
    source = tmp_path / "d.parquet"
    pq.write_table(pa.table({"v": pa.array(values, pa.int16())}), source)
    spec = parse_spec(
        {
            "name": "sharded",
            "dataset": {"id": "sharded", "source": str(source), "budget": {"epsilon": 5}},
            "domain": {"v": {"min": 0, "max": 63}},
            "workload": [{"name": "hist", "marginal": ["v"]}],
            "mechanism": "identity",
            "privacy": {"epsilon": 1.0},
            "execution": {"engine": "dask", "address": dask_address},
        }
    )
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    plan = make_plan(spec)
    release_id = release.new_release_id(spec)
    release.register(spec, plan, catalog, release_id=release_id)
    ingested = release.ingest(spec, plan, catalog)

    def measure() -> object:
        return release.measure(ingested, spec, plan, catalog, release_id=release_id)

    return measure, catalog, spec.dataset.id


def test_a_dask_release_is_charged_once_and_noised_on_the_cluster(
    tmp_path: Path, dask_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatched: list[int] = []
    real_call = DaskShardMapper.__call__

    def spy(self: DaskShardMapper, function: ShardFunction, shards: Sequence[NoiseShard]) -> list:
        dispatched.append(len(shards))
        return real_call(self, function, shards)

    monkeypatch.setattr(DaskShardMapper, "__call__", spy)
    measure, catalog, dataset_id = _dask_release(tmp_path, dask_address)
    measurement = measure()
    assert dispatched == [1]  # 64 answers: one shard, on a worker
    assert len(catalog.ledger_entries(dataset_id)) == 1
    assert measurement.values.shape == (64,)  # type: ignore[attr-defined]


def test_a_dask_release_whose_shard_fails_returns_nothing_and_keeps_its_charge(
    tmp_path: Path, dask_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dprelease.catalog.confidential.distributed_noise as distributed_noise

    monkeypatch.setattr(distributed_noise, "processing_counts", lambda _c, keys: [2] * len(keys))
    measure, catalog, dataset_id = _dask_release(tmp_path, dask_address)
    with pytest.raises(ShardedNoiseError, match=r"noise shard 0 of 1 failed .* ran it 2 times"):
        measure()
    entries = catalog.ledger_entries(dataset_id)
    assert len(entries) == 1 and entries[0].cost.epsilon > 0
