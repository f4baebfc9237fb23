"""The examples in the reference implementations' docstrings run (they moved out of mechanisms/,
whose examples tests/architecture/test_doctests.py runs)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[1] / "reference"
MODULES = sorted(f"tests.reference.{path.stem}" for path in REFERENCE.glob("[!_]*.py"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
