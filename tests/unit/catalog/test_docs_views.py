"""Data Docs written with ``catalog/validation/docs_views.py`` (GX's page views sharing one Jinja
bytecode cache per process) are the pages GX's own views write, and a second build in the same
process compiles no template."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd
import pytest

from dprelease.catalog.validation import docs_views
from dprelease.catalog.validation.gx import run_suites_here

# what differs between two builds of the same results: element ids, run times
VOLATILE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\d{8}T\d{6}\.\d{6}Z"
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z| UTC|[+-]\d{2}:\d{2})?"
    r"|'_run_time_sort': [0-9.]+"
)


def _jobs() -> list[tuple[str, pd.DataFrame, list[tuple[str, dict[str, Any]]]]]:
    frame = pd.DataFrame({"cell": np.arange(6), "estimate": np.linspace(-1.0, 1.0, 6)})
    return [
        ("ages", frame, [("expect_column_values_to_not_be_null", {"column": "estimate"})]),
        (  # a failing expectation: its page shows the unexpected values
            "bounds",
            frame,
            [
                ("expect_column_values_to_be_between", {"column": "estimate", "min_value": 0}),
                ("expect_table_row_count_to_equal", {"value": 6}),
            ],
        ),
    ]


def _pages(folder: Path) -> dict[str, str]:
    return {
        VOLATILE.sub("<volatile>", str(page.relative_to(folder))): VOLATILE.sub(
            "<volatile>", page.read_text()
        )
        for page in sorted(folder.rglob("*.html"))
    }


def test_the_pages_are_the_ones_gx_views_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_suites_here(_jobs(), docs_dir=tmp_path / "ours")
    run_suites_here(_jobs(), docs_dir=tmp_path / "ours-again")  # from the compiled templates
    gx_defaults = {"site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}}
    monkeypatch.setattr(docs_views, "site_views", lambda: gx_defaults)
    run_suites_here(_jobs(), docs_dir=tmp_path / "gx")
    ours, again, theirs = (_pages(tmp_path / name) for name in ("ours", "ours-again", "gx"))
    assert len(theirs) == 5  # the index, two suites, two validation results
    assert ours == theirs and again == theirs


def test_a_second_build_compiles_no_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[str | None] = []
    compile_source = jinja2.Environment.compile

    def counting(
        self: jinja2.Environment, source: Any, name: str | None = None, *a: Any, **k: Any
    ) -> Any:
        compiled.append(name)
        return compile_source(self, source, name, *a, **k)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    docs_views.COMPILED.clear()
    run_suites_here(_jobs(), docs_dir=tmp_path / "first")
    first = list(compiled)
    assert first and len(docs_views.COMPILED) == len(set(first))
    compiled.clear()
    run_suites_here(_jobs(), docs_dir=tmp_path / "second")
    assert compiled == []
    assert _pages(tmp_path / "first").keys() == _pages(tmp_path / "second").keys()


def test_a_changed_template_source_is_compiled_again() -> None:
    """The cache is keyed by name and checked against the source: a template whose source changed
    (another GX version in the same process) is never served from old bytecode."""
    cache = docs_views.CompiledTemplates()
    sources = {"page.j2": "one {{ x }}"}
    env = jinja2.Environment(loader=jinja2.DictLoader(sources), bytecode_cache=cache)
    assert env.get_template("page.j2").render(x=1) == "one 1" and len(cache) == 1
    sources["page.j2"] = "two {{ x }}"
    fresh = jinja2.Environment(loader=jinja2.DictLoader(sources), bytecode_cache=cache)
    assert fresh.get_template("page.j2").render(x=1) == "two 1"
