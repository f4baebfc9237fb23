"""Union weight optimiser: time limit, progress, Ctrl-C and cost prediction."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from dprelease.mechanisms.primitives.operators import AllRanges, Identity, Prefix, Total
from dprelease.mechanisms.primitives.union import (
    optimize_weights,
    per_item_terms,
    predict_seconds,
    unit_error,
    weight_problem_sizes,
)
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.fake_clock import install_fake_clock

SHAPE = (5, 2, 2)
WORKLOAD = Workload(
    domain_shape=SHAPE,
    items=(
        WorkloadItem(name="ranges", factors=(AllRanges(5), Identity(2), Total(2))),
        WorkloadItem(name="cross", factors=(Total(5), Identity(2), Identity(2))),
        WorkloadItem(name="cdf", factors=(Prefix(5), Total(2), Identity(2))),
    ),
)
TERMS = per_item_terms(WORKLOAD, ordered=(True, False, False), family="hierarchical")


def test_time_limit_keeps_every_term_and_the_best_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = install_fake_clock(monkeypatch)
    fractions: list[float] = []

    def tick(fraction: float, message: str) -> None:
        fractions.append(fraction)
        clock.advance(1.0)

    full = optimize_weights(WORKLOAD, TERMS, noise="laplace", name="optimized")
    stopped = optimize_weights(
        WORKLOAD, TERMS, noise="laplace", name="optimized", time_limit=2.5, progress=tick
    )
    assert stopped.parameters["stopped_early"] and not full.parameters["stopped_early"]
    assert len(stopped.terms) == len(TERMS)  # no pruning after a stop
    assert stopped.support_residual(WORKLOAD) < 1e-8
    assert 0 < stopped.parameters["evaluations"] < full.parameters["evaluations"]
    error = unit_error(stopped, WORKLOAD, noise="laplace")
    assert math.isfinite(error)
    assert unit_error(full, WORKLOAD, noise="laplace") <= error * (1 + 1e-9)
    assert all(0.0 <= f <= 1.0 for f in fractions)


def test_zero_time_limit_returns_equal_weights() -> None:
    stopped = optimize_weights(WORKLOAD, TERMS, noise="gaussian", name="optimized", time_limit=0.0)
    assert stopped.parameters["stopped_early"]
    assert stopped.parameters["weights"] == [1.0] * len(TERMS)
    assert stopped.support_residual(WORKLOAD) < 1e-8


def test_generous_time_limit_changes_nothing() -> None:
    fractions: list[float] = []
    plain = optimize_weights(WORKLOAD, TERMS, noise="laplace", name="optimized")
    limited = optimize_weights(
        WORKLOAD,
        TERMS,
        noise="laplace",
        name="optimized",
        time_limit=1e6,
        progress=lambda f, m: fractions.append(f),
    )
    assert plain.parameters == limited.parameters
    assert fractions and fractions[-1] == 1.0
    assert all(0.0 <= f <= 1.0 for f in fractions)


def test_ctrl_c_propagates() -> None:
    def interrupt(fraction: float, message: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        optimize_weights(WORKLOAD, TERMS, noise="laplace", name="optimized", progress=interrupt)


def test_weight_problem_sizes_match_the_structure() -> None:
    dense, blocks = weight_problem_sizes(WORKLOAD, TERMS)
    optimized = optimize_weights(WORKLOAD, TERMS, noise="laplace", name="optimized", time_limit=0.0)
    structure = optimized.structure(WORKLOAD)
    assert dense == math.prod(SHAPE[a] for a in structure.dense_axes)
    assert blocks == len(structure.blocks)


def test_predict_seconds_grows_with_size() -> None:
    small = predict_seconds(dense_cells=16, split_blocks=4, num_terms=4, num_cells=96)
    large = predict_seconds(dense_cells=512, split_blocks=8, num_terms=4, num_cells=12288)
    assert 0 < small < large
    assert predict_seconds(dense_cells=512, split_blocks=8, num_terms=1, num_cells=9) == 0.0


@pytest.mark.parametrize("field", ["dense_cells", "split_blocks", "num_terms", "num_cells"])
def test_predict_seconds_validators(field: str) -> None:
    sizes = {"dense_cells": 4, "split_blocks": 2, "num_terms": 2, "num_cells": 8}
    sizes[field] = 0
    with pytest.raises(ValueError, match=re.escape(f"{field} (0) must be an integer >= 1")):
        predict_seconds(**sizes)  # type: ignore[arg-type]
    assert np.isfinite(predict_seconds(dense_cells=4, split_blocks=2, num_terms=2, num_cells=8))
