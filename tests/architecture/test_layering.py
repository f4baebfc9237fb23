"""Import layering and banned APIs, checked by reading the source (no convention is trusted).

Layers point one way: flows -> tasks -> catalog -> mechanisms.  ``mechanisms`` is pure: no
Prefect, pyarrow, pandas, catalog or I/O libraries; OpenDP only in ``mechanisms/primitives/noise.py``.
Production code never calls ``numpy.random`` functions, ``RandomState`` or ``assert``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mechanisms", "catalog", "tasks", "flows")
FORBIDDEN = {
    "mechanisms": {
        "prefect",
        "pyarrow",
        "pandas",
        "catalog",
        "tasks",
        "flows",
        "great_expectations",
        "sqlalchemy",
        "duckdb",
    },
    "catalog": {"prefect", "tasks", "flows"},
    "tasks": {"flows"},
    "flows": set(),
}


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _top(module: str) -> str:
    """The top-level name an import reaches: ``catalog`` for ``dprelease.catalog.spec``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "dprelease" and len(parts) > 1 else parts[0]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(_top(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(_top(node.module))
    return names


def _all_modules() -> list[tuple[str, Path]]:
    return [(package, path) for package in PACKAGES for path in _modules(package)]


@pytest.mark.parametrize(
    ("package", "path"), _all_modules(), ids=[str(p.relative_to(ROOT)) for _, p in _all_modules()]
)
def test_layering(package: str, path: Path) -> None:
    bad = _imports(path) & FORBIDDEN[package]
    assert not bad, (
        f"{path.relative_to(ROOT)} imports {sorted(bad)}, which {package}/ must not import"
    )


def test_opendp_only_in_the_noise_module() -> None:
    users = [
        str(path.relative_to(ROOT)) for _, path in _all_modules() if "opendp" in _imports(path)
    ]
    assert users == ["mechanisms/primitives/noise.py"]


def test_the_layering_check_can_fail(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("import prefect\nfrom pyarrow import compute\n")
    assert _imports(module) & FORBIDDEN["mechanisms"] == {"prefect", "pyarrow"}


def _banned_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found.append(f"line {node.lineno}: assert")
        if isinstance(node, ast.Attribute):
            text = ast.unparse(node)
            if text.startswith(("np.random.", "numpy.random.")) and text.split(".")[-1] not in (
                "Generator",
                "default_rng",
                "SeedSequence",
            ):
                found.append(f"line {node.lineno}: {text}")
            if node.attr == "RandomState":
                found.append(f"line {node.lineno}: RandomState")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("laplace", "normal")
        ):
            found.append(f"line {node.lineno}: .{node.func.attr}(")
    return found


@pytest.mark.parametrize(
    ("package", "path"), _all_modules(), ids=[str(p.relative_to(ROOT)) for _, p in _all_modules()]
)
def test_no_global_randomness_numpy_noise_or_asserts(package: str, path: Path) -> None:
    found = [
        call
        for call in _banned_calls(path)
        if (str(path.relative_to(ROOT)), call.split(": ", 1)[1]) not in GLOBAL_RANDOMNESS_ALLOWED
    ]
    assert not found, f"{path.relative_to(ROOT)}: {found}"


GLOBAL_RANDOMNESS_ALLOWED = {
    ("flows/run_starter.py", "numpy.random.seed"): (
        "reseeds numpy's legacy global state from OS entropy in each forked run, so that no two "
        "runs share it (a new process gets its own at import); nothing draws from it"
    ),
}


def test_the_banned_api_check_can_fail(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text(
        "import numpy as np\nassert True\nx = np.random.laplace(0, 1)\nrng.normal(0, 1)\n"
    )
    assert sorted(_banned_calls(module)) == [
        "line 2: assert",
        "line 3: .laplace(",
        "line 3: np.random.laplace",
        "line 4: .normal(",
    ]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return "dprelease." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """Production modules ``path`` imports anywhere in its body (lazy imports count: a cycle
    broken only by importing inside a function is still a cycle of ideas)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            named = [name for name in submodules if name in known]  # from package import module
            candidates = named if len(named) == len(submodules) else [node.module, *named]
        else:
            continue
        found.update(name for name in candidates if name in known)
    return found


def import_cycles(paths: list[Path]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan's algorithm). O(modules + imports)."""
    names = {_module_name(path): path for path in paths}
    graph = {name: _imported_modules(path, set(names)) - {name} for name, path in names.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles


def test_no_import_cycles() -> None:
    assert import_cycles([path for _, path in _all_modules()]) == []


def test_the_cycle_check_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "catalog"
    package.mkdir()
    (package / "a.py").write_text("def f():\n    from dprelease.catalog import b\n")
    (package / "b.py").write_text("from dprelease.catalog.a import f\n")
    (package / "c.py").write_text("import dprelease.catalog.a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert import_cycles(sorted(package.glob("*.py"))) == [
        ["dprelease.catalog.a", "dprelease.catalog.b"]
    ]
