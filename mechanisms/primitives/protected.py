"""What mechanisms see of the confidential boundary: protocols and the public measurement record.

The implementation (the true counts, the ledger charge, the noise) is
:mod:`catalog.confidential.choke_point`; ``mechanisms/`` imports no catalog code, so a mechanism
is written against these protocols and is handed the protected input at measure time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dprelease.mechanisms.primitives.noise import NoiseKind, NoiseMechanism
from dprelease.mechanisms.primitives.privacy import PrivacyCost


class Accountant(Protocol):
    """Charges privacy costs durably; raises ``BudgetExceededError`` instead of overspending."""

    def charge(self, cost: PrivacyCost, *, label: str) -> str:
        """Record ``cost`` (committed before returning) and return the receipt id."""

    def holds(self, receipt_id: str) -> bool:
        """True when ``receipt_id`` is a charge on this dataset's ledger (a reusable payment)."""


class MeasurableStrategy(Protocol):
    """What the choke point needs from a strategy: its public shape, sensitivity and ``A·x``."""

    name: str

    @property
    def num_queries(self) -> int: ...

    def sensitivity(self, *, noise: NoiseKind) -> float: ...

    def apply(self, x: np.ndarray) -> np.ndarray: ...


class MarginalMeasurableStrategy(Protocol):
    """What the choke point needs from a strategy measured marginal by marginal.

    ``marginal_subsets`` lists, in answer order, the attribute subsets (ascending axis tuples) the
    strategy reads; ``term_answers(axes, table)`` is that term's answers computed from the
    ``axes``-marginal alone (confidential in, confidential out).
    """

    name: str

    @property
    def num_queries(self) -> int: ...

    @property
    def marginal_subsets(self) -> tuple[tuple[int, ...], ...]: ...

    def sensitivity(self, *, noise: NoiseKind) -> float: ...

    def term_answers(self, axes: tuple[int, ...], table: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, kw_only=True)
class NoisyMeasurement:
    """Public output of one measurement: noisy strategy answers and how they were made."""

    label: str
    strategy_name: str
    values: np.ndarray
    noise: NoiseMechanism
    receipt_id: str
