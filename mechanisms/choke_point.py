"""The one place confidential cell counts live during a run, and the only path from them to noise.

:class:`ProtectedCells` holds the true cell vector in a private attribute with no accessor.  Its
:meth:`~ProtectedCells.measure` runs in a fixed order, which is the privacy argument:

1. sensitivity of the strategy (L1 for Laplace, L2 for Gaussian) × the contribution bound;
2. noise scale and cost from one :class:`~mechanisms.noise.NoiseMechanism`;
3. the accountant charges that cost (and may refuse) — **before** the data is touched;
4. only then ``A·x`` is computed and noised by the production sampler.

The object refuses pickling and redacts its ``repr``, so it cannot reach Prefect result storage,
logs or another process by accident.  :class:`ProtectedMarginals` is the same choke point for
domains too large for a cell vector: it holds only the confidential marginal tables a plan needs
and measures in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from mechanisms import noise
from mechanisms.noise import NoiseMechanism, calibrate, noise_kind_for
from mechanisms.privacy import PrivacyCost

T = TypeVar("T")


class Accountant(Protocol):
    """Charges privacy costs durably; raises ``BudgetExceededError`` instead of overspending."""

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        """Record ``cost`` (committed before returning) and return the receipt id."""
        ...

    def holds(self, receipt_id: str) -> bool:
        """True when ``receipt_id`` is a charge on this dataset's ledger (a reusable payment)."""
        ...


class MeasurableStrategy(Protocol):
    """What a session needs from a strategy: its public shape, sensitivity and ``A·x``."""

    name: str

    @property
    def num_queries(self) -> int: ...

    def sensitivity(self, *, norm: int) -> float: ...

    def apply(self, x: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, kw_only=True)
class NoisyMeasurement:
    """Public output of one measurement: noisy strategy answers and how they were made."""

    label: str
    strategy_name: str
    values: np.ndarray
    noise: NoiseMechanism
    receipt_id: str


class ProtectedCells:
    """Confidential cell counts over a public domain.

    The counts have no accessor and never print:

    >>> ProtectedCells([3.0, 4.0], domain_shape=(2,), contribution_bound=1)
    ProtectedCells(domain_shape=(2,), values=<redacted>)

    Parameters
    ----------
    cells:
        The true count per cell (row-major over ``domain_shape``).
    contribution_bound:
        Most rows one privacy unit can contribute (after bounding); multiplies every sensitivity.
    """

    def __init__(
        self, cells: np.ndarray, *, domain_shape: tuple[int, ...], contribution_bound: int
    ) -> None:
        cells = np.asarray(cells, dtype=np.float64).ravel()
        if cells.size != math.prod(domain_shape):
            raise ValueError(
                f"cells has {cells.size} entries but the domain {domain_shape} has a different size"
            )
        if contribution_bound < 1:
            raise ValueError(f"contribution_bound ({contribution_bound}) must be >= 1")
        self.__cells = cells
        self.domain_shape = tuple(domain_shape)
        self.contribution_bound = int(contribution_bound)

    def measure(
        self,
        strategy: MeasurableStrategy,
        *,
        target: PrivacyCost,
        accountant: Accountant,
        label: str,
    ) -> NoisyMeasurement:
        """Charge, then release ``A·x`` + noise calibrated to ``target`` (see module docstring)."""
        norm = 1 if noise_kind_for(target.measure) == "laplace" else 2
        sensitivity = strategy.sensitivity(norm=norm) * self.contribution_bound
        mechanism = calibrate(target=target, sensitivity=sensitivity, size=strategy.num_queries)
        receipt_id = accountant.charge(mechanism.cost, label=label)  # privacy: charge before noise
        answers = strategy.apply(self.__cells)
        noisy = mechanism.apply(answers, sampler=noise.production_sampler())
        return NoisyMeasurement(
            label=label,
            strategy_name=strategy.name,
            values=noisy,
            noise=mechanism,
            receipt_id=receipt_id,
        )

    def select(
        self,
        selector: Callable[[np.ndarray, noise.NoiseSampler], T],
        *,
        cost: PrivacyCost,
        accountant: Accountant,
        label: str,
    ) -> tuple[T, str]:
        """Charge ``cost``, then run a private ``selector(cells, sampler)`` and return its public output.

        The selector (e.g. DAWA's private partition) must itself satisfy ``cost`` for the
        contribution bound of this session; the caller is responsible for passing the bound in.
        """
        receipt_id = accountant.charge(
            cost, label=label
        )  # privacy: charge before the selector runs
        return selector(self.__cells.copy(), noise.production_sampler()), receipt_id

    def __repr__(self) -> str:
        return f"ProtectedCells(domain_shape={self.domain_shape}, values=<redacted>)"

    def __reduce__(self) -> Any:
        raise TypeError("ProtectedCells holds confidential data and cannot be pickled or persisted")

    def __getstate__(self) -> Any:
        raise TypeError("ProtectedCells holds confidential data and cannot be pickled or persisted")


class MarginalMeasurableStrategy(Protocol):
    """What :class:`ProtectedMarginals` needs from a strategy measured marginal by marginal.

    ``marginal_subsets`` lists, in answer order, the attribute subsets (ascending axis tuples) the
    strategy reads; ``term_answers(axes, table)`` is that term's answers computed from the
    ``axes``-marginal alone (confidential in, confidential out).
    """

    name: str

    @property
    def num_queries(self) -> int: ...

    @property
    def marginal_subsets(self) -> tuple[tuple[int, ...], ...]: ...

    def sensitivity(self, *, norm: int) -> float: ...

    def term_answers(self, axes: tuple[int, ...], table: np.ndarray) -> np.ndarray: ...


class ProtectedMarginals:
    """Confidential marginal tables over a public domain: the counts of each attribute subset.

    The marginal-space counterpart of :class:`ProtectedCells`, for domains whose full cell vector
    is never formed.  Tables are keyed by ascending axis tuples (``()`` is the total count), held
    read-only in a private attribute with no accessor, and never print:

    >>> ProtectedMarginals({(0,): [3.0, 4.0]}, domain_shape=(2, 3), contribution_bound=1)
    ProtectedMarginals(domain_shape=(2, 3), subsets=((0,),), values=<redacted>)

    :meth:`measure` keeps :class:`ProtectedCells`' order (the privacy argument): sensitivity ×
    contribution bound, one noise mechanism for the whole strategy, the accountant's charge, and
    only then the answers, computed marginal by marginal, noised by the production sampler.

    Privacy: every table must come from the same contribution-bounded rows, so one privacy unit
    changes each table by at most ``contribution_bound`` in L1; a strategy's sensitivity (column
    norms of its stacked terms over the full domain) then bounds the change of all its answers.
    """

    def __init__(
        self,
        tables: Mapping[tuple[int, ...], Any],
        *,
        domain_shape: tuple[int, ...],
        contribution_bound: int,
    ) -> None:
        if contribution_bound < 1:
            raise ValueError(f"contribution_bound ({contribution_bound}) must be >= 1")
        shape = tuple(int(n) for n in domain_shape)
        stored: dict[tuple[int, ...], np.ndarray] = {}
        for key, values in tables.items():
            axes = tuple(int(a) for a in key)
            if list(axes) != sorted(set(axes)) or any(not 0 <= a < len(shape) for a in axes):
                raise ValueError(
                    f"marginal key {key!r} must be strictly increasing axes in [0, {len(shape)})"
                )
            table = np.array(values, dtype=np.float64)
            sizes = tuple(shape[a] for a in axes)
            if table.size != math.prod(sizes):
                raise ValueError(
                    f"the table for axes {axes} has {table.size} entries; its marginal has "
                    f"{math.prod(sizes)} cells {sizes}"
                )
            table = table.reshape(sizes)
            table.setflags(write=False)
            stored[axes] = table
        self.__tables = stored
        self.domain_shape = shape
        self.contribution_bound = int(contribution_bound)

    @property
    def subsets(self) -> tuple[tuple[int, ...], ...]:
        """The attribute subsets held (public: they come from the plan)."""
        return tuple(self.__tables)

    def measure(
        self,
        strategy: MarginalMeasurableStrategy,
        *,
        target: PrivacyCost,
        accountant: Accountant,
        label: str,
    ) -> NoisyMeasurement:
        """Charge, then release the strategy's answers + noise calibrated to ``target``.

        A strategy that reads a marginal not held here is refused before anything is charged.
        Cost: O(Σ marginal sizes) for the answers, plus the sampler's O(answers).
        """
        missing = [axes for axes in strategy.marginal_subsets if axes not in self.__tables]
        if missing:
            raise ValueError(
                f"strategy {strategy.name!r} reads marginals {missing} that were not counted"
            )
        norm = 1 if noise_kind_for(target.measure) == "laplace" else 2
        sensitivity = strategy.sensitivity(norm=norm) * self.contribution_bound
        mechanism = calibrate(target=target, sensitivity=sensitivity, size=strategy.num_queries)
        receipt_id = accountant.charge(mechanism.cost, label=label)  # privacy: charge before noise
        answers = np.concatenate(
            [
                np.ravel(strategy.term_answers(axes, self.__tables[axes]))
                for axes in strategy.marginal_subsets
            ]
        )
        noisy = mechanism.apply(answers, sampler=noise.production_sampler())
        return NoisyMeasurement(
            label=label,
            strategy_name=strategy.name,
            values=noisy,
            noise=mechanism,
            receipt_id=receipt_id,
        )

    def __repr__(self) -> str:
        return (
            f"ProtectedMarginals(domain_shape={self.domain_shape}, subsets={self.subsets}, "
            "values=<redacted>)"
        )

    def __reduce__(self) -> Any:
        raise TypeError(
            "ProtectedMarginals holds confidential data and cannot be pickled or persisted"
        )

    def __getstate__(self) -> Any:
        raise TypeError(
            "ProtectedMarginals holds confidential data and cannot be pickled or persisted"
        )
