"""The local-model mechanism without files or Prefect: baselines (test vectors of ``seed-ldp.md``),
the Gram-root and per-item shortcuts against dense computations, the optimised strategy and its
cache, options and availability, the once-per-collection charge and the reconstruction."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from dprelease.mechanisms import registry
from dprelease.mechanisms.local import baselines, estimation, randomizer
from dprelease.mechanisms.local import mechanism as local_mechanism
from dprelease.mechanisms.local import strategy as local_strategy
from dprelease.mechanisms.local.mechanism import MECHANISM, LocalOptions
from dprelease.mechanisms.local.strategy import LocalStrategy, ResponseCounts, describe
from dprelease.mechanisms.primitives.operators import AllRanges, Identity, Prefix, Total, kron_dense
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import (
    CandidateUnavailable,
    MeasureContext,
    Measurement,
    OptionsError,
    PlanRequest,
    StoredStrategy,
)
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem
from tests.reference import ldp as ldp_reference

FAST = {"iterations": 60}


class MemoryCache:
    """An in-memory :class:`~mechanisms.primitives.protocol.StrategyCache`."""

    def __init__(self) -> None:
        self.entries: dict[str, StoredStrategy] = {}

    def load(self, key: str) -> StoredStrategy | None:
        return self.entries.get(key)

    def save(self, key: str, stored: StoredStrategy) -> None:
        self.entries[key] = stored


class Ledger:
    """An accountant that records every charge."""

    def __init__(self) -> None:
        self.charges: list[tuple[PrivacyCost, str]] = []

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        self.charges.append((cost, label))
        return f"receipt-{len(self.charges)}"

    def holds(self, receipt_id: str) -> bool:
        return receipt_id in {f"receipt-{k + 1}" for k in range(len(self.charges))}


def workload(*items: tuple[str, tuple[Any, ...]]) -> Workload:
    shape = tuple(f.n for f in items[0][1])
    return Workload(
        domain_shape=shape,
        items=tuple(WorkloadItem(name=name, factors=factors) for name, factors in items),
    )


def request(
    wl: Workload,
    *,
    ordered: tuple[bool, ...] | None = None,
    epsilon: float = 1.0,
    options: dict[str, Any] | None = None,
    fingerprint: str = "f" * 64,
) -> PlanRequest:
    return PlanRequest(
        workload=wl,
        ordered=ordered if ordered is not None else (True,) * len(wl.domain_shape),
        target=PrivacyCost(measure="pure", epsilon=epsilon),
        contribution_bound=1,
        options=FAST if options is None else options,
        workload_fingerprint=fingerprint,
        requested=True,
    )


def dense(wl: Workload) -> np.ndarray:
    return np.vstack([kron_dense(item.factors) for item in wl.items])


PREFIX16 = workload(("v_cdf", (Prefix(16),)))
MIXED = workload(  # a = integers 0..5 (ordered), b = three categories
    ("ab", (Identity(6), Identity(3))),
    ("a_cdf", (Prefix(6), Total(3))),
    ("a_ranges", (AllRanges(6), Total(3))),
    ("total", (Total(6), Total(3))),
)


@pytest.fixture(scope="module")
def optimized() -> tuple[PlanRequest, LocalStrategy]:
    planned = request(PREFIX16)
    return planned, MECHANISM.plan(planned, cache=MemoryCache())


def as_strategy(randomiser: randomizer.LDPStrategy, wl: Workload) -> LocalStrategy:
    return describe(
        randomiser,
        workload=wl,
        ordered=(True,) * len(wl.domain_shape),
        workload_fingerprint="w" * 64,
        settings={},
        seconds=0.0,
    )


# --- the registry ---------------------------------------------------------------------------------


def test_the_local_model_selects_this_mechanism() -> None:
    assert registry.candidates(requested="auto", model="local") == (MECHANISM,)
    assert registry.get("optimized", model="local") is MECHANISM
    assert registry.get("optimized", model="central") is not MECHANISM
    assert MECHANISM.input_kind == "responses" and MECHANISM.data_independent


# --- test vectors through the baseline evaluation -------------------------------------------------

VECTORS = [
    pytest.param(
        workload(("hist", (Identity(5),))),
        (False,),
        "randomized_response",
        11.4298,
        1e-5,
        id="ex3.7-rr-histogram-n5",
    ),
    pytest.param(
        workload(("cdf", (Prefix(128),))),
        (True,),
        "hierarchical",
        5466.1318,
        1e-7,
        id="sec9.2-hierarchical-prefix-n128-thm3.10",
    ),
]


@pytest.mark.parametrize(("wl", "ordered", "name", "expected", "tolerance"), VECTORS)
def test_baseline_variances_match_the_reference_note(
    wl: Workload, ordered: tuple[bool, ...], name: str, expected: float, tolerance: float
) -> None:
    root = local_strategy.workload_root(wl)
    found = baselines.baseline_strategies(wl.domain_shape, ordered, epsilon=1.0)
    summary = local_strategy.evaluate_baselines(root, found)[name]
    assert summary["worst_variance"] == pytest.approx(expected, rel=tolerance)


def test_rr_histogram_vector_fails_at_another_epsilon() -> None:
    wl = workload(("h", (Identity(5),)))
    root = local_strategy.workload_root(wl)

    def rr(epsilon: float) -> float:
        found = baselines.baseline_strategies((5,), (False,), epsilon=epsilon)
        return local_strategy.evaluate_baselines(root, found)["randomized_response"][
            "worst_variance"
        ]

    assert abs(rr(1.1) - 11.4298) > 0.5 and rr(1.0) == pytest.approx(11.4298, rel=1e-5)


@pytest.mark.parametrize(
    ("shape", "ordered", "expected"),
    [
        pytest.param(
            (16,), (True,), {"randomized_response", "hadamard", "hierarchical", "rappor"}, id="n16"
        ),
        pytest.param(
            (17,), (True,), {"randomized_response", "hadamard", "hierarchical"}, id="n17-no-rappor"
        ),
        pytest.param(
            (3,),
            (False,),
            {"randomized_response", "hadamard", "rappor"},
            id="unordered-no-hierarchical",
        ),
        pytest.param(
            (2, 2, 2),
            (False, False, False),
            {"randomized_response", "hadamard", "rappor", "fourier"},
            id="binary-fourier",
        ),
    ],
)
def test_baseline_applicability(
    shape: tuple[int, ...], ordered: tuple[bool, ...], expected: set[str]
) -> None:
    assert set(baselines.baseline_strategies(shape, ordered, epsilon=1.0)) == expected


# --- structural shortcuts against dense computations ----------------------------------------------


def test_workload_root_has_the_dense_gram_and_variances() -> None:
    matrix = dense(MIXED)
    root = local_strategy.workload_root(MIXED)
    np.testing.assert_allclose(root.T @ root, matrix.T @ matrix, atol=1e-9)
    strategy = baselines.hadamard(MIXED.num_cells, epsilon=1.0)
    np.testing.assert_allclose(
        estimation.per_type_variance(root, strategy),
        estimation.per_type_variance(matrix, strategy),
        rtol=1e-9,
    )
    assert estimation.lower_bound(root, epsilon=1.0) == pytest.approx(
        estimation.lower_bound(matrix, epsilon=1.0), rel=1e-9
    )


def test_item_estimates_equal_the_dense_reconstruction(rng: np.random.Generator) -> None:
    strategy = baselines.randomized_response(MIXED.num_cells, epsilon=1.0)
    counts = rng.integers(0, 200, strategy.num_outputs)
    expected = estimation.estimate(counts, estimation.reconstruction(dense(MIXED), strategy))
    operator = local_strategy.least_squares_operator(strategy)
    parts = [local_strategy.estimate_item(item, strategy, operator, counts) for item in MIXED.items]
    np.testing.assert_allclose(
        np.concatenate([p.answers for p in parts]), expected.answers, rtol=1e-9
    )
    np.testing.assert_allclose(
        np.concatenate([p.variance for p in parts]), expected.variance, rtol=1e-8, atol=1e-6
    )


def test_item_estimates_in_small_chunks_equal_one_chunk(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    strategy = baselines.hadamard(MIXED.num_cells, epsilon=1.0)
    counts = rng.integers(0, 50, strategy.num_outputs)
    operator = local_strategy.least_squares_operator(strategy)
    item = MIXED.items[2]
    whole = local_strategy.estimate_item(item, strategy, operator, counts)
    monkeypatch.setattr(local_strategy, "V_CHUNK_ENTRIES", strategy.num_outputs * 7)
    chunked = local_strategy.estimate_item(item, strategy, operator, counts)
    assert item.num_queries > 7  # more than one chunk
    np.testing.assert_allclose(chunked.answers, whole.answers, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(chunked.variance, whole.variance, rtol=1e-10, atol=1e-8)


def test_strategy_protocol_members_equal_dense_computations() -> None:
    randomiser = baselines.hadamard(MIXED.num_cells, epsilon=1.0)
    strategy = as_strategy(randomiser, MIXED)
    matrix = dense(MIXED)
    V = estimation.reconstruction(matrix, randomiser)
    x = np.arange(MIXED.num_cells, dtype=np.float64)
    answers = strategy.answers(strategy.apply(x), MIXED)
    np.testing.assert_allclose(
        np.concatenate([answers[i.name] for i in MIXED.items]), matrix @ x, atol=1e-9
    )
    worst = ldp_reference.query_worst_case_variance(matrix, randomiser, V)
    per_item = [strategy.item_unit_variances(item, MIXED) for item in MIXED.items]
    np.testing.assert_allclose(np.concatenate(per_item), worst, rtol=1e-8, atol=1e-8)
    item = MIXED.items[0]
    rows = kron_dense(item.factors)
    assert strategy.item_unit_total(item, MIXED) == pytest.approx(
        ldp_reference.worst_case_variance(rows, randomiser), rel=1e-8
    )
    assert strategy.support_residual(MIXED) < 1e-8
    assert strategy.num_queries == randomiser.num_outputs


def test_support_residual_detects_a_workload_outside_the_row_space() -> None:
    # Q with identical columns 0 and 1 cannot tell items 0 and 1 apart: a histogram is unanswerable
    base = baselines.randomized_response(3, epsilon=1.0).Q
    merged = randomizer.LDPStrategy(name="merged", Q=base[:, [0, 0, 1, 2]], epsilon=1.0)
    strategy = as_strategy(merged, workload(("total", (Total(4),))))
    assert strategy.support_residual(workload(("total", (Total(4),)))) < 1e-8
    assert strategy.support_residual(workload(("hist", (Identity(4),)))) > 0.1


# --- the optimised strategy and the cache ---------------------------------------------------------


def test_optimised_strategy_is_exactly_ldp_and_factorises_w(optimized) -> None:
    planned, strategy = optimized
    matrix = strategy.randomiser.Q
    bound = Fraction(math.exp(1.0))
    for row in matrix:
        assert Fraction(float(row.max())) <= bound * Fraction(float(row.min()))
    for column in matrix.T:
        assert abs(math.fsum(column.tolist()) - 1.0) <= 1e-12
    W = dense(PREFIX16)
    V = estimation.reconstruction(W, strategy.randomiser)
    np.testing.assert_allclose(V @ matrix, W, atol=1e-8)
    record = strategy.parameters
    assert strategy.fingerprint == randomizer.strategy_fingerprint(strategy.randomiser)
    assert record["worst_variance"] == pytest.approx(
        ldp_reference.worst_case_variance(W, strategy.randomiser)
    )
    assert record["average_variance"] == pytest.approx(
        ldp_reference.average_case_variance(W, strategy.randomiser)
    )
    assert record["worst_variance"] < min(b["worst_variance"] for b in record["baselines"].values())
    assert record["worst_variance"] >= record["lower_bound"]
    assert record["settings"]["iterations"] == 60
    evaluation = MECHANISM.evaluate(strategy, planned)
    assert evaluation.cost == PrivacyCost(measure="pure", epsilon=1.0)
    assert evaluation.total_variance == record["worst_variance"]
    assert evaluation.note is not None and "per user (N = 1)" in evaluation.note


def test_the_cache_is_reused_without_optimising(optimized) -> None:
    planned, strategy = optimized
    cache = MemoryCache()
    messages: list[str] = []
    progress = lambda fraction, text: messages.append(text)  # noqa: E731
    first = MECHANISM.plan(replace(planned, progress=progress), cache=cache)
    assert messages[0].startswith("optimising the LDP strategy") and len(messages) > 1
    reported = len(messages)  # the optimiser reports its steps too
    again = MECHANISM.plan(replace(planned, progress=progress), cache=cache)
    assert len(messages) == reported  # no second optimisation
    assert again.parameters == first.parameters
    np.testing.assert_array_equal(again.randomiser.Q, first.randomiser.Q)
    assert first.fingerprint == strategy.fingerprint  # the public seed reproduces the strategy


def test_a_tampered_cache_entry_is_recomputed(optimized) -> None:
    planned, strategy = optimized
    cache = MemoryCache()
    tampered = np.array(strategy.randomiser.Q)
    tampered[:, [0, 1]] = tampered[:, [1, 0]]  # still epsilon-LDP, another fingerprint
    key = local_mechanism.strategy_key(planned)
    cache.save(key, StoredStrategy(parameters=dict(strategy.parameters), arrays={"Q": tampered}))
    messages: list[str] = []
    again = MECHANISM.plan(replace(planned, progress=lambda f, t: messages.append(t)), cache=cache)
    assert sum(m.startswith("optimising the LDP strategy") for m in messages) == 1
    assert again.fingerprint == strategy.fingerprint  # same seed, same strategy
    assert LocalStrategy.restore(cache.entries[key]).fingerprint == strategy.fingerprint


def test_strategy_key_depends_on_epsilon_settings_and_workload() -> None:
    key = local_mechanism.strategy_key(request(PREFIX16, options={}))
    assert key != local_mechanism.strategy_key(request(PREFIX16, options={"iterations": 10}))
    assert key != local_mechanism.strategy_key(request(PREFIX16, options={}, epsilon=2.0))
    assert key != local_mechanism.strategy_key(request(PREFIX16, options={}, fingerprint="e" * 64))
    assert key == local_mechanism.strategy_key(request(PREFIX16, options={}))


def test_restore_refuses_a_modified_strategy(optimized) -> None:
    _, strategy = optimized
    stored = strategy.stored()
    assert LocalStrategy.restore(stored).fingerprint == strategy.fingerprint
    swapped = np.array(strategy.randomiser.Q)[:, ::-1]
    with pytest.raises(ValueError, match="does not match its record"):
        LocalStrategy.restore(StoredStrategy(parameters=stored.parameters, arrays={"Q": swapped}))
    broken = np.array(strategy.randomiser.Q)
    broken[0, 0] *= 10
    with pytest.raises(ValueError, match="is not an epsilon-LDP strategy"):
        LocalStrategy.restore(StoredStrategy(parameters=stored.parameters, arrays={"Q": broken}))
    with pytest.raises(ValueError, match="has no 'Q' entry"):
        LocalStrategy.restore(StoredStrategy(parameters=stored.parameters))
    other = {**stored.parameters, "epsilon": 2.0}
    with pytest.raises(ValueError):
        LocalStrategy.restore(StoredStrategy(parameters=other, arrays=stored.arrays))


# --- options and availability ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            {"rows_factor": 0},
            "mechanism_options.rows_factor (0) must be an integer >= 1",
            id="rows",
        ),
        pytest.param(
            {"iterations": -1},
            "mechanism_options.iterations (-1) must be an integer >= 0",
            id="iterations",
        ),
        pytest.param(
            {"iterations": 2.5},
            "mechanism_options.iterations (2.5) must be an integer >= 0",
            id="iterations-float",
        ),
        pytest.param(
            {"tolerance": 1.0},
            "mechanism_options.tolerance (1.0) must be a number in [0, 1)",
            id="tolerance",
        ),
        pytest.param(
            {"tolerance": "small"},
            "mechanism_options.tolerance ('small') must be a number in [0, 1)",
            id="tolerance-type",
        ),
    ],
)
def test_options_validation(values: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionsError, match=re.escape(message)):
        LocalOptions(**values)


def test_default_options() -> None:
    assert LocalOptions().as_dict() == {"rows_factor": 4, "iterations": 500, "tolerance": 1e-5}


@pytest.mark.parametrize(
    ("wl", "target", "message"),
    [
        pytest.param(
            workload(("t", (Total(1),))),
            None,
            "the domain has 1 cell(s); local-model releases need >= 2",
            id="one-cell",
        ),
        pytest.param(
            workload(("c", (Prefix(4097),))),
            None,
            "at most 2,048 cells (each step costs O(m n^2) with m = 4n)",
            id="huge-domain",
        ),
        pytest.param(
            workload(("r", (AllRanges(2048),))),
            None,
            "workload item 'r' has 2,098,176 queries over 2,048 cells",
            id="huge-item",
        ),
        pytest.param(
            PREFIX16,
            PrivacyCost(measure="zcdp", rho=0.5),
            "the local model needs privacy {epsilon}",
            id="not-pure",
        ),
    ],
)
def test_unavailable_reasons(wl: Workload, target: PrivacyCost | None, message: str) -> None:
    planned = request(wl)
    if target is not None:
        planned = replace(planned, target=target)
    reason = MECHANISM.unavailable_reason(planned)
    assert reason is not None and message in reason
    with pytest.raises(CandidateUnavailable, match=re.escape(message)):
        MECHANISM.plan(planned, cache=MemoryCache())


def test_a_fitting_workload_is_available() -> None:
    assert MECHANISM.unavailable_reason(request(MIXED, ordered=(True, False))) is None
    assert MECHANISM.predicted_seconds(request(PREFIX16)) < MECHANISM.predicted_seconds(
        request(workload(("c", (Prefix(512),))))
    )


# --- measure: one charge per collection -----------------------------------------------------------


def _context(ledger: Ledger, released: MemoryCache, responses: str) -> MeasureContext:
    return MeasureContext(
        target=PrivacyCost(measure="pure", epsilon=1.0),
        accountant=ledger,
        label="unit",
        contribution_bound=1,
        input_fingerprint=responses,
        dataset_id="ldp-unit",
        released=released,
    )


def test_a_collection_is_charged_once() -> None:
    strategy = as_strategy(baselines.randomized_response(16, epsilon=1.0), PREFIX16)
    data = strategy.response_counts(np.bincount([1, 2, 3], minlength=16))
    ledger, released = Ledger(), MemoryCache()
    cost = PrivacyCost(measure="pure", epsilon=1.0)
    assert (
        MECHANISM.cost_due(
            strategy, dataset_id="ldp-unit", input_fingerprint="r1", released=released
        )
        == cost
    )
    first = MECHANISM.measure(strategy, data, context=_context(ledger, released, "r1"))
    second = MECHANISM.measure(strategy, data, context=_context(ledger, released, "r1"))
    assert len(ledger.charges) == 1
    assert ledger.charges[0][0] == cost
    assert local_mechanism.COLLECTION_LABEL in ledger.charges[0][1]
    assert (first.charged, second.charged) == (cost, PrivacyCost.zero("pure"))
    assert first.receipts == second.receipts == ("receipt-1",)
    assert [m.details["collection_reused"] for m in (first, second)] == [False, True]
    assert MECHANISM.cost_due(
        strategy, dataset_id="ldp-unit", input_fingerprint="r1", released=released
    ) == PrivacyCost.zero("pure")
    # another collection (other responses content) is charged again
    third = MECHANISM.measure(strategy, data, context=_context(ledger, released, "r2"))
    assert len(ledger.charges) == 2 and third.receipts == ("receipt-2",)
    assert third.details["collection_reused"] is False


def test_a_receipt_not_on_this_ledger_is_not_reused() -> None:
    strategy = as_strategy(baselines.randomized_response(16, epsilon=1.0), PREFIX16)
    data = strategy.response_counts(np.bincount([1, 2, 3], minlength=16))
    released = MemoryCache()
    MECHANISM.measure(strategy, data, context=_context(Ledger(), released, "r1"))
    elsewhere = Ledger()  # e.g. a catalog recreated at the same URL: the receipt is not on it
    elsewhere.charges.append((PrivacyCost.zero("pure"), "unrelated"))  # holds only "receipt-1"
    key = next(iter(released.entries))
    released.entries[key] = StoredStrategy(parameters={"receipt_id": "receipt-9"})
    again = MECHANISM.measure(strategy, data, context=_context(elsewhere, released, "r1"))
    assert again.details["collection_reused"] is False
    assert again.charged == PrivacyCost(measure="pure", epsilon=1.0)
    assert again.receipts == ("receipt-2",) and len(elsewhere.charges) == 2


def test_measurement_details_are_the_public_record() -> None:
    strategy = as_strategy(baselines.hadamard(16, epsilon=1.0), PREFIX16)
    data = strategy.response_counts(np.full(strategy.num_queries, 5))
    measured = MECHANISM.measure(strategy, data, context=_context(Ledger(), MemoryCache(), "r"))
    details = measured.details
    n = 5 * strategy.num_queries
    assert details["num_responses"] == n and details["epsilon_per_user"] == 1.0
    assert details["strategy_fingerprint"] == strategy.fingerprint
    worst = strategy.parameters["worst_variance"]
    assert details["promised_worst_variance_per_user"] == worst
    assert details["expected_worst_rmse"] == pytest.approx(math.sqrt(worst * n / 16))
    assert set(details["baselines"]) == set(strategy.parameters["baselines"])
    assert measured.noise.kind == "client-side epsilon-LDP randomiser"
    assert (measured.noise.scale, measured.noise.size) == (1.0, n)


def test_measure_refuses_counts_of_another_strategy() -> None:
    strategy = as_strategy(baselines.randomized_response(16, epsilon=1.0), PREFIX16)
    other = ResponseCounts(counts=np.ones(16), num_responses=16, strategy_fingerprint="0" * 64)
    ledger = Ledger()
    with pytest.raises(ValueError, match="not the planned"):
        MECHANISM.measure(strategy, other, context=_context(ledger, MemoryCache(), "r"))
    assert ledger.charges == []


@pytest.mark.parametrize(
    ("counts", "total", "message"),
    [
        pytest.param([[1, 2]], 3, "must be a non-empty 1-D array", id="2-d"),
        pytest.param([1, -1, 3], 3, "counts must be >= 0", id="negative"),
        pytest.param([1, 2], 4, "num_responses must equal the sum of counts", id="sum"),
    ],
)
def test_response_counts_validation(counts: Any, total: int, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ResponseCounts(counts=np.asarray(counts), num_responses=total, strategy_fingerprint="f")


def test_response_counts_have_the_strategy_size() -> None:
    strategy = as_strategy(baselines.randomized_response(16, epsilon=1.0), PREFIX16)
    with pytest.raises(ValueError, match="must have 16 entries"):
        strategy.response_counts(np.ones(15))


# --- reconstruction -------------------------------------------------------------------------------


def test_noiseless_reconstruction_recovers_the_workload() -> None:
    wl = workload(("cdf", (Prefix(16),)), ("hist", (Identity(16),)))
    strategy = as_strategy(baselines.randomized_response(16, epsilon=1.0), wl)
    x = np.arange(16, dtype=np.float64) * 10 + 5
    counts = strategy.apply(x)  # the expected response vector: V y must equal W x exactly
    measurement = Measurement(
        values=counts,
        noise=MECHANISM.measure(
            strategy,
            strategy.response_counts(np.ones(16, dtype=np.int64)),
            context=_context(Ledger(), MemoryCache(), "r"),
        ).noise,
        strategy=strategy,
        receipts=("r",),
        charged=PrivacyCost.zero("pure"),
    )
    answers = MECHANISM.reconstruct(measurement, workload=wl)
    np.testing.assert_allclose(answers["cdf"].estimates, np.cumsum(x), rtol=1e-10)
    np.testing.assert_allclose(answers["hist"].estimates, x, rtol=1e-10)
    std_error = np.sqrt(answers["cdf"].variances)
    assert (std_error > 0).all()
    assert std_error[-1] < 1e-6 * x.sum()  # the total N is exact: only the rounding floor
    assert std_error[:-1].min() > 1.0
