"""One subset-space search per workload: ``optimized`` and ``marginal_space`` share its store entry.

Entries written before the search was shared (``marginal_space``'s weights, ``optimized``'s record
of a winning marginals template) are written here by hand, in the format the store used then, and
must load without a new search; so must pickles of :class:`SubsetStrategy` from before its caches
were ``cached_property``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from dprelease.catalog.planning.strategy_store import StrategyStore
from dprelease.mechanisms.marginal_space import MECHANISM as MARGINAL_SPACE
from dprelease.mechanisms.optimized import MECHANISM as OPTIMIZED
from dprelease.mechanisms.primitives import marginal_objectives, marginal_strategies
from dprelease.mechanisms.primitives.marginal_strategies import MarginalWeights, SubsetStrategy
from dprelease.mechanisms.primitives.operators import Identity, Prefix, Total
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import PlanRequest, StoredStrategy, cache_key
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

SHAPE = (3, 4, 2)
FINGERPRINT = "cd" * 32


def _marginals() -> Workload:
    subsets = [(0, 1), (1, 2), (0,)]
    return Workload(
        domain_shape=SHAPE,
        items=tuple(
            WorkloadItem(
                name="m" + "".join(map(str, axes)),
                factors=tuple(Identity(n) if i in axes else Total(n) for i, n in enumerate(SHAPE)),
            )
            for axes in subsets
        ),
    )


def _request(workload: Workload, *, pure: bool = True) -> PlanRequest:
    target = (
        PrivacyCost(measure="pure", epsilon=1.0) if pure else PrivacyCost(measure="zcdp", rho=0.5)
    )
    return PlanRequest(
        workload=workload,
        ordered=(True,) * len(workload.domain_shape),
        target=target,
        contribution_bound=1,
        options={},
        workload_fingerprint=FINGERPRINT,
    )


def _write_entry(root: Path, key: str, parameters: dict) -> None:
    """An entry exactly as the store wrote it: ``<key>.npz`` holding the parameters' JSON."""
    root.mkdir(parents=True, exist_ok=True)
    np.savez(root / f"{key}.npz", __parameters__=np.array(json.dumps(parameters, sort_keys=True)))


def _no_search(*args: object, **kwargs: object) -> None:
    raise AssertionError("a stored entry must load without a new search")


def test_marginal_space_entry_from_before_is_used_by_both_mechanisms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = _request(_marginals())
    weights = np.zeros(2**3)
    weights[[0b011, 0b110, 0b001, 0b111]] = [0.4, 0.3, 0.2, 0.1]
    parameters = {  # MarginalWeights.to_parameters() as marginal_space stored it
        "basis": "marginal",
        "norm": 1,
        "subset_weights": {str(m): float(weights[m]) for m in np.flatnonzero(weights)},
        "unit_total_error": 123.5,
        "lower_bound": 100.25,
        "stopped_early": False,
        "iterations": 17,
    }
    root = tmp_path / "strategies"
    _write_entry(root, cache_key("marginal_space", FINGERPRINT, {"norm": 1}), parameters)
    monkeypatch.setattr(marginal_strategies, "search_marginal_weights", _no_search)

    planned = MARGINAL_SPACE.plan(request, cache=StrategyStore(root))
    np.testing.assert_array_equal(planned.weights.weights, weights)
    assert planned.weights.unit_total_error == 123.5 and planned.weights.iterations == 17

    chosen = OPTIMIZED.plan(request, cache=StrategyStore(root))  # the union search still runs
    assert chosen.parameters["unit_errors"]["subset"] == 123.5


def test_optimized_marginals_template_entry_from_before_rebuilds_the_same_strategy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A general workload whose winner was the marginals template (stored as a list of weights)."""
    workload = Workload(
        domain_shape=(4, 3),
        items=(
            WorkloadItem(name="cdf", factors=(Prefix(4), Identity(3))),
            WorkloadItem(name="b", factors=(Total(4), Identity(3))),
        ),
    )
    request = _request(workload)
    weights = [0.0, 0.25, 1e-15, 0.75]  # bitmask order; 1e-15 is round-off, not a measured term
    parameters = {
        "template": "marginals",
        "marginal_weights": weights,
        "seed": request.seed,
        "unit_errors": {"union": 9.0, "kron": 8.0, "marginals": 7.0},
    }
    root = tmp_path / "strategies"
    _write_entry(root, cache_key("optimized", FINGERPRINT, {"norm": 1, "b": 2}), parameters)
    monkeypatch.setattr(marginal_strategies, "search_marginal_weights", _no_search)

    strategy = OPTIMIZED.plan(request, cache=StrategyStore(root))
    assert dict(strategy.parameters) == parameters
    x = np.arange(12.0)
    cells = x.reshape(4, 3)
    # the old union of weighted marginals: bit 0 = attribute 0 kept, bit 1 = attribute 1 kept
    expected = np.concatenate([0.25 * cells.sum(axis=1), 0.75 * cells.ravel()])
    np.testing.assert_allclose(strategy.apply(x), expected)
    assert strategy.sensitivity(noise="laplace") == pytest.approx(1.0)


@pytest.mark.parametrize("pure", [True, False], ids=["laplace", "gaussian"])
def test_auto_searches_a_marginal_workload_once(
    monkeypatch: pytest.MonkeyPatch, pure: bool
) -> None:
    calls = {"l1": 0, "l2": 0}
    for name, counter in (("marginal_weights_l1", "l1"), ("marginal_weights_l2", "l2")):
        original = getattr(marginal_objectives, name)

        def counted(*args: object, _original=original, _counter=counter, **kwargs: object):
            calls[_counter] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(marginal_objectives, name, counted)  # where the planner calls them
    cache: dict[str, StoredStrategy] = {}

    class DictCache:
        def load(self, key: str) -> StoredStrategy | None:
            return cache.get(key)

        def save(self, key: str, stored: StoredStrategy) -> None:
            cache[key] = stored

    request = _request(_marginals(), pure=pure)
    first = MARGINAL_SPACE.plan(request, cache=DictCache())
    second = OPTIMIZED.plan(request, cache=DictCache())
    assert calls == ({"l1": 1, "l2": 0} if pure else {"l1": 0, "l2": 1})
    assert second.parameters["unit_errors"]["subset"] == first.weights.unit_total_error


def test_subset_strategy_pickles_from_before_cached_property_still_load() -> None:
    workload = _marginals()
    weights = marginal_strategies.marginal_weights_l2(workload)
    fresh = marginal_strategies.subset_strategy(weights, name="s")
    old = SubsetStrategy.__new__(SubsetStrategy)
    # the instance state pickled by the dataclass with list memo slots
    old.__dict__.update(
        name="s", weights=weights, parameters=dict(fresh.parameters), _union=[], _inverse=[]
    )
    loaded = pickle.loads(pickle.dumps(old))
    assert isinstance(loaded.weights, MarginalWeights)
    np.testing.assert_array_equal(loaded.inverse_eigenvalues, fresh.inverse_eigenvalues)
    x = np.arange(float(np.prod(SHAPE)))
    np.testing.assert_array_equal(loaded.apply(x), fresh.apply(x))
    item = workload.items[0]
    np.testing.assert_allclose(loaded.item_unit_variances(item), fresh.item_unit_variances(item))
    again = pickle.loads(pickle.dumps(fresh))  # the cached values travel with the instance
    np.testing.assert_array_equal(again.apply(x), fresh.apply(x))
