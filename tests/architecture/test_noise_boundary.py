"""Only the choke point adds noise to confidential values: the vetted sampler is reached nowhere else.

Checked by reading the source of ``mechanisms/``, ``catalog/``, ``tasks/`` and ``flows/``: the
names ``production_sampler`` and ``OpenDPSampler`` (the only ways to obtain the vetted sampler)
appear only in ``mechanisms/noise.py`` (which defines them) and ``mechanisms/choke_point.py``
(``ProtectedCells`` and ``ProtectedMarginals``, which charge the ledger before calling them).
Mechanisms that draw noise themselves (DAWA's selector, LRM's helpers) get the sampler as an
argument from the choke point.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mechanisms", "catalog", "tasks", "flows")
SAMPLER_NAMES = {"production_sampler", "OpenDPSampler"}
ALLOWED = {"mechanisms/noise.py", "mechanisms/choke_point.py"}


def _sampler_references(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.ImportFrom):
            hits = [alias.name for alias in node.names if alias.name in SAMPLER_NAMES]
            found += [f"line {node.lineno}: imports {hit}" for hit in hits]
        if name in SAMPLER_NAMES:
            found.append(f"line {node.lineno}: {name}")
    return found


def _files() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_vetted_sampler_is_reached_only_through_the_choke_point(path: Path) -> None:
    if str(path.relative_to(ROOT)) in ALLOWED:
        return
    found = _sampler_references(path)
    assert not found, f"{path.relative_to(ROOT)} reaches the noise sampler directly: {found}"


def test_the_choke_point_classes_draw_noise() -> None:
    source = (ROOT / "mechanisms" / "choke_point.py").read_text()
    tree = ast.parse(source)
    users = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and _sampler_references_in(node)
    }
    assert users == {"ProtectedCells", "ProtectedMarginals"}


def _sampler_references_in(node: ast.AST) -> bool:
    return any(
        isinstance(child, ast.Attribute) and child.attr == "production_sampler"
        for child in ast.walk(node)
    )


def test_the_boundary_check_can_fail(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text(
        "from mechanisms.noise import production_sampler\n"
        "from mechanisms import noise\n"
        "noise.production_sampler().add_laplace(x, scale=1.0)\n"
    )
    assert _sampler_references(module) == [
        "line 1: imports production_sampler",
        "line 3: production_sampler",
    ]
