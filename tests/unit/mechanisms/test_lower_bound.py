"""The one SVD-bound implementation (mechanisms.primitives.lower_bound) against dense eigenvalues and the
reference values of seed-eigen.md §4 item 6 and §9 (moved here from test_optimized.py and
test_error.py when the three copies were merged)."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest

from dprelease.mechanisms.primitives.lower_bound import (
    DENSE_BOUND_LIMIT,
    svd_bound,
    svd_bound_from_eigenvalues,
    svd_bound_gram,
)
from dprelease.mechanisms.primitives.operators import (
    AllRanges,
    Centring,
    Identity,
    MatrixFactor,
    Prefix,
    Ranges,
    Total,
    kron_dense,
    kron_matrices,
)
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.reference.lower_bound import svd_bound_terms

ALL_RANGE_SVDB = {16: 404.4829, 64: 10787.15, 512: 1.330722e6, 2048: 3.034182e7}
"""seed-eigen.md §4 item 6 (recomputed there from dense eigenvalues)."""


def _dense_svdb(gram: np.ndarray) -> float:
    values = np.clip(np.linalg.eigvalsh(gram), 0.0, None)
    return float(np.sqrt(values).sum() ** 2 / gram.shape[0])


def _explicit_gram(workload: Workload) -> np.ndarray:
    """WᵀW from the explicit query matrices (independent of the closed-form Grams)."""
    return sum(kron_dense(item.factors).T @ kron_dense(item.factors) for item in workload.items)


def _random_gram(rng: np.random.Generator, n: int) -> np.ndarray:
    w = rng.standard_normal((n + 2, n))
    return w.T @ w


def _marginal_items(shape: tuple[int, ...], subsets) -> tuple[WorkloadItem, ...]:
    return tuple(
        WorkloadItem(
            name=str(s),
            factors=tuple(Identity(n) if i in s else Total(n) for i, n in enumerate(shape)),
        )
        for s in subsets
    )


# --- reference values ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", list(ALL_RANGE_SVDB), ids=[f"ALLRANGE({n})" for n in ALL_RANGE_SVDB])
def test_all_ranges_match_reference_by_every_entry_point(n: int) -> None:
    workload = Workload(domain_shape=(n,), items=(WorkloadItem(name="r", factors=(AllRanges(n),)),))
    assert svd_bound(workload) == pytest.approx(ALL_RANGE_SVDB[n], rel=2e-6)
    if n <= 512:
        assert svd_bound_terms([(AllRanges(n).gram(),)]) == pytest.approx(
            ALL_RANGE_SVDB[n], rel=2e-6
        )
        assert svd_bound_gram(AllRanges(n).gram()) == pytest.approx(ALL_RANGE_SVDB[n], rel=2e-6)


def test_all_ranges_two_is_two_plus_sqrt3() -> None:
    assert svd_bound_terms([(AllRanges(2).gram(),)]) == pytest.approx(2 + math.sqrt(3), rel=1e-14)


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        ([(AllRanges(64).gram(), AllRanges(32).gram())], 2.2605e7),
        ([tuple(AllRanges(2).gram() for _ in range(10))], (2 + math.sqrt(3)) ** 10),
        (
            [
                tuple(
                    np.eye(n) if i in pair else np.ones((n, n)) for i, n in enumerate((8, 16, 16))
                )
                for pair in itertools.combinations(range(3), 2)
            ],
            1.3606e3,
        ),
        ([(np.array([[1.0, 1, 1], [0, 1, 1]]).T @ np.array([[1.0, 1, 1], [0, 1, 1]]),)], 2.6095),
    ],
    ids=["ALLRANGE(64,32)", "ALLRANGE(2^x10)", "2-way-marginals-8x16x16", "example-4.4"],
)
def test_terms_reference_vectors(terms, expected: float) -> None:
    assert svd_bound_terms(terms) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("one_term", [False, True], ids=["identity-plus-total", "one-dense-term"])
def test_all_predicate(one_term: bool) -> None:
    """ALLPREDICATE(n): Gram 2^(n−2)(I + J); SVDB(1024) = 4.8851e310 (§9, printed e156)."""
    n = 128 if one_term else 1024
    terms = [(np.eye(n) + np.ones((n, n)),)] if one_term else [(np.eye(n),), (np.ones((n, n)),)]
    closed_form = (n - 1 + math.sqrt(n + 1)) ** 2 / n
    assert svd_bound_terms(terms) == pytest.approx(closed_form, rel=1e-10)
    if not one_term:
        log10_bound = math.log10(svd_bound_terms(terms)) + (n - 2) * math.log10(2.0)
        assert log10_bound == pytest.approx(310 + math.log10(4.8851), abs=1e-4)


def test_workload_two_way_marginals_8_16_16() -> None:
    shape = (8, 16, 16)
    workload = Workload(
        domain_shape=shape, items=_marginal_items(shape, itertools.combinations(range(3), 2))
    )
    assert svd_bound(workload) == pytest.approx(1.3606e3, rel=1e-4)


def test_adult_marginal_bounds_in_closed_form() -> None:
    """Issue 19's figures: all 1–3-way (2-way) marginals of the 14 Adult attributes have SVD-bound
    rmse 10.66 (6.36) at ρ = 1/2 (unit variance per unit L2 sensitivity)."""
    sizes = (85, 9, 100, 16, 7, 15, 6, 5, 2, 100, 100, 99, 42, 2)
    for ks, expected in [((1, 2, 3), 10.66), ((2,), 6.36)]:
        subsets = [s for k in ks for s in itertools.combinations(range(14), k)]
        workload = Workload(domain_shape=sizes, items=_marginal_items(sizes, subsets))
        bound = svd_bound(workload)
        assert bound is not None
        assert math.sqrt(bound / workload.num_queries) == pytest.approx(expected, abs=0.005)


# --- agreement with dense eigenvalues ---------------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["single-term-product", "marginals-closed-form", "mixed-split-and-dense", "all-dense"]
)
def test_terms_equal_dense(case: str) -> None:
    rng = np.random.default_rng(7)
    if case == "single-term-product":
        terms = [(AllRanges(8).gram(), Prefix(4).gram(), _random_gram(rng, 3))]
    elif case == "marginals-closed-form":
        terms = [
            tuple(np.eye(n) if i in s else np.ones((n, n)) for i, n in enumerate((2, 3, 4)))
            for s in [(0,), (1, 2), (0, 1, 2), ()]
        ]
    elif case == "mixed-split-and-dense":
        terms = [
            (np.eye(3), _random_gram(rng, 4), np.ones((2, 2))),
            (2.0 * np.eye(3) + 0.5 * np.ones((3, 3)), _random_gram(rng, 4), np.eye(2)),
            (np.ones((3, 3)), _random_gram(rng, 4), np.ones((2, 2))),
        ]
    else:
        terms = [
            (_random_gram(rng, 3), _random_gram(rng, 4)),
            (_random_gram(rng, 3), np.eye(4)),
        ]
    expected = _dense_svdb(sum(kron_matrices(term) for term in terms))
    assert svd_bound_terms(terms) == pytest.approx(expected, rel=1e-7)


def test_workload_mixed_union_equals_dense() -> None:
    shape = (6, 2, 3)
    workload = Workload(
        domain_shape=shape,
        items=(
            WorkloadItem(name="cdf", factors=(Prefix(6), Total(2), Total(3))),
            WorkloadItem(name="marg", factors=(Identity(6), Identity(2), Total(3))),
            WorkloadItem(name="rng", factors=(AllRanges(6), Total(2), Identity(3))),
            WorkloadItem(name="tot", factors=(Total(6), Total(2), Total(3))),
            WorkloadItem(name="few", factors=(Ranges(6, [0, 2], [3, 5]), Identity(2), Total(3))),
            WorkloadItem(name="ctr", factors=(Total(6), Centring(2), Identity(3))),
        ),
    )
    assert svd_bound(workload) == pytest.approx(_dense_svdb(_explicit_gram(workload)), rel=1e-7)


def test_single_item_uses_closed_form_spectra_beyond_the_dense_limit() -> None:
    """Prefix and all-range spectra are closed forms: no n × n eigendecomposition at n = 20,000."""
    n = 20_000
    single = Workload(
        domain_shape=(n, 3), items=(WorkloadItem(name="p", factors=(Prefix(n), Identity(3))),)
    )
    k = np.arange(1, n + 1)
    prefix_root = np.sum(1.0 / (2.0 * np.sin((2 * k - 1) * np.pi / (4 * n + 2))))
    assert svd_bound(single) == pytest.approx(prefix_root**2 * 3**2 / (3 * n), rel=1e-10)


# --- refusals and validation -----------------------------------------------------------------------


def test_terms_refuse_a_large_dense_part_naming_the_size() -> None:
    big, bigger = AllRanges(64).gram(), AllRanges(128).gram()
    assert DENSE_BOUND_LIMIT < 64 * 128
    with pytest.raises(ValueError, match=re.escape("8192 cells together")):
        svd_bound_terms([(big, bigger), (np.eye(64), bigger)])


def test_workload_bound_is_none_when_too_large() -> None:
    items = (
        WorkloadItem(name="a", factors=(Prefix(5000), Total(2))),
        WorkloadItem(name="b", factors=(AllRanges(5000), Identity(2))),
    )
    assert svd_bound(Workload(domain_shape=(5000, 2), items=items)) is None
    explicit = MatrixFactor(np.ones((2, 5000)))
    one = Workload(domain_shape=(5000,), items=(WorkloadItem(name="x", factors=(explicit,)),))
    assert svd_bound(one) is None  # no closed form and above the dense limit


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: svd_bound_gram(np.ones((2, 3))), "must be a non-empty square matrix"),
        (lambda: svd_bound_gram(np.array([[1.0, np.nan], [np.nan, 1.0]])), "gram must be finite"),
        (lambda: svd_bound_gram(np.array([[1.0, 2.0], [0.0, 1.0]])), "gram must be symmetric"),
        (lambda: svd_bound_gram(np.zeros((2, 2))), "gram must not be all zero"),
        (lambda: svd_bound_terms([]), "non-empty sequence"),
        (lambda: svd_bound_terms([(np.eye(2),), (np.eye(3),)]), "attribute sizes"),
        (lambda: svd_bound_terms([(np.array([[1.0, 2.0], [0.0, 1.0]]),)]), "must be symmetric"),
        (lambda: svd_bound_from_eigenvalues(np.array([]), 4), "num_cells >= 1"),
        (lambda: svd_bound_from_eigenvalues(np.ones(2), 0), "num_cells >= 1"),
    ],
    ids=[
        "shape",
        "finite",
        "symmetric",
        "zero",
        "empty",
        "sizes",
        "terms-symmetric",
        "no-eig",
        "cells",
    ],
)
def test_validation_fires(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_from_eigenvalues_with_multiplicities() -> None:
    # a I + b J on n cells: a + b n once, a with multiplicity n − 1 (thesis Thm 4.8)
    a, b, n = 3.0, 2.0, 5
    expected = _dense_svdb(a * np.eye(n) + b * np.ones((n, n)))
    value = svd_bound_from_eigenvalues(
        np.array([a + b * n, a]), n, multiplicities=np.array([1.0, n - 1.0])
    )
    assert value == pytest.approx(expected, rel=1e-12)
