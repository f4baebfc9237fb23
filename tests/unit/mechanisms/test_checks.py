"""mechanisms.primitives.privacy.check_epsilon: the one privacy-parameter check fires on every bad value, naming it."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest

from dprelease.mechanisms.primitives.privacy import check_epsilon


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.5, 0.5), (2, 2.0), (np.float64(0.25), 0.25), (np.int64(3), 3.0), (Fraction(1, 4), 0.25)],
    ids=["float", "int", "numpy-float", "numpy-int", "fraction"],
)
def test_a_finite_positive_real_is_returned_as_a_float(value: object, expected: float) -> None:
    result = check_epsilon(value)
    assert result == expected and type(result) is float


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0.0, "epsilon (0.0) must be finite and > 0"),
        (0, "epsilon (0) must be finite and > 0"),
        (-1.0, "epsilon (-1.0) must be finite and > 0"),
        (math.inf, "epsilon (inf) must be finite and > 0"),
        (math.nan, "epsilon (nan) must be finite and > 0"),
        ("one", "epsilon ('one') must be a real number"),
        (None, "epsilon (None) must be a real number"),
        (np.array([1.0]), "epsilon (array([1.])) must be a real number"),
    ],
    ids=["zero", "int-zero", "negative", "inf", "nan", "string", "none", "array"],
)
def test_every_bad_value_is_refused_with_its_value_and_the_rule(
    value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_epsilon(value)


def test_the_message_names_the_parameter() -> None:
    with pytest.raises(
        ValueError, match=re.escape("measurement_epsilon (-2.0) must be finite and > 0")
    ):
        check_epsilon(-2.0, name="measurement_epsilon")
