"""Marginals at any scale (issue 28): a workload of only marginals has no product-domain limit,
``marginals`` expansions are bounded by what they build, and marginal items share their factors."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning.memory import predict
from dprelease.catalog.planning.planner import build_workload, plan_request
from dprelease.catalog.spec import model as spec_module
from dprelease.catalog.spec.limits import MAX_EXPANDED_MARGINAL_ROWS, MAX_EXPANDED_MARGINALS
from dprelease.catalog.spec.load import check_runnable, parse_spec
from dprelease.catalog.spec.model import (
    elementary_symmetric,
    expand_item,
    item_num_queries,
    magnitude,
)
from dprelease.mechanisms import registry
from dprelease.mechanisms.primitives.operators import Identity, Prefix, Total
from dprelease.mechanisms.primitives.workload import (
    Workload,
    WorkloadItem,
    cell_vector_reason,
    item_subset,
    shared_identity,
    shared_total,
)


def _raw(num_attributes: int, workload: list[dict[str, Any]], size: int = 10) -> dict[str, Any]:
    return {
        "name": "scale",
        "dataset": {"id": "scale", "budget": {"rho": 10.0}},
        "domain": {f"a{i:03d}": {"min": 0, "max": size - 1} for i in range(num_attributes)},
        "workload": workload,
        "privacy": {"rho": 0.5},
    }


UP_TO_3_WAY = [
    {"name": f"m{k}", "marginals": {"attributes": "all", "degree": k}} for k in (1, 2, 3)
]


def _old_item_subset(item: WorkloadItem) -> int | None:
    """item_subset before marginal items recorded their kept axes (one isinstance per factor)."""
    mask = 0
    for axis, factor in enumerate(item.factors):
        if isinstance(factor, Identity):
            mask |= 1 << axis
        elif not isinstance(factor, Total):
            return None
    return mask


def test_all_1_to_3_way_marginals_of_100_attributes_parse_at_1e100_cells() -> None:
    spec = parse_spec(_raw(100, UP_TO_3_WAY))
    assert spec.num_cells == 10**100
    assert spec.all_marginals
    tables = [item_num_queries(spec, item) for item in spec.workload]
    assert tables == [100 * 10, 4_950 * 100, 161_700 * 1_000]
    parts = expand_item(spec, spec.workload[2])
    assert len(parts) == 161_700
    assert (parts[0].name, parts[0].marginal, parts[0].kind) == (
        "m3.a000.a001.a002",
        ["a000", "a001", "a002"],
        "marginal",
    )


def test_expanded_parts_equal_model_construct() -> None:
    """The parts copy a prototype's fields: the same objects ``model_construct`` would build."""
    spec = parse_spec(
        _raw(
            4,
            [{"name": "w", "marginals": {"attributes": "all", "degree": 2}, "max_std_error": 3.0}],
        )
        | {"privacy": None, "accuracy": {"noise": "gaussian"}}
    )
    parts = expand_item(spec, spec.workload[0])
    assert len(parts) == 6
    for part in parts:
        built = type(part).model_construct(
            name=part.name, marginal=list(part.marginal or []), max_std_error=3.0
        )
        assert part == built
        assert part.model_dump() == built.model_dump()
        assert part.marginal is not parts[0].marginal or part is parts[0]


def test_a_non_marginal_item_keeps_the_1e18_limit() -> None:
    with pytest.raises(SpecError, match=r"domain has 1e\+100 cells .*at most 1e\+18 are supported"):
        parse_spec(_raw(100, [*UP_TO_3_WAY, {"name": "cdf", "prefix": "a000"}]))


def test_a_workload_of_marginals_past_1e300_cells_is_refused() -> None:
    with pytest.raises(
        SpecError,
        match=re.escape(
            "domain has 1e+301 cells (the product of its 301 attribute sizes); a "
            "workload of marginals supports at most 1e+300"
        ),
    ):
        parse_spec(_raw(301, [{"name": "t", "total": True}]))
    assert parse_spec(_raw(300, [{"name": "t", "total": True}])).num_cells == 10**300


def test_the_expansion_table_limit_names_the_item_count_and_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert MAX_EXPANDED_MARGINALS >= 166_750
    monkeypatch.setattr(spec_module, "MAX_EXPANDED_MARGINALS", 161_699)
    with pytest.raises(
        SpecError,
        match=re.escape(
            "workload[2] ('m3'): all 3-way marginals of 100 attributes are 161,700 "
            "tables; at most 161,699 per item"
        ),
    ):
        parse_spec(_raw(100, UP_TO_3_WAY))


def test_the_expansion_cell_limit_names_the_item_count_and_limit() -> None:
    # 3-way of 60 attributes × 40 values: C(60, 3) · 40³ = 34,220 · 64,000 cells
    rows = elementary_symmetric([40] * 60, 3)
    assert rows == 34_220 * 64_000 > MAX_EXPANDED_MARGINAL_ROWS
    with pytest.raises(
        SpecError,
        match=re.escape(
            f"workload[0] ('w'): all 3-way marginals of 60 attributes release "
            f"{rows:,} cells; at most {MAX_EXPANDED_MARGINAL_ROWS:,} per item"
        ),
    ):
        parse_spec(_raw(60, [{"name": "w", "marginals": {"attributes": "all", "degree": 3}}], 40))


def test_magnitude_never_converts_a_huge_count_to_float() -> None:
    assert magnitude(10**5000) == "1e+5000"
    assert magnitude(25 * 10**399) == "2.5e+400"
    assert magnitude(10**21) == f"{10**21:.3g}"
    assert magnitude(123) == "123"


def test_marginal_items_share_factors_and_item_subset_matches_the_old_computation() -> None:
    spec = parse_spec(
        _raw(
            12,
            [
                *UP_TO_3_WAY,
                {"name": "t", "total": True},
                {"name": "m", "marginal": ["a003", "a001"]},
            ],
        )
    )
    workload = build_workload(spec)
    assert len(workload.items) == 12 + 66 + 220 + 2
    for item in workload.items:
        assert item.kept is not None
        assert item_subset(item) == _old_item_subset(item)
        assert item.num_queries == 10 ** len(item.kept)
        for axis, factor in enumerate(item.factors):  # no factor object per table: linear memory
            assert factor is (shared_identity(10) if axis in item.kept else shared_total(10))
    assert workload.items[-1].kept == (1, 3)
    assert item_subset(workload.items[-2]) == 0


def test_non_marginal_items_keep_the_old_item_subset() -> None:
    item = WorkloadItem(name="cdf", factors=(Prefix(4), Identity(3)))
    assert item.kept is None and item_subset(item) is None
    fresh = WorkloadItem(name="m", factors=(Identity(4), Total(3)))
    assert fresh.kept is None and item_subset(fresh) == 0b1


def test_a_marginal_item_of_the_wrong_shape_is_refused() -> None:
    item = WorkloadItem.marginal(name="m", domain_shape=(4, 3), kept=[0])
    assert Workload(domain_shape=(4, 3), items=(item,)).num_queries == 4
    with pytest.raises(ValueError, match=r"item 'm' has factor sizes \(4, 3\), domain is \(4, 5\)"):
        Workload(domain_shape=(4, 5), items=(item,))
    with pytest.raises(
        ValueError, match=r"item 'm' has factor sizes \(4, 3\), domain is \(4, 3, 2\)"
    ):
        Workload(domain_shape=(4, 3, 2), items=(item,))


def test_attribute_roles_from_kept_axes() -> None:
    shape = (4, 3, 5)
    items = (
        WorkloadItem.marginal(name="a", domain_shape=shape, kept=[0]),
        WorkloadItem(name="b", factors=(Total(4), Total(3), Prefix(5))),
    )
    roles = Workload(domain_shape=shape, items=items).attribute_roles((True, False, True))
    assert roles == [(4, "ordered"), (3, "total"), (5, "ordered")]


def test_every_candidate_but_marginal_space_refuses_past_1e18_cells_from_sizes() -> None:
    """20 attributes × 10 values (1e20 cells): each cell-vector mechanism gives a reason, and no
    predicted time overflows (N³ would, as a float, past 5.6e102)."""
    spec = parse_spec(_raw(20, UP_TO_3_WAY[:2]) | {"privacy": {"epsilon": 1.0}})
    workload = build_workload(spec)
    request = plan_request(spec, workload=workload, requested=False)
    reasons = {}
    for mechanism in registry.candidates(requested="auto", model="central"):
        assert mechanism.predicted_seconds(request) >= 0  # inf when refused, never OverflowError
        reasons[mechanism.name] = mechanism.unavailable_reason(request)
    cell_vector = "it works on the full cell vector, and this domain has 1e+20 cells; at most 1e+18"
    for name in ("identity", "hierarchical", "wavelet", "optimized"):
        assert reasons[name] is not None and reasons[name].startswith(cell_vector)
    assert "1e+20-cell Gram" in str(reasons["eigen"])
    assert "1e+20)" in str(reasons["lrm"])
    assert reasons["dawa"] is not None
    assert cell_vector_reason(build_workload(parse_spec(_raw(18, UP_TO_3_WAY[:1])))) is None


def test_memory_prediction_of_a_1e100_cell_domain_is_finite_and_readable() -> None:
    cell_kind = predict(
        cells=10**100, queries=10, strategy_rows=10, released_rows=10, input_bytes=0
    )
    stage, peak, driver = cell_kind.peak
    assert (stage, driver) == ("reconstruct", "10 queries x 1e+100 cells")
    assert peak >= 8 * 10**100
    marginal = predict(
        cells=10**100,
        queries=162_196_000,
        strategy_rows=1_000,
        released_rows=162_196_000,
        input_bytes=0,
        input_kind="subsets",
    )
    assert marginal.peak[1] < 10**15  # no cell vector is held: bytes from queries and rows


def test_counting_the_cell_vector_of_a_1e100_cell_marginal_workload_is_refused() -> None:
    spec = parse_spec(
        _raw(100, UP_TO_3_WAY[:1])
        | {"dataset": {"id": "s", "budget": {"rho": 1.0}, "source": "/nonexistent/x.parquet"}}
    )
    with pytest.raises(SpecError) as raised:
        check_runnable(spec)
    message = str(raised.value)
    assert "the domain has 1e+100 cells" in message
    assert "or mechanism: marginal_space (it counts only its measured subsets)" in message
