"""Load time of ``report.html`` for 91 tables in headless Chromium (navigation timing), offline.

Usage: PYTHONPATH=. .venv/bin/python benchmarks/report_bench.py [--runs 3] [--all-rows]
       PYTHONPATH=. .venv/bin/python benchmarks/report_bench.py --attributes 30 [--split-from N]

The 91 tables are the bundled ``adult-marginals`` spec's 2-way marginals (148,137 rows), filled
with synthetic values from a seeded generator (public randomness; no data is read), rendered by
``catalog.publishing.report.render_report`` into a release-like folder with the tables' CSVs.  Each page is
opened ``--runs`` times, each time in a fresh browser, and ``loadEventEnd`` is read from
``performance.getEntriesByType('navigation')``.  Baselines measured in the same run:

- ``minimal``: a page with one paragraph (the browser's floor on this machine);
- ``all rows as HTML`` (``--all-rows``, one load, minutes): the same tables with every row in
  the page as a plain HTML table (what "complete tables" cost without the pager's page data).

Target: the report's median load under 2,000 ms.

``--attributes D``: instead, every 1-, 2- and 3-way marginal of D attributes × 10 values (D = 30:
4,525 tables, 4.1M rows; issue 28), with synthetic values from the same seeded generator.  From
``report.SPLIT_FROM`` tables (``--split-from`` overrides it, e.g. to time one page of them all)
``report.html`` is a searchable index and every table has its own page (``report/<name>.html``):
the index and the first three-way table's page are timed.  Target there: under 3,000 ms.
Measured (2 shared cores, D = 30): index 1.4 MB, 583-741 ms; a 1,000-row table's page 37 KB,
106-120 ms; 159 MB of HTML in all, rendered and written in ~30 s; minimal page 72-110 ms.
One page of all tables (``--split-from 100000``): D = 10 (175 tables) 4.2 MB 1.2 s, D = 13 (377
tables) 9.7 MB 3.5-12 s.
"""

from __future__ import annotations

import argparse
import html
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dprelease.catalog.planning.planner import build_workload  # noqa: E402
from dprelease.catalog.publishing import report  # noqa: E402
from dprelease.catalog.publishing.artifacts import write_csv  # noqa: E402
from dprelease.catalog.publishing.tables import build_table  # noqa: E402
from dprelease.catalog.spec.load import load_spec, parse_spec  # noqa: E402
from tests.flows.chromium import Browser  # noqa: E402

TARGET_MS = 2000.0
SCALE_TARGET_MS = 3000.0
VALUES = 10  # per attribute with --attributes
SMALL = ("a00", "a01", "a02")  # the template spec's attributes


def fill(spec: Any, seed: int) -> dict[str, pa.Table]:
    """Every workload item's table with synthetic values (seeded). O(rows)."""
    rng = np.random.default_rng(seed)  # public randomness: synthetic values, no data
    tables = {}
    for item in build_workload(spec).items:
        rows = item.num_queries
        tables[item.name] = build_table(
            spec,
            item,
            estimates=rng.gamma(0.6, 300.0, rows) + rng.laplace(0.0, 40.0, rows),
            unit_variances=np.ones(rows),
            noise_variance=2 * 40.0**2,
            nonnegative=False,
        )
    return tables


def scale_tables(attributes: int, seed: int) -> dict[str, pa.Table]:
    """Every 1-3-way marginal of ``attributes`` attributes × 10 values, synthetic values.

    The spec refuses more than 1e18 domain cells today (issue 28, item 1), so each table is its
    degree's table of a 3-attribute spec with the columns renamed and fresh values (the same
    columns, error model and interval a release writes). O(rows)."""
    from itertools import combinations

    spec = parse_spec(
        {
            "name": "scale",
            "dataset": {"id": "scale", "budget": {"rho": 10}},
            "domain": {f"a{i:02d}": {"min": 0, "max": VALUES - 1} for i in range(3)},
            "workload": [
                {"name": f"way{k}", "marginals": {"attributes": "all", "degree": k}}
                for k in (1, 2, 3)
            ],
            "mechanism": "marginal_space",
            "privacy": {"rho": 0.5},
        }
    )
    templates = {k: fill(spec, seed)[".".join([f"way{k}", *SMALL[:k]])] for k in (1, 2, 3)}
    rng = np.random.default_rng(seed)  # public randomness: synthetic values, no data
    names = [f"a{i:02d}" for i in range(attributes)]
    tables = {}
    for k in (1, 2, 3):
        template = templates[k]
        for chosen in combinations(names, k):
            rows = template.num_rows
            estimate = rng.gamma(0.6, 300.0, rows) + rng.laplace(0.0, 40.0, rows)
            half = 1.96 * template["std_error"].to_numpy()
            table = template.rename_columns([*chosen, *template.column_names[k:]])
            for column, values in (
                ("estimate", estimate),
                ("ci_low", estimate - half),
                ("ci_high", estimate + half),
            ):
                table = table.set_column(table.column_names.index(column), column, pa.array(values))
            tables[".".join([f"way{k}", *chosen])] = table
    return tables


def synthetic_tables(seed: int) -> dict[str, pa.Table]:
    return fill(load_spec(ROOT / "flows" / "examples" / "adult-marginals.yaml"), seed)


def render(tables: dict[str, pa.Table], folder: Path) -> tuple[Path, float]:
    (folder / "tables").mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        write_csv(table, folder / "tables" / f"{name}.csv")
    results = [
        {
            "expectation": "expect_column_values_to_be_between",
            "column": "std_error",
            "kwargs": {"column": "std_error", "min_value": 0.0, "strict_min": True},
            "success": True,
            "observed_value": None,
            "unexpected_count": 0,
        }
    ]
    started = time.perf_counter()
    text = report.render_report(
        manifest={
            "release_id": "bench-1",
            "name": "adult-marginals",
            "dataset_id": "adult-marginals",
            "created_at": "2026-11-25T00:00:00+00:00",
            "spec_fingerprint": "0" * 64,
            "input_fingerprint": "0" * 64,
            "code_version": {"package": "bench", "git_commit": None},
            "privacy_unit": "1 row(s) per person",
            "privacy": {"requested": {"epsilon": 1.0}, "charged": {"epsilon": 1.0}},
            "mechanism": {
                "name": "marginal_space",
                "noise": {"kind": "laplace", "scale": 40.0, "size": 158097, "sensitivity": 1.0},
            },
            "review": {"status": "staged", "trail": []},
        },
        plan={
            "chosen": "marginal_space",
            "reason": "bench",
            "lower_bound_rmse": 9.0,
            "lower_bound_note": "bench",
            "candidates": [{"mechanism": "marginal_space", "rmse": 73.3, "total_variance": 8e5}],
        },
        tables=tables,
        validation={"success": True, "tables": {n: {"results": results} for n in tables}},
        budget={k: {"epsilon": 1.0} for k in ("cap", "before", "after", "remaining")},
        ledger_rows=[
            {
                "seq": 1,
                "created_at": "2026-11-25T00:00:00+00:00",
                "release_id": "bench-1",
                "label": "bench",
                "cost": "epsilon=1",
            }
        ],
        reviews=[],
    )
    page = folder / "report.html"
    page.write_text(text)
    if len(tables) >= report.SPLIT_FROM:
        (folder / report.TABLE_PAGES).mkdir(exist_ok=True)
        manifest = {"name": "bench", "release_id": "bench-1"}
        for relative, html_text in report.table_pages(manifest, tables):
            (folder / relative).write_text(html_text)
    return page, time.perf_counter() - started


def all_rows_page(tables: dict[str, pa.Table], folder: Path) -> Path:
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"]
    for name, table in tables.items():
        parts.append(f"<h3>{html.escape(name)}</h3><table>")
        columns = [[report._fmt(v) for v in table[c].to_pylist()] for c in table.column_names]
        for row in zip(*columns, strict=True):
            parts.append("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>")
        parts.append("</table>")
    page = folder / "all_rows.html"
    page.write_text("".join(parts) + "</body></html>")
    return page


def load_ms(page: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        with Browser(offline=True) as browser:
            browser.open(page, timeout=300)
            entry = browser.evaluate(
                "JSON.stringify(performance.getEntriesByType('navigation')[0].toJSON())"
            )
            times.append(float(json.loads(entry)["loadEventEnd"]))
            browser.settle(0.2)
            if browser.events.console or browser.events.failed:
                raise SystemExit(f"{page.name}: {browser.events.console + browser.events.failed}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument(
        "--all-rows", action="store_true", help="also time every row as a plain HTML table (slow)"
    )
    parser.add_argument(
        "--attributes", type=int, help="every 1-3-way marginal of this many attributes × 10 values"
    )
    parser.add_argument("--split-from", type=int, help="override report.SPLIT_FROM (tables)")
    args = parser.parse_args()
    if args.split_from is not None:
        report.SPLIT_FROM = args.split_from
    started = time.perf_counter()
    tables = (
        scale_tables(args.attributes, args.seed) if args.attributes else synthetic_tables(args.seed)
    )
    build_seconds = time.perf_counter() - started
    rows = sum(t.num_rows for t in tables.values())
    split = len(tables) >= report.SPLIT_FROM
    with tempfile.TemporaryDirectory(prefix="dprelease-report-bench-") as work:
        folder = Path(work)
        page, render_seconds = render(tables, folder)
        minimal = folder / "minimal.html"
        minimal.write_text("<!DOCTYPE html><html><body><p>minimal</p></body></html>")
        pages = [("minimal (baseline)", minimal, None, args.runs)]
        if args.all_rows:  # one load: it takes minutes
            pages.append(("all rows as HTML (baseline)", all_rows_page(tables, folder), None, 1))
        pages.append(
            ("report.html" + (" (index)" if split else ""), page, render_seconds, args.runs)
        )
        total_bytes = page.stat().st_size
        if split:
            own = sorted((folder / report.TABLE_PAGES).glob("*.html"))
            total_bytes += sum(path.stat().st_size for path in own)
            widest = max(tables, key=lambda name: (tables[name].num_rows, name))
            one = folder / report.table_page_path(widest)
            pages.append((f"one table's page ({tables[widest].num_rows:,} rows)", one, None, 2))
        measured = [
            (label, path.stat().st_size, render, load_ms(path, runs))
            for label, path, render, runs in pages
        ]
    floor = statistics.median(measured[0][3])
    print(
        f"{len(tables):,} tables, {rows:,} rows (synthetic, built in {build_seconds:.1f} s); "
        f"{args.runs} fresh-browser loads each (offline)"
    )
    print(
        f"report: {'index + one page per table' if split else 'one page'}, "
        f"{total_bytes / 1e6:,.1f} MB of HTML in all, rendered and written in {render_seconds:.1f} s"
    )
    print(
        f"{'page':<30}{'size KB':>10}{'render s':>10}{'load ms (median)':>18}{'runs ms':>24}{'x minimal':>11}"
    )
    for label, size, render_s, times in measured:
        median = statistics.median(times)
        print(
            f"{label:<30}{size / 1000:>10,.0f}"
            f"{'' if render_s is None else f'{render_s:.2f}':>10}{median:>18,.0f}"
            f"{' '.join(f'{t:,.0f}' for t in times):>24}{median / floor:>11.1f}"
        )
    target = SCALE_TARGET_MS if args.attributes else TARGET_MS
    for label, _, _, times in measured[1:]:
        median = statistics.median(times)
        verdict = "meets" if median < target else "MISSES"
        print(f"{label} median load {median:,.0f} ms {verdict} the {target:,.0f} ms target")


if __name__ == "__main__":
    main()
