"""Privacy arithmetic: costs under an explicit measure, composition, and conversion between measures.

Three accounting measures are supported:

* ``pure``: ε-differential privacy (Laplace noise, L1 sensitivity);
* ``zcdp``: ρ-zero-concentrated DP (Gaussian noise, L2 sensitivity);
* ``approx``: (ε, δ)-differential privacy (Gaussian noise calibrated through zCDP).

Costs compose by addition within one measure.  Converting between measures uses only the standard,
one-way implications: ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4) and ε-DP ⇒ (ε, 0)-DP.
Nothing converts *into* pure DP, and zCDP is not silently turned into (ε, δ).

Neighbouring relation throughout: add or remove one privacy unit (a person, with at most
``max_rows`` rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Literal

Measure = Literal["pure", "zcdp", "approx"]
MEASURES: tuple[Measure, ...] = ("pure", "zcdp", "approx")
COMPONENTS = ("epsilon", "rho", "delta")


def check_epsilon(value: object, *, name: str = "epsilon") -> float:
    """``value`` as a float if it is a finite real number > 0; ``ValueError`` otherwise.

    The one rule for an ε a mechanism is asked to spend: a zero, negative, infinite or NaN ε would
    give infinite, negative or undefined noise scales; it is refused before any scale is computed.

    Examples
    --------
    >>> check_epsilon(0.5)
    0.5
    >>> check_epsilon(0, name="measurement_epsilon")
    Traceback (most recent call last):
    ...
    ValueError: measurement_epsilon (0) must be finite and > 0
    """
    if not isinstance(value, Real):
        raise ValueError(f"{name} ({value!r}) must be a real number")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} ({value}) must be finite and > 0")
    return float(value)


class PrivacyError(Exception):
    """Base class of privacy-accounting errors."""


class MeasureMismatchError(PrivacyError):
    """A cost cannot be expressed in the measure of the budget it is charged to."""


class BudgetExceededError(PrivacyError):
    """A charge would take a dataset over its lifetime cap."""


@dataclass(frozen=True, kw_only=True)
class PrivacyCost:
    """A privacy cost in one measure.

    Only the fields of ``measure`` are meaningful: ``epsilon`` for pure, ``rho`` for zCDP,
    ``epsilon`` and ``delta`` for approx.  Costs of one measure add up (sequential composition):

    >>> (PrivacyCost(measure="pure", epsilon=0.25) + PrivacyCost(measure="pure", epsilon=0.75)).epsilon
    1.0
    """

    measure: Measure
    epsilon: float = 0.0
    rho: float = 0.0
    delta: float = 0.0

    def __post_init__(self) -> None:
        if self.measure not in MEASURES:
            raise ValueError(f"measure ({self.measure!r}) must be one of {MEASURES}")
        for name in COMPONENTS:
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} ({value}) must be finite and >= 0")
        if self.delta >= 1:
            raise ValueError(f"delta ({self.delta}) must be < 1")
        if self.measure == "pure" and (self.rho or self.delta):
            raise ValueError("a pure-DP cost has only epsilon (rho and delta must be 0)")
        if self.measure == "zcdp" and (self.epsilon or self.delta):
            raise ValueError("a zCDP cost has only rho (epsilon and delta must be 0)")
        if self.measure == "approx" and self.rho:
            raise ValueError("an (epsilon, delta) cost has no rho")

    @classmethod
    def zero(cls, measure: Measure) -> PrivacyCost:
        return cls(measure=measure)

    def __add__(self, other: PrivacyCost) -> PrivacyCost:
        if other.measure != self.measure:
            raise MeasureMismatchError(
                f"cannot add a {other.measure} cost to a {self.measure} cost; convert first"
            )
        return PrivacyCost(
            measure=self.measure, **{n: getattr(self, n) + getattr(other, n) for n in COMPONENTS}
        )

    def exceeds(self, cap: PrivacyCost, *, tolerance: float = 1e-12) -> bool:
        """True when any component of this cost is above the same component of ``cap``."""
        if cap.measure != self.measure:
            raise MeasureMismatchError(
                f"cannot compare a {self.measure} cost with a {cap.measure} cap"
            )
        return any(
            getattr(self, name) > getattr(cap, name) * (1 + tolerance) + tolerance
            for name in COMPONENTS
        )

    def remaining(self, cap: PrivacyCost) -> PrivacyCost:
        """``cap`` minus this (spent) cost, floored at zero per component."""
        if cap.measure != self.measure:
            raise MeasureMismatchError(
                f"cannot subtract a {self.measure} cost from a {cap.measure} cap"
            )
        return PrivacyCost(
            measure=cap.measure,
            **{n: max(getattr(cap, n) - getattr(self, n), 0.0) for n in COMPONENTS},
        )

    def as_dict(self) -> dict[str, float]:
        """The meaningful components, e.g. ``{"epsilon": 1.0}`` or ``{"rho": 0.5}``."""
        if self.measure == "pure":
            return {"epsilon": self.epsilon}
        if self.measure == "zcdp":
            return {"rho": self.rho}
        return {"epsilon": self.epsilon, "delta": self.delta}

    def describe(self) -> str:
        return ", ".join(f"{k}={v:.6g}" for k, v in self.as_dict().items())


def cost_from_dict(values: dict[str, float]) -> PrivacyCost:
    """Build a cost from the spec form: ``{epsilon}``, ``{rho}`` or ``{epsilon, delta}``."""
    keys = set(values)
    if keys == {"epsilon"}:
        return PrivacyCost(measure="pure", epsilon=float(values["epsilon"]))
    if keys == {"rho"}:
        return PrivacyCost(measure="zcdp", rho=float(values["rho"]))
    if keys == {"epsilon", "delta"}:
        return PrivacyCost(
            measure="approx", epsilon=float(values["epsilon"]), delta=float(values["delta"])
        )
    raise ValueError(
        f"privacy keys {sorted(keys)} must be exactly one of: {{epsilon}}, {{rho}}, {{epsilon, delta}}"
    )


def convert(cost: PrivacyCost, *, to: Measure) -> PrivacyCost:
    """Express ``cost`` in measure ``to`` using only sound one-way implications.

    ε-DP ⇒ (ε²/2)-zCDP and ε-DP ⇒ (ε, 0)-DP.  Anything else raises :class:`MeasureMismatchError`.
    """
    if cost.measure == to:
        return cost
    if cost.measure == "pure" and to == "zcdp":
        return PrivacyCost(measure="zcdp", rho=cost.epsilon**2 / 2)
    if cost.measure == "pure" and to == "approx":
        return PrivacyCost(measure="approx", epsilon=cost.epsilon, delta=0.0)
    raise MeasureMismatchError(
        f"a {cost.measure} cost ({cost.describe()}) cannot be charged to a {to} budget: "
        "only pure epsilon converts to zCDP or (epsilon, delta)"
    )


def rho_for_epsilon_delta(*, epsilon: float, delta: float) -> float:
    """Largest ρ whose classic zCDP→(ε,δ) conversion ε = ρ + 2√(ρ ln(1/δ)) meets the target.

    Used only as the starting point of the Gaussian calibration; the charged (ε, δ) is what the
    OpenDP measurement's map reports (its conversion is tighter).
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon ({epsilon}) must be > 0")
    if not 0 < delta < 1:
        raise ValueError(f"delta ({delta}) must be in (0, 1)")
    log_term = math.log(1 / delta)
    return (math.sqrt(log_term + epsilon) - math.sqrt(log_term)) ** 2
