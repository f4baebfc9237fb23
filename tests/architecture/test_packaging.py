"""One import package: the repository's folders install under ``dprelease`` and nothing else.

``pyproject.toml`` maps ``flows``, ``tasks``, ``catalog`` and ``mechanisms`` to ``dprelease.*``
(setuptools ``package-dir``), so an installed dprelease claims one name in site-packages.  Checked
by reading the files: the package list covers every folder with an ``__init__.py`` (a missing one
would be absent from a wheel while the editable install still finds it), and no code imports a
folder by its bare name (that would load a second copy of the module, or fail once installed).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("flows", "tasks", "catalog", "mechanisms")
CODE = (*FOLDERS, "tests", "benchmarks")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _packages_on_disk() -> list[str]:
    return sorted(
        "dprelease." + ".".join(path.parent.relative_to(ROOT).parts)
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("__init__.py")
    )


def test_every_package_folder_is_installed_under_dprelease() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    assert sorted(setuptools["packages"]) == _packages_on_disk()
    assert setuptools["package-dir"] == {f"dprelease.{folder}": folder for folder in FOLDERS}
    assert _pyproject()["project"]["scripts"] == {"dprelease": "dprelease.flows.cli:app"}


def bare_imports(source: str) -> list[str]:
    """``line N: module`` for each import of a repository folder by its bare name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [f"line {node.lineno}: {n}" for n in names if n.split(".")[0] in FOLDERS]
    return found


@pytest.mark.parametrize(
    "path",
    sorted(p for folder in CODE for p in (ROOT / folder).rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_code_imports_the_folders_through_dprelease(path: Path) -> None:
    assert bare_imports(path.read_text()) == [], f"{path.relative_to(ROOT)} imports a bare folder"


def test_the_bare_import_check_can_fail() -> None:
    source = "import catalog.spec\nfrom mechanisms import noise\nfrom dprelease.tasks import plan\n"
    assert bare_imports(source) == ["line 1: catalog.spec", "line 2: mechanisms"]
