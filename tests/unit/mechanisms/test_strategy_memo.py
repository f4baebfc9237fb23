"""Frozen strategies memoise their pseudo-inverses with ``functools.cached_property``: the memo
survives pickling, and an object pickled when the memo was a list field still loads and answers."""

from __future__ import annotations

import pickle

import numpy as np

from dprelease.mechanisms.primitives.dense import DenseStrategy
from dprelease.mechanisms.primitives.operators import Prefix
from dprelease.mechanisms.primitives.strategies import build_kron_strategy
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

WORKLOAD = Workload(domain_shape=(6,), items=(WorkloadItem(name="cdf", factors=(Prefix(6),)),))


def test_kron_memo_is_computed_once_and_pickles() -> None:
    strategy = build_kron_strategy("hierarchical", attribute_roles=[(6, "ordered")])
    first = strategy.gram_pinvs()
    assert strategy.gram_pinvs()[0] is first[0]
    restored = pickle.loads(pickle.dumps(strategy))
    np.testing.assert_array_equal(restored.gram_pinvs()[0], first[0])
    assert restored.support_residual(WORKLOAD) == strategy.support_residual(WORKLOAD)


def test_kron_pickled_with_the_old_list_memo_still_loads() -> None:
    strategy = build_kron_strategy("wavelet", attribute_roles=[(6, "ordered")])
    expected = strategy.item_unit_variances(WORKLOAD.items[0])
    old = build_kron_strategy("wavelet", attribute_roles=[(6, "ordered")])
    old.__dict__.update(_gram_pinvs=[np.eye(6)], _full_rank=[True])  # the former fields
    restored = pickle.loads(pickle.dumps(old))
    np.testing.assert_allclose(restored.item_unit_variances(WORKLOAD.items[0]), expected)


def test_dense_covariance_memo_and_old_pickles() -> None:
    matrix = np.vstack([np.eye(4), np.ones((1, 4))])
    strategy = DenseStrategy(name="dense", matrix=matrix)
    covariance = strategy.covariance()
    assert strategy.covariance() is covariance
    np.testing.assert_allclose(covariance, np.linalg.pinv(matrix.T @ matrix))
    old = DenseStrategy(name="dense", matrix=matrix)
    old.__dict__["_covariance"] = []  # the former list field
    np.testing.assert_allclose(pickle.loads(pickle.dumps(old)).covariance(), covariance)
