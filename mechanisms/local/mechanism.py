"""``optimized`` in the local model: the workload factorization mechanism of [McKenna20].

Every user randomises their own item on their device with a *published* ε-LDP strategy ``Q``
(``m x n``, :mod:`mechanisms.local.randomizer`) and sends one response index.  The server counts the responses
into ``y`` and answers the workload with ``V y``, ``V = W (Qᵀ D⁻¹ Q)⁺ Qᵀ D⁻¹`` (Thm 3.10).

As a :class:`~mechanisms.protocol.Mechanism`:

* **plan** optimises ``Q`` for the workload at the per-user ε (Problem 3.12), data-free and cached
  under the workload fingerprint, ε and the optimiser settings; the random start's seed is a hash
  of public facts, so the same spec always yields the same ``Q`` (and fingerprint).
* **evaluate**: cost ε per user (pure); expected error = worst-case total variance *per user*
  (Cor 3.5, N = 1; N responses give N times it).
* **measure** takes :class:`ResponseCounts` (already ε-LDP when they arrive: the noise was added on
  the devices, never here) and records the collection's cost on the ledger once per (dataset,
  strategy, responses content); a re-release of the same collection reuses the receipt, kept in
  the released-intermediates cache.
* **reconstruct** is post-processing: ``V y`` with the variance estimate
  ``N/(N-1)·[(V∘V) y − (V y)²/N]`` (:func:`mechanisms.local.estimation.estimate`).

References
----------
R. McKenna, R. K. Maity, A. Mazumdar, G. Miklau, "A workload-adaptive mechanism for linear queries
under local differential privacy", PVLDB 13(11), 2020 (§3, Thm 3.4, 3.10, Cor 3.5-3.6, 5.7).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mechanisms.local import baselines, estimation, optimizer, randomizer
from mechanisms.local.randomizer import LDPStrategy
from mechanisms.operators import kron_dense
from mechanisms.privacy import PrivacyCost
from mechanisms.protocol import (
    CandidateUnavailable,
    Evaluation,
    ItemAnswers,
    MeasureContext,
    Measurement,
    MechanismOptions,
    NoiseDescription,
    OptionsError,
    PlanRequest,
    StoredStrategy,
    StrategyCache,
    cache_key,
    require_int,
)
from mechanisms.workload import Workload, WorkloadItem

NAME = "optimized"
STORE_VERSION = "1"
MAX_LDP_CELLS = 2048  # one optimiser step is O(m n^2) with m = 4n (benchmarks/ldp_bench.py)
MAX_TABLE_ENTRIES = 25_000_000  # queries × cells of one item's dense rows (200 MB of float64)
V_CHUNK_ENTRIES = 4_000_000  # rows of V formed at a time
COLLECTION_LABEL = "local-model collection (epsilon per user)"
STD_ERROR = "sqrt of N/(N-1)[(V∘V)y - (Vy)^2/N], V of Thm 3.10"
VARIANCE_UNIT = "total variance of all workload queries per user (N = 1)"
RECONSTRUCTION = "V = W (Q^T D^-1 Q)^+ Q^T D^-1 (McKenna et al. 2020, Thm 3.10)"


@dataclass(frozen=True, kw_only=True)
class LocalOptions(MechanismOptions):
    """Optimiser settings (public; part of the strategy's cache key)."""

    rows_factor: int = 4
    """outputs of the random start per cell, m = rows_factor · n ([McKenna20] §4: 4)"""
    iterations: int = 500
    """maximum gradient steps (vs 1000: ``benchmarks/ldp_bench.py --n 512 --iterations 1000``)"""
    tolerance: float = 1e-5
    """a phase stops when the objective fell by less than this fraction over 50 steps"""

    def __post_init__(self) -> None:
        require_int(self.rows_factor, option="rows_factor", minimum=1)
        require_int(self.iterations, option="iterations", minimum=0)
        value = self.tolerance
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
            raise OptionsError(
                f"mechanism_options.tolerance ({value!r}) must be a number in [0, 1)"
            )


@dataclass(frozen=True, kw_only=True)
class ResponseCounts:
    """One collection's response counts ``y`` (``y_o`` = users who sent response ``o``).

    ε-LDP data (each user randomised their own item), kept out of logs and result storage anyway.
    """

    counts: np.ndarray = field(repr=False)
    num_responses: int
    strategy_fingerprint: str

    def __post_init__(self) -> None:
        counts = np.array(self.counts, dtype=np.int64, copy=True)
        if counts.ndim != 1 or counts.size == 0:
            raise ValueError(f"counts (shape {counts.shape}) must be a non-empty 1-D array")
        if (counts < 0).any():
            raise ValueError("counts must be >= 0 (numbers of responses)")
        if int(counts.sum()) != self.num_responses:
            raise ValueError("num_responses must equal the sum of counts")
        counts.setflags(write=False)
        object.__setattr__(self, "counts", counts)


@dataclass(frozen=True, kw_only=True, eq=False)
class LocalStrategy:
    """A published ε-LDP randomiser and its public record (``parameters``, JSON-able).

    Construction checks that the record's fingerprint and ε are the randomiser's, so a restored
    or read strategy is exactly the one that was published.
    """

    randomiser: LDPStrategy
    parameters: Mapping[str, Any]
    name: str = NAME

    def __post_init__(self) -> None:
        fingerprint = randomizer.strategy_fingerprint(self.randomiser)  # O(m n)
        recorded = (self.parameters.get("fingerprint"), self.parameters.get("epsilon"))
        if recorded != (fingerprint, self.randomiser.epsilon):
            raise ValueError(
                f"does not match its record (fingerprint {fingerprint[:16]}… and epsilon "
                f"{self.randomiser.epsilon}, the record says {str(recorded[0])[:16]}… and "
                f"{recorded[1]}): the matrix or the record was modified"
            )

    @classmethod
    def restore(cls, stored: StoredStrategy) -> LocalStrategy:
        """The strategy from its record and ``Q`` (store entry or published artifact), checked:
        exactly ε-LDP and the record's fingerprint; ``ValueError`` otherwise."""
        record = dict(stored.parameters)
        try:
            randomiser = LDPStrategy(
                name=str(record["mechanism"]), Q=stored.arrays["Q"], epsilon=record["epsilon"]
            )
        except KeyError as exc:
            raise ValueError(f"has no {exc.args[0]!r} entry") from None
        except ValueError as exc:
            raise ValueError(f"is not an epsilon-LDP strategy: {exc}") from None
        return cls(randomiser=randomiser, parameters=record)

    def stored(self) -> StoredStrategy:
        """What :meth:`restore` reads back: the record and ``Q``."""
        return StoredStrategy(parameters=dict(self.parameters), arrays={"Q": self.randomiser.Q})

    def response_counts(self, counts: np.ndarray) -> ResponseCounts:
        """``counts[o]`` = number of users who sent response ``o`` of this strategy."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (self.num_queries,):
            raise ValueError(f"counts (shape {counts.shape}) must have {self.num_queries} entries")
        return ResponseCounts(
            counts=counts, num_responses=int(counts.sum()), strategy_fingerprint=self.fingerprint
        )

    @property
    def fingerprint(self) -> str:
        return str(self.parameters["fingerprint"])

    @property
    def epsilon(self) -> float:
        return self.randomiser.epsilon

    @property
    def cost(self) -> PrivacyCost:
        """What one collection costs each user: ε, pure (one response per user)."""
        return PrivacyCost(measure="pure", epsilon=self.epsilon)

    @property
    def num_queries(self) -> int:
        """Number of possible responses ``m`` (the measured "answers" are their counts)."""
        return self.randomiser.num_outputs

    def sensitivity(self, *, norm: int) -> float:
        """One user adds one response: the counts change by 1 in one entry (any norm)."""
        return 1.0

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``E[y] = Q x``: the expected response counts of users with cell counts ``x``."""
        return self.randomiser.Q @ np.asarray(x, dtype=np.float64)

    def answers(self, y: np.ndarray, workload: Workload) -> dict[str, np.ndarray]:
        operator = least_squares_operator(self.randomiser)
        return {item.name: _item_rows(item, operator)[1] @ y for item in workload.items}

    def item_unit_variances(self, item: WorkloadItem, workload: Workload) -> np.ndarray:
        """Per-query worst-case variance per user, ``max_u Σ_o V_io² Q_ou − W_iu²``. O(p n m)."""
        rows, V = _item_rows(item, least_squares_operator(self.randomiser))
        return ((V**2) @ self.randomiser.Q - rows**2).max(axis=1)

    def item_unit_total(self, item: WorkloadItem, workload: Workload) -> float:
        """Worst-case total variance per user of the item's queries (Cor 3.5). O(m n² + n³)."""
        return float(
            estimation.per_type_variance(gram_root(item.dense_gram()), self.randomiser).max()
        )

    def support_residual(self, workload: Workload) -> float:
        """``‖W N‖_F / ‖W‖_F`` with ``N`` a basis of Q's null space. O(m n² + n³)."""
        gram = workload.dense_gram()
        matrix = self.randomiser.Q
        eigenvalues, eigenvectors = np.linalg.eigh(matrix.T @ matrix)
        null = eigenvectors[:, eigenvalues <= eigenvalues.max() * matrix.shape[1] * 2.2e-16]
        total = float(np.trace(gram))
        outside = float(np.sum((null.T @ gram) * null.T))  # tr(Nᵀ G N), no cancellation
        return math.sqrt(max(outside, 0.0) / total) if total > 0 else 0.0


def gram_root(gram: np.ndarray) -> np.ndarray:
    """An ``n x n`` matrix ``R`` with ``RᵀR = G`` (eigen square root). O(n³).

    Every strategy-side quantity of :mod:`mechanisms.local` depends on W only through ``WᵀW`` (the
    optimiser, Thm 3.4 variances with the Thm 3.10 reconstruction, the row-space check) or through
    its singular values and Frobenius norm (Cor 5.7), which ``R`` shares; so ``R`` stands in for a
    workload of any number of queries.
    """
    eigenvalues, eigenvectors = np.linalg.eigh((gram + gram.T) / 2.0)
    return np.sqrt(np.clip(eigenvalues, 0.0, None))[:, None] * eigenvectors.T


def workload_root(workload: Workload) -> np.ndarray:
    """``R`` with ``RᵀR = WᵀW`` from the closed-form Grams, never forming W. O(items n² + n³)."""
    return gram_root(workload.dense_gram())


def summarize(root: np.ndarray, strategy: LDPStrategy) -> dict[str, float]:
    """Worst (Cor 3.5) and average (Cor 3.6) total variance per user, with Thm 3.10's V."""
    per_type = estimation.per_type_variance(root, strategy)  # O(m n^2 + n^3)
    return {
        "worst_variance": float(per_type.max()),
        "average_variance": float(per_type.mean()),
        "rows": strategy.num_outputs,
    }


def evaluate_baselines(
    root: np.ndarray, baselines: Mapping[str, LDPStrategy]
) -> dict[str, dict[str, float]]:
    """Variance per user of every baseline (one that cannot answer the workload, i.e. W outside
    its row space, is left out)."""
    results = {}
    for name, strategy in baselines.items():
        try:
            results[name] = summarize(root, strategy)
        except ValueError:
            continue
    return results


def describe(
    randomiser: LDPStrategy,
    *,
    workload: Workload,
    ordered: tuple[bool, ...],
    workload_fingerprint: str,
    settings: Mapping[str, Any],
    seconds: float,
    root: np.ndarray | None = None,
) -> LocalStrategy:
    """``randomiser`` with its public record: variances, Cor 5.7 bound, baselines, settings."""
    root = workload_root(workload) if root is None else root
    return LocalStrategy(
        randomiser=randomiser,
        parameters={
            "mechanism": NAME,
            "model": "local",
            "fingerprint": randomizer.strategy_fingerprint(randomiser),
            "epsilon": randomiser.epsilon,
            "domain_size": randomiser.domain_size,
            **summarize(root, randomiser),
            "lower_bound": estimation.lower_bound(root, epsilon=randomiser.epsilon),
            "baselines": evaluate_baselines(
                root,
                baselines.baseline_strategies(
                    workload.domain_shape, ordered, epsilon=randomiser.epsilon
                ),
            ),
            "settings": dict(settings),
            "optimizer": dict(randomiser.details),
            "workload_fingerprint": workload_fingerprint,
            "num_queries": workload.num_queries,
            "seconds": seconds,
            "variance_unit": VARIANCE_UNIT,
            "reconstruction": RECONSTRUCTION,
        },
    )


def optimizer_settings(request: PlanRequest) -> dict[str, Any]:
    """The spec's optimiser settings plus the random start's seed, a hash of public facts
    (workload fingerprint and ε), recorded so the strategy can be reproduced."""
    options = LocalOptions.parse(request.options)
    raw = f"{request.workload_fingerprint}:{request.target.epsilon!r}"
    seed = int(hashlib.sha256(raw.encode()).hexdigest()[:15], 16)
    return {**options.as_dict(), "seed": seed}


def strategy_key(request: PlanRequest) -> str:
    """Strategy-cache key: workload fingerprint, per-user ε, optimiser settings, version."""
    return cache_key(
        "local-strategy",
        STORE_VERSION,
        request.workload_fingerprint,
        request.target.epsilon,
        optimizer_settings(request),
    )


def collection_key(*, dataset_id: str, strategy_fingerprint: str, responses: str) -> str:
    """Released-cache key of one collection: dataset, strategy, keyed responses fingerprint."""
    return cache_key("local-collection", dataset_id, strategy_fingerprint, responses)


class LocalMechanism:
    name = NAME
    summary = (
        "local model: workload factorization strategy optimised for the workload (McKenna et al. "
        "2020, Problem 3.12), estimates with the reconstruction of Thm 3.10"
    )
    model = "local"
    data_independent = True
    input_kind = "responses"
    options = LocalOptions

    def unavailable_reason(self, request: PlanRequest) -> str | None:
        if request.target.measure != "pure":
            return "the local model needs privacy {epsilon} (the per-user epsilon)"
        n = request.workload.num_cells
        if n < 2:
            return f"the domain has {n} cell(s); local-model releases need >= 2"
        if n > MAX_LDP_CELLS:
            return (
                f"the domain has {n:,} cells; a local-model strategy is optimised over at most "
                f"{MAX_LDP_CELLS:,} cells (each step costs O(m n^2) with m = 4n)"
            )
        for item in request.workload.items:
            if item.num_queries * n > MAX_TABLE_ENTRIES:
                return (
                    f"workload item {item.name!r} has {item.num_queries:,} queries over {n:,} "
                    f"cells; a local-model release forms at most {MAX_TABLE_ENTRIES:,} query × "
                    "cell entries per item"
                )
        return None

    def predicted_seconds(self, request: PlanRequest) -> float:
        # Per step max(O(m n) projection passes, O(m n² + n³) algebra), single-threaded BLAS; the
        # constants: benchmarks/predict_bench.py --calibrate ldp.
        options = LocalOptions.parse(request.options)
        n = request.workload.num_cells
        step = max(
            2.5e-6 * n * n * options.rows_factor / 4, 1e-9 * (options.rows_factor + 1) * n**3
        )
        return 0.01 + options.iterations * step

    def plan(self, request: PlanRequest, *, cache: StrategyCache) -> LocalStrategy:
        reason = self.unavailable_reason(request)
        if reason is not None:
            raise CandidateUnavailable(reason)
        settings = optimizer_settings(request)
        epsilon = request.target.epsilon
        key = strategy_key(request)
        stored = cache.load(key)
        if stored is not None:
            try:
                return self.restore(stored)
            except (TypeError, ValueError):
                pass  # an unreadable or tampered entry is recomputed, never used
        workload = request.workload
        root = workload_root(workload)
        n = workload.num_cells
        if request.progress is not None:
            request.progress(
                0.0,
                f"optimising the LDP strategy: n = {n}, m = {settings['rows_factor'] * n}, "
                f"epsilon = {epsilon:g}, up to {settings['iterations']} steps",
            )
        started = time.perf_counter()
        randomiser = optimizer.optimize_strategy(
            root,
            epsilon=epsilon,
            rng=np.random.default_rng(settings["seed"]),  # public randomness: the random start
            rows=settings["rows_factor"] * n,
            iterations=settings["iterations"],
            tolerance=settings["tolerance"],
            progress=request.progress,
            # no time limit: the published Q must be reproducible from its recorded seed
        )
        strategy = describe(
            randomiser,
            workload=workload,
            ordered=request.ordered,
            workload_fingerprint=request.workload_fingerprint,
            settings=settings,
            seconds=time.perf_counter() - started,
            root=root,
        )
        cache.save(key, strategy.stored())
        return strategy

    def restore(self, stored: StoredStrategy) -> LocalStrategy:
        """A stored or published strategy of this mechanism (:meth:`LocalStrategy.restore`)."""
        return LocalStrategy.restore(stored)

    def evaluate(self, strategy: LocalStrategy, request: PlanRequest) -> Evaluation:
        record = strategy.parameters
        return Evaluation(
            cost=strategy.cost,
            total_variance=float(record["worst_variance"]),
            num_queries=request.workload.num_queries,
            note=(
                f"per user (N = 1), worst case over the users' items (Cor 3.5): N responses give "
                f"N times it; average case {record['average_variance']:.6g}, lower bound of any "
                f"epsilon-LDP factorization {record['lower_bound']:.6g} (Cor 5.7); "
                f"{strategy.num_queries} outputs"
            ),
        )

    def cost_due(
        self,
        strategy: LocalStrategy,
        *,
        dataset_id: str,
        input_fingerprint: str,
        released: StrategyCache,
    ) -> PrivacyCost:
        """What measuring this input will charge: zero when an earlier release already charged
        this collection (its receipt is reused), else ε per user.  Public facts only."""
        key = collection_key(
            dataset_id=dataset_id,
            strategy_fingerprint=strategy.fingerprint,
            responses=input_fingerprint,
        )
        return PrivacyCost.zero("pure") if released.load(key) is not None else strategy.cost

    def measure(
        self, strategy: LocalStrategy, data: ResponseCounts, *, context: MeasureContext
    ) -> Measurement:
        """Record the collection's ε per user once; the responses are the measurement.

        Privacy: the responses are ε-LDP when they arrive (randomised on the devices); this charges
        their cost to the dataset's ledger (atomically checked against the cap), once per
        collection.  Two releases racing on one new collection may both charge it (conservative,
        never under-counted).
        """
        if data.strategy_fingerprint != strategy.fingerprint:
            raise ValueError(
                f"the responses were counted for strategy {data.strategy_fingerprint[:16]}…, "
                f"not the planned {strategy.fingerprint[:16]}…"
            )
        if data.counts.size != strategy.num_queries:
            raise ValueError(
                f"counts has {data.counts.size} entries; the strategy has {strategy.num_queries}"
            )
        key = collection_key(
            dataset_id=context.dataset_id,
            strategy_fingerprint=strategy.fingerprint,
            responses=context.input_fingerprint,
        )
        stored = context.released.load(key)
        if stored is not None and not context.accountant.holds(
            str(stored.parameters["receipt_id"])
        ):
            stored = None  # its receipt is not on this catalog's ledger: charge again
        if stored is None:
            receipt = context.accountant.charge(
                strategy.cost, label=f"{context.label}: {COLLECTION_LABEL} [collection {key[:32]}]"
            )
            context.released.save(
                key,
                StoredStrategy(parameters={"receipt_id": receipt, "epsilon": strategy.epsilon}),
            )
            charged = strategy.cost
        else:
            receipt = str(stored.parameters["receipt_id"])
            charged = PrivacyCost.zero("pure")
        record = strategy.parameters
        n_responses = data.num_responses
        num_queries = int(record["num_queries"])

        def rmse(per_user: float) -> float:
            return math.sqrt(max(per_user, 0.0) * n_responses / num_queries)

        return Measurement(
            values=data.counts.astype(np.float64),
            noise=NoiseDescription(
                kind="client-side epsilon-LDP randomiser",
                scale=strategy.epsilon,
                sensitivity=1.0,
                size=n_responses,
                variance=float(record["worst_variance"]) * n_responses / num_queries,
                sampler="on users' devices (mechanisms.local.randomizer.randomize, OS entropy)",
            ),
            strategy=strategy,
            receipts=(receipt,),
            charged=charged,
            details={
                "epsilon_per_user": strategy.epsilon,
                "num_responses": n_responses,
                "strategy_fingerprint": strategy.fingerprint,
                "strategy_rows": strategy.num_queries,
                "domain_size": strategy.randomiser.domain_size,
                "promised_worst_variance_per_user": record["worst_variance"],
                "promised_average_variance_per_user": record["average_variance"],
                "lower_bound_per_user": record["lower_bound"],
                "expected_worst_rmse": rmse(record["worst_variance"]),
                "lower_bound_rmse": rmse(record["lower_bound"])
                if record["lower_bound"] > 0
                else None,
                "baselines": {
                    name: {
                        "worst_variance": b["worst_variance"],
                        "average_variance": b["average_variance"],
                        "worst_rmse": rmse(b["worst_variance"]),
                    }
                    for name, b in record["baselines"].items()
                },
                "collection_key": key,
                "collection_receipt": receipt,
                "collection_reused": stored is not None,
                "std_error": STD_ERROR,
            },
        )

    def reconstruct(
        self, measurement: Measurement, *, workload: Workload
    ) -> dict[str, ItemAnswers]:
        """Every item's ``V y`` and its variance estimate (post-processing of ε-LDP responses)."""
        strategy: LocalStrategy = measurement.strategy
        counts = measurement.values
        num_responses = round(float(counts.sum()))
        operator = least_squares_operator(strategy.randomiser)
        answers = {}
        for item in workload.items:
            estimate = estimate_item(item, strategy.randomiser, operator, counts)
            floor = rounding_floor(estimate.answers, num_responses, strategy.num_queries)
            answers[item.name] = ItemAnswers(
                estimates=estimate.answers, variances=np.maximum(estimate.variance, floor**2)
            )
        return answers


def least_squares_operator(strategy: LDPStrategy) -> np.ndarray:
    """``B = (Qᵀ D⁻¹ Q)⁺ Qᵀ D⁻¹`` (``n x m``), so that Thm 3.10's ``V = W B`` for every W in the
    row space of Q.  Needs Q of full column rank (every optimised strategy has it)."""
    return estimation.reconstruction(np.eye(strategy.domain_size), strategy)  # O(m n^2 + n^3)


def _item_rows(item: WorkloadItem, operator: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = _dense_rows(item, operator.shape[0])
    return rows, rows @ operator


def _dense_rows(item: WorkloadItem, n: int) -> np.ndarray:
    if item.num_queries * n > MAX_TABLE_ENTRIES:
        raise ValueError(
            f"workload item {item.name!r} has {item.num_queries:,} queries over {n:,} cells; at "
            f"most {MAX_TABLE_ENTRIES:,} query × cell entries per item"
        )
    return kron_dense(item.factors)  # O(p n)


def _chunks(rows: np.ndarray, num_outputs: int) -> Iterator[np.ndarray]:
    chunk = max(1, V_CHUNK_ENTRIES // max(num_outputs, 1))
    for start in range(0, rows.shape[0], chunk):
        yield rows[start : start + chunk]


def estimate_item(
    item: WorkloadItem, strategy: LDPStrategy, operator: np.ndarray, counts: np.ndarray
) -> estimation.LDPEstimate:
    """:func:`mechanisms.local.estimation.estimate` on the item's rows of ``V = W_item B``, a chunk of rows at
    a time.  Cost ``O(p n m)`` for the item's ``p`` queries; memory ``V_CHUNK_ENTRIES`` floats."""
    rows = _dense_rows(item, strategy.domain_size)
    parts = [
        estimation.estimate(counts, chunk @ operator)
        for chunk in _chunks(rows, strategy.num_outputs)
    ]
    return estimation.LDPEstimate(
        answers=np.concatenate([p.answers for p in parts]),
        variance=np.concatenate([p.variance for p in parts]),
        num_responses=parts[0].num_responses,
    )


def rounding_floor(item_answers: np.ndarray, num_responses: int, num_outputs: int) -> np.ndarray:
    """Floating-point error bound of ``V y``: ``m ε_mach (|answer| + N)``.

    A query the responses determine exactly (the total N, public in the local model) has zero
    sampling variance; its reported ``std_error`` is this rounding bound, so it stays > 0 as
    output validation requires.
    """
    return num_outputs * np.finfo(np.float64).eps * (np.abs(item_answers) + num_responses)


MECHANISM = LocalMechanism()
