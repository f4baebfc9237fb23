"""Hostile and out-of-range specs are refused before any work, each with a ``SpecError`` naming the
field and the rule (issue 13, item 7): YAML aliases, anchors, deep nesting and oversized files;
booleans and strings where numbers belong; δ above 1e-3 without ``allow_large_delta``; privacy
parameters outside the range the noise arithmetic supports; domains and workloads too large to
plan or to run (``check_runnable``).
"""

from __future__ import annotations

import copy
import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from dprelease.catalog.errors import SpecError
from dprelease.catalog.spec.limits import (
    BUDGET_EPSILON_RANGE,
    BUDGET_RHO_RANGE,
    DELTA_RANGE,
    EPSILON_RANGE,
    MAX_DOMAIN_INTEGER,
    MAX_PLAN_CELLS,
    MAX_RELEASE_CELLS,
    MAX_RELEASE_QUERIES,
    MAX_ROWS_PER_PERSON,
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    RHO_RANGE,
)
from dprelease.catalog.spec.load import check_runnable, load_spec, parse_spec
from dprelease.catalog.spec.model import item_num_queries


def base() -> dict[str, Any]:
    return {
        "name": "hard",
        "dataset": {"id": "ds", "source": "data.parquet", "budget": {"epsilon": 10.0}},
        "domain": {"age": {"min": 0, "max": 99}, "sex": {"values": ["F", "M"]}},
        "workload": [{"name": "age_by_sex", "marginal": ["age", "sex"]}],
        "privacy": {"epsilon": 1.0},
    }


def with_(**changes: Any) -> dict[str, Any]:
    spec = base()
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = copy.deepcopy(value)
    return spec


def refused(spec: dict[str, Any], pattern: str) -> str:
    with pytest.raises(SpecError, match=pattern) as raised:
        parse_spec(spec)
    return str(raised.value)


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# --- YAML -------------------------------------------------------------------------------------------

BILLION_LAUGHS = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


def test_yaml_alias_bomb_is_refused_in_well_under_a_second(tmp_path: Path) -> None:
    path = write(tmp_path / "bomb.yaml", BILLION_LAUGHS)
    assert path.stat().st_size < 1000  # 9 levels of 9 aliases: 10^9 strings if expanded
    started = time.thread_time()
    with pytest.raises(
        SpecError, match=r"bomb\.yaml: not valid YAML: YAML anchor &a is not allowed"
    ):
        load_spec(path)
    # ~0.3 s alone for the 200,000-deep bomb; thread CPU time still grows ~3x when both cores are
    # saturated (1.04 s once in CI), while an unbounded parse would take far longer or overflow
    assert time.thread_time() - started < 3.0


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        pytest.param(
            "name: &n demo\nother: *n\n", r"YAML anchor &n is not allowed", id="scalar-anchor"
        ),
        pytest.param(
            "base: &b {epsilon: 1.0}\nprivacy:\n  <<: *b\n",
            r"YAML anchor &b is not allowed",
            id="merge-key",
        ),
        pytest.param("privacy: *undefined\n", r"YAML alias \*undefined is not allowed", id="alias"),
        pytest.param(
            "x: " + "[" * (MAX_SPEC_DEPTH + 5) + "]" * (MAX_SPEC_DEPTH + 5) + "\n",
            rf"YAML nesting deeper than {MAX_SPEC_DEPTH} levels is not allowed",
            id="deep-nesting",
        ),
        pytest.param(
            "name: demo\n" + "[" * 200_000 + "]" * 200_000 + "\n",
            r"not valid YAML",
            id="recursion-bomb",
        ),
        pytest.param("max: " + "9" * 5000 + "\n", r"not valid YAML: .*digits", id="huge-integer"),
        pytest.param("name: [unclosed\n", r"not valid YAML", id="syntax"),
        pytest.param("x: !!python/object:os.system {}\n", r"not valid YAML", id="python-tag"),
    ],
)
def test_hostile_yaml_is_refused(tmp_path: Path, text: str, pattern: str) -> None:
    path = write(tmp_path / "spec.yaml", text)
    started = time.thread_time()  # CPU time of this thread: other processes' load does not count
    with pytest.raises(SpecError, match=pattern):
        load_spec(path)
    # ~0.3 s alone for the 200,000-deep bomb; thread CPU time still grows ~3x when both cores are
    # saturated (1.04 s once in CI), while an unbounded parse would take far longer or overflow
    assert time.thread_time() - started < 3.0


def test_a_spec_file_over_the_size_limit_is_refused_without_parsing(tmp_path: Path) -> None:
    path = write(tmp_path / "big.yaml", "# padding\n" * (MAX_SPEC_BYTES // 10 + 1))
    assert path.stat().st_size > MAX_SPEC_BYTES
    with pytest.raises(
        SpecError, match=r"big\.yaml: the spec file is larger than 1,048,576 bytes \(1 MiB\)"
    ):
        load_spec(path)


def test_a_spec_file_at_the_size_limit_is_read(tmp_path: Path) -> None:
    text = yaml.safe_dump(base())
    path = write(
        tmp_path / "ok.yaml", text + "#" * (MAX_SPEC_BYTES - len(text.encode()) - 1) + "\n"
    )
    assert path.stat().st_size == MAX_SPEC_BYTES
    assert load_spec(path).name == "hard"


def test_a_spec_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "latin1.yaml", "name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SpecError, match=r"latin1\.yaml: not UTF-8 text \(byte 9\)"):
        load_spec(path)


# --- booleans and strings are not numbers ------------------------------------------------------------

NOT_A_NUMBER = r"Input should be a valid (number|integer); a boolean \(true/false\) is not a number"


@pytest.mark.parametrize(
    ("changes", "location"),
    [
        pytest.param({"privacy": {"epsilon": True}}, r"privacy\.epsilon", id="epsilon"),
        pytest.param({"privacy": {"rho": True}}, r"privacy\.rho", id="rho"),
        pytest.param({"privacy": {"epsilon": 1.0, "delta": True}}, r"privacy\.delta", id="delta"),
        pytest.param(
            {"dataset__budget": {"epsilon": True}}, r"dataset\.budget\.epsilon", id="budget"
        ),
        pytest.param({"domain__age": {"min": 0, "max": 9, "width": True}}, r"width", id="width"),
        pytest.param({"domain__age": {"min": False, "max": 9}}, r"min", id="min"),
        pytest.param({"domain__age": {"bins": [0, True, 5]}}, r"bins", id="bins"),
        pytest.param({"privacy_unit": {"rows_per_person": True}}, r"rows_per_person", id="rows"),
        pytest.param(
            {"privacy_unit": {"person_column": "pid", "max_rows": True}}, r"max_rows", id="max-rows"
        ),
    ],
)
def test_a_boolean_is_not_a_number(changes: dict[str, Any], location: str) -> None:
    refused(with_(**changes), rf"{location}.*{NOT_A_NUMBER}")


def test_epsilon_true_in_yaml_is_refused(tmp_path: Path) -> None:
    text = yaml.safe_dump(base()).replace("epsilon: 1.0", "epsilon: true")
    path = write(tmp_path / "spec.yaml", text)
    with pytest.raises(SpecError, match=rf"privacy\.epsilon: {NOT_A_NUMBER} \(got True\)"):
        load_spec(path)


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        pytest.param(
            {"privacy": {"epsilon": "1"}},
            r"privacy\.epsilon: Input should be a valid number \(got '1'\)",
            id="quoted-epsilon",
        ),
        pytest.param(
            {"domain__age": {"min": 0, "max": 99.0}},
            r"max: Input should be a valid integer",
            id="float-max",
        ),
        pytest.param(
            {"allow_large_delta": "yes"},
            r"allow_large_delta: Input should be a valid boolean \(got 'yes'\)",
            id="allow-large-delta-string",
        ),
        pytest.param(
            {"allow_large_delta": 1},
            r"allow_large_delta: Input should be a valid boolean \(got 1\)",
            id="allow-large-delta-int",
        ),
        pytest.param(
            {"postprocess": {"nonnegative": "true"}},
            r"postprocess\.nonnegative: Input should be a valid boolean",
            id="flag-string",
        ),
    ],
)
def test_no_coercion_between_strings_numbers_and_flags(
    changes: dict[str, Any], pattern: str
) -> None:
    refused(with_(**changes), pattern)


def test_integers_are_still_numbers() -> None:
    spec = parse_spec(with_(privacy={"epsilon": 1}, dataset__budget={"rho": 5}))
    assert spec.privacy == {"epsilon": 1.0}
    assert spec.dataset.budget == {"rho": 5.0}


def test_a_boolean_range_bound_is_refused() -> None:
    spec = with_(workload=[{"name": "r", "ranges": {"age": [[True, 5]]}}])
    refused(spec, r"workload\[0\] \('r'\): ranges for 'age' \(\[\[True, 5\]\]\) hold a boolean")


# --- delta -------------------------------------------------------------------------------------------


def test_delta_above_1e_3_needs_allow_large_delta() -> None:
    message = refused(
        with_(privacy={"epsilon": 1.0, "delta": 0.5}),
        r"privacy\.delta \(0\.5\) must be at most 0\.001: .*set allow_large_delta: true",
    )
    assert "(0, 1)" not in message
    spec = parse_spec(with_(privacy={"epsilon": 1.0, "delta": 0.5}, allow_large_delta=True))
    assert spec.allow_large_delta is True
    assert spec.privacy_target().delta == 0.5
    assert '"allow_large_delta":true' in spec.canonical_json()  # recorded with the spec


def test_delta_at_the_limit_needs_no_flag() -> None:
    spec = parse_spec(with_(privacy={"epsilon": 1.0, "delta": DELTA_RANGE[1]}))
    assert spec.allow_large_delta is False
    assert '"allow_large_delta":false' in spec.canonical_json()


def test_a_large_budget_delta_also_needs_the_flag() -> None:
    budget = {"epsilon": 10.0, "delta": 0.01}
    refused(
        with_(dataset__budget=budget), r"dataset\.budget\.delta \(0\.01\) must be at most 0\.001"
    )
    assert parse_spec(with_(dataset__budget=budget, allow_large_delta=True)).allow_large_delta


@pytest.mark.parametrize(
    ("delta", "pattern"),
    [
        (1e-31, r"privacy\.delta \(1e-31\) is below the supported minimum 1e-30"),
        (1.0, r"privacy\.delta \(1\.0\) must be in the open interval \(0, 1\)"),
        (float("nan"), r"privacy\.delta \(nan\) must be in the open interval \(0, 1\)"),
    ],
)
def test_delta_outside_its_range_is_refused_even_with_the_flag(delta: float, pattern: str) -> None:
    refused(with_(privacy={"epsilon": 1.0, "delta": delta}, allow_large_delta=True), pattern)


# --- privacy parameters the noise arithmetic cannot carry ----------------------------------------


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        pytest.param(
            {"privacy": {"epsilon": 1e-300}},
            r"privacy\.epsilon \(1e-300\) is outside the supported range \[1e-06, 100\]",
            id="epsilon-1e-300",
        ),
        pytest.param(
            {"privacy": {"epsilon": 1e300}},
            r"privacy\.epsilon \(1e\+300\) is outside the supported range \[1e-06, 100\]",
            id="epsilon-1e300",
        ),
        pytest.param(
            {"privacy": {"epsilon": 5e-324}},
            r"privacy\.epsilon \(4\.94066e-324\) is outside the supported range",
            id="epsilon-denormal",
        ),
        pytest.param(
            {"privacy": {"rho": 1e-300}},
            r"privacy\.rho \(1e-300\) is outside the supported range \[5e-13, 5000\]",
            id="rho-1e-300",
        ),
        pytest.param(
            {"privacy": {"rho": 1e4}},
            r"privacy\.rho \(10000\) is outside the supported range \[5e-13, 5000\]",
            id="rho-1e4",
        ),
        pytest.param(
            {"privacy": {"epsilon": 1e-7, "delta": 1e-9}},
            r"privacy\.epsilon \(1e-07\) is outside the supported range",
            id="approx-epsilon",
        ),
        pytest.param(
            {"privacy": {"epsilon": float("nan")}},
            r"privacy\.epsilon \(nan\) must be a finite number > 0",
            id="epsilon-nan",
        ),
        pytest.param(
            {"dataset__budget": {"epsilon": 1e5}},
            r"budget\.epsilon \(100000\) is outside the supported range \[1e-06, 10000\]",
            id="budget-epsilon-1e5",
        ),
        pytest.param(
            {"dataset__budget": {"rho": 1e-300}},
            r"budget\.rho \(1e-300\) is outside the supported range \[5e-13, 500000\]",
            id="budget-rho-1e-300",
        ),
        pytest.param(
            {"dataset__budget": {"epsilon": float("inf")}},
            r"budget\.epsilon \(inf\) must be a finite number > 0",
            id="budget-inf",
        ),
    ],
)
def test_privacy_parameters_outside_the_supported_range_are_refused(
    changes: dict[str, Any], pattern: str
) -> None:
    refused(with_(**changes), pattern)


@pytest.mark.parametrize(
    "privacy",
    [
        {"epsilon": EPSILON_RANGE[0]},
        {"epsilon": EPSILON_RANGE[1]},
        {"rho": RHO_RANGE[0]},
        {"rho": RHO_RANGE[1]},
        {"epsilon": EPSILON_RANGE[0], "delta": DELTA_RANGE[0]},
        {"epsilon": EPSILON_RANGE[1], "delta": DELTA_RANGE[1]},
    ],
    ids=["eps-min", "eps-max", "rho-min", "rho-max", "approx-min", "approx-max"],
)
def test_the_ends_of_the_ranges_calibrate_finite_noise(privacy: dict[str, float]) -> None:
    """The ranges are what the arithmetic carries: at each end, with the largest contribution
    bound times a large strategy sensitivity, the calibrated noise and its variance are finite."""
    from dprelease.mechanisms.primitives.noise import calibrate

    budget = (
        {"rho": BUDGET_RHO_RANGE[1]} if "rho" in privacy else {"epsilon": BUDGET_EPSILON_RANGE[1]}
    )
    if "delta" in privacy:
        budget = {**budget, "delta": DELTA_RANGE[1]}
    spec = parse_spec(with_(privacy=privacy, dataset__budget=budget))
    sensitivity = 30.0 * MAX_ROWS_PER_PERSON  # e.g. a 30-level tree, the largest bound
    noise = calibrate(target=spec.privacy_target(), sensitivity=sensitivity, size=10)
    assert math.isfinite(noise.scale) and noise.scale > 0
    assert math.isfinite(noise.variance)


@pytest.mark.parametrize(
    ("unit", "pattern"),
    [
        (
            {"person_column": "pid", "max_rows": MAX_ROWS_PER_PERSON + 1},
            r"privacy_unit: max_rows \(1000001\) must be at most 1,000,000",
        ),
        (
            {"rows_per_person": 10**30},
            r"privacy_unit: rows_per_person \(10{30}\) must be at most 1,000,000",
        ),
    ],
)
def test_contribution_bounds_past_the_limit_are_refused(unit: dict[str, Any], pattern: str) -> None:
    refused(with_(privacy_unit=unit), pattern)


@pytest.mark.parametrize("field", ["min", "max"])
def test_integer_domains_past_float64_exactness_are_refused(field: str) -> None:
    attribute = {"min": MAX_DOMAIN_INTEGER - 5, "max": MAX_DOMAIN_INTEGER + 1}
    if field == "min":
        attribute = {"min": -MAX_DOMAIN_INTEGER - 1, "max": -MAX_DOMAIN_INTEGER + 5}
    refused(
        with_(domain__age=attribute),
        rf"domain\.age .*: {field} \(-?\d+\) must be within ±9,007,199,254,740,992 \(2\*\*53",
    )


# --- domain and workload sizes ---------------------------------------------------------------------


def big_domain(sizes: list[int]) -> dict[str, Any]:
    return {f"a{k}": {"min": 1, "max": n} for k, n in enumerate(sizes)}


def test_a_domain_past_the_plan_limit_is_refused_when_parsed() -> None:
    spec = with_(
        domain=big_domain([10_000_000] * 3),
        workload=[{"name": "m", "marginal": ["a0"]}, {"name": "c", "prefix": "a1"}],
    )
    refused(
        spec,
        r"domain has 1e\+21 cells \(10000000 × 10000000 × 10000000\); at most 1e\+18 are supported",
    )
    marginals_only = with_(
        domain=big_domain([10_000_000] * 3), workload=[{"name": "m", "marginal": ["a0"]}]
    )
    assert parse_spec(marginals_only).num_cells == 10**21  # no product limit for marginals


def test_a_domain_at_the_plan_limit_parses() -> None:
    spec = parse_spec(
        with_(domain=big_domain([1_000_000] * 3), workload=[{"name": "t", "total": True}])
    )
    assert spec.num_cells == MAX_PLAN_CELLS


def test_check_runnable_refuses_a_1e14_cell_domain_before_any_data() -> None:
    spec = parse_spec(
        with_(
            dataset__source="/nonexistent/never-read.parquet",
            domain=big_domain([10_000_000, 10_000_000]),
            workload=[{"name": "t", "total": True}],
        )
    )
    with pytest.raises(SpecError) as raised:
        check_runnable(spec)
    assert re.search(
        r"the domain has 100,000,000,000,000 cells \(10000000 × 10000000\); a release counts at "
        r"most 200,000,000 cells",
        str(raised.value),
    )
    assert MAX_RELEASE_CELLS == 200_000_000


def test_check_runnable_accepts_a_domain_at_the_release_limit() -> None:
    spec = parse_spec(
        with_(domain=big_domain([20_000, 10_000]), workload=[{"name": "t", "total": True}])
    )
    assert spec.num_cells == MAX_RELEASE_CELLS
    assert check_runnable(spec) is None


def test_check_runnable_needs_a_source() -> None:
    spec = base()
    del spec["dataset"]["source"]
    with pytest.raises(SpecError, match=r"dataset\.source is not set in the spec; plan works"):
        check_runnable(parse_spec(spec))


def test_check_runnable_refuses_too_many_output_rows() -> None:
    spec = parse_spec(
        with_(domain=big_domain([100_000]), workload=[{"name": "r", "all_ranges": ["a0"]}])
    )
    with pytest.raises(
        SpecError,
        match=r"workload: the output tables would have 5,000,050,000 rows \(item 'r': "
        r"5,000,050,000\); a release writes at most 200,000,000 rows",
    ):
        check_runnable(spec)
    assert MAX_RELEASE_QUERIES == 200_000_000


def test_output_rows_match_the_planning_workload(tmp_path: Path) -> None:
    matrix = tmp_path / "w.npy"
    np.save(matrix, np.ones((7, 100)))
    spec = parse_spec(
        with_(
            domain={
                "age": {"min": 0, "max": 99},
                "sex": {"values": ["F", "M"]},
                "hours": {"bins": [0, 20, 40, 60, 100]},
            },
            workload=[
                {"name": "m", "marginal": ["age", "sex"]},
                {"name": "p", "prefix": "age"},
                {"name": "a", "all_ranges": ["age", "hours"]},
                {"name": "r", "ranges": {"age": [[0, 9], [10, 99]], "hours": [[0, 20]]}},
                {"name": "t", "total": True},
                {"name": "x", "matrix": str(matrix), "attributes": ["age"]},
            ],
        )
    )
    from dprelease.catalog.planning.planner import build_workload

    workload = build_workload(spec)
    expected = {item.name: item.num_queries for item in workload.items}
    assert {item.name: item_num_queries(spec, item) for item in spec.workload} == expected
    assert expected["a"] == 5050 * 10 and expected["x"] == 7 * 1
