"""The ``marginals: {attributes: [...] | all, degree: k}`` workload item, and planning a marginal
workload on a domain too large for the cell vector."""

from __future__ import annotations

from typing import Any

import pytest

from dprelease.catalog.errors import SpecError
from dprelease.catalog.planning.planner import build_workload, make_plan
from dprelease.catalog.spec import model as spec_module
from dprelease.catalog.spec.load import parse_spec
from dprelease.catalog.spec.model import expand_item, item_num_queries
from dprelease.mechanisms.primitives.operators import Identity, Total

DOMAIN = {
    "age": {"min": 0, "max": 9},
    "sex": {"values": ["F", "M"]},
    "income>50K": {"values": [0, 1]},
    "race": {"values": [0, 1, 2]},
}


def _raw(workload: list[dict[str, Any]], **changes: Any) -> dict[str, Any]:
    return {
        "name": "t",
        "dataset": {"id": "t", "budget": {"epsilon": 10.0}},
        "domain": DOMAIN,
        "workload": workload,
        "privacy": {"epsilon": 1.0},
        **changes,
    }


def test_all_k_way_marginals_expand_in_domain_order_with_safe_names() -> None:
    spec = parse_spec(
        _raw(
            [
                {"name": "pairs", "marginals": {"attributes": "all", "degree": 2}},
                {"name": "cdf", "prefix": "age"},
                {"name": "some", "marginals": {"attributes": ["race", "age", "sex"], "degree": 3}},
            ]
        )
    )
    names = [item.name for item in spec.expanded_workload()]
    assert names == [
        "pairs.age.sex",
        "pairs.age.income_50K",
        "pairs.age.race",
        "pairs.sex.income_50K",
        "pairs.sex.race",
        "pairs.income_50K.race",
        "cdf",
        "some.age.sex.race",
    ]
    workload = build_workload(spec)
    first = workload.items[0]
    assert [type(f) for f in first.factors] == [Identity, Identity, Total, Total]
    assert item_num_queries(spec, spec.workload[0]) == 10 * 2 + 10 * 2 + 10 * 3 + 4 + 6 + 6
    assert item_num_queries(spec, spec.workload[2]) == 60
    assert expand_item(spec, spec.workload[1]) == [spec.workload[1]]
    assert workload.num_queries == sum(item_num_queries(spec, item) for item in spec.workload)


def test_the_workload_fingerprint_of_existing_specs_is_unchanged_by_the_new_kind() -> None:
    spec = parse_spec(_raw([{"name": "m", "marginal": ["age", "sex"]}]))
    assert "marginals" not in spec.workload[0].model_dump(exclude_none=True)
    other = parse_spec(_raw([{"name": "m", "marginals": {"attributes": "all", "degree": 1}}]))
    assert other.workload_fingerprint() != spec.workload_fingerprint()


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ({"attributes": "all", "degree": 0}, r"marginals.degree \(0\) must be an integer >= 1"),
        ({"attributes": ["age"], "degree": 2}, r"marginals.degree \(2\) exceeds the 1 attributes"),
        ({"attributes": "all", "degree": 5}, r"marginals.degree \(5\) exceeds the 4 attributes"),
        ({"attributes": ["age", "age"], "degree": 1}, r"\['age', 'age'\] lists an attribute twice"),
        ({"attributes": [], "degree": 1}, r"marginals.attributes must list attributes"),
        ({"attributes": ["height"], "degree": 1}, r"unknown attribute 'height'"),
        ({"attributes": "some", "degree": 1}, r"Input should be 'all'"),
        ({"attributes": "all"}, r"degree\n?.*Field required"),
    ],
)
def test_every_marginals_rule_fires(selection: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(_raw([{"name": "w", "marginals": selection}]))


def test_too_many_tables_and_clashing_names_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_module, "MAX_EXPANDED_MARGINALS", 5)
    with pytest.raises(SpecError, match=r"2-way marginals of 4 attributes are 6 tables; at most 5"):
        parse_spec(_raw([{"name": "w", "marginals": {"attributes": "all", "degree": 2}}]))
    monkeypatch.undo()
    clash = {**DOMAIN, "a>b": {"values": [0, 1]}, "a<b": {"values": [0, 1]}}
    with pytest.raises(SpecError, match=r"table names that repeat \['w.a_b'\]"):
        parse_spec(
            _raw(
                [{"name": "w", "marginals": {"attributes": ["a>b", "a<b"], "degree": 1}}],
                domain=clash,
            )
        )
    with pytest.raises(SpecError, match=r"exactly one of marginal, prefix, .*, marginals"):
        parse_spec(
            _raw(
                [
                    {
                        "name": "w",
                        "marginal": ["age"],
                        "marginals": {"attributes": "all", "degree": 1},
                    }
                ]
            )
        )


def test_auto_on_a_domain_too_large_for_the_cell_vector_chooses_the_marginal_path() -> None:
    """8 attributes of 20 cells (2.6·10¹⁰ cells > MAX_RELEASE_CELLS), 28 pairs: only the
    marginal-space mechanism can run; full-vector candidates are listed as plan-only, with the
    reason."""
    domain = {f"v{i}": {"min": 0, "max": 19} for i in range(8)}
    spec = parse_spec(
        _raw([{"name": "p", "marginals": {"attributes": "all", "degree": 2}}], domain=domain)
    )
    plan = make_plan(spec)
    assert plan.strategy.marginal_subsets  # the chosen strategy reads marginals only
    chosen = plan.candidate(plan.chosen)
    assert chosen.status == "planned"
    others = [c for c in plan.candidates if c.mechanism != plan.chosen]
    assert all(c.status != "planned" for c in others)
    planned_elsewhere = [c for c in others if c.rmse is not None]
    assert planned_elsewhere and all("plan only" in (c.note or "") for c in planned_elsewhere)
