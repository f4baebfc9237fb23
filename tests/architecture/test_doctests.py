"""The examples in the pure core's docstrings run (and stay true)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(
    [
        *(
            ".".join(("dprelease", *path.relative_to(ROOT).with_suffix("").parts))
            for path in (ROOT / "mechanisms").rglob("*.py")
            if path.name != "__init__.py"
        ),
        "dprelease.catalog.confidential.choke_point",
    ]
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_core_has_examples() -> None:
    attempted = 0
    for name in (
        "dprelease.mechanisms.primitives.protocol",
        "dprelease.mechanisms.registry",
        "dprelease.catalog.confidential.choke_point",
    ):
        attempted += doctest.testmod(importlib.import_module(name)).attempted
    assert attempted >= 4
