"""Inside ``catalog/ledger/`` imports point one way, and the ledger needs little of the rest.

Each ledger module belongs to a layer and imports ledger modules of earlier layers only (lazy
imports count, as in ``test_layering``); outside the ledger it imports only :data:`OUTSIDE`.
The package's ``__init__`` is documentation and imports nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.architecture.test_layering import ROOT, _all_modules, _imported_modules, _module_name

LEDGER = ROOT / "catalog" / "ledger"
LAYERS: tuple[tuple[str, ...], ...] = (
    ("database", "chain", "names", "leases"),  # no other ledger module
    ("schema",),  # tables and migrations: chain digests, URL redaction
    ("spending", "pg_roles"),  # sums over the ledger table; PostgreSQL roles' SQL
    ("budget",),  # Ledger: datasets, caps, charges, the integrity check
    ("store",),  # Catalog(Ledger): releases and reviews
)
OUTSIDE = frozenset(
    {
        "dprelease.catalog.errors",  # CatalogError, BudgetExceededError
        "dprelease.catalog.home",  # where the default SQLite catalog lives
        "dprelease.catalog.keys",  # the catalog key and the chain's anchor
        "dprelease.catalog.processes",  # is a lease owner alive
        "dprelease.mechanisms.primitives.privacy",  # PrivacyCost and its conversions
    }
)


def _layer(name: str) -> int:
    return next(k for k, layer in enumerate(LAYERS) if name in layer)


def ledger_import_problems(path: Path, known: set[str]) -> list[str]:
    """What ``path`` (a module of the ledger) imports against the rules above."""
    imported = _imported_modules(path, known)
    if path.stem == "__init__":
        return [f"imports {name}" for name in sorted(imported)]
    problems = []
    for name in sorted(imported):
        if name.startswith("dprelease.catalog.ledger."):
            other = name.removeprefix("dprelease.catalog.ledger.")
            if _layer(other) >= _layer(path.stem):
                problems.append(f"imports {name}, which is not in an earlier layer")
        elif name not in OUTSIDE:
            problems.append(f"imports {name}, which the ledger does not need")
    return problems


def _known() -> set[str]:
    return {_module_name(path) for _, path in _all_modules()}


@pytest.mark.parametrize("path", sorted(LEDGER.glob("*.py")), ids=lambda path: path.name)
def test_ledger_imports_point_one_way(path: Path) -> None:
    assert ledger_import_problems(path, _known()) == []


def test_every_ledger_module_has_a_layer() -> None:
    modules = {path.stem for path in LEDGER.glob("*.py")} - {"__init__"}
    assert modules == {name for layer in LAYERS for name in layer}


def test_the_ledger_layering_check_can_fail(tmp_path: Path) -> None:
    module = tmp_path / "schema.py"
    module.write_text(
        "from dprelease.catalog.ledger.chain import GENESIS\n"
        "def f():\n"
        "    from dprelease.catalog.ledger.store import Catalog\n"
        "from dprelease.catalog import spec\n"
    )
    known = {
        "dprelease.catalog.ledger.chain",
        "dprelease.catalog.ledger.store",
        "dprelease.catalog.spec",
    }
    assert ledger_import_problems(module, known) == [
        "imports dprelease.catalog.ledger.store, which is not in an earlier layer",
        "imports dprelease.catalog.spec, which the ledger does not need",
    ]
