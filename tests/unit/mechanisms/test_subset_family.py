"""Subset families: a downward-closed family computes what the whole lattice computes.

Every operation of a closed family is checked against the lattice's on the same subsets, and the
whole marginal-space path (projections, the centred and largest-variance designs, the template,
answers, variances, stored weights) is run twice on small domains: once on the lattice, once on
the downward closure (``MAX_MARGINAL_ATTRIBUTES`` lowered), and must agree.  A 70-attribute
workload (masks past 63 bits) is checked against the closed form written out by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dprelease.mechanisms.marginal_space import MECHANISM, MarginalSpaceStrategy
from dprelease.mechanisms.primitives import subset_family
from dprelease.mechanisms.primitives.lower_bound import svd_bound
from dprelease.mechanisms.primitives.marginal_objectives import marginal_weights_max_variance
from dprelease.mechanisms.primitives.marginal_strategies import (
    MarginalWeights,
    marginal_weights_l1,
    marginal_weights_l2,
    subset_workload,
)
from dprelease.mechanisms.primitives.operators import Identity, Total
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import PlanRequest
from dprelease.mechanisms.primitives.subset_family import (
    SubsetFamily,
    down_closure,
    maximal_masks,
    set_bits,
    submasks,
)
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.doubles import MemoryStore

SHAPE = (2, 3, 4, 1, 3)
TABLES = [(0, 1), (1, 2, 4), (3,), (0, 4), ()]
SCALES = {"m0_1": 4.0, "m1_2_4": 1.0, "m3": 0.5, "m0_4": 9.0, "m": 1.0}


def marginals(shape: tuple[int, ...], tables: list[tuple[int, ...]]) -> Workload:
    items = tuple(
        WorkloadItem(
            name="m" + "_".join(map(str, axes)),
            factors=tuple(Identity(n) if i in axes else Total(n) for i, n in enumerate(shape)),
        )
        for axes in tables
    )
    return Workload(domain_shape=shape, items=items)


def mask(axes: tuple[int, ...]) -> int:
    return sum(1 << a for a in axes)


@pytest.fixture
def closure_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every domain of more than one attribute planned on its downward closure."""
    monkeypatch.setattr(subset_family, "MAX_MARGINAL_ATTRIBUTES", 1)


def test_closed_family_operations_equal_the_lattice_on_its_subsets() -> None:
    rng = np.random.default_rng(5)
    lattice = SubsetFamily.every_subset(SHAPE)
    closed = SubsetFamily.below(SHAPE, [mask(t) for t in TABLES])
    masks = list(closed.closed_masks or ())
    assert masks == down_closure(mask(t) for t in TABLES)
    inside = np.array(masks)
    values = np.zeros(len(lattice))
    values[inside] = rng.random(len(closed))
    on_closed = values[inside]
    np.testing.assert_allclose(
        closed.superset_sums(on_closed), lattice.superset_sums(values)[inside]
    )
    np.testing.assert_allclose(closed.subset_sums(on_closed), lattice.subset_sums(values)[inside])
    for got, want in [
        (closed.summed_out_sizes(), lattice.summed_out_sizes()),
        (closed.multiplicities(), lattice.multiplicities()),
        (
            closed.kept_products([0.5, 2.0, 3.0, 7.0, 1.5]),
            lattice.kept_products([0.5, 2, 3, 7, 1.5]),
        ),
    ]:
        np.testing.assert_allclose(got, want[inside])
    assert closed.masks_at(closed.maximal_positions()) == maximal_masks(mask(t) for t in TABLES)
    assert closed.position(0b1000000) is None and closed.value_at(on_closed, 0b1000000) == 0.0
    assert lattice.maximal_positions() == [2**5 - 1]


def test_bits_subsets_and_maximal_masks_past_64_attributes() -> None:
    wide = 1 << 90 | 1 << 64 | 1
    assert set_bits(wide) == [0, 64, 90]
    bits = [1, 1 << 64, 1 << 90]
    expected = {sum(b for k, b in enumerate(bits) if pick >> k & 1) for pick in range(8)}
    assert set(submasks(wide)) == expected and len(list(submasks(wide))) == 8
    assert maximal_masks([wide, 1, 1 << 90 | 1, 0b110]) == [0b110, wide]
    huge = (1 << 20) - 1  # wider than the enumerated bound: tested one mask at a time
    assert maximal_masks([huge, 0b101, 1 << 20]) == [huge, 1 << 20]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: SubsetFamily.every_subset((2,) * 21), "at most 20 attributes"),
        (
            lambda: SubsetFamily.below((2,) * 30, [(1 << 30) - 1]),
            "up to 1,073,741,824 attribute subsets below them; at most 20,000,000",
        ),
        (lambda: SubsetFamily.below((2, 2), [0b100]), "beyond the 2 of the domain"),
        (
            lambda: SubsetFamily.below((2, 2), [0b11]).products([1.0, 1.0], [0.0, 1.0]),
            "non-zero summed-out factors",
        ),
        (
            lambda: SubsetFamily.below((2, 2), [0b11]).superset_sums(np.ones(3)),
            "one entry per subset",
        ),
    ],
    ids=["lattice-too-wide", "closure-too-large", "mask-beyond-domain", "zero-factor", "length"],
)
def test_family_validation_fires(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def _by_mask(weights: MarginalWeights) -> dict[int, float]:
    return {int(m): weights.weight_of(int(m)) for m in weights.subsets}


def test_the_closure_plans_what_the_lattice_plans(closure_only: None) -> None:
    workload = marginals(SHAPE, TABLES)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subset_family, "MAX_MARGINAL_ATTRIBUTES", 20)
        lattice_subset = subset_workload(workload)
        lattice_l2 = marginal_weights_l2(lattice_subset)
        lattice_max = marginal_weights_max_variance(workload)
        lattice_scaled = marginal_weights_max_variance(workload, item_scales=SCALES)
        lattice_l1 = marginal_weights_l1(lattice_subset, rng=np.random.default_rng(1), restarts=0)
    closed_subset = subset_workload(workload)
    assert not closed_subset.family.is_lattice
    inside = np.array(closed_subset.family.closed_masks)
    np.testing.assert_allclose(closed_subset.projections, lattice_subset.projections[inside])
    assert lattice_subset.projections.sum() == pytest.approx(closed_subset.projections.sum())
    closed_l2 = marginal_weights_l2(closed_subset)
    assert closed_l2.unit_total_error == pytest.approx(lattice_l2.unit_total_error, rel=1e-12)
    assert closed_l2.lower_bound == pytest.approx(lattice_l2.lower_bound, rel=1e-12)
    assert _by_mask(closed_l2) == pytest.approx(_by_mask(lattice_l2), rel=1e-12)
    closed_max = marginal_weights_max_variance(workload)
    assert closed_max.largest_variance == pytest.approx(lattice_max.largest_variance, rel=1e-9)
    assert closed_max.item_variances == pytest.approx(lattice_max.item_variances, rel=1e-9)
    closed_scaled = marginal_weights_max_variance(workload, item_scales=SCALES)
    assert closed_scaled.item_variances == pytest.approx(lattice_scaled.item_variances, rel=1e-9)
    assert closed_scaled.largest_variance != pytest.approx(closed_max.largest_variance, rel=1e-3)
    closed_l1 = marginal_weights_l1(closed_subset, rng=np.random.default_rng(1), restarts=0)
    assert closed_l1.unit_total_error <= lattice_l1.unit_total_error * (1 + 1e-6)


def test_closure_answers_and_variances_equal_the_lattice(closure_only: None) -> None:
    workload = marginals(SHAPE, TABLES)
    closed = MarginalSpaceStrategy(name="c", weights=marginal_weights_l2(subset_workload(workload)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subset_family, "MAX_MARGINAL_ATTRIBUTES", 20)
        lattice = MarginalSpaceStrategy(
            name="l", weights=marginal_weights_l2(subset_workload(workload))
        )
        y = np.random.default_rng(3).normal(size=lattice.num_queries)
        want_answers = lattice.answers(y, workload)
        want_variances = [lattice.item_unit_variances(item) for item in workload.items]
        want_totals = [lattice.item_unit_total(item) for item in workload.items]
    assert closed.marginal_subsets == lattice.marginal_subsets
    got = closed.answers(y, workload)
    for name, table in want_answers.items():
        np.testing.assert_allclose(got[name], table, atol=1e-9)
    for item, variances, total in zip(workload.items, want_variances, want_totals, strict=True):
        np.testing.assert_allclose(closed.item_unit_variances(item), variances, rtol=1e-12)
        assert closed.item_unit_total(item) == pytest.approx(total, rel=1e-12)
    assert closed.support_residual(workload) == 0.0
    stored = MarginalWeights.from_parameters(SHAPE, closed.weights.to_parameters())
    assert not stored.family.is_lattice
    assert _by_mask(stored) == _by_mask(closed.weights)


def test_seventy_attributes_plan_at_the_closed_form() -> None:
    """Masks past bit 63; total variance ``(Σ_T √(g_T r_T))² / N`` written out by hand."""
    shape = (3,) * 70
    tables = [(0, 65), (65, 69), (10,), (69,)]
    workload = marginals(shape, tables)
    request = PlanRequest(
        workload=workload,
        ordered=(True,) * 70,
        target=PrivacyCost(measure="zcdp", rho=0.5),
        contribution_bound=1,
        options={},
        workload_fingerprint="cd" * 32,
    )

    strategy = MECHANISM.plan(request, cache=MemoryStore())
    n = 3.0
    cells = n**70
    roots: dict[int, float] = {}
    for axes in tables:  # g_T(R) = r_T · N / |R| for T ⊆ R, r_T = 2^|T|
        for t in submasks(mask(axes)):
            k = t.bit_count()
            roots[t] = roots.get(t, 0.0) + (n - 1) ** k * cells / n ** len(axes)
    closed_form = sum(math.sqrt(g * (n - 1) ** t.bit_count()) for t, g in roots.items()) ** 2
    assert strategy.weights.unit_total_error == pytest.approx(closed_form / cells, rel=1e-12)
    assert svd_bound(workload) == pytest.approx(closed_form / cells, rel=1e-12)  # the SVD bound
    assert {int(m) for m in strategy.weights.subsets} == set(roots)
    assert strategy.weights.subsets.dtype == object  # masks past 62 bits stay Python ints


@pytest.mark.parametrize("closed", [False, True], ids=["lattice", "closure"])
def test_support_residual_finds_an_unmeasured_subset(closed: bool) -> None:
    """Centred 0- and 1-way marginals support the 1-way tables, not the 2-way one."""
    shape = (3, 4)
    family = SubsetFamily.below(shape, [0b11]) if closed else SubsetFamily.every_subset(shape)
    weights = np.zeros(len(family))
    for measured in (0b00, 0b01, 0b10):
        weights[family.position(measured)] = 1.0
    strategy = MarginalSpaceStrategy(
        name="one-way",
        weights=MarginalWeights(
            domain_shape=shape,
            family=family,
            basis="centred",
            weights=weights,
            noise="gaussian",
            unit_total_error=1.0,
        ),
    )
    assert strategy.support_residual(marginals(shape, [(0,), (1,), ()])) == 0.0
    assert strategy.support_residual(marginals(shape, [(0,), (0, 1)])) == 1.0
