"""Only the registry and the mechanism modules name concrete mechanisms; the pipeline iterates.

Checked by reading the source: in ``catalog/``, ``tasks/``, ``flows/`` and the pure core of
``mechanisms/`` (protocol, choke point, noise, privacy, operators, workloads, error, bounds), no
string literal equals a registered mechanism's name and no module that defines a mechanism is
imported.  The release flow calls its tasks without any branch.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from dprelease.mechanisms import registry

ROOT = Path(__file__).resolve().parents[2]
PIPELINE_PACKAGES = ("catalog", "tasks", "flows")
CORE = (
    "mechanisms/__init__.py",
    "mechanisms/primitives/protocol.py",
    "mechanisms/primitives/protected.py",
    "mechanisms/primitives/noise.py",
    "mechanisms/primitives/privacy.py",
    "mechanisms/primitives/operators.py",
    "mechanisms/primitives/workload.py",
    "mechanisms/primitives/lower_bound.py",
    "mechanisms/primitives/compute_limits.py",
    "mechanisms/primitives/intervals.py",
)


def _mechanism_modules() -> set[str]:
    return {type(m).__module__ for m in registry.mechanisms()}


def _checked_files() -> list[Path]:
    files = [p for package in PIPELINE_PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    return files + [ROOT / name for name in CORE if (ROOT / name).exists()]


def _inside(name: str, modules: set[str]) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in modules)


def _violations(path: Path, names: set[str], modules: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"line {node.lineno}: the literal {node.value!r}")
        imported: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            imported = (
                [node.module]
                if _inside(node.module, modules)
                else [f"{node.module}.{alias.name}" for alias in node.names]
            )
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        found += [
            f"line {node.lineno}: imports {name}" for name in imported if _inside(name, modules)
        ]
    return found


@pytest.mark.parametrize("path", _checked_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_concrete_mechanism_outside_the_registry(path: Path) -> None:
    found = _violations(path, set(registry.names()), _mechanism_modules())
    assert not found, f"{path.relative_to(ROOT)} names a concrete mechanism: {found}"


def test_the_boundary_check_can_fail(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text(
        "from dprelease.mechanisms import dawa\nif plan.chosen == 'dawa':\n    pass\n"
        "from dprelease.mechanisms.dawa.partition import Partition\n"
    )
    found = _violations(module, {"dawa"}, {"dprelease.mechanisms.dawa"})
    assert sorted(found) == [
        "line 1: imports dprelease.mechanisms.dawa",
        "line 2: the literal 'dawa'",
        "line 4: imports dprelease.mechanisms.dawa.partition",
    ]


MECHANISM_ATTRIBUTES = {"chosen", "mechanism", "model", "input_kind", "name"}


def _mechanism_branches(function: ast.FunctionDef) -> list[str]:
    """Branches whose condition looks at the plan or a mechanism (names a string, reads ``plan`` or
    an attribute such as ``chosen``/``model``): the one thing the release flow must not do.  A
    branch on the registration outcome (a skipped release returns early) is not one."""
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Match):
            found.append(f"line {node.lineno}: match")
        elif isinstance(node, ast.If | ast.IfExp):
            for part in ast.walk(node.test):
                if (
                    (isinstance(part, ast.Name) and part.id == "plan")
                    or (isinstance(part, ast.Attribute) and part.attr in MECHANISM_ATTRIBUTES)
                    or (isinstance(part, ast.Constant) and isinstance(part.value, str))
                ):
                    found.append(f"line {node.lineno}: {ast.unparse(node.test)}")
                    break
    return found


def _flow_function(source: str) -> ast.FunctionDef:
    return next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "release_flow"
    )


def test_the_release_flow_has_no_mechanism_branches() -> None:
    function = _flow_function((ROOT / "flows" / "release_flow.py").read_text())
    assert not _mechanism_branches(function), "the release flow must not branch on the mechanism"
    # can fail: the branches the old flow had are found
    old = (
        "def release_flow(spec):\n"
        "    if plan.chosen == 'dawa':\n        pass\n"
        "    x = 1 if spec.model == 'local' else 2\n"
    )
    assert len(_mechanism_branches(_flow_function(old))) == 2


def test_every_registered_mechanism_follows_the_protocol() -> None:
    for mechanism in registry.mechanisms():
        assert mechanism.model in ("central", "local")
        assert mechanism.input_kind in ("cells", "responses", "marginals")
        assert isinstance(mechanism.summary, str) and mechanism.summary
        for method in ("unavailable_reason", "predicted_seconds", "plan", "evaluate"):
            assert callable(getattr(mechanism, method)), (mechanism.name, method)
        for method in ("measure", "reconstruct"):
            assert callable(getattr(mechanism, method)), (mechanism.name, method)
        mechanism.options.parse({})  # every option has a default
        module = sys.modules[type(mechanism).__module__]
        assert module.MECHANISM is mechanism  # one module, one MECHANISM
