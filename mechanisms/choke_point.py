"""The one place confidential cell counts live during a run, and the only path from them to noise.

:class:`ProtectedCells` holds the true cell vector in a private attribute with no accessor.  Its
:meth:`~ProtectedCells.measure` runs in a fixed order, which is the privacy argument:

1. sensitivity of the strategy (L1 for Laplace, L2 for Gaussian) × the contribution bound;
2. noise scale and cost from one :class:`~mechanisms.noise.NoiseMechanism`;
3. the accountant charges that cost (and may refuse) — **before** the data is touched;
4. only then ``A·x`` is computed and noised by the production sampler.

The object refuses pickling and redacts its ``repr``, so it cannot reach Prefect result storage,
logs or another process by accident.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
