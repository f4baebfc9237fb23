"""Inside ``catalog/`` the subpackages import one way: from the shared basics up to the release.

Each catalog module belongs to a layer (by its subpackage, or its own name at the top level) and
imports catalog modules of its own subpackage or of earlier layers only; lazy imports count, as
in ``test_layering``.  The order is the order a release uses them: what the ledger and the spec
need, then planning (public information only), the confidential boundary, publishing,
validation, review, and the release stages that run them all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.architecture.test_layering import ROOT, _all_modules, _imported_modules, _module_name

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "home", "processes"),
    ("keys", "engine"),  # the catalog key; where a release runs
    ("ledger",),
    ("spec", "watch_state"),
    ("planning",),  # from public information only
    ("confidential",),  # the only code that reads rows or holds true counts
    ("publishing",),
    ("identity",),  # keys, DSSE envelopes, in-toto statements over a release directory
    ("validation",),
    ("review",),
    ("partitions", "show"),  # which partitions a release reads; everything about one release
    ("release", "series"),  # the stage functions the tasks wrap (a series' period: series)
    ("series_audit",),  # show, budget and verify of a series
)


def _group(module: str) -> str:
    """``ledger`` for ``dprelease.catalog.ledger.store``, ``keys`` for ``dprelease.catalog.keys``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""  # "" is the package's own __init__


def _layer(group: str) -> int:
    return next(k for k, layer in enumerate(LAYERS) if group in layer)


def catalog_import_problems(path: Path, known: set[str]) -> list[str]:
    """What ``path`` (a catalog module) imports against the order of :data:`LAYERS`."""
    own = _group(_module_name(path))
    if own == "":
        return [f"imports {name}" for name in sorted(_imported_modules(path, known))]
    problems = []
    for name in sorted(_imported_modules(path, known)):
        if not name.startswith("dprelease.catalog.") or _group(name) == own:
            continue
        if _layer(_group(name)) >= _layer(own):
            problems.append(f"imports {name}, which is not in an earlier layer than {own}")
    return problems


def _catalog_modules() -> list[Path]:
    return sorted(path for _, path in _all_modules() if path.is_relative_to(ROOT / "catalog"))


def _known() -> set[str]:
    return {_module_name(path) for _, path in _all_modules()}


@pytest.mark.parametrize("path", _catalog_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_catalog_imports_point_one_way(path: Path) -> None:
    assert catalog_import_problems(path, _known()) == []


def test_every_catalog_module_has_a_layer() -> None:
    groups = {_group(_module_name(path)) for path in _catalog_modules()} - {""}
    assert groups <= {group for layer in LAYERS for group in layer}


def test_the_catalog_layering_check_can_fail(tmp_path: Path, monkeypatch) -> None:
    ledger = tmp_path / "catalog" / "ledger"
    ledger.mkdir(parents=True)
    module = ledger / "store.py"
    module.write_text(
        "from dprelease.catalog.keys import catalog_key\n"
        "def f():\n"
        "    from dprelease.catalog.review import decisions\n"
    )
    import tests.architecture.test_layering as layering

    monkeypatch.setattr(layering, "ROOT", tmp_path)
    known = {"dprelease.catalog.keys", "dprelease.catalog.review.decisions"}
    assert catalog_import_problems(module, known) == [
        "imports dprelease.catalog.review.decisions, which is not in an earlier layer than ledger"
    ]
