"""Release spec validation: every validator in ``catalog.spec`` fires with a message naming the field,
the value and the rule; YAML loading; relative sources; fingerprints.

Each invalid case starts from one valid spec and changes one thing, so a case can only pass if that
one change is what the spec rejects.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.domain import Categorical, IntegerRange, NumericBins
from dprelease.catalog.spec.load import load_spec, parse_spec

REPO = Path(__file__).resolve().parents[3]
DELETE = object()


def valid_spec() -> dict[str, Any]:
    """A spec using every domain kind and every workload kind (it must parse)."""
    return {
        "name": "demo",
        "dataset": {"id": "ds", "budget": {"epsilon": 10.0}},
        "privacy_unit": {"rows_per_person": 1},
        "domain": {
            "age": {"min": 0, "max": 99, "width": 5},
            "sex": {"values": ["F", "M"]},
            "hours": {"bins": [0, 20, 40, 60, 100]},
            "grade": {"values": ["low", "mid", "high"], "ordered": True},
        },
        "workload": [
            {"name": "age_by_sex", "marginal": ["age", "sex"]},
            {"name": "age_cdf", "prefix": "age"},
            {"name": "rectangles", "all_ranges": ["age", "hours"]},
            {"name": "custom", "ranges": {"age": [[0, 24], [25, 99]], "grade": [["low", "mid"]]}},
            {"name": "everyone", "total": True},
        ],
        "mechanism": "auto",
        "privacy": {"epsilon": 1.0},
    }


def edited(changes: dict[str, Any]) -> dict[str, Any]:
    """The valid spec with ``{"dotted.path": value}`` set (``DELETE`` removes the key)."""
    spec = valid_spec()
    for path, value in changes.items():
        *parents, last = path.split(".")
        node: Any = spec
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = copy.deepcopy(value)
        else:
            node[last] = copy.deepcopy(value)
    return spec


def workload(*items: dict[str, Any]) -> dict[str, Any]:
    return {"workload": list(items)}


def test_valid_spec_parses_with_derived_properties() -> None:
    spec = parse_spec(valid_spec())
    assert list(spec.domain) == ["age", "sex", "hours", "grade"]
    assert spec.domain_shape == (20, 2, 4, 3)
    assert spec.num_cells == 20 * 2 * 4 * 3
    assert isinstance(spec.domain["age"], IntegerRange)
    assert isinstance(spec.domain["hours"], NumericBins)
    assert isinstance(spec.domain["sex"], Categorical)
    assert [item.kind for item in spec.workload] == [
        "marginal",
        "prefix",
        "all_ranges",
        "ranges",
        "total",
    ]
    assert spec.privacy_target().measure == "pure"
    assert spec.privacy_unit.contribution_bound == 1


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"privacy": {"rho": 0.5}}, id="rho"),
        pytest.param({"privacy": {"epsilon": 1.0, "delta": 1e-9}}, id="epsilon-delta"),
        pytest.param({"dataset.budget": {"rho": 2.0}}, id="rho-budget"),
        pytest.param({"privacy_unit": {"person_column": "pid", "max_rows": 3}}, id="person-column"),
        pytest.param({"domain.hours.bins": [[0, 20], [20, 40], [60, 100]]}, id="bin-pairs-gap"),
        pytest.param({"domain.sex.values": [0, 1]}, id="integer-categories"),
        pytest.param({"mechanism_options": {"branching": 4}}, id="branching-4"),
        pytest.param({"on_out_of_domain": "drop"}, id="drop"),
        pytest.param({"dataset.source": "data/*.parquet"}, id="glob-source"),
        pytest.param(workload({"name": "r", "ranges": {"hours": [[20, 60]]}}), id="range-on-edges"),
    ],
)
def test_valid_variants_parse(changes: dict[str, Any]) -> None:
    parse_spec(edited(changes))


INVALID = [
    # --- domain ---------------------------------------------------------------------------------
    pytest.param({"domain": {}}, r"domain must be a non-empty mapping", id="empty-domain"),
    pytest.param(
        {"domain.sex": ["F", "M"]},
        r"domain\.sex \(\['F', 'M'\]\) must be a mapping",
        id="attr-list",
    ),
    pytest.param(
        {"domain.sex": {"labels": ["F"]}},
        r"domain\.sex \(\{'labels': \['F'\]\}\) must be an integer range .* or categorical",
        id="attr-unknown-form",
    ),
    pytest.param(
        {"domain.hours.bins": []}, r"domain\.hours .*bins must not be empty", id="empty-bins"
    ),
    pytest.param(
        {"domain.hours.bins": [[0, 20], [10, 30]]},
        r"domain\.hours .*bin 1 \(\[10\.0, 30\.0\]\) overlaps bin 0 \(\[0\.0, 20\.0\]\): bins must "
        r"be sorted and must not overlap",
        id="overlapping-pairs",
    ),
    pytest.param(
        {"domain.hours.bins": [[20, 40], [0, 20]]},
        r"domain\.hours .*bin 1 \(\[0\.0, 20\.0\]\) overlaps bin 0",
        id="unsorted-pairs",
    ),
    pytest.param(
        {"domain.hours.bins": [0, 20, 20, 40]},
        r"domain\.hours .*strictly increasing: edge 2 \(20\.0\) <= edge 1 \(20\.0\) makes an empty "
        r"or overlapping bin",
        id="overlapping-edges",
    ),
    pytest.param(
        {"domain.hours.bins": [0, 40, 20, 60]},
        r"domain\.hours .*strictly increasing: edge 2 \(20\.0\) <= edge 1 \(40\.0\)",
        id="decreasing-edges",
    ),
    pytest.param(
        {"domain.hours.bins": [[10, 10]]},
        r"domain\.hours .*bin 0 \(\[10\.0, 10\.0\]\) is empty: low must be < high",
        id="empty-pair",
    ),
    pytest.param(
        {"domain.hours.bins": [[0, 10, 20]]},
        r"domain\.hours .*bin 0 \(\[0\.0, 10\.0, 20\.0\]\) must be a \[low, high\) pair",
        id="pair-of-three",
    ),
    pytest.param(
        {"domain.hours.bins": [[0, float("inf")]]},
        r"domain\.hours .*bin 0 \(\[0\.0, inf\]\) must be finite",
        id="infinite-pair",
    ),
    pytest.param(
        {"domain.hours.bins": [5]},
        r"domain\.hours .*bin edges \(\[5\.0\]\) need at least two values",
        id="one-edge",
    ),
    pytest.param(
        {"domain.hours.bins": [0, float("nan")]},
        r"domain\.hours .*bin edges \(\[0\.0, nan\]\) must be finite",
        id="nan-edge",
    ),
    pytest.param(
        {"domain.age": {"min": 5, "max": 3}},
        r"domain\.age .*max \(3\) must be >= min \(5\)",
        id="integer-max-below-min",
    ),
    pytest.param({"domain.age.width": 0}, r"domain\.age .*width \(0\) must be >= 1", id="width-0"),
    pytest.param(
        {"domain.age": {"min": 0, "max": 10_000_000}},
        r"domain\.age .*10000001 cells is more than the 10,000,000 allowed per attribute",
        id="attribute-too-large",
    ),
    pytest.param(
        {"domain.sex.values": ["F", "M", "F"]},
        r"domain\.sex .*value 'F' is listed twice; categories must be distinct",
        id="duplicate-categories",
    ),
    pytest.param(
        {"domain.sex.values": ["F", 1]},
        r"domain\.sex \(\{'values': \['F', 1\]\}\).*valid string.*valid integer",
        id="mixed-str-int-categories",
    ),
    pytest.param(
        {"domain.sex.values": [True, False]},
        r"domain\.sex \(\{'values': \[True, False\]\}\).*valid integer",
        id="bool-categories",
    ),
    pytest.param(
        {"domain.sex.values": []}, r"domain\.sex .*values must not be empty", id="no-categories"
    ),
    # --- privacy and budget -----------------------------------------------------------------------
    pytest.param(
        {"privacy": {"epsilon": 0}},
        r"privacy\.epsilon \(0\.0\) must be a finite number > 0",
        id="epsilon-0",
    ),
    pytest.param(
        {"privacy": {"epsilon": -1}},
        r"privacy\.epsilon \(-1\.0\) must be a finite number > 0",
        id="epsilon-neg",
    ),
    pytest.param(
        {"privacy": {"epsilon": float("inf")}},
        r"privacy\.epsilon \(inf\) must be a finite number > 0",
        id="epsilon-inf",
    ),
    pytest.param(
        {"privacy": {"rho": 0}}, r"privacy\.rho \(0\.0\) must be a finite number > 0", id="rho-0"
    ),
    pytest.param(
        {"dataset.budget": {"rho": -2}},
        r"budget\.rho \(-2\.0\) must be a finite number > 0",
        id="budget-rho-neg",
    ),
    pytest.param(
        {"dataset.budget": {"epsilon": 0}},
        r"budget\.epsilon \(0\.0\) must be a finite number > 0",
        id="budget-epsilon-0",
    ),
    pytest.param(
        {"privacy": {"epsilon": 1, "delta": 0}},
        r"privacy\.delta \(0\.0\) must be in the open interval \(0, 1\)",
        id="delta-0",
    ),
    pytest.param(
        {"privacy": {"epsilon": 1, "delta": 1}},
        r"privacy\.delta \(1\.0\) must be in the open interval \(0, 1\)",
        id="delta-1",
    ),
    pytest.param(
        {"privacy": {"epsilon": 1, "delta": 1.5}},
        r"privacy\.delta \(1\.5\) must be in the open interval \(0, 1\)",
        id="delta-1.5",
    ),
    pytest.param(
        {"privacy": {"epsilon": 1, "rho": 0.5}},
        r"privacy keys \['epsilon', 'rho'\] must be exactly one of \{epsilon\}, \{rho\}, "
        r"\{epsilon, delta\}",
        id="epsilon-and-rho",
    ),
    pytest.param(
        {"privacy": {"delta": 1e-9}},
        r"privacy keys \['delta'\] must be exactly one of",
        id="delta-alone",
    ),
    pytest.param(
        {"privacy": {}}, r"privacy keys \[\] must be exactly one of", id="no-privacy-keys"
    ),
    pytest.param(
        {"dataset.budget": {"rho": 1, "epsilon": 2}},
        r"budget keys \['epsilon', 'rho'\] must be exactly one of",
        id="budget-epsilon-and-rho",
    ),
    # --- mechanism ---------------------------------------------------------------------------------
    pytest.param(
        {"mechanism": "laplace"},
        r"mechanism: unknown mechanism 'laplace'; choose one of auto, identity",
        id="unknown-mechanism",
    ),
    pytest.param(
        {"mechanism_options": {"depth": 3}},
        r"mechanism_options \['depth'\] do not apply to mechanism 'auto'; allowed: "
        r"\['branching', 'intervals', 'noise_offset', 'ratio'\]",
        id="unknown-mechanism-option",
    ),
    pytest.param(
        {"mechanism_options": {"branching": 1}},
        r"mechanism_options\.branching \(1\) must be an integer >= 2",
        id="branching-1",
    ),
    pytest.param(
        {"mechanism_options": {"branching": 2.5}},
        r"mechanism_options\.branching \(2\.5\) must be an integer >= 2",
        id="branching-float",
    ),
    # --- workload ----------------------------------------------------------------------------------
    pytest.param(
        workload({"name": "m", "marginal": ["age", "colour"]}),
        r"workload\[0\] \('m'\): unknown attribute 'colour'; the domain has \['age', 'grade', "
        r"'hours', 'sex'\]",
        id="unknown-attribute",
    ),
    pytest.param(
        workload({"name": "c", "prefix": "colour"}),
        r"workload\[0\] \('c'\): unknown attribute 'colour'",
        id="unknown-prefix-attribute",
    ),
    pytest.param(
        workload({"name": "c", "prefix": "sex"}),
        r"workload\[0\] \('c'\): prefix needs an ordered attribute, but 'sex' is categorical",
        id="prefix-unordered",
    ),
    pytest.param(
        workload({"name": "r", "all_ranges": ["age", "sex"]}),
        r"workload\[0\] \('r'\): all_ranges needs an ordered attribute, but 'sex' is categorical",
        id="all-ranges-unordered",
    ),
    pytest.param(
        workload({"name": "r", "ranges": {"sex": [["F", "M"]]}}),
        r"workload\[0\] \('r'\): ranges needs an ordered attribute, but 'sex' is categorical",
        id="ranges-unordered",
    ),
    pytest.param(
        workload({"name": "r", "all_ranges": ["age", "hours", "grade"]}),
        r"all_ranges \(\['age', 'hours', 'grade'\]\) takes one or two attributes",
        id="all-ranges-3-attributes",
    ),
    pytest.param(
        workload({"name": "a", "marginal": ["age"]}, {"name": "a", "total": True}),
        r"workload item names must be unique; repeated: \['a'\]",
        id="duplicate-item-names",
    ),
    pytest.param({"workload": []}, r"workload must have at least one item", id="empty-workload"),
    pytest.param(
        workload({"name": "a", "marginal": ["age"], "prefix": "age"}),
        r"workload item 'a' must have exactly one of marginal, prefix, all_ranges, ranges, total, "
        r"matrix, marginals, mean, sum, quantiles "
        r"\(got \['marginal', 'prefix'\]\)",
        id="item-two-kinds",
    ),
    pytest.param(
        workload({"name": "a"}),
        r"workload item 'a' must have exactly one of .* \(got none\)",
        id="item-no-kind",
    ),
    pytest.param(
        workload({"name": "a", "marginal": ["age", "age"]}),
        r"marginal \['age', 'age'\] lists an attribute twice",
        id="marginal-repeats",
    ),
    pytest.param(
        workload({"name": "a", "total": False}), r"total must be true when given", id="total-false"
    ),
    pytest.param(
        workload({"name": "bad name", "total": True}),
        r"workload\.0\.name: String should match pattern .*\(got 'bad name'\)",
        id="item-name-pattern",
    ),
    pytest.param(
        workload({"name": "r", "ranges": {"age": [[3, 9]]}}),
        r"workload\[0\] \('r'\): range \[3, 9\] on 'age': 3 is not a cell start \(cells have width "
        r"5; nearest is 0\)",
        id="range-low-not-aligned",
    ),
    pytest.param(
        workload({"name": "r", "ranges": {"age": [[0, 7]]}}),
        r"range \[0, 7\] on 'age': 7 is not a cell end \(cells have width 5; nearest is 9\)",
        id="range-high-not-aligned",
    ),
    pytest.param(
        workload({"name": "r", "ranges": {"age": [[10, 4]]}}),
        r"workload\[0\] \('r'\): range \[10, 4\] on 'age' has low > high",
        id="range-low-above-high",
    ),
    pytest.param(
        workload({"name": "r", "ranges": {"age": [[0, 104]]}}),
        r"range \[0, 104\] on 'age': 104 is outside \[0, 99\]",
        id="range-outside-domain",
    ),
    pytest.param(
        workload({"name": "r", "ranges": {"hours": [[10, 40]]}}),
        r"range \[10, 40\] on 'hours': 10 is not a bin lower edge",
        id="range-not-on-bin-edge",
    ),
    pytest.param(
        workload({"name": "r", "ranges": {"grade": [["low", "top"]]}}),
        r"range \['low', 'top'\] on 'grade': 'top' is not one of the values",
        id="range-unknown-category",
    ),
    pytest.param(
        workload({"name": "r", "ranges": {"age": [[0, 4, 9]]}}),
        r"range \[0, 4, 9\] must be \[low, high\]",
        id="range-three-values",
    ),
    pytest.param(
        workload({"name": "r", "ranges": {"age": []}}),
        r"ranges for 'age' must not be empty",
        id="ranges-empty",
    ),
    # --- privacy unit ------------------------------------------------------------------------------
    pytest.param(
        {"privacy_unit": {"person_column": "pid"}},
        r"privacy_unit: max_rows \(None\) must be an integer >= 1",
        id="person-column-without-max-rows",
    ),
    pytest.param(
        {"privacy_unit": {"person_column": "pid", "max_rows": 0}},
        r"privacy_unit: max_rows \(0\) must be an integer >= 1",
        id="max-rows-0",
    ),
    pytest.param(
        {"privacy_unit": {"rows_per_person": 1, "person_column": "pid", "max_rows": 2}},
        r"give either rows_per_person or person_column/max_rows, not both",
        id="rows-per-person-and-person-column",
    ),
    pytest.param(
        {"privacy_unit": {"max_rows": 2}}, r"max_rows needs person_column", id="max-rows-alone"
    ),
    pytest.param(
        {"privacy_unit": {}},
        r"give rows_per_person, or person_column with max_rows",
        id="empty-privacy-unit",
    ),
    pytest.param(
        {"privacy_unit": {"rows_per_person": 0}},
        r"rows_per_person \(0\) must be >= 1",
        id="rows-per-person-0",
    ),
    pytest.param(
        {"privacy_unit": {"person_column": "age", "max_rows": 2}},
        r"privacy_unit\.person_column \('age'\) must not be a domain attribute",
        id="person-column-is-attribute",
    ),
    # --- top level ---------------------------------------------------------------------------------
    pytest.param(
        {"colour": "blue"},
        r"colour: Extra inputs are not permitted \(got 'blue'\)",
        id="unknown-key",
    ),
    pytest.param(
        {"dataset.owner": "me"},
        r"dataset\.owner: Extra inputs are not permitted",
        id="unknown-dataset-key",
    ),
    pytest.param({"name": DELETE}, r"name: Field required", id="missing-name"),
    pytest.param(
        {"privacy": DELETE}, r"give exactly one of privacy .* and accuracy", id="missing-privacy"
    ),
    pytest.param(
        {"dataset.id": "bad id"},
        r"dataset\.id: String should match pattern .*\(got 'bad id'\)",
        id="dataset-id-pattern",
    ),
    pytest.param(
        {"on_out_of_domain": "ignore"},
        r"on_out_of_domain: Input should be 'error' or 'drop' \(got 'ignore'\)",
        id="on-out-of-domain",
    ),
    pytest.param(
        {"model": "remote"}, r"model: Input should be 'central' or 'local'", id="model-unknown"
    ),
    pytest.param(
        {"model": "local", "privacy": {"rho": 0.5}},
        r"model: local needs privacy \{epsilon\} \(the per-user epsilon\)",
        id="model-local-rho",
    ),
    pytest.param(
        {"model": "local", "mechanism": "wavelet"},
        r"unknown mechanism 'wavelet' for model: local; choose one of auto",
        id="model-local-mechanism",
    ),
]


@pytest.mark.parametrize(("changes", "message"), INVALID)
def test_invalid_spec_is_refused_naming_field_value_and_rule(
    changes: dict[str, Any], message: str
) -> None:
    spec = edited(changes)
    with pytest.raises(SpecError, match=message) as caught:
        parse_spec(spec, source="demo.yaml")
    assert str(caught.value).startswith("demo.yaml: invalid release spec:")


def test_spec_must_be_a_mapping() -> None:
    with pytest.raises(
        SpecError, match=r"demo\.yaml: a release spec must be a YAML mapping, got list"
    ):
        parse_spec([1, 2], source="demo.yaml")


# --- YAML files --------------------------------------------------------------------------------------


def write_yaml(path: Path, spec: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_missing_yaml_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match=r"spec file '.*nope\.yaml' does not exist"):
        load_spec(missing)


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: demo\ndomain: {age: [1, 2\n")
    with pytest.raises(SpecError, match=r"broken\.yaml: not valid YAML"):
        load_spec(path)


def test_yaml_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(
        SpecError, match=r"list\.yaml: a release spec must be a YAML mapping, got list"
    ):
        load_spec(path)


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "bad.yaml", edited({"privacy": {"epsilon": -1}}))
    with pytest.raises(SpecError, match=r"bad\.yaml: invalid release spec:\n.*privacy\.epsilon"):
        load_spec(path)


def test_relative_source_is_resolved_against_the_spec_folder(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "specs" / "s.yaml", edited({"dataset.source": "../data/input.parquet"})
    )
    spec = load_spec(path)
    assert spec.dataset.source == str((tmp_path / "data" / "input.parquet").resolve())


def test_relative_glob_source_is_resolved_against_the_spec_folder(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "specs" / "s.yaml", edited({"dataset.source": "parts/*.parquet"}))
    spec = load_spec(path)
    assert spec.dataset.source == str((tmp_path / "specs").resolve() / "parts" / "*.parquet")


def test_absolute_and_missing_sources_are_kept(tmp_path: Path) -> None:
    absolute = str(tmp_path / "elsewhere" / "x.parquet")
    spec = load_spec(write_yaml(tmp_path / "a.yaml", edited({"dataset.source": absolute})))
    assert spec.dataset.source == absolute
    spec = load_spec(write_yaml(tmp_path / "b.yaml", valid_spec()))
    assert spec.dataset.source is None


def test_bundled_demo_spec_loads() -> None:
    spec = load_spec(REPO / "flows" / "examples" / "adult-demo.yaml")
    assert spec.dataset.source is not None
    assert Path(spec.dataset.source).is_file()
    assert spec.domain_shape == (85, 16, 5, 2, 2)


# --- fingerprints ----------------------------------------------------------------------------------


def test_fingerprints_are_stable_for_equal_specs(tmp_path: Path) -> None:
    first = parse_spec(valid_spec())
    reordered = dict(reversed(list(valid_spec().items())))  # same content, other key order
    second = parse_spec(reordered)
    from_yaml = load_spec(write_yaml(tmp_path / "s.yaml", valid_spec()))
    assert first.fingerprint() == second.fingerprint() == from_yaml.fingerprint()
    assert first.workload_fingerprint() == second.workload_fingerprint()
    assert first.workload_fingerprint() == from_yaml.workload_fingerprint()
    assert len(first.fingerprint()) == 64


@pytest.mark.parametrize(
    ("changes", "workload_changes"),
    [
        pytest.param(workload({"name": "age_cdf", "prefix": "age"}), True, id="workload"),
        pytest.param({"workload.0.name": "renamed"}, True, id="item-name"),
        pytest.param({"domain.age.max": 104}, True, id="domain"),
        pytest.param({"mechanism": "hierarchical"}, True, id="mechanism"),
        pytest.param({"privacy": {"rho": 0.5}}, True, id="noise-kind"),
        pytest.param({"privacy": {"epsilon": 2.0}}, False, id="epsilon-only"),
        pytest.param({"dataset.id": "other"}, False, id="dataset-id"),
    ],
)
def test_fingerprints_change_with_the_spec(changes: dict[str, Any], workload_changes: bool) -> None:
    base = parse_spec(valid_spec())
    changed = parse_spec(edited(changes))
    assert changed.fingerprint() != base.fingerprint()
    assert (changed.workload_fingerprint() != base.workload_fingerprint()) is workload_changes


def test_a_domain_too_large_to_count_is_valid_for_plan_but_refused_by_count() -> None:
    from dprelease.catalog.confidential.source import count_cells

    spec = parse_spec(
        {
            "name": "big",
            "dataset": {"id": "big", "source": "nowhere.parquet", "budget": {"epsilon": 1}},
            "domain": {k: {"min": 1, "max": 1000} for k in ("a", "b", "c")},
            "workload": [{"name": "all", "marginal": ["a", "b", "c"]}],
            "privacy": {"epsilon": 1.0},
        }
    )
    assert spec.num_cells == 1_000_000_000
    with pytest.raises(
        SpecError,
        match=r"the domain has 1,000,000,000 cells \(1000 × 1000 × 1000\); a release counts at most",
    ):
        count_cells(spec)


def test_the_domain_order_is_part_of_the_workload_fingerprint_only() -> None:
    """The order of the domain is the cell layout: a strategy stored (or a series plan recorded)
    for one order must not be found for another.  The spec fingerprint leaves it out (the same
    statistics are released), and a domain already in sorted order keeps its fingerprint."""
    raw = valid_spec()
    reordered = {**raw, "domain": dict(reversed(list(raw["domain"].items())))}
    spec, other = parse_spec(raw), parse_spec(reordered)
    assert spec.domain_shape != other.domain_shape
    assert spec.workload_fingerprint() != other.workload_fingerprint()
    assert spec.fingerprint() == other.fingerprint()
    in_order = {**raw, "domain": dict(sorted(raw["domain"].items()))}
    # computed by the code before the domain order was added (a sorted domain adds nothing)
    assert (
        parse_spec(in_order).workload_fingerprint()
        == "86961373fc34798ada12f6249c8203b395daa514c490533a790fe36f01047ef8"
    )
