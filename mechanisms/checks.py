"""Validation of privacy parameters shared by every mechanism.

One rule for an ε a mechanism is asked to spend: a real number, finite and > 0.  A zero, negative,
infinite or NaN ε would give infinite, negative or undefined noise scales; it is refused before
any scale is computed.  The message names the parameter, its value and the rule.
"""

from __future__ import annotations

import math
from numbers import Real


def check_epsilon(value: object, *, name: str = "epsilon") -> float:
    """``value`` as a float if it is a finite real number > 0; ``ValueError`` otherwise.

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
