"""The confidential boundary is one package: only ``catalog/confidential/`` reads input data, and
only its choke point reaches the vetted noise sampler.

Checked by parsing every production module (``flows/``, ``tasks/``, ``catalog/``,
``mechanisms/``) with :mod:`ast`; a finding names the module, the line and what was found.

1. **Data.**  Outside ``catalog/confidential/`` no module imports ``pyarrow.dataset`` or
   ``dask.dataframe``, or calls a Parquet/Arrow reader (``pq.read_table``, ``ParquetFile``,
   ``ds.dataset``, ``read_parquet``, ``.to_table()``, ...).  Writing Parquet (``write_table``) is
   not reading and is allowed: released tables are public.
2. **Sampler.**  The vetted sampler is obtained or run only through ``production_sampler``,
   ``OpenDPSampler`` and ``noise_shard`` (``mechanisms/primitives/noise.py``).  Those names appear only in
   ``mechanisms/primitives/noise.py`` (which defines them) and ``catalog/confidential/choke_point.py`` (which
   charges the ledger before calling them).  Outside those two modules nothing calls a sampler
   (``.add_laplace``, ``.add_gaussian``, ``.apply(..., sampler=...)``).

The local model's randomiser (``mechanisms.local.randomizer.randomize``) is client code, public
by design: it plays the respondent's device, which randomises its own item with the device's own
``rng`` (``rng.integers``) before anything is sent.  That is the local model's noise, not the
central sampler, and it never sees a confidential count, so it needs no exception here; the only
code that feeds it true items (``dprelease ldp simulate``) is inside ``catalog/confidential/``.

Exceptions are listed below, each by (module, enclosing function or call) with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flows", "tasks", "catalog", "mechanisms")
CONFIDENTIAL = "catalog/confidential/"
NOISE_MODULE = "mechanisms/primitives/noise.py"
CHOKE_POINT = "catalog/confidential/choke_point.py"

DATA_MODULES = {"pyarrow.dataset", "pyarrow.feather", "pyarrow.orc", "dask.dataframe"}
DATA_READERS = {
    "read_table",
    "read_pandas",
    "read_metadata",
    "read_schema",
    "ParquetFile",
    "ParquetDataset",
    "read_parquet",
    "read_feather",
    "read_csv",
    "read_json",
    "dataset",
    "parquet_dataset",
    "open_file",
    "memory_map",
    "to_table",
    "to_batches",
    "iter_batches",
    "read_row_group",
    "read_row_groups",
    "get_fragments",
}
SAMPLER_NAMES = {"production_sampler", "OpenDPSampler", "noise_shard"}
SAMPLER_METHODS = {"add_laplace", "add_gaussian"}

# (module, what) -> why it may do that outside the confidential package.
PUBLIC_READS = {
    (
        "catalog/publishing/report.py",
        "pq.read_table",
    ): "reads the staged release's own (noised) tables",
    ("catalog/publishing/synthetic.py", "pq.read_table"): "reads a released (noised) table",
    (
        "catalog/publishing/series_report.py",
        "pq.read_table",
    ): "reads earlier periods' published (noised) tables, each checked against its manifest",
    (
        "catalog/series_audit.py",
        "pq.read_table",
    ): "verify: reads a series period's published (noised) tables to compare them",
    (
        "catalog/publishing/artifacts.py",
        "pq.read_metadata",
    ): "verify: footers of the released tables",
    (
        "catalog/planning/memory.py",
        "pq.ParquetFile",
    ): "footer sizes of the input, for the memory prediction",
    ("flows/watch.py", "pq.read_metadata"): "is an arriving input file complete (footer only)",
}
# (module, enclosing function) -> why it may call a sampler it was handed.
SAMPLER_CALLS = {
    (
        "mechanisms/dawa/partition.py",
        "PartitionSelector.select.perturb",
    ): "DAWA's private partition: runs inside ProtectedCells.select, after the choke point charged "
    "its epsilon1, on the sampler the choke point hands it",
}


def _text(node: ast.AST) -> str:
    return ast.unparse(node)


def _named(node: ast.AST) -> str | None:
    """The last name of a called expression (``pq.read_table`` -> ``read_table``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _scopes(tree: ast.AST) -> dict[ast.AST, str]:
    """Every node's enclosing class/function path (``Class.method``), '' at module level."""
    scope: dict[ast.AST, str] = {}

    def visit(node: ast.AST, path: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = path
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{path}.{child.name}" if path else child.name
            scope[child] = inner
            visit(child, inner)

    visit(tree, "")
    return scope


def violations(source: str, module: str) -> list[str]:
    """Boundary findings of one module (``module`` is its path from the repository root)."""
    tree = ast.parse(source, filename=module)
    scope = _scopes(tree)
    inside = module.startswith(CONFIDENTIAL)
    sampler_home = module in (NOISE_MODULE, CHOKE_POINT)
    found: list[str] = []

    def report(node: ast.AST, what: str) -> None:
        found.append(f"{module}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                imported = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            if not inside:
                for name in imported:
                    if name in DATA_MODULES:
                        report(node, f"imports {name}")
            if not sampler_home and isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in SAMPLER_NAMES:
                        report(node, f"imports {alias.name}")
        elif isinstance(node, ast.Call):
            name = _named(node.func)
            what = _text(node.func)
            if not inside and name in DATA_READERS and (module, what) not in PUBLIC_READS:
                report(node, f"reads data: {what}(...)")
            calls_sampler = name in SAMPLER_METHODS or (
                name == "apply" and any(k.arg == "sampler" for k in node.keywords)
            )
            if (
                calls_sampler
                and not sampler_home
                and (module, scope.get(node, "")) not in SAMPLER_CALLS
            ):
                report(node, f"calls a noise sampler: {what}(...)")
        if not sampler_home and _named(node) in SAMPLER_NAMES and not isinstance(node, ast.Call):
            report(node, f"reaches the vetted sampler: {_text(node)}")
    return sorted(set(found), key=lambda line: (int(line.split(":")[1]), line))


def _production_modules() -> list[str]:
    return [
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


@pytest.mark.parametrize("module", _production_modules())
def test_the_confidential_boundary_holds(module: str) -> None:
    found = violations((ROOT / module).read_text(), module)
    assert not found, "outside the confidential boundary:\n" + "\n".join(found)


def test_the_exceptions_are_still_needed() -> None:
    """Every listed exception still matches code (a stale one would hide a future violation)."""
    for module, what in PUBLIC_READS:
        assert f"{what}(" in (ROOT / module).read_text(), (module, what)
    for module, function in SAMPLER_CALLS:
        tree = ast.parse((ROOT / module).read_text())
        scope = _scopes(tree)
        assert any(
            scope.get(node) == function
            and isinstance(node, ast.Call)
            and _named(node.func) in SAMPLER_METHODS
            for node in ast.walk(tree)
        ), (module, function)


def test_noise_is_drawn_only_after_a_charge_in_the_choke_point() -> None:
    """In the choke point, the sampler is reached only by the one calibrate -> charge -> noise
    path, its shard dispatcher, and ``ProtectedCells.select`` (which charges first)."""
    tree = ast.parse((ROOT / CHOKE_POINT).read_text())
    scope = _scopes(tree)
    users = {
        scope[node]
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in SAMPLER_NAMES
    }
    assert users == {"_Protected._release", "_noise_on_shards", "ProtectedCells.select"}


def test_the_boundary_check_can_fail() -> None:
    source = (
        "import pyarrow.parquet as pq\n"
        "import pyarrow.dataset as ds\n"
        "import dask.dataframe as dd\n"
        "from dprelease.mechanisms.primitives.noise import production_sampler\n"
        "table = pq.read_table('x.parquet')\n"
        "rows = ds.dataset('x').to_table()\n"
        "frame = dd.read_parquet('x')\n"
        "pq.write_table(table, 'y.parquet')\n"
        "def measure(x, sampler):\n"
        "    return sampler.add_laplace(x, scale=1.0)\n"
        "noisy = mechanism.apply(x, sampler=noise.production_sampler())\n"
    )
    assert violations(source, "catalog/leaky.py") == [
        "catalog/leaky.py:2: imports pyarrow.dataset",
        "catalog/leaky.py:3: imports dask.dataframe",
        "catalog/leaky.py:4: imports production_sampler",
        "catalog/leaky.py:5: reads data: pq.read_table(...)",
        "catalog/leaky.py:6: reads data: ds.dataset('x').to_table(...)",
        "catalog/leaky.py:6: reads data: ds.dataset(...)",
        "catalog/leaky.py:7: reads data: dd.read_parquet(...)",
        "catalog/leaky.py:10: calls a noise sampler: sampler.add_laplace(...)",
        "catalog/leaky.py:11: calls a noise sampler: mechanism.apply(...)",
        "catalog/leaky.py:11: reaches the vetted sampler: noise.production_sampler",
    ]
    # inside the package the same reads are allowed; the sampler still only in the choke point
    assert violations(source, "catalog/confidential/leaky.py") == [
        "catalog/confidential/leaky.py:4: imports production_sampler",
        "catalog/confidential/leaky.py:10: calls a noise sampler: sampler.add_laplace(...)",
        "catalog/confidential/leaky.py:11: calls a noise sampler: mechanism.apply(...)",
        "catalog/confidential/leaky.py:11: reaches the vetted sampler: noise.production_sampler",
    ]
    assert violations(source.split("table = ")[0], CHOKE_POINT) == []
