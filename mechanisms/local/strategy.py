"""The local model's published strategy: the ε-LDP randomiser with its public record, and the
server-side answers and variances it gives (Thm 3.4, 3.10 of [McKenna20], see
:mod:`mechanisms.local`).

Every strategy-side quantity depends on the workload only through ``WᵀW`` or its singular values,
so a Gram root ``R`` (``RᵀR = WᵀW``) stands in for a workload of any number of queries."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dprelease.mechanisms.local import baselines, estimation, randomizer
from dprelease.mechanisms.local.randomizer import LDPStrategy
from dprelease.mechanisms.primitives.noise import NoiseKind
from dprelease.mechanisms.primitives.operators import kron_dense
from dprelease.mechanisms.primitives.privacy import PrivacyCost
from dprelease.mechanisms.primitives.protocol import StoredStrategy
from dprelease.mechanisms.primitives.workload import Workload, WorkloadItem

NAME = "optimized"
MAX_TABLE_ENTRIES = 25_000_000  # queries × cells of one item's dense rows (200 MB of float64)
V_CHUNK_ENTRIES = 4_000_000  # rows of V formed at a time
VARIANCE_UNIT = "total variance of all workload queries per user (N = 1)"
RECONSTRUCTION = "V = W (Q^T D^-1 Q)^+ Q^T D^-1 (McKenna et al. 2020, Thm 3.10)"


@dataclass(frozen=True, kw_only=True)
class ResponseCounts:
    """One collection's response counts ``y`` (``y_o`` = users who sent response ``o``): ε-LDP data
    (each user randomised their own item), kept out of logs and result storage anyway."""

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

    def sensitivity(self, *, noise: NoiseKind) -> float:
        """One user adds one response: the counts change by 1 in one entry (any norm)."""
        return 1.0

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``E[y] = Q x``: the expected response counts of users with cell counts ``x``."""
        return self.randomiser.Q @ np.asarray(x, dtype=np.float64)

    def answers(self, y: np.ndarray, workload: Workload) -> dict[str, np.ndarray]:
        operator = least_squares_operator(self.randomiser)
        n = self.randomiser.domain_size
        return {item.name: _dense_rows(item, n) @ operator @ y for item in workload.items}

    def item_unit_variances(self, item: WorkloadItem, workload: Workload) -> np.ndarray:
        """Per-query worst-case variance per user, ``max_u Σ_o V_io² Q_ou − W_iu²``. O(p n m)."""
        rows = _dense_rows(item, self.randomiser.domain_size)
        V = rows @ least_squares_operator(self.randomiser)
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
    """An ``n x n`` matrix ``R`` with ``RᵀR = G`` (eigen square root). O(n³)."""
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


def least_squares_operator(strategy: LDPStrategy) -> np.ndarray:
    """``B = (Qᵀ D⁻¹ Q)⁺ Qᵀ D⁻¹`` (``n x m``), so that Thm 3.10's ``V = W B`` for every W in the
    row space of Q.  Needs Q of full column rank (every optimised strategy has it)."""
    return estimation.reconstruction(np.eye(strategy.domain_size), strategy)  # O(m n^2 + n^3)


def _dense_rows(item: WorkloadItem, n: int) -> np.ndarray:
    if item.num_queries * n > MAX_TABLE_ENTRIES:
        raise ValueError(
            f"workload item {item.name!r} has {item.num_queries:,} queries over {n:,} cells; at "
            f"most {MAX_TABLE_ENTRIES:,} query × cell entries per item"
        )
    return kron_dense(item.factors)  # O(p n)


def estimate_item(
    item: WorkloadItem, strategy: LDPStrategy, operator: np.ndarray, counts: np.ndarray
) -> estimation.LDPEstimate:
    """:func:`mechanisms.local.estimation.estimate` on the item's rows of ``V = W_item B``, a chunk
    of rows at a time.  Cost ``O(p n m)`` for the item's ``p`` queries; memory ``V_CHUNK_ENTRIES`` floats."""
    rows = _dense_rows(item, strategy.domain_size)
    chunk = max(1, V_CHUNK_ENTRIES // max(strategy.num_outputs, 1))
    parts = [
        estimation.estimate(counts, rows[start : start + chunk] @ operator)
        for start in range(0, rows.shape[0], chunk)
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
